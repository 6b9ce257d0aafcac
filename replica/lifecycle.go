package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// startBackoff is the wait before the next start after n failed ones in a
// row (or n replicas in a row that exited soon after starting).
func startBackoff(n int) time.Duration {
	return min(startBackoffMin<<min(max(n-1, 0), 20), startBackoffMax)
}

// A replica process that exits within crashLoopUptime of becoming healthy
// counts towards the backoff of its replacement's start, as a failed start
// does (but not towards max_constructor_retry_count: it did start). The
// count is forgotten crashLoopForget after the last such exit, or at a
// scale.
const (
	crashLoopUptime = 10 * time.Second
	crashLoopForget = 5 * time.Minute
)

// Backoff between failed replica starts: doubling from startBackoffMin,
// at most startBackoffMax.
const (
	startBackoffMin = 100 * time.Millisecond
	startBackoffMax = 30 * time.Second
)

// newID returns a new replica id: the deployment's name and six letters,
// as Serve's replica ids are.
func (d *Deployment) newID() string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.issued == nil {
		d.issued = make(map[string]bool)
	}
	for {
		b := make([]byte, 6)
		for i := range b {
			b[i] = letters[rand.IntN(len(letters))]
		}
		// 26^6 ids: among 10000 replicas two alike are likely (16%).
		if id := d.spec.Name + "#" + string(b); !d.issued[id] {
			d.issued[id] = true
			return id
		}
	}
}

// forgetID takes id out of those given, once no replica has it: a
// deployment whose replicas crash and are replaced for months must not
// keep every id it ever gave.
func (d *Deployment) forgetID(id string) {
	d.mu.Lock()
	delete(d.issued, id)
	d.mu.Unlock()
}

// newReplica builds a replica with spec.Start, or in process with the
// user's factory; a panic in either is an error, not a crash.
func (d *Deployment) newReplica(ctx context.Context, userConfig json.RawMessage) (r Replica, err error) {
	id := d.newID()
	d.starts.Add(1)
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("application %q deployment %q: starting a replica panicked: %v", d.spec.App, d.spec.Name, v)
		}
		if err != nil {
			d.forgetID(id) // a replica that never was
		}
	}()
	if d.spec.Start != nil {
		timeout := time.Duration(d.healthTimeout.Load())
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		r, err = d.spec.Start(ctx, id, d.hooks.OnRelease)
		if err != nil && timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded) {
			// Say which setting gave up: a slow start (a model that
			// loads for a minute) needs a larger one.
			err = fmt.Errorf("%w; a replica's start is bounded by health_check_timeout_s (%v)", err, timeout)
		}
	} else {
		var h Handler
		if h, err = d.spec.Factory.build(userConfig); err == nil {
			l := NewLocal(id, h, int(d.maxOngoing.Load()), d.hooks.OnRelease)
			l.builtWith = userConfig
			r = l
		}
	}
	if err != nil {
		return nil, fmt.Errorf("application %q deployment %q: %w", d.spec.App, d.spec.Name, err)
	}
	if g, ok := r.(graceSetter); ok {
		// Start's is the one it was built with: a reload may have
		// changed it since.
		g.SetGrace(time.Duration(d.grace.Load()))
	}
	return r, nil
}

// graceSetter is a replica that keeps its own grace period for its stop
// (a process: SIGTERM, then SIGKILL after it).
type graceSetter interface {
	SetGrace(time.Duration)
}

// SetGracefulShutdownTimeout changes the deployment's
// graceful_shutdown_timeout_s live, as Serve's light updates do: replicas
// retired from now on drain for it, and processes get it between SIGTERM
// and SIGKILL, those running now included. It must not be negative.
func (d *Deployment) SetGracefulShutdownTimeout(grace time.Duration) error {
	if grace < 0 {
		return fmt.Errorf("SetGracefulShutdownTimeout: %v is negative", grace)
	}
	d.mu.Lock()
	d.spec.GracefulShutdownTimeout = grace // for Spec
	d.grace.Store(int64(grace))
	all := slices.Concat(d.replicas, d.retired)
	d.mu.Unlock()
	for _, r := range all {
		if g, ok := r.(graceSetter); ok {
			g.SetGrace(grace)
		}
	}
	return nil
}

