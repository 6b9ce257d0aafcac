package replica

// Repairs: the replicas of a deployment that follows targets which came
// back different from how they left (a replica host restarted with
// another config or other actors) are brought in line, beside the health
// loop.

import (
	"context"
	"slices"
	"time"
)

// Reconnected tells the deployment that rs, the actors of a replica host
// that was unreachable, can be reached again. A host that was restarted
// holds the user_config it was started with, which need not be the
// deployment's: rs stay out of routing until the health loop has given
// them the deployment's (when it has one); then a health check brings
// them back. It does not wait.
//
// They are given the GC settings of the last SetGC too, if there was one:
// a restarted host runs its own env's. That does not keep them out of
// routing.
func (d *Deployment) Reconnected(rs []Replica) {
	d.mu.Lock()
	if d.gc != nil {
		for _, r := range rs {
			if slices.Contains(d.replicas, r) {
				d.gcStale[r] = true
			}
		}
	}
	if d.spec.UserConfig != nil {
		in := make(map[Replica]bool, len(d.replicas))
		for _, r := range d.replicas {
			in[r] = true
		}
		changed := false
		for _, r := range rs {
			if in[r] {
				d.unsync[r] = true
				changed = changed || !d.excluded[r]
				d.excluded[r] = true
			}
		}
		if changed {
			d.publishLocked()
		}
	}
	d.mu.Unlock()
	d.CheckHealthNow()
}

// ReplaceTarget has target connected anew, its replicas replaced by those
// of the new connection: a replica host back with other actors than it
// had (restarted with another number of them, say), whose missing ones
// would fail their checks for ever and whose new ones would get nothing.
// The health loop has it done; ReplaceTarget does not wait.
func (d *Deployment) ReplaceTarget(target string) {
	if d.spec.Connect == nil {
		return
	}
	d.mu.Lock()
	d.renew[target] = true
	d.mu.Unlock()
	d.CheckHealthNow()
}

// startRepair runs a repair pass in the background, unless one runs: the
// targets to connect anew and the replicas waiting for their user_config
// or the GC settings.
// Only the health loop calls it, so that its d.wg.Add comes before Stop's
// Wait.
func (d *Deployment) startRepair(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.repairing || len(d.renew) == 0 && len(d.unsync) == 0 && len(d.gcStale) == 0 {
		return
	}
	d.repairing = true
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.repair(ctx)
		d.mu.Lock()
		d.repairing = false
		d.mu.Unlock()
	}()
}

// repair makes one pass: each target to renew is connected anew, and the
// replicas waiting for the user_config are given it, and those waiting
// for the GC settings theirs; then a health round brings back those that
// took the user_config. What failed waits for the next round.
func (d *Deployment) repair(ctx context.Context) {
	d.mu.Lock()
	var renew []string
	for t := range d.renew {
		renew = append(renew, t)
	}
	clear(d.renew)
	d.mu.Unlock()
	slices.Sort(renew)
	progress := false
	for _, t := range renew {
		progress = d.renewTarget(ctx, t) || progress
	}
	progress = d.syncUnsync(ctx) > 0 || progress
	d.syncGC(ctx) // routing does not wait for it
	// Only for progress: what failed waits for the next period, rather
	// than be tried again at once, and again.
	if progress && ctx.Err() == nil {
		d.CheckHealthNow()
	}
}

// renewTarget retires target's replicas, waits for them to drain (the new
// ones may have their ids), then connects it again if it is still wanted
// and not connected meanwhile. A failed connection is tried again at the
// next health round. It reports whether it connected the target.
func (d *Deployment) renewTarget(ctx context.Context, target string) bool {
	d.control.Lock()
	if d.stopped {
		d.control.Unlock()
		return false
	}
	d.mu.Lock()
	var olds []Replica
	for _, r := range d.replicas {
		if d.targets[r] == target {
			olds = append(olds, r)
		}
	}
	wanted := d.want[target]
	if wanted && len(olds) > 0 {
		d.log().Info().Str("target", target).Int("replicas", len(olds)).Msg("replacing the replicas of a target that came back with other actors")
		d.retireLocked(olds...)
		d.spec.NumReplicas = len(d.replicas)
	}
	d.mu.Unlock()
	d.control.Unlock()
	if !wanted {
		return false // gone from the list meanwhile
	}

	deadline := time.Now().Add(time.Duration(d.grace.Load()) + time.Second)
	for d.draining(target) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}

	// Dialled without control: a target that does not answer (its
	// connect waits out a timeout at every health check) must hold up no
	// reload, reconfigure or scale.
	rs, dialErr := d.connect(d.ctx, target)
	conns, errs := [][]Replica{rs}, []error{dialErr}
	d.control.Lock()
	check := func() {}
	defer func() {
		d.control.Unlock()
		check() // its replicas' checks on joining, without control
	}()
	d.mu.Lock()
	connected := d.connectedLocked(target)
	wanted = d.want[target]
	d.mu.Unlock()
	if d.stopped || !wanted || connected {
		d.dropConns(conns) // a list or discovery answer took it meanwhile, or left it
		return false
	}
	var added []error
	added, check = d.addTargets([]string{target}, conns, errs)
	err := added[0]
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unconnected = slices.DeleteFunc(d.unconnected, func(te TargetError) bool { return te.Target == target })
	if err != nil {
		// At Warn when it begins, then once a failureLogEvery: a target
		// left down (a host not started yet, a typo in the list) is
		// tried at every health check.
		ev := d.log().Debug()
		if at, ok := d.renewWarned[target]; !ok || time.Since(at) >= failureLogEvery {
			ev = d.log().Warn()
			d.renewWarned[target] = time.Now()
		}
		ev.Err(err).Str("target", target).Msg("connecting a target failed; tried again at each health check")
		d.unconnected = append(d.unconnected, TargetError{Target: target, Error: err.Error()})
		d.renew[target] = true
		return false
	}
	if _, ok := d.renewWarned[target]; ok {
		delete(d.renewWarned, target)
		d.log().Info().Str("target", target).Msg("target connected after failing")
	}
	return true
}

