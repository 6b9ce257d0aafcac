package replica

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// slowReconf takes its time to reconfigure, ignoring ctx.
type slowReconf struct {
	delay time.Duration
	fail  bool
	seen  atomic.Value // the last user_config applied
}

func (*slowReconf) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (s *slowReconf) Reconfigure(_ context.Context, c json.RawMessage) error {
	time.Sleep(s.delay)
	if s.fail {
		return errors.New("no")
	}
	s.seen.Store(string(c))
	return nil
}

func startDeployment(t *testing.T, spec DeploymentSpec) *Deployment {
	t.Helper()
	spec.App, spec.Name = "app", "dep"
	spec.MaxOngoingRequests = max(spec.MaxOngoingRequests, 1)
	spec.GracefulShutdownTimeout = time.Second
	spec.HealthCheckTimeout = time.Second
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	return d
}

// A reconfigure that outlives its deadline is no rejection: the new
// config stays, and no replica is replaced for being slow.
func TestReconfigureDeadlineIsNotRejection(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{NumReplicas: 2, UserConfig: json.RawMessage(`{"v":1}`),
		Factory: func(json.RawMessage) (Handler, error) { return &slowReconf{delay: 200 * time.Millisecond}, nil }})
	before := d.Replicas()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Reconfigure(ctx, json.RawMessage(`{"v":2}`)); err != nil {
		t.Fatalf("Reconfigure past its deadline = %v, want no rejection", err)
	}
	if got := string(d.Spec().UserConfig); got != `{"v":2}` {
		t.Fatalf("user_config after a slow reconfigure = %s, want the new one", got)
	}
	after := d.Replicas()
	if len(after) != 2 || after[0] != before[0] || after[1] != before[1] {
		t.Fatal("slow replicas were replaced")
	}
}

// A user_config that is not a JSON object is refused by name before any
// replica sees it, as the admin API's PUT refuses it (Serve's is a dict).
func TestReconfigureNotAnObject(t *testing.T) {
	h := &slowReconf{}
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, UserConfig: json.RawMessage(`{"v":1}`),
		Factory: func(json.RawMessage) (Handler, error) { return h, nil }})
	for _, uc := range []string{``, ` `, `[1]`, `"v"`, `null`, `{"v":`, `{} {}`} {
		res, err := d.Reconfigure(context.Background(), json.RawMessage(uc))
		if !errors.Is(err, ErrNotAnObject) || res != nil {
			t.Errorf("Reconfigure(%q) = %v, %v; want ErrNotAnObject", uc, res, err)
		}
	}
	if got := string(d.Spec().UserConfig); got != `{"v":1}` || h.seen.Load() != nil {
		t.Fatalf("user_config %s, handler saw %v: want the old one, never called", got, h.seen.Load())
	}
}

// A deployment of targets keeps a replica whose reconfigure failed, as
// nothing here could start another, but out of routing: it is given the
// user_config again at each health round, and serves once it takes it.
func TestReconfigureFailureKeepsTargets(t *testing.T) {
	var n atomic.Int32
	first := &toggleReconf{}
	first.fail.Store(true)
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			h := first
			if n.Add(1) > 1 {
				h = &toggleReconf{}
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}})
	results, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":2}`))
	if err != nil || results[0].Err == nil || results[1].Err != nil {
		t.Fatalf("Reconfigure = %+v, %v", results, err)
	}
	if d.Replaces() || len(d.Replicas()) != 2 {
		t.Fatalf("replicas after a failed reconfigure: %d (Replaces %v), want 2 kept", len(d.Replicas()), d.Replaces())
	}
	time.Sleep(100 * time.Millisecond) // health rounds, whose checks pass
	if got := d.Running(); got != 1 {
		t.Fatalf("%d replicas routed while one holds an old user_config, want 1", got)
	}
	first.fail.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for d.Running() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the replica that took the user_config at a later round is not back in routing after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, _ := first.seen.Load().(string); got != `{"v":2}` {
		t.Fatalf("the replica back in routing holds %q, want the deployment's user_config", got)
	}
}