// limitSetter is a replica whose max_ongoing_requests the proxy enforces
// (in process, an HTTP server, a process it started), and so can change.
// A replica host's actors enforce their own, read when the host starts.
type limitSetter interface {
	SetMaxOngoing(n int)
}

// giveLimitLocked gives r, joining the replicas, the deployment's
// max_ongoing_requests: Start and Connect build with the one the
// deployment began with, and a reload may have changed it since. Under
// d.mu, as SetMaxOngoing's change is, so that a replica joining as the
// limit changes has the new one.
func (d *Deployment) giveLimitLocked(r Replica) {
	if l, ok := r.(limitSetter); ok {
		if n := int(d.maxOngoing.Load()); n != r.MaxOngoing() {
			l.SetMaxOngoing(n)
		}
	}
}

// SetMaxOngoing changes the deployment's max_ongoing_requests live, as
// Serve's light updates do, for the replicas whose limit the proxy
// enforces: those running now and those it builds from now on. Raised,
// requests waiting for a slot take the room at once; lowered, the
// requests over the new limit finish and none starts on a replica until
// it is under it. A replica host's actors enforce their own limit: it
// fails for a deployment of them (one with no actor connected yet cannot
// tell, and takes n for its Spec only). n must be at least 1.
func (d *Deployment) SetMaxOngoing(n int) error {
	if n < 1 {
		return fmt.Errorf("SetMaxOngoing: %d is below 1: no replica could take a request", n)
	}
	d.mu.Lock()
	all := slices.Concat(d.replicas, d.retired)
	for _, r := range all {
		if _, ok := r.(limitSetter); !ok {
			d.mu.Unlock()
			return fmt.Errorf("SetMaxOngoing: replica %s enforces its own max_ongoing_requests (a replica host reads it when it starts)", r.ID())
		}
	}
	d.spec.MaxOngoingRequests = n // for Spec
	d.maxOngoing.Store(int64(n))
	for _, r := range all {
		r.(limitSetter).SetMaxOngoing(n)
	}
	d.mu.Unlock()
	return nil
}

// Starts returns how many replicas the deployment has tried to build in
// process or start as processes since it began, whether or not they came
// up: the first ones, scale-ups, every replacement of one that crashed,
// failed its health checks or exited, and every retry of a failed start
// (a crash loop shows as its rate). Replicas outside the proxy that it
// connects to (upstreams, replica hosts' actors) do not count.
func (d *Deployment) Starts() uint64 { return d.starts.Load() }

// startMany starts n replicas with spec.Start at once, maxParallelStarts
// at a time (each may take seconds to become healthy), and returns those
// that started; the failures are logged and counted, for the starter to
// retry.
func (d *Deployment) startMany(ctx context.Context, n int) []Replica {
	got := make([]Replica, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelStarts)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i], errs[i] = d.newReplica(ctx, d.spec.UserConfig)
		})
	}
	wg.Wait()
	got = slices.DeleteFunc(got, func(r Replica) bool { return r == nil })
	if ctx.Err() != nil {
		return got // cut short, not failed: the caller stops them
	}
	d.firstStartsFailed(errs, len(got) == 0, n)
	return got
}

// buildMany builds n in-process replicas with spec.Factory, one after
// another as the starter does (a factory need not be safe to call from
// several goroutines), until one fails, and returns those built; the
// failure is logged and counted, for the starter to retry.
func (d *Deployment) buildMany(ctx context.Context, n int) []Replica {
	var got []Replica
	for range n {
		if ctx.Err() != nil {
			return got // cut short: the caller stops them
		}
		r, err := d.newReplica(ctx, d.spec.UserConfig)
		if err != nil {
			d.firstStartsFailed([]error{err}, len(got) == 0, n)
			break
		}
		got = append(got, r)
	}
	return got
}

// firstStartsFailed logs the errors of the deployment's first starts
// (nil for a start that succeeded), and counts a failed round if none of
// its n replicas started.
func (d *Deployment) firstStartsFailed(errs []error, none bool, n int) {
	gaveUp := none && n > 0 && d.countFailedRound()
	msg := "starting a replica failed; retrying with backoff"
	if gaveUp {
		msg = "starting a replica failed"
	}
	for _, err := range errs {
		if err != nil {
			d.log().Error().Err(err).Msg(msg)
		}
	}
	if gaveUp {
		d.log().Error().Int("failed_starts", 1).Int("missing_replicas", n).Msg(gaveUpMessage)
	}
}

