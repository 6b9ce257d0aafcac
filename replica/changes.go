package replica

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrStopped is the error of a change asked of a stopped deployment.
var ErrStopped = errors.New("the deployment is stopping")

// ErrFixedReplicas is Scale's error for a deployment whose replicas follow
// their targets (handler upstream): their number is the targets'.
var ErrFixedReplicas = errors.New("its replicas are its upstreams or its hosts' actors: change those (or their DNS records), not num_replicas")

// Reconfigure gives every replica userConfig through one broadcast, while
// requests keep flowing, and makes it the config of replicas built from
// now on. It returns each replica's result, in routing order. A replica
// whose reconfigure failed has been taken out of routing and is being
// replaced by one built with userConfig (or, where none can be built, is
// given it again at each health check). If no replica took it, nothing
// changed: the old user_config stays and the error wraps ErrRejected (and
// ErrNotReconfigurable when the handler takes none), or ErrUnreached when
// none could be reached at all (every host down: no replica vouched for
// a config the proxy may have no factory to check). A userConfig that is
// not a JSON object is ErrNotAnObject, and one the Factory refuses (it
// builds one handler to check, as the proxy's reload does) is ErrRejected
// too: no replica sees either. A replica replaced for failing it would
// never have started.
func (d *Deployment) Reconfigure(ctx context.Context, userConfig json.RawMessage) ([]Result, error) {
	return d.reconfigure(ctx, userConfig, true)
}

// ReconfigureChecked is Reconfigure for a userConfig its caller has had
// the Factory check already (the proxy's reload checks the whole file
// first): the factory is not run for it again, where a handler that loads
// a model would load it once more.
func (d *Deployment) ReconfigureChecked(ctx context.Context, userConfig json.RawMessage) ([]Result, error) {
	return d.reconfigure(ctx, userConfig, false)
}