// A reconfigure while no replica is in routing, one still draining, is
// the config of the replicas to come: it had reached the draining one
// through a broadcast to "every actor" and panicked on its result, with
// the deployment's lock held (found by review).
func TestReconfigureWithOnlyADrainingReplica(t *testing.T) {
	h := &toggleReconf{}
	d := startDeployment(t, DeploymentSpec{Targets: []string{"h:1"},
		Connect: func(_ context.Context, _, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(target+"/a", h, 1, onRelease)}, nil
		}})
	release, ok := d.Replicas()[0].TryAcquire()
	if !ok {
		t.Fatal("no free slot")
	}
	defer release() // before Stop, which waits for the drain
	if err := d.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	// None to take it, and no factory to check it: nothing changes (a
	// review found any config taken then, for hosts to get unchecked).
	res, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":2}`))
	if !errors.Is(err, ErrUnreached) || len(res) != 0 || string(d.Spec().UserConfig) == `{"v":2}` {
		t.Fatalf("Reconfigure with no replica in routing: %v, %v, user_config %s; want ErrUnreached, nothing changed", res, err, d.Spec().UserConfig)
	}
	if got, _ := h.seen.Load().(string); got != "" {
		t.Errorf("the draining replica was reconfigured with %q", got)
	}
}

// toggleReconf is a handler whose Reconfigure fails while fail is set.
type toggleReconf struct {
	fail atomic.Bool
	seen atomic.Value // the last user_config applied
}

func (*toggleReconf) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (s *toggleReconf) Reconfigure(_ context.Context, c json.RawMessage) error {
	if s.fail.Load() {
		return errors.New("no")
	}
	s.seen.Store(string(c))
	return nil
}