// connect builds the replicas of a target with spec.Connect.
func (d *Deployment) connect(ctx context.Context, target string) ([]Replica, error) {
	id := d.newID()
	rs, err := d.spec.Connect(ctx, id, target, d.hooks.OnRelease)
	if err != nil {
		d.forgetID(id)
		return nil, fmt.Errorf("application %q deployment %q: %w", d.spec.App, d.spec.Name, err)
	}
	d.mu.Lock()
	for _, r := range rs {
		d.targets[r] = target
	}
	d.mu.Unlock()
	return rs, nil
}

// retireLocked takes olds out of routing and drains them in the
// background (MethodDrain through the pool, one broadcast for the batch),
// for up to graceful_shutdown_timeout_s or until Stop, then stops them;
// the starter replaces them. The pool is rebuilt once for the batch, and
// once when it is done: a scale from 10000 to 1 is one batch, not 9999.
// d.mu must be held.
func (d *Deployment) retireLocked(olds ...Replica) {
	var batch []Replica
	for _, old := range olds {
		i := slices.Index(d.replicas, old)
		if i < 0 {
			continue // retired already
		}
		d.replicas = slices.Delete(d.replicas, i, i+1)
		old.SetState(StateDraining) // refused at once, even from a stale snapshot
		delete(d.failures, old)
		delete(d.failLogged, old)
		delete(d.excluded, old)
		delete(d.unreachableAt, old)
		delete(d.unsync, old)
		delete(d.refused, old)
		delete(d.gcStale, old)
		delete(d.gcRefused, old)
		delete(d.kept, old)
		d.retired = append(d.retired, old)
		batch = append(batch, old)
	}
	if len(batch) == 0 {
		return
	}
	d.rebuildPoolLocked()
	d.publishLocked()
	d.kick()
	pool := d.pool
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.ctx, time.Duration(d.grace.Load()))
		defer cancel()
		ids := make([]string, len(batch))
		for i, old := range batch {
			ids[i] = old.ID()
		}
		var busy []string
		for _, r := range pool.Broadcast(ctx, Call{Method: MethodDrain}, ids...) {
			if r.Err != nil {
				busy = append(busy, r.Actor)
			}
		}
		if len(busy) > 0 && d.ctx.Err() != nil {
			return // Stop drains and stops them with its own deadline
		}
		if len(busy) > 0 {
			// How many requests (WebSockets, most likely) are in flight
			// at the stop: it closes WebSocket sessions and kills a
			// command's process, and the plain requests of an in-process
			// replica or an upstream server run to their end (the line
			// said they were cut, found by a tester).
			inFlight := 0
			for _, old := range batch {
				if slices.Contains(busy, old.ID()) {
					inFlight += old.Ongoing()
				}
			}
			if inFlight > 0 {
				d.log().Warn().Strs("replicas", busy).Int("requests_in_flight", inFlight).
					Msg("replicas still busy at graceful_shutdown_timeout_s: stopped anyway (their WebSocket sessions closed, a command's process and its requests ended; other requests run to their end)")
			} else {
				// Idle, but their drain did not answer in time (a
				// graceful_shutdown_timeout_s of 0 gives it none):
				// nothing was cut.
				d.log().Debug().Strs("replicas", busy).
					Msg("replicas' drain unanswered at graceful_shutdown_timeout_s; none had requests: stopped")
			}
		}
		d.stopReplicas(ctx, batch)
		done := make(map[Replica]bool, len(batch))
		for _, old := range batch {
			done[old] = true
		}
		d.mu.Lock()
		n := len(d.retired)
		d.retired = slices.DeleteFunc(d.retired, func(r Replica) bool { return done[r] })
		if len(d.retired) != n {
			for _, old := range batch {
				delete(d.targets, old)
				delete(d.issued, old.ID())
			}
			d.rebuildPoolLocked()
		}
		d.mu.Unlock()
	}()
}

// stopReplicas stops rs at once, once drained. Not with ctx itself: the
// drain may have spent it, and a process gets its own SIGTERM grace before
// SIGKILL, which ctx's end must not cut short.
func (d *Deployment) stopReplicas(ctx context.Context, rs []Replica) {
	sctx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range rs {
		r.SetState(StateStopped)
		if s, ok := r.(Stopper); ok {
			wg.Go(func() {
				if err := s.Stop(sctx); err != nil {
					d.log().Warn().Str("replica", r.ID()).Err(err).Msg("stopping a replica")
				}
			})
		}
	}
	wg.Wait()
}