func (d *Deployment) reconfigure(ctx context.Context, userConfig json.RawMessage, check bool) ([]Result, error) {
	if b := bytes.TrimSpace(userConfig); len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		if len(b) > 40 {
			b = append(b[:40:40], "..."...)
		}
		return nil, fmt.Errorf("%w, got %q", ErrNotAnObject, b)
	}
	d.control.Lock()
	stopped := d.stopped
	d.control.Unlock()
	if stopped {
		return nil, ErrStopped
	}
	// The factory runs outside control: one that takes its time (a model
	// to load) must not hold up Stop, or the health loop's replacements.
	var checkErr error
	if f := d.spec.Factory; f != nil && check {
		checkErr = f.Check(userConfig)
	}
	d.control.Lock()
	defer d.control.Unlock()
	if d.stopped {
		return nil, ErrStopped
	}
	if d.spec.Factory != nil {
		err := checkErr
		switch {
		case err != nil && !d.reconfigurable():
			// Both reasons: no config change reaches these, and this one
			// would not have started a replica either.
			return nil, fmt.Errorf("%w: %w; and the handler's factory refuses it: %w", ErrRejected, ErrNotReconfigurable, err)
		case err != nil:
			return nil, fmt.Errorf("%w: the handler's factory refuses it: %w", ErrRejected, err)
		}
	}
	d.mu.Lock()
	if len(d.replicas) == 0 && d.spec.Factory == nil {
		// No replica to take it, and no factory of the proxy's to check
		// it (replica hosts' actors, none connected): as with every one
		// unreachable, nothing changes.
		d.mu.Unlock()
		return nil, fmt.Errorf("%w: the deployment has no replica connected", ErrUnreached)
	}
	old := d.spec.UserConfig
	d.spec.UserConfig = userConfig
	targets := slices.Clone(d.replicas)
	pool := d.pool
	d.mu.Unlock()

	results := d.broadcastTo(ctx, Call{Method: MethodReconfigure, Payload: userConfig}, pool, targets, nil)
	// A replica that had not answered when ctx ended may still apply the
	// config: its result is unknown, neither a rejection nor a failure.
	// One that could not be reached (a host down) has not rejected it, but
	// has not vouched for it either: with none reached, nothing changes.
	failed, unknown, unreachable := 0, 0, 0
	var firstErr error
	for _, r := range results {
		switch {
		case r.Err == nil:
		case timedOut(ctx, r.Err):
			unknown++
		default:
			failed++
			firstErr = cmp.Or(firstErr, r.Err)
			if _, ok := errors.AsType[*UnreachableError](r.Err); ok {
				unreachable++
			}
		}
	}
	log := d.log()
	if len(targets) > 0 && failed == len(targets) {
		// None took it: the old one stays.
		d.mu.Lock()
		d.spec.UserConfig = old
		d.mu.Unlock()
		if unreachable == failed {
			log.Warn().Err(firstErr).Int("replicas", len(targets)).Msg("user_config reached no replica (all unreachable); nothing changed")
			return results, fmt.Errorf("%w: %w", ErrUnreached, firstErr)
		}
		log.Warn().Err(firstErr).Int("replicas", len(targets)).Msg("user_config rejected by every replica; nothing changed")
		return results, fmt.Errorf("%w by every replica: %w", ErrRejected, firstErr)
	}
	d.mu.Lock()
	var replace []Replica
	excluded, synced := false, false
	for i, r := range results {
		switch {
		case r.Err == nil:
			if d.unsync[targets[i]] {
				delete(d.unsync, targets[i]) // it has the config that stands
				delete(d.refused, targets[i])
				synced = true
			}
		case timedOut(ctx, r.Err):
			// It may apply it later; it is given it again to be sure.
			log.Warn().Str("replica", r.Actor).Msg("replica did not answer its reconfigure in time: it may apply it later, and is given it again at the next health check")
			d.unsync[targets[i]] = true
		case !d.Replaces():
			// Nothing here can start another: it stays out of routing,
			// and the health loop tries again.
			log.Error().Str("replica", r.Actor).Err(r.Err).Msg("replica failed to reconfigure: out of routing until it takes the user_config (tried again at each health check)")
			d.unsync[targets[i]] = true
			d.excluded[targets[i]] = true
			excluded = true
		default:
			log.Error().Str("replica", r.Actor).Err(r.Err).Msg("replica failed to reconfigure: taken out of routing, to be replaced")
			replace = append(replace, targets[i])
		}
	}
	if excluded {
		d.publishLocked()
	}
	d.retireLocked(replace...) // one batch
	d.mu.Unlock()
	if synced {
		d.CheckHealthNow() // brings back the replicas that waited for a config and took this one
	}
	log.Info().Int("replicas", len(targets)).Int("failed", failed).Int("unknown", unknown).Msg("user_config reconfigured")
	_ = d.topUpHeld(ctx) // a replacement that fails to start is logged and retried by the starter
	return results, nil
}

// timedOut reports whether err is a replica's not answering a control
// call within ctx: ctx's own error once it ended, or a replica host's
// deadline, which comes a little before its caller's (see
// controlTimeoutMS).
func timedOut(ctx context.Context, err error) bool {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return true
	}
	_, bounded := ctx.Deadline()
	return bounded && errors.Is(err, context.DeadlineExceeded)
}

// Scale changes the number of replicas live: new replicas start (built
// with the current user_config) and take requests once built; extra ones
// leave routing at once and drain in the background, for up to
// graceful_shutdown_timeout_s. It returns the error of a replica that
// could not be built (the starter keeps trying). A deployment that had
// given up starting replicas tries again.
func (d *Deployment) Scale(ctx context.Context, n int) error {
	if d.spec.Connect != nil {
		return ErrFixedReplicas
	}
	if n < 1 {
		return fmt.Errorf("num_replicas must be >= 1, got %d", n)
	}
	d.control.Lock()
	defer d.control.Unlock()
	if d.stopped {
		return ErrStopped
	}
	d.mu.Lock()
	from := len(d.replicas)
	d.spec.NumReplicas = n
	d.gaveUp, d.startFailures, d.quickExits = false, 0, 0
	var retired []string
	if len(d.replicas) > n {
		// The newest go first: the oldest have warm caches.
		batch := slices.Clone(d.replicas[n:])
		for _, r := range batch {
			retired = append(retired, r.ID())
		}
		d.retireLocked(batch...)
	}
	d.mu.Unlock()
	ev := d.log().Info().Int("from", from).Int("to", n)
	if len(retired) > maxNamedInLog {
		ev = ev.Int("draining_more", len(retired)-maxNamedInLog)
		retired = retired[:maxNamedInLog]
	}
	if len(retired) > 0 {
		ev = ev.Strs("draining", retired)
	}
	ev.Msg("num_replicas changed")
	err := d.topUpHeld(ctx)
	d.kick() // the starter finishes what ctx cut short
	return err
}

