package replica

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// DeploymentSpec is what a deployment controller needs to run a deployment:
// the config's deployment, resolved to a factory and durations.
//
// It has no defaults: the config package gives a file's deployments
// Serve's, and NewDeployment refuses a spec that Validate does.
type DeploymentSpec struct {
	// App and Name are the application's and the deployment's names, for
	// logs, metrics and errors; neither may be empty.
	App  string
	Name string
	// Factory builds each in-process replica's handler; it is required
	// unless Start or Connect builds the replicas.
	Factory Factory
	// UserConfig is given to Factory and to every replica's Reconfigure;
	// nil for none.
	UserConfig json.RawMessage
	// NumReplicas is how many replicas Factory or Start builds (0 or
	// more; Serve's default is 1). Connect's follow Targets instead.
	NumReplicas int
	// MaxOngoingRequests is each replica's limit of requests at once: 1
	// or more (Serve's default is 5). A replica never exceeds it.
	MaxOngoingRequests int
	// HealthCheckPeriod is how often every replica is health-checked
	// (Serve's default is 10 s); 0 checks none.
	HealthCheckPeriod time.Duration
	// HealthCheckTimeout bounds each health check, and a started
	// replica's wait to become healthy: above 0 (Serve's default is 30 s).
	HealthCheckTimeout time.Duration
	// GracefulShutdownTimeout is how long a stopping replica may take to
	// finish its requests (Serve's default is 20 s); 0 stops it at once.
	GracefulShutdownTimeout time.Duration

	// MaxConstructorRetryCount is how many rounds of replica starts in a
	// row may start none before the deployment stops trying (until the
	// next Scale); a round starts the missing replicas, processes at once,
	// in-process ones one at a time. If 0, there is no limit.
	MaxConstructorRetryCount int

	// Start, if not nil, builds each replica instead of Factory: a
	// replica elsewhere, such as a process (handler command). It returns
	// once the replica serves, or fails within ctx; onRelease is to be
	// called each time one of the replica's slots is freed.
	Start func(ctx context.Context, id string, onRelease func()) (Replica, error)

	// Connect, if not nil, makes the replicas follow a set of targets
	// instead of NumReplicas: the replicas of each target, built by
	// Connect (one for an HTTP server, handler upstream; a host's actors,
	// handler host), with Targets the first set and SetTargets the next
	// ones. id is a fresh replica id, for a target that is one replica.
	// ctx ends when the deployment stops. Nothing here can start such a
	// replica, so one that fails its health checks leaves routing until it
	// passes again, instead of being replaced.
	Connect func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error)
	Targets []string
	// Discovered is set when the targets come from DNS discovery, which
	// tries those it could not connect to again at each answer; a list's
	// are tried again at each health check.
	Discovered bool
}

