package replica

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DeploymentSpec is what a deployment controller needs to run a deployment:
// the config's deployment, resolved to a factory and durations.
type DeploymentSpec struct {
	App                     string
	Name                    string
	Factory                 Factory
	UserConfig              json.RawMessage
	NumReplicas             int
	MaxOngoingRequests      int
	HealthCheckPeriod       time.Duration
	HealthCheckTimeout      time.Duration
	GracefulShutdownTimeout time.Duration
}

// Hooks connect a deployment to the router and the log.
type Hooks struct {
	// OnChange is called with the routable replicas each time they change.
	// If nil, nothing is told.
	OnChange func([]Handle)
	// OnRelease is given to every replica (see NewLocal). If nil, nothing
	// is notified.
	OnRelease func()
	// Log receives the controller's events. The zero Logger logs nothing.
	Log zerolog.Logger
}

// unhealthyAfter is how many consecutive failed health checks take a replica
// out of routing and replace it, as in Serve.
const unhealthyAfter = 3

// ErrRejected wraps the error of a Reconfigure that no replica took: the
// deployment keeps its old user_config, and nothing was replaced.
var ErrRejected = errors.New("every replica rejected the user_config")

// Deployment is a deployment's controller: it owns the replicas, tells the
// router which ones are routable, and health-checks, reconfigures, scales
// and drains them. Every control call reaches the replicas through one
// Pool.Broadcast: the controller never loops over replicas to call them.
type Deployment struct {
	hooks Hooks

	// control serializes the changes of the replica set and its config
	// (Reconfigure, Scale, topUp, Stop), so that a replica is never built
	// with a user_config that is being replaced.
	control sync.Mutex

	// mu guards every field below.
	mu       sync.Mutex
	spec     DeploymentSpec  // NumReplicas and UserConfig change live
	replicas []Replica       // in routing order; the running ones take requests
	retired  []Replica       // taken out of routing, finishing their requests
	failures map[Replica]int // consecutive failed health checks
	// pool holds replicas and retired, in that order: rebuilt (cheaply)
	// whenever they change, so a Broadcast reads a fixed membership.
	pool *Pool

	// ctx ends when Stop begins; it stops the health loop and cuts short
	// the background drains of retired replicas (Stop drains them itself).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewDeployment builds spec.NumReplicas replicas, each with its own Handler
// from spec.Factory. They take requests once Start is called.
func NewDeployment(spec DeploymentSpec, hooks Hooks) (*Deployment, error) {
	d := &Deployment{spec: spec, hooks: hooks, failures: make(map[Replica]int)}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	for range spec.NumReplicas {
		l, err := d.newReplica(spec.UserConfig)
		if err != nil {
			return nil, err
		}
		d.replicas = append(d.replicas, l)
	}
	d.rebuildPoolLocked()
	return d, nil
}

// newReplica builds a replica with the user's factory; a panic in the
// factory is an error, not a crash.
func (d *Deployment) newReplica(userConfig json.RawMessage) (r Replica, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("application %q deployment %q: handler factory panicked: %v", d.spec.App, d.spec.Name, v)
		}
	}()
	h, err := d.spec.Factory(userConfig)
	if err != nil {
		return nil, fmt.Errorf("application %q deployment %q: %w", d.spec.App, d.spec.Name, err)
	}
	return NewLocal(d.spec.Name+"#"+randomSuffix(), h, d.spec.MaxOngoingRequests, d.hooks.OnRelease), nil
}

// randomSuffix returns six lowercase letters, as Serve's replica ids end.
func randomSuffix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 6)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// App returns the deployment's application name.
func (d *Deployment) App() string { return d.spec.App }

// Name returns the deployment's name.
func (d *Deployment) Name() string { return d.spec.Name }

// Spec returns the deployment's spec as it is now: NumReplicas and
// UserConfig follow Scale and Reconfigure.
func (d *Deployment) Spec() DeploymentSpec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.spec
}

// log returns the controller's logger with the deployment named.
func (d *Deployment) log() *zerolog.Logger {
	l := d.hooks.Log.With().Str("application", d.spec.App).Str("deployment", d.spec.Name).Logger()
	return &l
}

// Start makes every replica routable and starts the health-check loop,
// which runs until Stop.
func (d *Deployment) Start() {
	d.mu.Lock()
	for _, l := range d.replicas {
		l.SetState(StateRunning)
	}
	d.publishLocked()
	d.mu.Unlock()
	if d.spec.HealthCheckPeriod > 0 {
		d.wg.Add(1)
		go d.healthLoop(d.ctx)
	}
}

// Replicas returns the deployment's replicas in routing order, without
// the retired ones still draining.
func (d *Deployment) Replicas() []Replica {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.replicas)
}

// Running returns how many replicas take requests.
func (d *Deployment) Running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.replicas {
		if l.State() == StateRunning {
			n++
		}
	}
	return n
}