// watchExitLocked replaces r as soon as it exits on its own, if it can (a
// process). d.mu must be held.
func (d *Deployment) watchExitLocked(r Replica) {
	e, ok := r.(exiter)
	if !ok {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case <-d.ctx.Done():
			return
		case <-e.Exited():
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if !slices.Contains(d.replicas, r) {
			// Retired first, and stopped by the proxy, unless it died
			// before it was signalled: then what it still had failed.
			if c, ok := r.(*commandReplica); ok && c.proc.ExitedUnasked() {
				d.log().Warn().Str("replica", r.ID()).Str("exit", exitText(c.exitError())).
					Msg("replica process exited on its own after it was retired, before the proxy stopped it: any requests it still had got 502")
			}
			return
		}
		how := "exited"
		ev := d.log().Error().Str("replica", r.ID())
		if c, ok := r.(*commandReplica); ok {
			how = exitText(c.exitError())
			uptime := time.Since(c.healthyAt)
			ev = ev.Stringer("uptime", uptime.Round(time.Millisecond))
			if uptime < crashLoopUptime {
				d.quickExits++
				d.lastQuickExit = time.Now()
				ev = ev.Stringer("backoff", startBackoff(d.quickExits))
			} else {
				d.quickExits = 0
			}
		}
		msg := "replica process exited: replacing it"
		if d.gaveUp {
			// It served since the deployment gave up starting others:
			// its exit is news, and the program may be back (a tester
			// put back a deleted binary, and the deployment went to
			// none, "replacing it" logged). One more series of rounds,
			// bounded as the first.
			d.gaveUp, d.startFailures = false, 0
			msg = "replica process exited: replacing it (the deployment had given up starting replicas: trying again)"
		}
		ev.Str("exit", how).Msg(msg)
		d.retireLocked(r)
	}()
}

// kick asks the starter to start the missing replicas; it never blocks.
func (d *Deployment) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// starter starts missing replicas whenever kicked (a replica retired or
// exited, a health period passed), until ctx ends. A failed start is
// retried with backoff; after MaxConstructorRetryCount rounds in a row that
// started none it gives up until the next Scale, with an error in the log.
func (d *Deployment) starter(ctx context.Context) {
	defer d.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		var failedAt time.Time // when the last round of this kick failed
		for ctx.Err() == nil {
			if !d.waitBackoff(ctx, failedAt) {
				break // given up
			}
			if err := d.topUp(); err == nil || ctx.Err() != nil {
				break
			}
			failedAt = time.Now()
		}
	}
}

// waitBackoff waits out the backoff after the last failure: a round that
// failed (here, failedAt, or before the kick: the first starts, say) or a
// replica that crashed soon after it started. The backoff runs from the
// failure, not from the wake-up: a health period's wake-up must not start
// a timer that a crash then cuts short (a tester saw 0.7 s for a logged
// 3.2 s), and a failure during the wait moves its end. It reports false if
// the deployment has given up.
func (d *Deployment) waitBackoff(ctx context.Context, failedAt time.Time) bool {
	for {
		d.mu.Lock()
		if d.quickExits > 0 && time.Since(d.lastQuickExit) > crashLoopForget {
			d.quickExits = 0
		}
		n, gaveUp := max(d.startFailures, d.quickExits), d.gaveUp
		last := failedAt
		if d.startFailures > 0 && d.lastFailedRound.After(last) {
			last = d.lastFailedRound
		}
		if d.quickExits > 0 && d.lastQuickExit.After(last) {
			last = d.lastQuickExit
		}
		d.mu.Unlock()
		if gaveUp {
			return false
		}
		if n == 0 && failedAt.IsZero() {
			return true
		}
		wait := time.Until(last.Add(startBackoff(n)))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return true // the caller's topUp sees ctx end
		case <-t.C:
		}
	}
}

// publishEvery is how long in-process replicas are built before those
// built so far are published to routing.
const publishEvery = 10 * time.Millisecond

// topUp starts replicas until the deployment has num_replicas again.
func (d *Deployment) topUp() error {
	d.control.Lock()
	defer d.control.Unlock()
	return d.topUpHeld(d.ctx)
}