// maxNamedInLog bounds the replicas one log line names.
const maxNamedInLog = 20

// Replaces reports whether a replica that fails is replaced by a new one:
// false for a deployment that follows targets (Connect), whose replicas
// nothing here can start.
func (d *Deployment) Replaces() bool { return d.spec.Connect == nil }

// SetTargets makes the replicas of a Connect deployment follow targets: a
// replica is connected for each new target, and the replicas of targets
// gone leave routing and drain. An empty set is valid: every replica is
// gone, and requests get 503 "No replicas are available". The targets it
// could not connect to are in its error, and are tried again at each
// health check until they connect or leave the list; so is a
// *ConfigRefusedError for each target connected whose replicas did not
// take the user_config (see SplitConfigRefused).
func (d *Deployment) SetTargets(targets []string) error {
	if d.spec.Connect == nil {
		return errors.New("SetTargets: the deployment does not follow targets")
	}
	// One list at a time; control only while the replica set changes, not
	// while fresh targets are dialled: a replica host that accepts and
	// never says hello holds its dial for seconds, at every DNS answer
	// while it is listed, and must hold up no reconfigure, health repair
	// or Stop meanwhile, nor the other targets of its list.
	d.targetsMu.Lock()
	defer d.targetsMu.Unlock()
	fresh, ok := d.followTargets(targets)
	if !ok {
		return nil // stopped: nothing is routed any more
	}
	dials := make(chan dialed, len(fresh))
	for i, t := range fresh {
		go func() {
			rs, err := d.connect(d.ctx, t)
			dials <- dialed{i: i, replicas: rs, err: err}
		}()
	}
	// Each target joins as soon as its dial is done, with those done by
	// then: a tester's healthy hosts waited 5 s for a mute one listed
	// beside them, every request a 503 meanwhile.
	errs := make([]error, len(fresh))
	var refused []error
	stopped := false
	// Their checks on joining run beside the next batches, without
	// control: each replica is in routing once its own passes.
	var checks sync.WaitGroup
	for left := len(fresh); left > 0; {
		batch := []dialed{<-dials}
		for left--; left > 0 && len(dials) > 0; left-- {
			batch = append(batch, <-dials)
		}
		ref, check, ok := d.joinDialed(fresh, batch, errs)
		refused = append(refused, ref...)
		stopped = stopped || !ok
		if check != nil {
			checks.Go(check)
		}
	}
	checks.Wait()
	if stopped {
		return d.ctx.Err() // its dials cut short
	}

	d.mu.Lock()
	// Only this list's failures are replaced: the repair may have failed
	// to connect one meanwhile, which it reported itself.
	dialled := make(map[string]bool, len(fresh))
	for _, t := range fresh {
		dialled[t] = true
	}
	d.unconnected = slices.DeleteFunc(d.unconnected, func(te TargetError) bool {
		return dialled[te.Target] || !d.want[te.Target]
	})
	for i, err := range errs {
		if err != nil && d.connectedLocked(fresh[i]) {
			// The health loop's repair connected it meanwhile, while
			// another target's dial kept the list waiting.
			errs[i] = nil
		}
		if err := errs[i]; err != nil {
			d.unconnected = append(d.unconnected, TargetError{Target: fresh[i], Error: err.Error()})
			// The health loop tries it again each period: a list (a
			// reload's hosts, one of them not up yet) has nothing else to
			// bring it in.
			if !d.spec.Discovered {
				d.renew[fresh[i]] = true
			}
		}
	}
	d.mu.Unlock()
	return errors.Join(append(errs, refused...)...)
}

