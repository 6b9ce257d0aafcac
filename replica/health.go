package replica

import (
	"context"
	"time"
)

// healthLoop checks every replica each health_check_period_s until ctx is
// done, and replaces the ones taken out.
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

// checkHealth runs one round of health checks: one broadcast of
// MethodCheckHealth to the running replicas, bounded by
// health_check_timeout_s. A replica that fails unhealthyAfter times in a
// row is taken out of routing (topUp replaces it). A check that has not
// answered by the deadline is a failure; one still running at the next
// round fails at once (ErrCheckInFlight), as a hung check should.
func (d *Deployment) checkHealth(ctx context.Context) {
	d.mu.Lock()
	var targets []Replica
	for _, l := range d.replicas {
		if l.State() == StateRunning {
			targets = append(targets, l)
		}
	}
	pool := d.pool
	d.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, d.spec.HealthCheckTimeout)
	results := d.broadcastTo(cctx, Call{Method: MethodCheckHealth}, pool, targets)
	cancel()
	if ctx.Err() != nil {
		return // stopping: a cancelled check is no verdict
	}
	for i, r := range results {
		d.recordHealth(targets[i], r.Err)
	}
}

// recordHealth counts a check's result; the unhealthyAfter-th failure in a
// row takes the replica out of routing (topUp replaces it).
func (d *Deployment) recordHealth(l Replica, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	log := d.log().With().Str("replica", l.ID()).Logger()
	if err == nil {
		if d.failures[l] > 0 {
			log.Info().Msg("replica passed its health check again")
		}
		d.failures[l] = 0
		return
	}
	if l.State() != StateRunning {
		return // retired meanwhile
	}
	d.failures[l]++
	n := d.failures[l]
	log.Warn().Err(err).Int("consecutive_failures", n).Msg("replica failed its health check")
	if n < unhealthyAfter {
		return
	}
	log.Error().Int("consecutive_failures", n).Msg("replica unhealthy: taken out of routing, to be replaced")
	d.retireLocked(l)
}