// Validate reports the first field of s that no deployment can run with,
// by name.
func (s DeploymentSpec) Validate() error {
	var problem string
	switch {
	case s.App == "":
		problem = "App is empty"
	case s.Name == "":
		problem = "Name is empty"
	case s.Factory == nil && s.Start == nil && s.Connect == nil:
		problem = "none of Factory, Start or Connect is set: nothing can build its replicas"
	case s.NumReplicas < 0:
		problem = fmt.Sprintf("NumReplicas is %d, must be 0 or more", s.NumReplicas)
	case s.MaxOngoingRequests < 1:
		problem = fmt.Sprintf("MaxOngoingRequests is %d, must be 1 or more (Serve's default is 5): no replica could take a request", s.MaxOngoingRequests)
	case s.HealthCheckPeriod < 0:
		problem = fmt.Sprintf("HealthCheckPeriod is %v, must be 0 (no checks) or more", s.HealthCheckPeriod)
	case s.HealthCheckTimeout <= 0:
		problem = fmt.Sprintf("HealthCheckTimeout is %v, must be above 0 (Serve's default is 30s): every check would fail", s.HealthCheckTimeout)
	case s.GracefulShutdownTimeout < 0:
		problem = fmt.Sprintf("GracefulShutdownTimeout is %v, must be 0 or more", s.GracefulShutdownTimeout)
	case s.MaxConstructorRetryCount < 0:
		problem = fmt.Sprintf("MaxConstructorRetryCount is %d, must be 0 (no limit) or more", s.MaxConstructorRetryCount)
	default:
		return nil
	}
	return fmt.Errorf("application %q deployment %q: %s", s.App, s.Name, problem)
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

// ErrRejected wraps the error of a Reconfigure that no replica took (every
// one refused it, or the handler's factory did first): the deployment
// keeps its old user_config, and nothing was replaced.
var ErrRejected = errors.New("user_config rejected")

// ErrUnreached wraps the error of a Reconfigure that reached no replica
// (every one unreachable, its host down): nothing changed, and it may be
// tried again once they are back.
var ErrUnreached = errors.New("no replica could be reached to take the user_config")

// ErrNotAnObject is Reconfigure's error for a user_config that is not a
// JSON object (Serve's user_config is a dict): no replica was called.
var ErrNotAnObject = errors.New("user_config must be a JSON object")

// Deployment is a deployment's controller: it owns the replicas, tells the
// router which ones are routable, and health-checks, reconfigures, scales
// and drains them. Every control call reaches the replicas through one
// Pool.Broadcast: the controller never loops over replicas to call them.
type Deployment struct {
	hooks Hooks

	// starts counts the replicas it tried to build or start (see Starts).
	starts atomic.Uint64

	// control serializes the changes of the replica set and its config
	// (Reconfigure, Scale, topUp, Stop), so that a replica is never built
	// with a user_config that is being replaced.
	control sync.Mutex
	// targetsMu serializes SetTargets, which holds control only while
	// the replica set changes, not while it dials fresh targets. It is
	// taken before control.
	targetsMu sync.Mutex
	// stopped is set, under control, once Stop begins: the changes that
	// would start background work refuse with ErrStopped from then on.
	stopped bool
	// gcMu orders the set_gc calls (SetGC's broadcast, and the repair's
	// to replicas that missed it), so that one reading an older payload
	// cannot land after a newer one. It is taken before mu, never under
	// it, and not with control: a retune need not wait for a scale.
	gcMu sync.Mutex

	// mu guards every field below.
	mu       sync.Mutex
	spec     DeploymentSpec   // NumReplicas and UserConfig change live
	replicas []Replica        // in routing order; the running ones take requests
	retired  []Replica        // taken out of routing, finishing their requests
	issued   map[string]bool  // the ids newID gave that a replica may still have: never two at once
	failures map[Replica]int  // consecutive failed health checks
	checking map[Replica]bool // whose health check is in flight (see checkHealth)
	kept     map[Replica]bool // of targets gone from the list, kept serving and logged so (see SetTargets)
	joining  map[Replica]bool // connected for their targets, starting until their check on joining is told (see addTargets)
	// failLogged is, for a replica failing its health checks past
	// unhealthyAfter, when its last failure was logged and its
	// consecutive failures then (see logHealthFailureLocked).
	failLogged map[Replica]failLog
	// excluded are replicas kept out of routing until a health check
	// passes: unreachable, or (with Connect) unhealthy.
	excluded map[Replica]bool
	// unreachableAt is when a replica was reported unreachable; a health
	// check begun before it cannot bring the replica back.
	unreachableAt map[Replica]time.Time
	targets       map[Replica]string // each replica's target, with Connect
	// want are the targets the deployment follows, with Connect: the
	// last SetTargets', or spec.Targets.
	want map[string]bool
	// unsync are replicas to be given the deployment's user_config before
	// they take requests (again): a host back from an outage, or one that
	// failed or did not answer a reconfigure (see Reconnected).
	unsync map[Replica]bool
	// refused are the unsync replicas whose refusal was logged: once.
	refused map[Replica]bool
	// gc is the set_gc payload SetGC last sent, nil until it is called
	// (PUT /-/gc): replicas that were not there for it, or failed it, are
	// given it, so that every replica host runs what the proxy reports.
	// Until then a host keeps its own settings (its env's).
	gc []byte
	// gcStale are the replicas to be given gc: a host that joined or
	// reconnected since (a restarted one runs its env's settings), or
	// one that failed it; gcRefused those whose failure was logged.
	gcStale   map[Replica]bool
	gcRefused map[Replica]bool
	// renew are targets to connect anew, their replicas replaced (a
	// replica host back with other actors; see ReplaceTarget).
	renew map[string]bool
	// renewWarned is when a target's failure to connect was last logged
	// at Warn (see renewTarget).
	renewWarned map[string]time.Time
	// repairing is set while a repair pass runs (see startRepair).
	repairing bool
	// unconnected are the targets of the last SetTargets it could not
	// connect to, with why.
	unconnected []TargetError
	// startFailures counts rounds of starts in a row that started none;
	// at MaxConstructorRetryCount, gaveUp stops the attempts.
	startFailures int
	gaveUp        bool
	// lastFailedRound is when the last such round ended: the backoff
	// runs from it.
	lastFailedRound time.Time
	// quickExits counts replica processes in a row that exited within
	// crashLoopUptime of becoming healthy (the last at lastQuickExit):
	// their replacements back off as failed starts do.
	quickExits    int
	lastQuickExit time.Time
	// settled is set once the deployment is past its start, and never
	// cleared (see Settled).
	settled atomic.Bool
	// pool holds replicas and retired, in that order: rebuilt (cheaply)
	// whenever they change, so a Broadcast reads a fixed membership.
	pool *Pool

	// ctx ends when Stop begins; it stops the health loop and cuts short
	// the background drains of retired replicas (Stop drains them itself).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{} // asks the starter for missing replicas; buffered
	// checkNow asks the health loop for a round at once; buffered.
	checkNow chan struct{}
	// healthPeriod and healthTimeout are spec's HealthCheckPeriod and
	// HealthCheckTimeout, read where d.mu is not held and changed by
	// SetHealthChecks (which kicks healthReset, buffered, for the loop's
	// ticker).
	healthPeriod, healthTimeout atomic.Int64
	healthReset                 chan struct{}
	// grace is spec's GracefulShutdownTimeout, read where d.mu is not
	// held and changed by SetGracefulShutdownTimeout.
	grace atomic.Int64
	// maxOngoing is spec's MaxOngoingRequests, read where d.mu is not
	// held and changed by SetMaxOngoing.
	maxOngoing atomic.Int64
}

// NewDeployment builds the deployment's replicas: spec.NumReplicas from
// spec.Factory or spec.Start, or one per spec.Targets with spec.Connect.
// They take requests once Start is called. A Connect error fails it (a
// target that cannot be reached); a Factory or Start error does not: the
// replicas that were built or started serve, and the others are retried
// with backoff, up to MaxConstructorRetryCount. ctx bounds
// these first starts (a shutdown asked for during them): once it is done,
// NewDeployment stops what it built and returns ctx's error. The
// deployment itself lives until Stop.
func NewDeployment(ctx context.Context, spec DeploymentSpec, hooks Hooks) (*Deployment, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	d := &Deployment{
		spec:          spec,
		hooks:         hooks,
		failures:      make(map[Replica]int),
		failLogged:    make(map[Replica]failLog),
		excluded:      make(map[Replica]bool),
		checking:      make(map[Replica]bool),
		kept:          make(map[Replica]bool),
		joining:       make(map[Replica]bool),
		unreachableAt: make(map[Replica]time.Time),
		targets:       make(map[Replica]string),
		want:          make(map[string]bool, len(spec.Targets)),
		unsync:        make(map[Replica]bool),
		refused:       make(map[Replica]bool),
		gcStale:       make(map[Replica]bool),
		gcRefused:     make(map[Replica]bool),
		renew:         make(map[string]bool),
		renewWarned:   make(map[string]time.Time),
		wake:          make(chan struct{}, 1),
		checkNow:      make(chan struct{}, 1),
		healthReset:   make(chan struct{}, 1),
	}
	d.healthPeriod.Store(int64(spec.HealthCheckPeriod))
	d.healthTimeout.Store(int64(spec.HealthCheckTimeout))
	d.grace.Store(int64(spec.GracefulShutdownTimeout))
	d.maxOngoing.Store(int64(spec.MaxOngoingRequests))
	d.ctx, d.cancel = context.WithCancel(context.Background())
	startCtx, cancelStart := context.WithCancel(d.ctx)
	defer cancelStart()
	defer context.AfterFunc(ctx, cancelStart)()
	// fail stops the replicas made before err (a host's connection, an
	// upstream's pool): nobody else holds them.
	fail := func(err error) (*Deployment, error) {
		d.cancel()
		d.stopReplicas(context.Background(), d.replicas) // at once: each may have a SIGTERM grace
		return nil, err
	}
	switch {
	case spec.Connect != nil:
		for _, t := range spec.Targets {
			d.want[t] = true
		}
		for _, t := range spec.Targets {
			rs, err := d.connect(startCtx, t)
			if err != nil {
				return fail(cmp.Or(ctx.Err(), err))
			}
			d.replicas = append(d.replicas, rs...)
		}
		d.spec.NumReplicas = len(d.replicas)
		// A replica host holds the user_config it was started with,
		// which need not be the deployment's: it gets this one before
		// any request (one that refuses it stays out of routing).
		d.giveUserConfig(startCtx, d.replicas, "connected at the start")
		d.checkJoining(startCtx, d.replicas, func(r Replica, err error) {
			if err != nil && ctx.Err() == nil {
				d.mu.Lock()
				d.joinFailedLocked(r, err)
				d.mu.Unlock()
			}
		})
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	case spec.Start != nil:
		d.replicas = d.startMany(startCtx, spec.NumReplicas)
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	default:
		// As processes are: a replica that fails to build (a factory's
		// error or panic, a model that failed to load) is logged and
		// tried again in the background, with backoff, up to
		// max_constructor_retry_count, as later builds are; the other
		// deployments are served meanwhile.
		d.replicas = d.buildMany(startCtx, spec.NumReplicas)
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
	}
	d.rebuildPoolLocked()
	return d, nil
}

// App returns the deployment's application name.
func (d *Deployment) App() string { return d.spec.App }

// Name returns the deployment's name.
func (d *Deployment) Name() string { return d.spec.Name }

// Spec returns the deployment's spec as it is now: NumReplicas and
// UserConfig follow Scale and Reconfigure, HealthCheckPeriod and
// HealthCheckTimeout SetHealthChecks, GracefulShutdownTimeout
// SetGracefulShutdownTimeout.
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
	for _, r := range d.replicas {
		if d.joining[r] {
			continue // in routing once its check on joining passes
		}
		r.SetState(StateRunning)
		d.watchExitLocked(r)
	}
	d.publishLocked()
	if d.spec.Connect != nil {
		d.settled.Store(true)
	}
	d.mu.Unlock()
	d.wg.Add(1)
	go d.starter(d.ctx)
	d.kick() // for replicas that failed to start in NewDeployment
	if d.healthPeriod.Load() > 0 {
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

// Running returns how many replicas take requests (are routable).
func (d *Deployment) Running() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, r := range d.replicas {
		if d.routableLocked(r) {
			n++
		}
	}
	return n
}

// routableLocked reports whether r takes requests: running, and not kept
// out of routing. d.mu must be held.
func (d *Deployment) routableLocked(r Replica) bool {
	return r.State() == StateRunning && !d.excluded[r]
}

// publishLocked tells the router the routable replicas. d.mu must be held,
// so that snapshots reach the router in the order they were made.
func (d *Deployment) publishLocked() {
	hs := make([]Handle, 0, len(d.replicas))
	for _, r := range d.replicas {
		if d.routableLocked(r) {
			hs = append(hs, r)
		}
	}
	if len(hs) > 0 {
		d.settled.Store(true)
	}
	if d.hooks.OnChange != nil {
		d.hooks.OnChange(hs)
	}
}

// Settled reports whether the deployment is past its start: one of its
// replicas has been routable, or its starts failed
// MaxConstructorRetryCount rounds in a row, or it follows targets (Connect)
// and has started: those are whatever the targets are, none included. It
// stays true from then on. A proxy is ready once every deployment is; one
// that loses its replicas later answers 503 on its own route without
// taking the other applications out of a load balancer.
func (d *Deployment) Settled() bool { return d.settled.Load() }

// GaveUp reports whether the deployment stopped starting replicas after
// MaxConstructorRetryCount rounds of starts in a row that started none,
// until its num_replicas is set again.
func (d *Deployment) GaveUp() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gaveUp
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
// their results in the same order, telling each of every one as it comes
// if each is not nil (see Pool.broadcastEach). The pool is read under
// d.mu, after the caller chose the replicas, so all of them are in it.
func (d *Deployment) broadcastTo(ctx context.Context, c Call, pool *Pool, targets []Replica, each func(i int, r Result)) []Result {
	if len(targets) == 0 {
		return nil // an empty only is every actor, the draining ones too
	}
	ids := make([]string, len(targets))
	for i, l := range targets {
		ids[i] = l.ID()
	}
	return pool.broadcastEach(ctx, c, each, ids...)
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
	// Target is what the replica was connected to (an upstream's URL, a
	// replica host's address), for a deployment that follows targets.
	Target string `json:"target,omitempty"`
	// Unsynced is set while the replica waits to take the deployment's
	// user_config (it refused it, or has not been given it yet).
	Unsynced bool `json:"waiting_for_user_config,omitempty"`
}

var (
	_ counted = (*Local)(nil)
	_ counted = (*hostReplica)(nil)
	_ counted = (*Upstream)(nil)
)

// Stats broadcasts MethodStats to every replica, the draining ones
// included, and returns their answers in pool order. A replica that does
// not answer (a stalled host) has its Error set and the proxy's own counts
// of it: the requests it holds slots for, its limit, its peak and the
// requests served.
func (d *Deployment) Stats(ctx context.Context) []ReplicaStatus {
	d.mu.Lock()
	pool := d.pool
	healthy := make(map[string]bool, len(d.replicas))
	unsynced := make(map[string]bool, len(d.unsync))
	for _, r := range d.replicas {
		healthy[r.ID()] = r.State() == StateRunning && d.failures[r] < 1 && !d.excluded[r]
		unsynced[r.ID()] = d.unsync[r]
	}
	byID := make(map[string]Replica, len(d.replicas)+len(d.retired))
	for _, r := range slices.Concat(d.replicas, d.retired) {
		byID[r.ID()] = r
	}
	target := make(map[string]string, len(d.targets))
	for r, t := range d.targets {
		target[r.ID()] = t
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
			// The proxy's own view rather than zeros: the controller's
			// state, and the slots it holds for the replica.
			if rep := byID[s.ID]; rep != nil {
				s.State = rep.State()
				if c, ok := rep.(counted); ok {
					s.Stats = statsOf(c)
				}
			}
		}
		// Health is the controller's view: a stats call that failed (a
		// stalled host, a deadline) is no health verdict.
		s.Healthy = healthy[s.ID] && (r.Err != nil || s.State == StateRunning)
		s.Target = target[s.ID]
		s.Unsynced = unsynced[s.ID]
		out[i] = s
	}
	return out
}

// Stop ends the health-check loop, takes every replica out of routing and
// drains them all through one broadcast, waiting up to ctx's deadline for
// their requests to finish, then stops them: a replica process gets
// SIGTERM and its own graceful_shutdown_timeout_s before SIGKILL, whatever
// ctx. It returns ctx's error if requests were still running at its
// deadline.
func (d *Deployment) Stop(ctx context.Context) error {
	d.cancel() // cuts short the starts in progress, so control frees soon
	d.control.Lock()
	d.stopped = true // no change adds to wg from now on
	d.control.Unlock()
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
	d.stopReplicas(ctx, all)
	return err
}

// waitIdle polls until l holds no request or ctx is done. Polling is fine:
// it runs only while stopping a replica.
func waitIdle(ctx context.Context, l interface{ Ongoing() int }) error {
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