// draining reports whether replicas of target are still draining.
func (d *Deployment) draining(target string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.retired, func(r Replica) bool { return d.targets[r] == target })
}

// syncUnsync gives the replicas waiting for the deployment's user_config
// (a host back from an outage, or one that failed or did not answer a
// reconfigure) the current one. control is held for it, as for a
// Reconfigure, so that no other config overtakes it. It returns how many
// took it.
func (d *Deployment) syncUnsync(ctx context.Context) int {
	d.control.Lock()
	defer d.control.Unlock()
	if d.stopped {
		return 0
	}
	d.mu.Lock()
	var rs []Replica
	for _, r := range d.replicas {
		if d.unsync[r] {
			rs = append(rs, r)
		}
	}
	d.mu.Unlock()
	return d.giveUserConfig(ctx, rs, "waiting for it")
}

// giveUserConfig reconfigures rs, replicas that were not there for the
// deployment's last reconfigure (or did not take it), with its
// user_config, if it has one. Its error keeps a replica out of routing,
// tried again at each health round: a replica host serves what it was
// started with otherwise. rs are taken out of unsync once they took it;
// it returns how many did. control must be held.
func (d *Deployment) giveUserConfig(ctx context.Context, rs []Replica, why string) int {
	d.mu.Lock()
	userConfig := d.spec.UserConfig
	d.mu.Unlock()
	if len(rs) == 0 || userConfig == nil {
		return 0
	}
	results := d.broadcastBounded(ctx, rs, Call{Method: MethodReconfigure, Payload: userConfig})
	log := d.log()
	failed := 0
	var replace []Replica
	d.mu.Lock()
	for i, res := range results {
		r := rs[i]
		if res.Err == nil {
			delete(d.unsync, r)
			delete(d.refused, r)
			continue
		}
		failed++
		if d.Replaces() {
			// One the deployment starts itself (a reconfigure that
			// timed out, then failed) is replaced, as a failed
			// reconfigure's is.
			log.Error().Str("replica", r.ID()).Err(res.Err).Msg("replica failed to reconfigure: taken out of routing, to be replaced")
			replace = append(replace, r)
			continue
		}
		ev := log.Debug() // said once at Error, not at every round
		if !d.refused[r] {
			ev, d.refused[r] = log.Error(), true
		}
		ev.Str("replica", r.ID()).Err(res.Err).Msg("replica did not take the deployment's user_config: out of routing until it does (tried again at each health check)")
		d.unsync[r] = true
		d.excluded[r] = true
	}
	d.publishLocked()
	d.retireLocked(replace...)
	d.mu.Unlock()
	ev := log.Info()
	if failed == len(rs) {
		ev = log.Debug() // nothing new: the refusals were said
	}
	ev.Str("replicas", why).Int("count", len(rs)).Int("failed", failed).Msg("user_config given to replicas that were not there for the last reconfigure")
	return len(rs) - failed
}

// syncGC gives the replicas waiting for the GC settings of the last
// SetGC (see gcStale) those settings.
func (d *Deployment) syncGC(ctx context.Context) {
	d.mu.Lock()
	var rs []Replica
	for _, r := range d.replicas {
		if d.gcStale[r] {
			rs = append(rs, r)
		}
	}
	d.mu.Unlock()
	d.giveGC(ctx, rs, "waiting for them")
}

// giveGC gives rs the GC settings of the last SetGC, if there was one,
// through one set_gc broadcast bounded by health_check_timeout_s. A
// replica that fails it stays in gcStale, tried again at each health
// check (logged once at Warn); it stays in routing, since it serves
// either way.
func (d *Deployment) giveGC(ctx context.Context, rs []Replica, why string) {
	d.gcMu.Lock()
	defer d.gcMu.Unlock()
	d.mu.Lock()
	payload := d.gc
	d.mu.Unlock()
	if len(rs) == 0 || payload == nil {
		return
	}
	results := d.broadcastBounded(ctx, rs, Call{Method: MethodSetGC, Payload: payload})
	log := d.log()
	failed := 0
	d.mu.Lock()
	for i, res := range results {
		r := rs[i]
		if res.Err == nil {
			delete(d.gcStale, r)
			delete(d.gcRefused, r)
			continue
		}
		failed++
		if !slices.Contains(d.replicas, r) {
			continue // retired meanwhile
		}
		ev := log.Debug() // said once at Warn, not at every round
		if !d.gcRefused[r] {
			ev, d.gcRefused[r] = log.Warn(), true
		}
		ev.Str("replica", r.ID()).Err(res.Err).Msg("replica did not take the GC settings of PUT /-/gc: tried again at each health check")
		d.gcStale[r] = true
	}
	d.mu.Unlock()
	ev := log.Info()
	if failed == len(rs) {
		ev = log.Debug() // nothing new: the failures were said
	}
	ev.Str("replicas", why).Int("count", len(rs)).Int("failed", failed).Msg("GC settings of PUT /-/gc given to replicas that were not there for them")
}

// broadcastBounded sends c to rs, one batched broadcast bounded by
// health_check_timeout_s, and returns their results in rs's order.
func (d *Deployment) broadcastBounded(ctx context.Context, rs []Replica, c Call) []Result {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(d.healthTimeout.Load()))
	defer cancel()
	actors := make([]Actor, len(rs))
	for i, r := range rs {
		actors[i] = r
	}
	return NewPool(actors...).Broadcast(ctx, c)
}