// publishLocked tells the router the routable replicas. d.mu must be held,
// so that snapshots reach the router in the order they were made.
func (d *Deployment) publishLocked() {
	if d.hooks.OnChange == nil {
		return
	}
	hs := make([]Handle, 0, len(d.replicas))
	for _, l := range d.replicas {
		if l.State() == StateRunning {
			hs = append(hs, l)
		}
	}
	d.hooks.OnChange(hs)
}

// rebuildPoolLocked makes the pool hold replicas and retired again. d.mu
// must be held.
func (d *Deployment) rebuildPoolLocked() {
	actors := make([]Actor, 0, len(d.replicas)+len(d.retired))
	for _, l := range d.replicas {
		actors = append(actors, l)
	}
	for _, l := range d.retired {
		actors = append(actors, l)
	}
	d.pool = NewPool(actors...)
}

// broadcastTo sends c to the given replicas through the pool and returns
// their results in the same order. The pool is read under d.mu, after the
// caller chose the replicas, so all of them are in it.
func (d *Deployment) broadcastTo(ctx context.Context, c Call, pool *Pool, targets []Replica) []Result {
	ids := make([]string, len(targets))
	for i, l := range targets {
		ids[i] = l.ID()
	}
	return pool.Broadcast(ctx, c, ids...)
}

// ReplicaStatus is one replica as GET /-/applications shows it: its own
// Stats, answered through the pool, and the controller's view of its
// health.
type ReplicaStatus struct {
	Stats
	// Healthy is true while the replica runs and passed its last health
	// check.
	Healthy bool `json:"healthy"`
	// Error is set when the replica did not answer its stats call.
	Error string `json:"error,omitempty"`
}

// Stats broadcasts MethodStats to every replica, the draining ones
// included, and returns their answers in pool order.
func (d *Deployment) Stats(ctx context.Context) []ReplicaStatus {
	d.mu.Lock()
	pool := d.pool
	healthy := make(map[string]bool, len(d.replicas))
	for _, l := range d.replicas {
		healthy[l.ID()] = l.State() == StateRunning && d.failures[l] < 1
	}
	d.mu.Unlock()
	results := pool.Broadcast(ctx, Call{Method: MethodStats})
	out := make([]ReplicaStatus, len(results))
	for i, r := range results {
		s := ReplicaStatus{Stats: Stats{ID: r.Actor}}
		if r.Err == nil {
			r.Err = json.Unmarshal(r.Value, &s.Stats)
		}
		if r.Err != nil {
			s.Error = r.Err.Error()
		}
		s.Healthy = r.Err == nil && healthy[s.ID] && s.State == StateRunning
		out[i] = s
	}
	return out
}

// Reconfigure gives every replica userConfig through one broadcast, while
// requests keep flowing, and makes it the config of replicas built from
// now on. It returns each replica's result, in routing order. A replica
// whose reconfigure failed has been taken out of routing and is being
// replaced by one built with userConfig. If no replica took it, nothing
// changed: the old user_config stays and the error wraps ErrRejected (and
// ErrNotReconfigurable when the handler takes none).
func (d *Deployment) Reconfigure(ctx context.Context, userConfig json.RawMessage) ([]Result, error) {
	d.control.Lock()
	defer d.control.Unlock()
	d.mu.Lock()
	old := d.spec.UserConfig
	d.spec.UserConfig = userConfig
	targets := slices.Clone(d.replicas)
	pool := d.pool
	d.mu.Unlock()

	results := d.broadcastTo(ctx, Call{Method: MethodReconfigure, Payload: userConfig}, pool, targets)
	failed := 0
	var firstErr error
	for _, r := range results {
		if r.Err != nil {
			failed++
			firstErr = cmp.Or(firstErr, r.Err)
		}
	}
	log := d.log()
	if len(targets) > 0 && failed == len(targets) {
		d.mu.Lock()
		d.spec.UserConfig = old
		d.mu.Unlock()
		log.Warn().Err(firstErr).Int("replicas", len(targets)).Msg("user_config rejected by every replica; nothing changed")
		return results, fmt.Errorf("%w: %w", ErrRejected, firstErr)
	}
	d.mu.Lock()
	for i, r := range results {
		if r.Err != nil {
			log.Error().Str("replica", r.Actor).Err(r.Err).Msg("replica failed to reconfigure: taken out of routing, to be replaced")
			d.retireLocked(targets[i])
		}
	}
	d.mu.Unlock()
	log.Info().Int("replicas", len(targets)).Int("failed", failed).Msg("user_config reconfigured")
	_ = d.topUpHeld(ctx) // a replacement that fails to build is logged, and retried each period
	return results, nil
}