// A replica host back from an outage, or new to the deployment, may hold
// the user_config it was started with: its actors take the deployment's
// before they take requests.
func TestJoiningReplicasGetTheUserConfig(t *testing.T) {
	handlers := map[string]*toggleReconf{}
	var mu sync.Mutex
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour, UserConfig: json.RawMessage(`{"v":1}`),
		Connect: func(_ context.Context, _, target string, onRelease func()) ([]Replica, error) {
			h := &toggleReconf{}
			mu.Lock()
			handlers[target] = h
			mu.Unlock()
			return []Replica{NewLocal(target+"/0", h, 1, onRelease)}, nil
		}})
	seen := func(target string) string {
		mu.Lock()
		defer mu.Unlock()
		s, _ := handlers[target].seen.Load().(string)
		return s
	}
	// One that joins is given the deployment's, whatever it was started
	// with.
	if err := d.SetTargets([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if got := seen("b"); got != `{"v":1}` {
		t.Fatalf("a replica joining got %q, want the deployment's user_config", got)
	}
	if _, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	if err := d.SetTargets([]string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if got := seen("c"); got != `{"v":2}` || d.Running() != 3 {
		t.Fatalf("a replica joining after a reconfigure holds %q (%d routed), want {\"v\":2} and 3", got, d.Running())
	}

	// A host back from an outage: out of routing until it has the config.
	a := d.Replicas()[0]
	handlers["a"].seen.Store("")
	d.ReportUnreachable(a, nil)
	d.Reconnected([]Replica{a})
	deadline := time.Now().Add(10 * time.Second)
	for d.Running() != 3 {
		if time.Now().After(deadline) {
			t.Fatal("a reconnected replica is not back in routing after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := seen("a"); got != `{"v":2}` {
		t.Fatalf("the reconnected replica holds %q, want the deployment's user_config", got)
	}
}

// A Scale cut short by its caller's deadline does not count as failed
// starts, and the starter finishes the job.
func TestScaleCutShortIsNotAFailure(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, MaxConstructorRetryCount: 1,
		Start: func(ctx context.Context, id string, onRelease func()) (Replica, error) {
			select { // a start that takes 100 ms
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			return NewLocal(id, Echo{}, 1, onRelease), nil
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = d.Scale(ctx, 3)
	deadline := time.Now().Add(10 * time.Second)
	for d.Running() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas running, want 3: the cut-short start counted as a failure", d.Running())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestChangesAfterStop(t *testing.T) {
	// The factory refuses every config but the first: a stopped
	// deployment says it is stopping, not that the config is bad.
	built := 0
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, Factory: func(json.RawMessage) (Handler, error) {
		if built++; built > 1 {
			return nil, errors.New("no more")
		}
		return Echo{}, nil
	}})
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.Scale(context.Background(), 2); !errors.Is(err, ErrStopped) {
		t.Fatalf("Scale after Stop = %v, want ErrStopped", err)
	}
	if _, err := d.Reconfigure(context.Background(), json.RawMessage(`{}`)); !errors.Is(err, ErrStopped) {
		t.Fatalf("Reconfigure after Stop = %v, want ErrStopped", err)
	}
}

// A health check that passed before a replica was reported unreachable
// does not bring it back when its result lands after the report; a check
// begun after the report does, and CheckHealthNow asks for one at once.
func TestStalePassKeepsUnreachableOut(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	r := d.Replicas()[0]
	routed := func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return !d.excluded[r]
	}
	before := time.Now()
	time.Sleep(time.Millisecond) // the report comes strictly after the check began
	d.ReportUnreachable(r, nil)
	d.mu.Lock()
	d.recordHealthLocked(r, nil, before)
	d.mu.Unlock()
	if routed() {
		t.Fatal("a pass from a check begun before the report brought the replica back")
	}
	d.CheckHealthNow()
	deadline := time.Now().Add(10 * time.Second)
	for !routed() {
		if time.Now().After(deadline) {
			t.Fatal("CheckHealthNow did not bring the replica back in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// A target that leaves and comes back while its replicas still drain (a
// replica host whose pod flapped during a long request) brings the same
// replica ids again: it is refused with an error until the drain is done,
// then taken, and nothing panics on the duplicate ids.
func TestSetTargetsBackWhileDraining(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{Targets: []string{"h:1"},
		Connect: func(_ context.Context, _, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(target+"/a", Echo{}, 1, onRelease)}, nil
		}})
	release, ok := d.Replicas()[0].TryAcquire() // a request in flight
	if !ok {
		t.Fatal("no slot")
	}
	if err := d.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	if err := d.SetTargets([]string{"h:1"}); err == nil || !strings.Contains(err.Error(), "still draining") {
		t.Fatalf("SetTargets back while draining = %v, want a still-draining error", err)
	}
	if n := len(d.Replicas()); n != 0 {
		t.Fatalf("%d replicas while the old one drains, want 0", n)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for d.SetTargets([]string{"h:1"}) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the target was not taken after its old replica drained")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rs := d.Replicas(); len(rs) != 1 || rs[0].ID() != "h:1/a" || rs[0].State() != StateRunning {
		t.Fatalf("replicas after the drain: %v", rs)
	}
}

// A replica still busy when its drain's time is up is stopped anyway, and
// the log line says how many requests (WebSockets, most likely) that cut.
func TestDrainTimeoutCountsRequestsCut(t *testing.T) {
	logs := &syncBuffer{}
	spec := DeploymentSpec{App: "app", Name: "dep", Targets: []string{"h:1"}, MaxOngoingRequests: 2,
		GracefulShutdownTimeout: 50 * time.Millisecond, HealthCheckTimeout: time.Second,
		Connect: func(_ context.Context, _, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(target+"/a", Echo{}, 2, onRelease)}, nil
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{Log: zerolog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	r := d.Replicas()[0]
	for range 2 { // two requests that never end
		release, ok := r.TryAcquire()
		if !ok {
			t.Fatal("no slot")
		}
		t.Cleanup(release)
	}
	if err := d.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the drain's end", func() bool { return strings.Contains(logs.String(), "stopped anyway") })
	if !strings.Contains(logs.String(), `"requests_in_flight":2`) {
		t.Errorf("log: %s", logs.String())
	}
}

// A target that takes long to connect does not hold back the removal of
// those gone while others are left to route to, and Stop cuts its connect
// short.
func TestSetTargetsSlowConnect(t *testing.T) {
	connecting := make(chan struct{})
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "slow" {
				close(connecting)
				<-ctx.Done() // a host that accepts and never says hello
				return nil, ctx.Err()
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"b", "slow"}) }()
	<-connecting
	if n := len(d.Replicas()); n != 1 {
		t.Fatalf("%d replicas while the new target connects, want b's alone: the gone one out already", n)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop waited for the connect")
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("SetTargets = %v, want the connect cut short", err)
	}
}

// gate holds a connect until the test opens it: reached is closed when
// the connect gets there.
type gate struct {
	reached, opened chan struct{}
	once            sync.Once
}

func newGate() *gate { return &gate{reached: make(chan struct{}), opened: make(chan struct{})} }

// wait is the connect's side: it says it got there, then waits until the
// gate opens or ctx ends.
func (g *gate) wait(ctx context.Context) error {
	close(g.reached)
	select {
	case <-g.opened:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// open lets the connect through; once or more.
func (g *gate) open() { g.once.Do(func() { close(g.opened) }) }

// A target that takes long to connect (a replica host that accepts and
// never says hello, dialled again at every DNS answer while it is listed)
// holds up no reconfigure meanwhile: the dial runs without the
// deployment's control. Before, each Reconfigure or PUT waited for the
// dial's timeout, 5 s.
func TestSetTargetsDialHoldsNoControl(t *testing.T) {
	slow := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "slow" {
				if err := slow.wait(ctx); err != nil {
					return nil, err
				}
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "slow"}) }()
	<-slow.reached
	reconfigured := make(chan error, 1)
	go func() {
		_, err := d.Reconfigure(context.Background(), json.RawMessage(`{"k": 1}`))
		reconfigured <- err
	}()
	select {
	case <-reconfigured: // refused (Echo takes no user_config), but answered
	case <-done:
		t.Fatal("SetTargets returned before its slow target was let connect")
	case <-time.After(10 * time.Second):
		t.Fatal("Reconfigure waited for a target's dial")
	}
	slow.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(d.Replicas()); n != 2 {
		t.Fatalf("%d replicas once the slow target connected, want 2", n)
	}
}

// Each target of a list joins as soon as its own dial is done: before, a
// tester's healthy hosts waited 5 s for a mute one listed beside them,
// every request a 503 meanwhile.
func TestSetTargetsJoinAsDialled(t *testing.T) {
	mute := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "mute" {
				if err := mute.wait(ctx); err != nil {
					return nil, err
				}
				return nil, errors.New("handshake: no answer")
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "mute", "b"}) }()
	<-mute.reached
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(targetsOf(d), "b") {
		if time.Now().After(deadline) {
			mute.open()
			t.Fatalf("b not in routing while the mute target's dial waits: %v", targetsOf(d))
		}
		time.Sleep(5 * time.Millisecond)
	}
	mute.open()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "handshake: no answer") {
		t.Fatalf("SetTargets = %v, want the mute target's error", err)
	}
	if u := d.Unconnected(); len(u) != 1 || u[0].Target != "mute" {
		t.Fatalf("Unconnected() = %v, want the mute target", u)
	}
}

// A target that the health loop's repair connected while a list dialled it
// too is connected once.
func TestSetTargetsConnectedMeanwhileOnce(t *testing.T) {
	listDial := newGate()
	var calls atomic.Int32
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "b" && calls.Add(1) == 1 {
				if err := listDial.wait(ctx); err != nil {
					return nil, err
				}
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "b"}) }()
	<-listDial.reached
	renewed := make(chan bool, 1)
	go func() { renewed <- d.renewTarget(context.Background(), "b") }()
	select {
	case ok := <-renewed:
		if !ok {
			t.Fatal("the repair did not connect b while the list's dial of it waited")
		}
	case <-time.After(10 * time.Second):
		listDial.open()
		t.Fatal("the repair waited for the list's dial")
	}
	listDial.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(d.Replicas()); n != 2 {
		t.Fatalf("%d replicas, want a's and b's once", n)
	}
}

