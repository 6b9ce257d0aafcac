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
		}
	}
}

// checkHealth runs one round of health checks, all replicas at once, each
// bounded by health_check_timeout_s, and replaces those that failed
// unhealthyAfter times in a row.
func (d *Deployment) checkHealth(ctx context.Context) {
	replicas := d.Replicas()
	errs := make([]error, len(replicas))
	done := make(chan struct{})
	pending := 0
	for i, l := range replicas {
		hc, ok := l.Handler().(HealthChecker)
		if !ok || l.State() != StateRunning {
			continue
		}
		pending++
		go func() {
			defer func() { done <- struct{}{} }()
			cctx, cancel := context.WithTimeout(ctx, d.spec.HealthCheckTimeout)
			defer cancel()
			errs[i] = callHealth(cctx, hc)
		}()
	}
	for range pending {
		<-done
	}
	for i, l := range replicas {
		d.recordHealth(l, errs[i])
	}
}

// callHealth runs a health check, turning a panic into a failure and giving
// up at ctx's deadline even if the check ignores ctx.
func callHealth(ctx context.Context, hc HealthChecker) error {
	res := make(chan error, 1)
	go func() {
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
// row replaces the replica.
func (d *Deployment) recordHealth(l *Local, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		if d.failures[l] > 0 {
			d.hooks.Log.Info().Str("application", d.spec.App).Str("deployment", d.spec.Name).
				Str("replica", l.ID()).Msg("replica passed its health check again")
		}
		d.failures[l] = 0
		return
	}
	d.failures[l]++
	n := d.failures[l]
	d.hooks.Log.Warn().Err(err).Str("application", d.spec.App).Str("deployment", d.spec.Name).
		Str("replica", l.ID()).Int("consecutive_failures", n).Msg("replica failed its health check")
	if n < unhealthyAfter {
		return
	}
	d.replaceLocked(l)
}

// replaceLocked takes l out of routing, starts a replacement and lets l
// finish its requests in the background. d.mu must be held.
func (d *Deployment) replaceLocked(old *Local) {
	idx := -1
	for i, l := range d.replicas {
		if l == old {
			idx = i
		}
	}
	if idx < 0 {
		return
	}
	old.SetState(StateDraining)
	delete(d.failures, old)
	log := d.hooks.Log.Error().Str("application", d.spec.App).Str("deployment", d.spec.Name).Str("replica", old.ID())
	nl, err := d.newReplica()
	if err != nil {
		// Keep the slot empty rather than route to a failing replica; the
		// next round tries nothing more, so say so loudly.
		d.replicas = append(d.replicas[:idx], d.replicas[idx+1:]...)
		log.Err(err).Msg("replica unhealthy; its replacement failed to start")
	} else {
		nl.SetState(StateRunning)
		d.replicas[idx] = nl
		log.Str("replacement", nl.ID()).Msg("replica unhealthy; replaced")
	}
	d.publishLocked()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), d.spec.GracefulShutdownTimeout)
		defer cancel()
		_ = waitIdle(ctx, old)
		old.SetState(StateStopped)
	}()
}
