package replica

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A target whose list dial failed, connected by the health loop's repair
// while the list still waits for a slower target, is no failure of the
// list's when it ends: it was reported unconnected and set to be renewed,
// and the next repair replaced its working replicas (a review).
func TestSetTargetsFailureConnectedMeanwhile(t *testing.T) {
	var xCalls atomic.Int32
	mute := newGate()
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			switch target {
			case "x":
				if xCalls.Add(1) == 1 {
					return nil, errors.New("x: connection refused")
				}
			case "mute":
				if err := mute.wait(ctx); err != nil {
					return nil, err
				}
				return nil, errors.New("mute: handshake: no answer")
			}
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "x", "mute"}) }()
	<-mute.reached
	for xCalls.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // x's failed dial joined (its batch)
	if !d.renewTarget(context.Background(), "x") {
		t.Fatal("repair did not connect x")
	}
	var xReplica Replica
	d.mu.Lock()
	for _, r := range d.replicas {
		if d.targets[r] == "x" {
			xReplica = r
		}
	}
	d.mu.Unlock()
	t.Logf("x connected by the repair: %s; targets %v", xReplica.ID(), targetsOf(d))
	mute.open()
	err := <-done
	t.Logf("SetTargets = %v", err)
	d.mu.Lock()
	renewX := d.renew["x"]
	d.mu.Unlock()
	t.Logf("Unconnected() = %v; renew[x] = %v", d.Unconnected(), renewX)
	if renewX || strings.Contains(err.Error(), "x: connection refused") {
		// What the next health round's repair does with it (repair
		// calls renewTarget for each target in renew):
		d.renewTarget(context.Background(), "x")
		d.mu.Lock()
		stillIn := false
		for _, r := range d.replicas {
			if r == xReplica {
				stillIn = true
			}
		}
		d.mu.Unlock()
		t.Errorf("x, connected and serving, reported failed by the list (renew[x]=%v); after the next repair its replica %s still in routing: %v (targets %v)", renewX, xReplica.ID(), stillIn, targetsOf(d))
	}
}

// stopCounted is a replica that counts its stops.
type stopCounted struct {
	Replica
	stopped *atomic.Int32
}

func (s stopCounted) Stop(context.Context) error { s.stopped.Add(1); return nil }

// Stop while a list's slow dial runs: what it brings after is dropped and
// stopped once, SetTargets returns, nothing is added.
func TestSetTargetsStopWhileTargetsJoin(t *testing.T) {
	slow := newGate()
	var stops atomic.Int32
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "slow" {
				close(slow.reached)
				<-slow.opened // ignores ctx: a dial that ends late
			}
			return []Replica{stopCounted{NewLocal(id, Echo{}, 1, onRelease), &stops}}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "b", "slow"}) }()
	<-slow.reached
	waitTargets(t, d, "a", "b")
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := stops.Load()
	slow.open()
	select {
	case err := <-done:
		t.Logf("SetTargets = %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("SetTargets did not return after Stop")
	}
	if stops.Load() != before+1 {
		t.Errorf("slow's late replica stopped %d times, want once", stops.Load()-before)
	}
	if got := targetsOf(d); len(got) != 2 {
		t.Errorf("targets %v after Stop", got)
	}
}

// joinGatedCheck is a handler whose health check waits at a gate (or for its
// context's end), and says when it answered.
type joinGatedCheck struct {
	g        *gate
	answered *atomic.Bool
}

func (joinGatedCheck) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (h joinGatedCheck) CheckHealth(ctx context.Context) error {
	defer h.answered.Store(true)
	return h.g.wait(ctx)
}