// A target the repair failed to connect while a list dialled others stays
// in Unconnected: the list replaces only its own targets' entries.
func TestSetTargetsKeepsRepairsUnconnected(t *testing.T) {
	var xCalls atomic.Int32
	slow := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "x"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			switch {
			case target == "x" && xCalls.Add(1) > 1:
				return nil, errors.New("x: connection refused")
			case target == "slow":
				if err := slow.wait(ctx); err != nil {
					return nil, err
				}
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "x", "slow"}) }()
	<-slow.reached
	if d.renewTarget(context.Background(), "x") {
		t.Fatal("x connected again, want refused")
	}
	slow.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if u := d.Unconnected(); len(u) != 1 || u[0].Target != "x" {
		t.Fatalf("Unconnected() = %v, want x, which has no replica", u)
	}
}

// A target a list connected is not replaced by a repair asked for while
// it dialled (the repair's own dial of it failed meanwhile).
func TestSetTargetsConnectedIsNotRenewed(t *testing.T) {
	var bCalls atomic.Int32
	listDial := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "b" {
				switch bCalls.Add(1) {
				case 1, 3: // down at the first list, and for the repair's retry
					return nil, errors.New("b: connection refused")
				case 2: // the next list's: slow, then up
					if err := listDial.wait(ctx); err != nil {
						return nil, err
					}
				}
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	if err := d.SetTargets([]string{"a", "b"}); err == nil {
		t.Fatal("b connected at the first list, want refused")
	}
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "b", "c"}) }()
	<-listDial.reached
	d.mu.Lock()
	clear(d.renew) // as the repair does before its retries
	d.mu.Unlock()
	if d.renewTarget(context.Background(), "b") {
		t.Fatal("the repair connected b, want refused")
	}
	listDial.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	before := d.Replicas()
	d.repair(context.Background())
	if after := d.Replicas(); !slices.Equal(before, after) {
		t.Fatalf("replicas %v after the next repair, want %v: b's, connected by the list, replaced", after, before)
	}
}

// A list replaced whole (a DNS answer whose one pod was replaced between
// two refreshes) keeps the old replicas in routing until the new ones are
// connected: before, none were routable meanwhile, and every request got
// 503 (an exploratory run saw 28 of 616 during reloads that swapped a
// one-upstream list).
func TestSetTargetsReplacedWholeMakesBeforeBreak(t *testing.T) {
	c := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "c" {
				if err := c.wait(ctx); err != nil {
					return nil, err
				}
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	old := d.Replicas()
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"c"}) }()
	<-c.reached
	if got := d.Replicas(); len(got) != 1 || got[0] != old[0] {
		t.Fatalf("replicas while the new target connects: %v, want the old one still routed", got)
	}
	c.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := d.Replicas(); len(got) != 1 || got[0] == old[0] {
		t.Fatalf("replicas after the new target connected: %v, want the new one alone", got)
	}
}