// dialed is what one of SetTargets' dials came to: the replicas of
// fresh[i], or why not.
type dialed struct {
	i        int
	replicas []Replica
	err      error
}

// joinDialed adds the replicas of a batch of SetTargets' dials to the
// deployment (see connectTargets), under control, and sets each one's
// error in errs; check, to run without control, puts each in routing as
// its check on joining passes. It reports false, dropping them, if the
// deployment has stopped.
func (d *Deployment) joinDialed(fresh []string, batch []dialed, errs []error) (refused []error, check func(), ok bool) {
	d.control.Lock()
	defer d.control.Unlock()
	var late [][]Replica
	var adding []string
	var conns [][]Replica
	var addErrs []error
	d.mu.Lock()
	for _, r := range batch {
		// The health loop's repair may have connected one meanwhile (a
		// target that failed before).
		if d.stopped || d.connectedLocked(fresh[r.i]) {
			late = append(late, r.replicas)
			continue
		}
		adding, conns, addErrs = append(adding, fresh[r.i]), append(conns, r.replicas), append(addErrs, r.err)
	}
	d.mu.Unlock()
	d.dropConns(late)
	if d.stopped {
		return nil, nil, false
	}
	// Those kept leave as a new one joins in routing (addTargets).
	addErrs, refused, check = d.connectTargets(adding, conns, addErrs)
	k := 0
	for _, r := range batch {
		if k < len(adding) && adding[k] == fresh[r.i] {
			errs[r.i] = addErrs[k]
			k++
		}
	}
	return refused, check, true
}

