package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

// Deployment is a deployment's controller: it owns the replicas, tells the
// router which ones are routable, health-checks them and replaces the ones
// that fail.
type Deployment struct {
	spec  DeploymentSpec
	hooks Hooks

	// mu guards replicas, retired, failures and checking.
	mu       sync.Mutex
	replicas []*Local        // in routing order; the running ones take requests
	retired  []*Local        // taken out of routing, finishing their requests
	failures map[*Local]int  // consecutive failed health checks
	checking map[*Local]bool // a health check is running

	// ctx ends when Stop begins; it stops the health loop and cuts short
	// the background drains of retired replicas (Stop drains them itself).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewDeployment builds spec.NumReplicas replicas, each with its own Handler
// from spec.Factory. They take requests once Start is called.
func NewDeployment(spec DeploymentSpec, hooks Hooks) (*Deployment, error) {
	d := &Deployment{spec: spec, hooks: hooks, failures: make(map[*Local]int), checking: make(map[*Local]bool)}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	for range spec.NumReplicas {
		l, err := d.newReplica()
		if err != nil {
			return nil, err
		}
		d.replicas = append(d.replicas, l)
	}
	return d, nil
}

// newReplica builds a replica with the user's factory; a panic in the
// factory is an error, not a crash.
func (d *Deployment) newReplica() (l *Local, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("application %q deployment %q: handler factory panicked: %v", d.spec.App, d.spec.Name, v)
		}
	}()
	h, err := d.spec.Factory(d.spec.UserConfig)
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

// Spec returns the spec the deployment was built from.
func (d *Deployment) Spec() DeploymentSpec { return d.spec }

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

// Replicas returns the deployment's replicas, in order.
func (d *Deployment) Replicas() []*Local {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Local(nil), d.replicas...)
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

// Healthy reports whether a replica passed its last health check.
func (d *Deployment) Healthy(l *Local) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return l.State() == StateRunning && d.failures[l] == 0
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

// Stop ends the health-check loop, takes every replica out of routing and
// waits, up to ctx's deadline, for their requests to finish. It returns
// ctx's error if requests were still running then.
func (d *Deployment) Stop(ctx context.Context) error {
	d.cancel()
	d.wg.Wait() // the health loop and background drains end at once
	d.mu.Lock()
	for _, l := range d.replicas {
		l.SetState(StateDraining)
	}
	d.publishLocked()
	replicas := append(append([]*Local(nil), d.replicas...), d.retired...)
	d.retired = nil
	d.mu.Unlock()
	var err error
	for _, l := range replicas {
		if e := waitIdle(ctx, l); e != nil && err == nil {
			err = e
		}
		l.SetState(StateStopped)
	}
	return err
}

// waitIdle polls until l holds no request or ctx is done. Polling is fine:
// it runs only while stopping a replica.
func waitIdle(ctx context.Context, l *Local) error {
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