// A round in which every new target fails to connect changes nothing, so
// the router is told nothing.
func TestSetTargetsFailedRoundPublishesNothing(t *testing.T) {
	var publishes atomic.Int32
	d, err := NewDeployment(context.Background(), DeploymentSpec{App: "app", Name: "dep", MaxOngoingRequests: 1, Targets: []string{"a"},
		GracefulShutdownTimeout: time.Second, HealthCheckTimeout: time.Second,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "down" {
				return nil, errors.New("connection refused")
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}}, Hooks{OnChange: func([]Handle) { publishes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	before := publishes.Load()
	for range 3 {
		if err := d.SetTargets([]string{"a", "down"}); err == nil {
			t.Fatal("SetTargets with a target down gave no error")
		}
	}
	if n := publishes.Load() - before; n != 0 {
		t.Fatalf("%d publishes for rounds that changed nothing, want 0", n)
	}
}

// Scaling up starts the missing replica processes at once, not one after
// another: each start here returns only once all four are in progress.
func TestScaleStartsProcessesAtOnce(t *testing.T) {
	var inStart atomic.Int32
	allIn := make(chan struct{})
	var once sync.Once
	first := true
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1,
		Start: func(ctx context.Context, id string, onRelease func()) (Replica, error) {
			if first { // the replica of NewDeployment
				first = false
				return NewLocal(id, Echo{}, 1, onRelease), nil
			}
			if inStart.Add(1) == 4 {
				once.Do(func() { close(allIn) })
			}
			select {
			case <-allIn:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Second):
				return nil, errors.New("the other starts never began: started one at a time")
			}
			return NewLocal(id, Echo{}, 1, onRelease), nil
		}})
	if err := d.Scale(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	if n := d.Running(); n != 5 {
		t.Fatalf("%d running after Scale(5), want 5", n)
	}
}

// A round of parallel starts that started some is progress: its failures
// are retried and do not count towards max_constructor_retry_count, so a
// few failing starts among many never make the deployment give up.
func TestScaleSomeStartsFail(t *testing.T) {
	var calls atomic.Int32
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, MaxConstructorRetryCount: 2,
		Start: func(_ context.Context, id string, onRelease func()) (Replica, error) {
			if calls.Add(1)%5 == 0 {
				return nil, errors.New("a flaky start")
			}
			return NewLocal(id, Echo{}, 1, onRelease), nil
		}})
	_ = d.Scale(context.Background(), 17) // its first round had failures
	deadline := time.Now().Add(10 * time.Second)
	for d.Running() != 17 {
		if time.Now().After(deadline) {
			d.mu.Lock()
			gaveUp := d.gaveUp
			d.mu.Unlock()
			t.Fatalf("%d of 17 running (gave up: %v): the failed starts were counted as rounds that started none", d.Running(), gaveUp)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exitingLocal is an in-process replica that can "exit", as a process.
type exitingLocal struct {
	*Local
	exited chan struct{}
}

func (e *exitingLocal) Exited() <-chan struct{} { return e.exited }

// A replica that exits after the deployment gave up starting the others
// is replaced all the same, with one more series of rounds: before, its
// exit was logged "replacing it" and nothing started, the deployment left
// with none until num_replicas was set again (a tester: the program was
// back by then).
func TestExitAfterGivingUpStartsAgain(t *testing.T) {
	var calls atomic.Int32
	var back atomic.Bool
	first := make(chan *exitingLocal, 1)
	d := startDeployment(t, DeploymentSpec{NumReplicas: 2, MaxConstructorRetryCount: 2,
		Start: func(_ context.Context, id string, onRelease func()) (Replica, error) {
			if calls.Add(1) == 1 {
				r := &exitingLocal{Local: NewLocal(id, Echo{}, 1, onRelease), exited: make(chan struct{})}
				first <- r
				return r, nil
			}
			if !back.Load() {
				return nil, errors.New("fork/exec ./server: no such file or directory")
			}
			return NewLocal(id, Echo{}, 1, onRelease), nil
		}})
	deadline := time.Now().Add(10 * time.Second)
	for !d.GaveUp() {
		if time.Now().After(deadline) {
			t.Fatal("the deployment never gave up starting its second replica")
		}
		time.Sleep(10 * time.Millisecond)
	}
	back.Store(true)
	close((<-first).exited)
	deadline = time.Now().Add(10 * time.Second)
	for d.Running() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d running 10 s after a replica exited, the program back; want 2 (gave up: %v)", d.Running(), d.GaveUp())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Settled is for good once reached: a deployment that gave up stays
// settled when a Scale starts the attempts again, and one that follows
// targets is settled at Start even with none.
func TestSettledLatches(t *testing.T) {
	var starts atomic.Int32
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, MaxConstructorRetryCount: 1,
		Start: func(context.Context, string, func()) (Replica, error) {
			starts.Add(1)
			return nil, errors.New("broken")
		}})
	// With a limit of 1 the first round, in NewDeployment, is the last.
	if !d.Settled() || starts.Load() != 1 {
		t.Fatalf("after one failed round with max_constructor_retry_count 1: settled %v, %d starts; want settled after 1", d.Settled(), starts.Load())
	}
	_ = d.Scale(context.Background(), 2) // clears gaveUp, fails again
	if !d.Settled() {
		t.Fatal("Settled went back to false after a Scale")
	}
	empty := startDeployment(t, DeploymentSpec{Connect: func(context.Context, string, string, func()) ([]Replica, error) {
		return nil, errors.New("unused")
	}})
	if !empty.Settled() {
		t.Fatal("a deployment of targets with none is not settled at Start")
	}
}

// noop is a handler that answers nothing.
type noop struct{}

func (noop) ServeHTTP(http.ResponseWriter, *http.Request) {}

// targetsOf is the targets of d's replicas in routing, sorted.
func targetsOf(d *Deployment) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, r := range d.replicas {
		out = append(out, d.targets[r])
	}
	slices.Sort(out)
	return out
}