// followTargets makes targets the list SetTargets follows: the replicas of
// targets gone leave routing (unless none routable would be left), and it
// returns the fresh targets to connect, or false if the deployment has
// stopped. It holds control.
func (d *Deployment) followTargets(targets []string) (fresh []string, ok bool) {
	d.control.Lock()
	defer d.control.Unlock()
	if d.stopped || d.ctx.Err() != nil {
		return nil, false
	}
	want := make(map[string]bool, len(targets))
	for _, t := range targets {
		want[t] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.want = want
	for t := range d.renewWarned {
		if !want[t] {
			delete(d.renewWarned, t) // gone from the list: no failure to remember
		}
	}
	have := make(map[string]bool, len(d.replicas))
	var gone []Replica
	for _, r := range d.replicas {
		t := d.targets[r]
		have[t] = true
		if !want[t] {
			gone = append(gone, r)
		}
	}
	for _, t := range targets {
		if !have[t] {
			have[t] = true // a target listed twice is connected once
			fresh = append(fresh, t)
		}
	}
	// Those gone leave routing before anything is connected, which may
	// take seconds: unless none routable would be left meanwhile (a list
	// or a DNS answer replaced whole, as when a Kubernetes pod is
	// replaced between two refreshes), which would fail every request
	// until the new ones are in. Then they leave once one of the new
	// ones is in routing (connected, and past its first health check),
	// make before break: here if one is once connected, else when one
	// passes a health check, or at a later list that has one. A list
	// with no targets at all is meant: every replica leaves.
	keep := len(want) > 0 && len(gone) > 0 && d.routableWantedLocked() == 0
	if !keep {
		d.retireGoneLocked(gone, "")
		return fresh, true
	}
	// Only those that serve are kept: one out of routing (dead, failing
	// its checks) keeps nothing up.
	var out []Replica
	for _, r := range gone {
		if !d.routableLocked(r) {
			out = append(out, r)
			continue
		}
		if !d.kept[r] { // once, not at every DNS answer while it lasts
			d.kept[r] = true
			d.log().Warn().Str("replica", r.ID()).Str("target", d.targets[r]).
				Msg("replica's target gone from the list: kept serving until one of the list's is in routing")
		}
	}
	d.retireGoneLocked(out, "")
	return fresh, true
}

// connectedLocked reports whether target has replicas in the deployment.
// d.mu must be held.
func (d *Deployment) connectedLocked(target string) bool {
	return slices.ContainsFunc(d.replicas, func(r Replica) bool { return d.targets[r] == target })
}

// ConfigRefusedError is a target connected for SetTargets whose replicas
// did not take the deployment's user_config: they stay out of routing
// until they do, given it again at each health check.
type ConfigRefusedError struct {
	Target string
	// Refused of Of replicas of the target did not take it.
	Refused, Of int
}

// SplitConfigRefused splits an error of SetTargets into the targets whose
// replicas refused the user_config (connected, out of routing until they
// take it) and the rest (targets not connected), nil if none.
func SplitConfigRefused(err error) (refused []*ConfigRefusedError, rest error) {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	var others []error
	for _, e := range errs {
		if r, ok := errors.AsType[*ConfigRefusedError](e); ok {
			refused = append(refused, r)
		} else {
			others = append(others, e)
		}
	}
	return refused, errors.Join(others...)
}

// Error implements error.
func (e *ConfigRefusedError) Error() string {
	return fmt.Sprintf("target %s: %d of its %d replicas did not take the deployment's user_config: out of routing until they do (given it again at each health check)", e.Target, e.Refused, e.Of)
}

// routableWantedLocked counts the replicas in routing whose targets are
// in the list. d.mu must be held.
func (d *Deployment) routableWantedLocked() int {
	n := 0
	for _, r := range d.replicas {
		if d.want[d.targets[r]] && d.routableLocked(r) {
			n++
		}
	}
	return n
}

// retireUnwantedLocked takes out of routing, to drain, the replicas of
// targets no longer in the list that were kept serving while none of the
// list's was in routing (see SetTargets), once one is. d.mu must be held.
func (d *Deployment) retireUnwantedLocked() {
	if d.spec.Connect == nil || d.routableWantedLocked() == 0 {
		return
	}
	var gone []Replica
	for _, r := range d.replicas {
		if !d.want[d.targets[r]] {
			gone = append(gone, r)
		}
	}
	if len(gone) > 0 {
		d.retireGoneLocked(gone, " (kept until a listed target's replica was in routing)")
	}
}

// retireGoneLocked takes out of routing the replicas of targets no longer
// wanted, to drain; note ends their log line. d.mu must be held.
func (d *Deployment) retireGoneLocked(gone []Replica, note string) {
	log := d.log()
	for _, r := range gone {
		if slices.Contains(d.replicas, r) {
			log.Info().Str("replica", r.ID()).Str("target", d.targets[r]).Msg("replica's target gone from the list: draining" + note)
		}
	}
	d.retireLocked(gone...)
	d.spec.NumReplicas = len(d.replicas)
}

// connectTargets adds the replicas connected for fresh,
// targets the deployment has no replicas of, to routing (given the
// user_config first). It returns each target's error, and a
// *ConfigRefusedError for each target connected whose replicas did not
// take the user_config, and addTargets' check, to run once control is
// released. control must be held.
func (d *Deployment) connectTargets(fresh []string, conns [][]Replica, errs []error) (_, refused []error, check func()) {
	errs, check = d.addTargets(fresh, conns, errs)
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, rs := range conns {
		if errs[i] != nil {
			continue
		}
		n := 0
		for _, r := range rs {
			if d.unsync[r] {
				n++
			}
		}
		if n > 0 {
			refused = append(refused, &ConfigRefusedError{Target: fresh[i], Refused: n, Of: len(rs)})
		}
	}
	return errs, refused, check
}

// dropConns stops replicas dialled but not taken.
func (d *Deployment) dropConns(conns [][]Replica) {
	d.mu.Lock()
	for _, rs := range conns {
		for _, r := range rs {
			delete(d.targets, r)
		}
	}
	d.mu.Unlock()
	for _, rs := range conns {
		for _, r := range rs {
			if s, ok := r.(Stopper); ok {
				_ = s.Stop(d.ctx)
			}
		}
	}
}

// addTargets adds the replicas connected for fresh to
// routing, given the user_config first, and returns each target's error.
// control must be held.
func (d *Deployment) addTargets(fresh []string, conns [][]Replica, errs []error) (_ []error, check func()) {
	if len(fresh) == 0 {
		return errs, func() {}
	}
	var clashed, joining []Replica
	d.mu.Lock()
	taken := make(map[string]bool, len(d.replicas)+len(d.retired))
	for _, r := range slices.Concat(d.replicas, d.retired) {
		taken[r.ID()] = true
	}
	for i, rs := range conns {
		// A replica host that left and is back while its actors still
		// drain brings their ids again: it is taken once they are done.
		if slices.ContainsFunc(rs, func(r Replica) bool { return taken[r.ID()] }) {
			errs[i] = fmt.Errorf("target %s: its replicas from before are still draining; it can be taken once they are done (discovery tries again at its next answer, a reload at the next reload)", fresh[i])
			for _, r := range rs {
				delete(d.targets, r)
			}
			clashed = append(clashed, rs...)
			continue
		}
		joining = append(joining, rs...)
	}
	d.mu.Unlock()
	// Before they take requests: a replica host serves the user_config it
	// was started with, which need not be the deployment's.
	d.giveUserConfig(d.ctx, joining, "joining")

	// In the deployment, starting, so that control calls reach them; in
	// routing each as its check on joining passes, not once every one
	// of them has answered (one that accepts and never answers held the
	// others of its list back for the check's 5 s).
	d.mu.Lock()
	for _, r := range joining {
		d.giveLimitLocked(r)
		r.SetState(StateStarting)
		d.replicas = append(d.replicas, r)
		d.joining[r] = true
	}
	for i, rs := range conns {
		if errs[i] == nil && len(rs) > 0 {
			// Connected: a repair's retry asked for before (a failed
			// dial) would replace these fresh replicas.
			delete(d.renew, fresh[i])
		}
	}
	if len(joining) > 0 {
		d.spec.NumReplicas = len(d.replicas)
		d.rebuildPoolLocked()
	}
	d.mu.Unlock()
	log := d.log()
	return errs, func() {
		d.checkJoining(d.ctx, joining, func(r Replica, err error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			if !d.joining[r] {
				return
			}
			delete(d.joining, r)
			if r.State() != StateStarting || !slices.Contains(d.replicas, r) {
				return // retired meanwhile (the deployment stopping, say)
			}
			r.SetState(StateRunning)
			if err != nil {
				d.joinFailedLocked(r, err)
				return
			}
			log.Info().Str("replica", r.ID()).Str("target", d.targets[r]).Msg("replica added for its target")
			d.publishLocked()
			// Those kept while none of the list's was in routing, once
			// one is (a target connected at last by the health loop, too).
			d.retireUnwantedLocked()
		})
		// A replica host runs its own GC settings, which need not be
		// those of PUT /-/gc. Once they are in d.replicas, so that a
		// SetGC from now on reaches them and one before it is what
		// giveGC reads.
		d.giveGC(d.ctx, joining, "joining")
		for _, r := range clashed {
			if s, ok := r.(Stopper); ok {
				_ = s.Stop(d.ctx)
			}
		}
	}
}

// joinCheckTimeout bounds the health check of a target as it joins, below
// a longer health_check_timeout_s: a target that accepts and does not
// answer must not hold a reload or a DNS refresh (the deployment's
// control lock) for half a minute. One slower than that is in routing at
// the first check of the health loop that passes.
const joinCheckTimeout = 5 * time.Second

// checkJoining runs one health check of the replicas joining for their
// targets, bounded by health_check_timeout_s (at most joinCheckTimeout),
// and tells joined of each one's result as it comes, before it returns:
// an upstream is not dialled to join, so one that refuses or does not
// answer would otherwise be healthy and in routing until the health loop's
// next round. Those waiting for their user_config, out of routing already,
// are not checked; nor is any when the deployment has no health checks,
// which nothing would then bring in.
func (d *Deployment) checkJoining(ctx context.Context, joining []Replica, joined func(r Replica, err error)) {
	var check, unchecked []Replica
	d.mu.Lock()
	for _, r := range joining {
		if d.healthPeriod.Load() > 0 && !d.unsync[r] {
			check = append(check, r)
		} else {
			unchecked = append(unchecked, r)
		}
	}
	d.mu.Unlock()
	for _, r := range unchecked {
		joined(r, nil)
	}
	if len(check) == 0 {
		return
	}
	timeout := min(time.Duration(d.healthTimeout.Load()), joinCheckTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	actors := make([]Actor, len(check))
	for i, r := range check {
		actors[i] = r
	}
	var told sync.WaitGroup
	told.Add(len(check))
	NewPool(actors...).broadcastEach(ctx, Call{Method: MethodCheckHealth}, func(i int, res Result) {
		defer told.Done()
		err := res.Err
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer to its health check on joining within %v: %w", timeout, err)
		}
		joined(check[i], err)
	})
	told.Wait()
}

// joinFailedLocked keeps r, which failed its first health check with err,
// out of routing, counted as a failed check of the health loop's: the
// next that passes brings it in. d.mu must be held.
func (d *Deployment) joinFailedLocked(r Replica, err error) {
	d.failures[r], d.excluded[r] = 1, true
	d.failLogged[r] = failLog{at: time.Now(), failures: 1}
	d.log().Warn().Str("replica", r.ID()).Str("target", d.targets[r]).Err(err).Int("consecutive_failures", 1).
		Msg("replica failed its health check on joining: out of routing until one passes")
}

// TargetError is a target a deployment could not connect to, and why.
type TargetError struct {
	Target string `json:"target"` // as listed or resolved: an upstream's URL, a host's address
	Error  string `json:"error"`  // why it could not be connected to
}

// Unconnected returns the targets the last SetTargets could not connect
// to (retried at the next), in the order they were given.
func (d *Deployment) Unconnected() []TargetError {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.unconnected)
}