// Scale changes the number of replicas live: new replicas start (built
// with the current user_config) and take requests once built; extra ones
// leave routing at once and drain in the background, for up to
// graceful_shutdown_timeout_s. It returns the error of a replica that
// could not be built (the deployment keeps trying each health period).
func (d *Deployment) Scale(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("num_replicas must be >= 1, got %d", n)
	}
	d.control.Lock()
	defer d.control.Unlock()
	d.mu.Lock()
	from := len(d.replicas)
	d.spec.NumReplicas = n
	if extra := len(d.replicas) - n; extra > 0 {
		// The newest go first: the oldest have warm caches.
		victims := slices.Clone(d.replicas[n:])
		for _, l := range victims {
			d.retireLocked(l)
		}
	}
	d.mu.Unlock()
	d.log().Info().Int("from", from).Int("to", n).Msg("num_replicas changed")
	return d.topUpHeld(ctx)
}

// SetGC broadcasts MethodSetGC with payload to every replica and returns
// their results in pool order.
func (d *Deployment) SetGC(ctx context.Context, payload []byte) []Result {
	d.mu.Lock()
	pool := d.pool
	d.mu.Unlock()
	return pool.Broadcast(ctx, Call{Method: MethodSetGC, Payload: payload})
}

// retireLocked takes l out of routing and drains it in the background
// (MethodDrain through the pool), for up to graceful_shutdown_timeout_s or
// until Stop. d.mu must be held.
func (d *Deployment) retireLocked(old Replica) {
	i := slices.Index(d.replicas, old)
	if i < 0 {
		return // retired already
	}
	d.replicas = slices.Delete(d.replicas, i, i+1)
	old.SetState(StateDraining) // refused at once, even from a stale snapshot
	delete(d.failures, old)
	d.retired = append(d.retired, old)
	d.rebuildPoolLocked()
	d.publishLocked()
	pool := d.pool
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.ctx, d.spec.GracefulShutdownTimeout)
		defer cancel()
		r := pool.Broadcast(ctx, Call{Method: MethodDrain}, old.ID())[0]
		if r.Err != nil && d.ctx.Err() != nil {
			return // Stop drains it with its own deadline
		}
		if r.Err != nil {
			d.log().Warn().Str("replica", old.ID()).Int("ongoing", old.Ongoing()).
				Msg("replica still busy at graceful_shutdown_timeout_s: stopped anyway")
		}
		old.SetState(StateStopped)
		d.mu.Lock()
		if i := slices.Index(d.retired, old); i >= 0 {
			d.retired = slices.Delete(d.retired, i, i+1)
			d.rebuildPoolLocked()
		}
		d.mu.Unlock()
	}()
}

// topUp starts replicas until the deployment has num_replicas again.
func (d *Deployment) topUp() {
	d.control.Lock()
	defer d.control.Unlock()
	_ = d.topUpHeld(d.ctx)
}

// topUpHeld is topUp with d.control held. The factory runs without d.mu
// held (it may load a model); one that fails is logged, and tried again
// next period. It returns the factory's error.
func (d *Deployment) topUpHeld(ctx context.Context) error {
	log := d.log()
	for {
		d.mu.Lock()
		missing := d.spec.NumReplicas - len(d.replicas)
		userConfig := d.spec.UserConfig
		d.mu.Unlock()
		if missing <= 0 || d.ctx.Err() != nil || ctx.Err() != nil {
			return ctx.Err()
		}
		l, err := d.newReplica(userConfig)
		if err != nil {
			log.Error().Err(err).Int("missing_replicas", missing).Msg("starting a replica failed; retrying next health period")
			return err
		}
		d.mu.Lock()
		if d.ctx.Err() != nil {
			d.mu.Unlock()
			return nil
		}
		l.SetState(StateRunning)
		d.replicas = append(d.replicas, l)
		d.rebuildPoolLocked()
		d.publishLocked()
		d.mu.Unlock()
		log.Info().Str("replica", l.ID()).Msg("replica started")
	}
}

// Stop ends the health-check loop, takes every replica out of routing and
// drains them all through one broadcast, waiting up to ctx's deadline for
// their requests to finish. It returns ctx's error if requests were still
// running then.
func (d *Deployment) Stop(ctx context.Context) error {
	d.cancel()
	d.wg.Wait() // the health loop and background drains end at once
	d.control.Lock()
	defer d.control.Unlock()
	d.mu.Lock()
	all := append(slices.Clone(d.replicas), d.retired...)
	for _, l := range all {
		l.SetState(StateDraining)
	}
	d.publishLocked()
	pool := d.pool
	d.mu.Unlock()
	var err error
	for _, r := range pool.Broadcast(ctx, Call{Method: MethodDrain}) {
		if r.Err != nil && err == nil {
			err = r.Err
		}
	}
	for _, l := range all {
		l.SetState(StateStopped)
	}
	return err
}

// waitIdle polls until l holds no request or ctx is done. Polling is fine:
// it runs only while stopping a replica.
func waitIdle(ctx context.Context, l Handle) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for l.Ongoing() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