// waitTargets waits up to 10 s for d's targets to be want.
func waitTargets(t *testing.T, d *Deployment, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(targetsOf(d), want) {
		if time.Now().After(deadline) {
			t.Fatalf("targets %v after 10 s, want %v (unconnected %v)", targetsOf(d), want, d.Unconnected())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A target replaced whose new connection fails once is tried again at
// the next health round: a static list has nothing else to bring it back
// (found by review).
func TestReplaceTargetRetriesAFailedConnect(t *testing.T) {
	var failA atomic.Bool
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "a" && failA.Load() {
				return nil, errors.New("host down again")
			}
			return []Replica{NewLocal(id, noop{}, 1, onRelease)}, nil
		}})
	failA.Store(true)
	d.ReplaceTarget("a")
	waitTargets(t, d, "b")
	time.Sleep(100 * time.Millisecond) // rounds that fail to connect it
	failA.Store(false)
	waitTargets(t, d, "a", "b")
}

// A target a list brings in that cannot be connected yet (a replica host
// not up when the reload came) is tried again at each health check: it
// had waited for the next reload (found by an exploratory run).
func TestSetTargetsRetriesAFailedConnect(t *testing.T) {
	var downB atomic.Bool
	downB.Store(true)
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "b" && downB.Load() {
				return nil, errors.New("connection refused")
			}
			return []Replica{NewLocal(id, noop{}, 1, onRelease)}, nil
		}})
	if err := d.SetTargets([]string{"a", "b"}); err == nil {
		t.Fatal("SetTargets with b down gave no error")
	}
	time.Sleep(100 * time.Millisecond) // health rounds that fail to connect it
	if got := targetsOf(d); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("targets %v while b is down, want a alone", got)
	}
	downB.Store(false)
	waitTargets(t, d, "a", "b")
	if u := d.Unconnected(); len(u) != 0 {
		t.Fatalf("Unconnected() = %v once b connected", u)
	}
}

// A list set while a replacement waits for the old replicas' drain stands:
// the replacement connects its target only if the list still has it, and
// touches no other (found by review).
func TestReplaceTargetKeepsAListSetMeanwhile(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(target+"/0", noop{}, 1, onRelease)}, nil
		}})
	var ra Replica
	for _, r := range d.Replicas() {
		if r.ID() == "a/0" {
			ra = r
		}
	}
	release, ok := ra.TryAcquire() // a request in flight keeps a's old replica draining
	if !ok {
		t.Fatal("no slot")
	}
	d.ReplaceTarget("a")
	waitTargets(t, d, "b")
	if err := d.SetTargets([]string{"a", "c"}); err == nil {
		t.Fatal("a's old replica drains, but a was connected again at once")
	}
	release()
	waitTargets(t, d, "a", "c")
}

// gatedCheck is a handler whose health check waits at gate, when set, and
// whose Reconfigure fails while fail is set.
type gatedCheck struct {
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
	fail    atomic.Bool
}

