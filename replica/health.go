package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// healthLoop checks every replica each health_check_period_s until ctx is
// done, and replaces the ones taken out.
func (d *Deployment) healthLoop(ctx context.Context) {
	defer d.wg.Done()
	t := time.NewTicker(time.Duration(d.healthPeriod.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.healthReset:
			t.Reset(time.Duration(d.healthPeriod.Load()))
		case <-t.C:
			d.startRepair(ctx)
			d.goCheckHealth(ctx)
			d.kick() // and retry starts that failed
		case <-d.checkNow:
			d.startRepair(ctx)
			d.goCheckHealth(ctx)
		}
	}
}

// goCheckHealth runs a round of checkHealth on a goroutine of its own: a
// replica whose check takes until health_check_timeout_s (one that hangs)
// holds up no other's, in its round or the next ones (a tester: a replica
// back from a restart waited 57 s for its check, with a period of 3 s,
// beside one that hung, as each round waited for its slowest).
func (d *Deployment) goCheckHealth(ctx context.Context) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.checkHealth(ctx)
	}()
}

// SetHealthChecks changes the deployment's health_check_period_s and
// health_check_timeout_s live, as Serve's light updates do: the next round
// comes one new period from now, and checks and starts from now on are
// bounded by the new timeout. Both must be above 0, and the deployment
// must have had checks (a period above 0) from the start.
func (d *Deployment) SetHealthChecks(period, timeout time.Duration) error {
	switch {
	case period <= 0 || timeout <= 0:
		return fmt.Errorf("SetHealthChecks: period %v and timeout %v must be above 0", period, timeout)
	case d.healthPeriod.Load() <= 0:
		return errors.New("SetHealthChecks: the deployment was started without health checks")
	}
	d.mu.Lock()
	d.spec.HealthCheckPeriod, d.spec.HealthCheckTimeout = period, timeout // for Spec
	d.healthTimeout.Store(int64(timeout))
	changed := d.healthPeriod.Swap(int64(period)) != int64(period)
	d.mu.Unlock()
	if !changed {
		return nil // the next round stays where it was
	}
	select {
	case d.healthReset <- struct{}{}:
	default: // the loop has one to take already
	}
	return nil
}

// CheckHealthNow asks for a round of health checks at once rather than at
// the next period, so that replicas back from an outage (a replica host
// reconnected) take requests again as soon as they pass. It does not wait
// for the round.
func (d *Deployment) CheckHealthNow() {
	select {
	case d.checkNow <- struct{}{}:
	default: // one is asked for already
	}
}

// checkHealth runs one round of health checks: one broadcast of
// MethodCheckHealth to the running replicas whose check of an earlier
// round is not in flight, bounded by health_check_timeout_s, each answer
// counted as it comes: a hung replica is out after unhealthyAfter
// timeouts, and holds up no other's count. A replica that fails
// unhealthyAfter times in a row is taken out of routing (topUp replaces
// it). A check that has not answered by the deadline is a failure; one
// still running at the next round (a handler that ignores its context)
// fails at once (ErrCheckInFlight) rather than being started again.
func (d *Deployment) checkHealth(ctx context.Context) {
	d.mu.Lock()
	var targets []Replica
	for _, l := range d.replicas {
		// One still to be given the user_config stays out of routing,
		// which a passing check would end.
		if l.State() == StateRunning && !d.unsync[l] && !d.checking[l] {
			targets = append(targets, l)
			d.checking[l] = true
		}
	}
	pool := d.pool
	d.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	started := time.Now()
	timeout := time.Duration(d.healthTimeout.Load())
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Every answer is counted before this returns, inside the deployment's
	// wg: one told just after the deadline too (a filler's tell), which
	// comes at once, the call being done.
	var told sync.WaitGroup
	told.Add(len(targets))
	d.broadcastTo(cctx, Call{Method: MethodCheckHealth}, pool, targets, func(i int, r Result) {
		defer told.Done()
		err := r.Err
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within health_check_timeout_s (%v): %w", timeout, err)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		// Out of d.checking and counted at once: a later round's answer
		// must not be counted before this one.
		delete(d.checking, targets[i])
		if ctx.Err() != nil {
			return // stopping: a cancelled check is no verdict
		}
		d.recordHealthLocked(targets[i], err, started)
	})
	told.Wait()
}

// recordHealthLocked counts the result of a check begun at started. The
// unhealthyAfter-th failure in a row takes the replica out of routing: to
// be replaced (topUp), or, for a deployment that follows targets, until a
// check passes again. A pass from a check begun before the replica was
// reported unreachable is no news: it does not bring it back. d.mu must
// be held.
func (d *Deployment) recordHealthLocked(r Replica, err error, started time.Time) {
	if !slices.Contains(d.replicas, r) {
		return // retired while it was checked
	}
	log := d.log().With().Str("replica", r.ID()).Logger()
	if err == nil {
		if at, ok := d.unreachableAt[r]; ok {
			if !started.After(at) {
				return
			}
			delete(d.unreachableAt, r)
		}
		if n := d.failures[r]; n > 0 {
			log.Info().Int("failures_before", n).Msg("replica passed its health check again, after failing it")
		}
		d.failures[r] = 0
		delete(d.failLogged, r)
		if d.excluded[r] && !d.unsync[r] { // one waiting for its config stays out
			delete(d.excluded, r)
			d.publishLocked()
			log.Info().Msg("replica healthy: back in routing")
			d.retireUnwantedLocked() // those kept until a listed one was in
		}
		return
	}
	if r.State() != StateRunning {
		return // retired meanwhile
	}
	d.failures[r]++
	n := d.failures[r]
	d.logHealthFailureLocked(r, log, err, n)
	if n < unhealthyAfter {
		return
	}
	if d.spec.Connect != nil {
		// Said once it is out for its checks: as they take it out, or at
		// the unhealthyAfter-th failure of one out already (unreachable,
		// or failing on joining).
		newly := !d.excluded[r]
		if newly {
			d.excluded[r] = true
			d.publishLocked()
		}
		if newly || n == unhealthyAfter {
			log.Error().Int("consecutive_failures", n).Msg("replica unhealthy: out of routing until it passes a health check")
		}
		return
	}
	log.Error().Int("consecutive_failures", n).Msg("replica unhealthy: taken out of routing, to be replaced")
	d.retireLocked(r)
}

// failLog is when a replica's last health check failure was logged, and
// its consecutive failures then.
type failLog struct {
	at       time.Time
	failures int
}

// logHealthFailureLocked logs the n-th failure in a row of r's health
// check. The first unhealthyAfter are logged each (the last of them takes
// the replica out of routing); after that, only once a failureLogEvery,
// with the count since the last line, as DNS discovery does: a replica
// kept out rather than replaced (upstream, host) would otherwise log a
// line every health_check_period_s for as long as it is down. d.mu must
// be held.
func (d *Deployment) logHealthFailureLocked(r Replica, log zerolog.Logger, err error, n int) {
	now := time.Now()
	last, ok := d.failLogged[r]
	if n > unhealthyAfter && ok && now.Sub(last.at) < failureLogEvery {
		return
	}
	ev := log.Warn().Err(err).Int("consecutive_failures", n)
	if n > unhealthyAfter {
		ev = ev.Int("failures_since_last_log", n-last.failures)
	}
	ev.Msg("replica failed its health check")
	d.failLogged[r] = failLog{at: now, failures: n}
}