// SetGC broadcasts MethodSetGC with payload to every replica and returns
// their results in pool order. It remembers payload: a replica that failed
// it (a replica host that is down, say) is given it again at each health
// check until it takes it, and one that joins or reconnects later (a host
// restarted, which runs its own env's settings) is given it too.
func (d *Deployment) SetGC(ctx context.Context, payload []byte) []Result {
	d.gcMu.Lock()
	defer d.gcMu.Unlock()
	d.mu.Lock()
	d.gc = payload
	pool := d.pool
	all := slices.Concat(d.replicas, d.retired) // the pool's order
	d.mu.Unlock()
	results := pool.Broadcast(ctx, Call{Method: MethodSetGC, Payload: payload})
	d.mu.Lock()
	defer d.mu.Unlock()
	var in map[Replica]bool // d.replicas, once a failure needs it
	for i, res := range results {
		r := all[i]
		if res.Err == nil {
			delete(d.gcStale, r) // it has the one that stands
			delete(d.gcRefused, r)
			continue
		}
		if in == nil {
			in = make(map[Replica]bool, len(d.replicas))
			for _, r := range d.replicas {
				in[r] = true
			}
		}
		if in[r] { // not a retired one, which leaves
			// The caller logs this failure at Warn; the retries log
			// theirs at Debug.
			d.gcStale[r], d.gcRefused[r] = true, true
		}
	}
	return results
}

// ReportUnreachable takes a replica the proxy could not reach (its
// connection was refused, say) out of routing at once, without waiting for
// its health checks, so that the next requests go elsewhere. It counts as
// a failed health check; one that passes brings it back. cause, if not
// nil, is why: it goes in the log line.
func (d *Deployment) ReportUnreachable(h Handle, cause error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.replicas {
		if Handle(r) != h || d.excluded[r] {
			continue
		}
		d.excluded[r] = true
		d.failures[r] = max(d.failures[r], 1)
		d.unreachableAt[r] = time.Now()
		d.publishLocked()
		d.log().Warn().Str("replica", r.ID()).Err(cause).Msg("replica unreachable: out of routing until a health check passes")
		return
	}
}

// reconfigurable reports whether the deployment's in-process handlers take
// a new user_config (are Reconfigurers), as far as its replicas show.
func (d *Deployment) reconfigurable() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.replicas {
		if l, ok := r.(*Local); ok {
			_, ok := l.handler.(Reconfigurer)
			return ok
		}
	}
	return true
}
