package replica

import (
	"context"
	"time"
)

// healthLoop checks every replica each health_check_period_s until ctx is
// done.
func (d *Deployment) healthLoop(ctx context.Context) {
	defer d.wg.Done()
	t := time.NewTicker(d.spec.HealthCheckPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.checkHealth(ctx)
			d.topUp()
		}
	}
}

// checkHealth runs one round of health checks, all replicas at once, each
// bounded by health_check_timeout_s, and replaces those that failed
// unhealthyAfter times in a row. A replica whose previous check has not
// returned yet is not checked again (as in Serve), so a hung check costs
// one goroutine, not one per period.
func (d *Deployment) checkHealth(ctx context.Context) {
	type check struct {
		l  *Local
		hc HealthChecker
	}
	var checks []check
	d.mu.Lock()
	for _, l := range d.replicas {
		hc, ok := l.Handler().(HealthChecker)
		if ok && l.State() == StateRunning && !d.checking[l] {
			d.checking[l] = true
			checks = append(checks, check{l, hc})
		}
	}
	d.mu.Unlock()

	errs := make(chan struct {
		l   *Local
		err error
	}, len(checks))
	for _, c := range checks {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, d.spec.HealthCheckTimeout)
			defer cancel()
			errs <- struct {
				l   *Local
				err error
			}{c.l, d.callHealth(cctx, c.l, c.hc)}
		}()
	}
	for range checks {
		r := <-errs
		if ctx.Err() != nil {
			continue // stopping: a cancelled check is no verdict
		}
		d.recordHealth(r.l, r.err)
	}
}

// callHealth runs a health check, turning a panic into a failure and giving
// up at ctx's deadline even if the check ignores ctx; the replica counts as
// being checked until the check really returns.
func (d *Deployment) callHealth(ctx context.Context, l *Local, hc HealthChecker) error {
	res := make(chan error, 1)
	go func() {
		defer func() {
			d.mu.Lock()
			delete(d.checking, l)
			d.mu.Unlock()
		}()
		defer func() {
			if v := recover(); v != nil {
				res <- &PanicError{Value: v}
			}
		}()
		res <- hc.CheckHealth(ctx)
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recordHealth counts a check's result; the unhealthyAfter-th failure in a
// row takes the replica out of routing (topUp replaces it).
func (d *Deployment) recordHealth(l *Local, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	log := d.hooks.Log.With().Str("application", d.spec.App).Str("deployment", d.spec.Name).Str("replica", l.ID()).Logger()
	if err == nil {
		if d.failures[l] > 0 {
			log.Info().Msg("replica passed its health check again")
		}
		d.failures[l] = 0
		return
	}
	d.failures[l]++
	n := d.failures[l]
	log.Warn().Err(err).Int("consecutive_failures", n).Msg("replica failed its health check")
	if n < unhealthyAfter || l.State() != StateRunning {
		return
	}
	log.Error().Int("consecutive_failures", n).Msg("replica unhealthy: taken out of routing, to be replaced")
	d.retireLocked(l)
}

// retireLocked takes l out of routing and lets it finish its requests in
// the background, for up to graceful_shutdown_timeout_s or until Stop.
// d.mu must be held.
func (d *Deployment) retireLocked(old *Local) {
	for i, l := range d.replicas {
		if l == old {
			d.replicas = append(d.replicas[:i], d.replicas[i+1:]...)
			break
		}
	}
	old.SetState(StateDraining)
	delete(d.failures, old)
	d.retired = append(d.retired, old)
	d.publishLocked()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.ctx, d.spec.GracefulShutdownTimeout)
		defer cancel()
		if waitIdle(ctx, old) != nil && d.ctx.Err() != nil {
			return // Stop drains it with its own deadline
		}
		old.SetState(StateStopped)
		d.mu.Lock()
		for i, l := range d.retired {
			if l == old {
				d.retired = append(d.retired[:i], d.retired[i+1:]...)
				break
			}
		}
		d.mu.Unlock()
	}()
}

// topUp starts replicas until the deployment has num_replicas again. The
// factory runs without the lock held (it may load a model); one that fails
// is logged and tried again next period.
func (d *Deployment) topUp() {
	for {
		d.mu.Lock()
		missing := d.spec.NumReplicas - len(d.replicas)
		d.mu.Unlock()
		if missing <= 0 || d.ctx.Err() != nil {
			return
		}
		l, err := d.newReplica()
		log := d.hooks.Log.With().Str("application", d.spec.App).Str("deployment", d.spec.Name).Logger()
		if err != nil {
			log.Error().Err(err).Int("missing_replicas", missing).Msg("starting a replacement replica failed; retrying next health period")
			return
		}
		d.mu.Lock()
		if d.ctx.Err() != nil {
			d.mu.Unlock()
			return
		}
		l.SetState(StateRunning)
		d.replicas = append(d.replicas, l)
		d.publishLocked()
		d.mu.Unlock()
		log.Info().Str("replica", l.ID()).Msg("replacement replica running")
	}
}