func (*gatedCheck) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (g *gatedCheck) CheckHealth(context.Context) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-gate
	}
	return nil
}
func (g *gatedCheck) Reconfigure(context.Context, json.RawMessage) error {
	if g.fail.Load() {
		return errors.New("no")
	}
	return nil
}

// A health check in flight when a reconfigure fails does not bring the
// replica back into routing with its old config (found by review).
func TestCheckInFlightKeepsUnsyncedOut(t *testing.T) {
	first := &gatedCheck{entered: make(chan struct{}, 1)}
	var n atomic.Int32
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"}, HealthCheckPeriod: 50 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			h := first
			if n.Add(1) > 1 {
				h = &gatedCheck{}
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}})
	gate := make(chan struct{})
	first.mu.Lock()
	first.gate = gate
	first.mu.Unlock()
	first.fail.Store(true)
	<-first.entered // a round is checking a
	if _, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	first.mu.Lock()
	first.gate = nil
	first.mu.Unlock()
	close(gate)
	time.Sleep(100 * time.Millisecond) // the check passes; later rounds' syncs fail
	if got := d.Running(); got != 1 {
		t.Errorf("%d replicas routed, want 1: the one with the old user_config is back", got)
	}
}

// countReconf is a handler whose Reconfigure always fails, counted.
type countReconf struct{ calls atomic.Int32 }

func (*countReconf) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (c *countReconf) Reconfigure(context.Context, json.RawMessage) error {
	c.calls.Add(1)
	return errors.New("no")
}

// A replica that keeps refusing the user_config is tried again once a
// health period, not at once and again (found by review of the repairs).
func TestFailingSyncWaitsForThePeriod(t *testing.T) {
	bad := &countReconf{}
	var n atomic.Int32
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a", "b"}, HealthCheckPeriod: 100 * time.Millisecond,
		Connect: func(_ context.Context, id, _ string, onRelease func()) ([]Replica, error) {
			if n.Add(1) == 1 {
				return []Replica{NewLocal(id, bad, 1, onRelease)}, nil
			}
			return []Replica{NewLocal(id, &toggleReconf{}, 1, onRelease)}, nil
		}})
	if _, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if got := bad.calls.Load(); got > 15 {
		t.Errorf("%d reconfigures in a second with a health period of 100 ms: tried again at once", got)
	}
	unsynced := 0
	for _, st := range d.Stats(context.Background()) {
		if st.Unsynced {
			unsynced++
		}
	}
	if unsynced != 1 {
		t.Errorf("%d replicas shown waiting for the user_config, want the one refusing it", unsynced)
	}
}

// An in-process replica whose reconfigure did not answer in time, then
// failed when given the config again, is replaced, not kept out of
// routing for ever.
func TestTimedOutThenFailedReconfigureIsReplaced(t *testing.T) {
	var built atomic.Int32
	first := &slowReconf{delay: 300 * time.Millisecond, fail: true}
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, HealthCheckPeriod: 50 * time.Millisecond,
		Factory: func(json.RawMessage) (Handler, error) {
			if built.Add(1) == 1 {
				return first, nil
			}
			return &toggleReconf{}, nil
		}})
	old := d.Replicas()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _ = d.Reconfigure(ctx, json.RawMessage(`{"v":2}`))
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs := d.Replicas()
		if len(rs) == 1 && rs[0] != old && d.Running() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas %v (%d running) after 10 s, want the one that failed replaced", rs, d.Running())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A list target that does not answer, retried at each health check, is
// dialled without the deployment's control lock: a reconfigure, reload or
// scale waits for no connect of it (found by review: a Reconfigure had
// waited out the whole connect).
func TestDeadListTargetHoldsNoControl(t *testing.T) {
	const hang = 2 * time.Second // stands for hostConnectTimeout (10 s)
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "dead" {
				select {
				case <-time.After(hang):
				case <-ctx.Done():
				}
				return nil, errors.New("no connection before the deadline")
			}
			return []Replica{NewLocal(id, noop{}, 1, onRelease)}, nil
		}})
	_ = d.SetTargets([]string{"a", "dead"}) // waits hang once: expected
	time.Sleep(200 * time.Millisecond)      // a repair pass is connecting "dead" now
	var worst time.Duration
	for range 3 {
		start := time.Now()
		_, _ = d.Reconfigure(context.Background(), json.RawMessage(`{}`)) // needs control only briefly
		worst = max(worst, time.Since(start))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a Reconfigure took up to %v", worst)
	if worst > hang/2 {
		t.Errorf("Reconfigure waited %v on a repair pass's connect of a dead list target", worst)
	}
}