// Each replica of a list joins routing as its own check on joining
// passes: an upstream that accepted and never answered held the others of
// its list out of routing until its check's timeout.
func TestJoinCheckHoldsNoOtherBack(t *testing.T) {
	mute := newGate()
	var answered atomic.Bool
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			var h Handler = Echo{}
			switch target {
			case "mute":
				h = joinGatedCheck{g: mute, answered: &answered}
			case "b":
				<-mute.reached // dialled after the mute one is checked
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "mute", "b"}) }()
	<-mute.reached
	eventually(t, "b in routing", func() bool { return slices.Contains(routedTargets(d), "b") })
	if answered.Load() {
		t.Fatal("b joined routing only once the mute target's check had answered")
	}
	if slices.Contains(routedTargets(d), "mute") {
		t.Fatal("the mute target in routing before its check answered")
	}
	mute.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mute target in routing once its check passed", func() bool { return slices.Contains(routedTargets(d), "mute") })
}

// failingGatedCheck's health check waits at a gate, then fails.
type failingGatedCheck struct{ g *gate }

func (failingGatedCheck) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (h failingGatedCheck) CheckHealth(ctx context.Context) error {
	if err := h.g.wait(ctx); err != nil {
		return err
	}
	return errors.New("bad: unhealthy")
}

// A replica whose check on joining is in flight when Start runs (a
// discovery's first answer comes beside the proxy's start) is not put in
// routing by Start, and its failed check keeps it out: a review found it
// routed, never having passed a check.
func TestStartDuringJoinCheck(t *testing.T) {
	g := newGate()
	spec := DeploymentSpec{App: "app", Name: "dep", Targets: []string{"a"}, HealthCheckPeriod: time.Hour,
		HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second, MaxOngoingRequests: 1,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			var h Handler = Echo{}
			if target == "bad" {
				h = failingGatedCheck{g: g}
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "bad"}) }()
	<-g.reached // bad is in d.replicas, StateStarting, its check in flight
	d.Start()
	g.open() // its check fails
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if slices.Contains(routedTargets(d), "bad") {
		t.Fatalf("bad in routing though its check on joining failed: routed %v", routedTargets(d))
	}
}

// Stop during a check on joining ends it, and routes nothing after.
func TestStopDuringJoinCheck(t *testing.T) {
	mute := newGate()
	var answered atomic.Bool
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			var h Handler = Echo{}
			if target == "mute" {
				h = joinGatedCheck{g: mute, answered: &answered}
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "mute"}) }()
	<-mute.reached
	start := time.Now()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("SetTargets after Stop = %v (%v)", err, time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("SetTargets still waiting after Stop")
	}
	if got := routedTargets(d); len(got) != 0 {
		t.Fatalf("routed %v after Stop", got)
	}
}

// With no health checks, a joining replica is in routing at once.
func TestJoinWithNoHealthPeriod(t *testing.T) {
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"},
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			return []Replica{NewLocal(id, Echo{}, 1, onRelease)}, nil
		}})
	if err := d.SetTargets([]string{"b"}); err != nil {
		t.Fatal(err)
	}
	if got := routedTargets(d); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("routed %v", got)
	}
}

// A reconfigure refused by a replica whose join check is in flight keeps
// it out of routing once its check passes.
func TestReconfigureDuringJoinCheck(t *testing.T) {
	mute := newGate()
	var answered atomic.Bool
	d := startDeployment(t, DeploymentSpec{Targets: []string{"a"}, HealthCheckPeriod: time.Hour,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			var h Handler = reconfEcho{}
			if target == "mute" {
				h = joinGatedCheck{g: mute, answered: &answered} // no Reconfigurer: refuses
			}
			return []Replica{NewLocal(id, h, 1, onRelease)}, nil
		}})
	done := make(chan error, 1)
	go func() { done <- d.SetTargets([]string{"a", "mute"}) }()
	<-mute.reached
	res, err := d.Reconfigure(context.Background(), json.RawMessage(`{"x":1}`))
	t.Logf("reconfigure: %v %v", res, err)
	mute.open()
	<-done
	if slices.Contains(routedTargets(d), "mute") {
		t.Fatalf("mute routed after refusing the user_config: %v", routedTargets(d))
	}
}

type reconfEcho struct{ Echo }

func (reconfEcho) Reconfigure(context.Context, json.RawMessage) error { return nil }