// gaveUpMessage is the log line of a deployment that stops starting
// replicas.
const gaveUpMessage = "deployment unhealthy: max_constructor_retry_count rounds of replica starts failed in a row; no more attempts until num_replicas is set again, or a replica process still running exits"

// countFailedRound counts a round of starts that started none and reports
// whether the deployment gives up with it.
func (d *Deployment) countFailedRound() (gaveUp bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.startFailures++
	d.lastFailedRound = time.Now()
	if limit := d.spec.MaxConstructorRetryCount; limit > 0 && d.startFailures >= limit && !d.gaveUp {
		d.gaveUp = true
		d.settled.Store(true)
		return true
	}
	return false
}

// maxParallelStarts bounds the replica processes (spec.Start) started at
// once: each may take seconds to become healthy, but a thousand at once
// would slow every one of them.
const maxParallelStarts = 16

// topUpHeld is topUp with d.control held. Replicas are built without d.mu
// held (a factory may load a model, a process may take seconds): replica
// processes in rounds of up to maxParallelStarts at once, in-process ones
// one at a time (a user's factory need not be safe for concurrent use). It
// returns the first failure. A round that starts none counts once towards
// MaxConstructorRetryCount (and the starter's backoff), as one start did
// when they were made one at a time; a round that starts any is progress,
// and its failures are retried without counting.
func (d *Deployment) topUpHeld(ctx context.Context) error {
	if d.spec.Connect != nil {
		return nil // the targets give the replicas
	}
	// Stop cuts the starts short, whoever asked for them (a scale's ctx
	// does not end at a shutdown).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.ctx, cancel)()
	log := d.log()
	for {
		d.mu.Lock()
		missing := d.spec.NumReplicas - len(d.replicas)
		userConfig, gaveUp := d.spec.UserConfig, d.gaveUp
		d.mu.Unlock()
		if missing <= 0 || gaveUp || d.ctx.Err() != nil || ctx.Err() != nil {
			return ctx.Err()
		}
		var built []Replica
		var errs []error
		if d.spec.Start != nil {
			// Processes start in parallel rounds.
			n := min(missing, maxParallelStarts)
			built, errs = make([]Replica, n), make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { built[i], errs[i] = d.newReplica(ctx, userConfig) })
			}
			wg.Wait()
			built = slices.DeleteFunc(built, func(r Replica) bool { return r == nil })
			errs = slices.DeleteFunc(errs, func(err error) bool { return err == nil })
		} else {
			// In process: one after another, published every
			// publishEvery, so that each takes requests soon and a
			// scale to thousands is not one pool rebuild per replica.
			t0 := time.Now()
			for len(built) < missing && (len(built) == 0 || time.Since(t0) < publishEvery) {
				r, err := d.newReplica(ctx, userConfig)
				if err != nil {
					errs = append(errs, err)
					break
				}
				built = append(built, r)
			}
		}

		d.mu.Lock()
		if d.ctx.Err() != nil {
			d.mu.Unlock()
			var stops sync.WaitGroup
			for _, r := range built {
				if s, ok := r.(Stopper); ok {
					stops.Go(func() { _ = s.Stop(context.Background()) })
				}
			}
			stops.Wait()
			return nil
		}
		for _, r := range built {
			d.giveLimitLocked(r)
			r.SetState(StateRunning)
			d.replicas = append(d.replicas, r)
			d.watchExitLocked(r)
		}
		if len(built) > 0 {
			d.startFailures = 0
			d.rebuildPoolLocked()
			d.publishLocked()
		}
		d.mu.Unlock()
		for _, r := range built {
			log.Info().Str("replica", r.ID()).Msg("replica started")
		}
		if len(errs) == 0 {
			continue
		}
		if ctx.Err() != nil || d.ctx.Err() != nil {
			return errs[0] // cut short, not failed: not counted
		}
		if len(built) == 0 {
			d.countFailedRound()
		}
		d.mu.Lock()
		failures, gaveUp := d.startFailures, d.gaveUp
		d.mu.Unlock()
		msg := "starting a replica failed; retrying with backoff"
		if gaveUp {
			msg = "starting a replica failed"
		}
		for _, err := range errs {
			log.Error().Err(err).Int("failed_starts", failures).Int("missing_replicas", missing-len(built)).Msg(msg)
		}
		if gaveUp {
			log.Error().Int("failed_starts", failures).Int("missing_replicas", missing).
				Msg(gaveUpMessage)
		}
		return errs[0]
	}
}