// A user_config the factory refuses is refused before any replica sees
// it: replicas that failed its reconfigure were replaced by ones that
// could never start (found by a tester).
func TestReconfigureFactoryRefuses(t *testing.T) {
	h := &slowReconf{}
	d := startDeployment(t, DeploymentSpec{NumReplicas: 2, UserConfig: json.RawMessage(`{"v":1}`),
		Factory: func(uc json.RawMessage) (Handler, error) {
			if strings.Contains(string(uc), "bad") {
				return nil, errors.New("no such model")
			}
			if strings.Contains(string(uc), "panic") {
				panic("model file is corrupt")
			}
			return h, nil
		}})
	before := d.Replicas()
	res, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":"bad"}`))
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "factory refuses it: no such model") || res != nil {
		t.Fatalf("Reconfigure to what the factory refuses = %v, %v", res, err)
	}
	// A factory's panic is a refusal too, not a crash of the caller (the
	// reload goroutine, the admin API).
	res, err = d.Reconfigure(context.Background(), json.RawMessage(`{"v":"panic"}`))
	var pe *PanicError
	if !errors.Is(err, ErrRejected) || !errors.As(err, &pe) || !strings.Contains(err.Error(), "model file is corrupt") || res != nil {
		t.Fatalf("Reconfigure to what the factory panics on = %v, %v", res, err)
	}
	if got := string(d.Spec().UserConfig); got != `{"v":1}` || h.seen.Load() != nil || !slices.Equal(d.Replicas(), before) {
		t.Fatalf("user_config %s, a replica saw %v: want nothing changed", got, h.seen.Load())
	}
}

// A user_config for a handler that takes none, and that its factory
// refuses besides, is refused with both reasons: the factory's names the
// field (found by a tester: the answer said only the first).
func TestReconfigureNotReconfigurableNamesTheFactorysReason(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, Factory: NewEcho})
	_, err := d.Reconfigure(context.Background(), json.RawMessage(`{"a":1}`))
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrNotReconfigurable) || !strings.Contains(err.Error(), `unknown field "a"`) {
		t.Fatalf("Reconfigure of echo to {\"a\":1} = %v; want it rejected, not reconfigurable, naming the unknown field", err)
	}
}

// A factory that takes its time checking a new user_config (a model to
// load) does not hold up Stop: it runs outside the deployment's control
// lock, and the Reconfigure then finds the deployment stopped.
func TestReconfigureSlowFactoryDoesNotHoldUpStop(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := &slowReconf{}
	d := startDeployment(t, DeploymentSpec{NumReplicas: 1, UserConfig: json.RawMessage(`{"v":1}`),
		Factory: func(uc json.RawMessage) (Handler, error) {
			if strings.Contains(string(uc), "slow") {
				close(entered)
				<-release
			}
			return h, nil
		}})
	done := make(chan error, 1)
	go func() {
		_, err := d.Reconfigure(context.Background(), json.RawMessage(`{"v":"slow"}`))
		done <- err
	}()
	<-entered
	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- d.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Logf("Stop took %v while the factory checked", time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("Stop = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Stop waited for the factory's check of a Reconfigure")
	}
	close(release)
	if err := <-done; !errors.Is(err, ErrStopped) {
		t.Fatalf("Reconfigure that outlived Stop = %v, want ErrStopped", err)
	}
	if h.seen.Load() != nil {
		t.Fatalf("a replica saw the config after Stop: %v", h.seen.Load())
	}
}

// statsFailing is a replica whose stats call fails, as a stalled host's
// does.
type statsFailing struct{ *Local }

func (s statsFailing) Call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	if method == MethodStats {
		return nil, context.DeadlineExceeded
	}
	return s.Local.Call(ctx, method, payload)
}

// A replica that does not answer its stats call is shown with the proxy's
// own counts of it, not zeros (a tester: a stalled host's replicas read
// ongoing 0, served 0 and max_ongoing_requests 0 while 8 requests were on
// them).
func TestStatsOfAReplicaThatDoesNotAnswer(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour,
		Connect: func(_ context.Context, id, _ string, onRelease func()) ([]Replica, error) {
			return []Replica{statsFailing{NewLocal(id, handlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), 3, onRelease)}}, nil
		}})
	h := d.Replicas()[0]
	release, ok := h.TryAcquire()
	if !ok {
		t.Fatal("no slot")
	}
	defer release()
	st := d.Stats(context.Background())
	if len(st) != 1 || st[0].Error == "" || st[0].Ongoing != 1 || st[0].MaxOngoing != 3 || st[0].Peak != 1 || st[0].State != StateRunning {
		t.Errorf("stats %+v, want its error and the proxy's counts: 1 ongoing of 3, peak 1, RUNNING", st)
	}
}
