package replica

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// stopRecorder is a replica that records its Stop's context.
type stopRecorder struct {
	*Local
	stopped chan error // ctx.Err() when Stop was called
}

func (s *stopRecorder) Stop(ctx context.Context) error {
	s.stopped <- ctx.Err()
	return nil
}

// A retired replica whose drain used up graceful_shutdown_timeout_s is
// still stopped with a live context: a process gets its SIGTERM grace, not
// SIGKILL at once (found by review).
func TestRetiredReplicaStopHasItsOwnGrace(t *testing.T) {
	spec := DeploymentSpec{App: "a", Name: "d", NumReplicas: 2, MaxOngoingRequests: 2,
		GracefulShutdownTimeout: 200 * time.Millisecond, HealthCheckTimeout: time.Second, HealthCheckPeriod: time.Hour,
		Start: func(ctx context.Context, id string, onRelease func()) (Replica, error) {
			return &stopRecorder{Local: NewLocal(id, http.NotFoundHandler(), 2, onRelease), stopped: make(chan error, 1)}, nil
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	defer d.Stop(context.Background())
	rs := d.Replicas()
	newest := rs[len(rs)-1].(*stopRecorder)
	release, ok := newest.TryAcquire() // a request that outlives the grace period
	if !ok {
		t.Fatal("no slot")
	}
	defer release()
	if err := d.Scale(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-newest.stopped:
		if err != nil {
			t.Errorf("the retired replica was stopped with a spent context (%v)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retired replica was not stopped")
	}
}

// A deployment whose second target cannot be connected to fails, and
// closes the connection it made to the first (found by review).
func TestNewDeploymentFailureClosesConnected(t *testing.T) {
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {}), Replicas: 1, MaxOngoing: 1})
	var conns []*HostConn
	spec := DeploymentSpec{App: "a", Name: "d", MaxOngoingRequests: 1, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second,
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			hc, err := ConnectHost(ctx, target, HostOptions{OnRelease: onRelease})
			if err != nil {
				return nil, err
			}
			conns = append(conns, hc)
			return hc.Replicas(), nil
		},
		Targets: []string{addr, "127.0.0.1:1"}}
	if _, err := NewDeployment(context.Background(), spec, Hooks{}); err == nil {
		t.Fatal("NewDeployment with an unreachable host succeeded")
	}
	if len(conns) != 1 {
		t.Fatalf("%d connections made, want 1", len(conns))
	}
	if conns[0].Connected() {
		conns[0].Close()
		t.Fatal("the first host's connection is still open after NewDeployment failed")
	}
}

// Scaling in process to 10000 replicas and back is one pool rebuild per
// batch, not per replica: it had taken 53 s and 12 GiB down from 10000
// (found by an exploratory run). The bound is generous, for -race.
func TestScaleTenThousandAndBack(t *testing.T) {
	spec := DeploymentSpec{App: "a", Name: "d", NumReplicas: 1, MaxOngoingRequests: 5,
		GracefulShutdownTimeout: time.Second, HealthCheckTimeout: time.Second, HealthCheckPeriod: time.Hour,
		Factory: func(json.RawMessage) (Handler, error) { return NewStatic(nil) }}
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	defer d.Stop(context.Background())
	for _, n := range []int{10000, 1} {
		start := time.Now()
		if err := d.Scale(context.Background(), n); err != nil {
			t.Fatalf("Scale(%d): %v", n, err)
		}
		for len(d.Stats(context.Background())) != n { // the drained ones included
			if time.Since(start) > 30*time.Second {
				t.Fatalf("Scale(%d): %d replicas after 30 s", n, len(d.Stats(context.Background())))
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("Scale(%d): %v", n, time.Since(start))
	}
}

// Stop cuts short the starts of a scale whose own context would go on
// (an admin call's, a reload's): a shutdown during a scale-up of replicas
// that never become healthy had waited for their health_check_timeout_s
// (found by an exploratory run).
func TestStopCutsAScaleShort(t *testing.T) {
	var n atomic.Int32
	spec := DeploymentSpec{App: "a", Name: "d", NumReplicas: 1, MaxOngoingRequests: 1,
		GracefulShutdownTimeout: time.Second, HealthCheckTimeout: time.Minute, HealthCheckPeriod: time.Hour,
		Start: func(ctx context.Context, id string, onRelease func()) (Replica, error) {
			if n.Add(1) == 1 {
				return NewLocal(id, http.NotFoundHandler(), 1, onRelease), nil
			}
			<-ctx.Done() // never healthy
			return nil, ctx.Err()
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	scaled := make(chan error, 1)
	go func() { scaled <- d.Scale(context.Background(), 3) }()
	for n.Load() < 3 { // both new starts begun
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Stop took %v during a scale whose starts wait a minute", took)
	}
	select {
	case <-scaled:
	case <-time.After(10 * time.Second):
		t.Fatal("the scale did not return after Stop")
	}
}

// graceRecorder is a replica that keeps the grace it is given, as a
// process does for its stop.
type graceRecorder struct {
	*Local
	grace atomic.Int64
}

func (g *graceRecorder) SetGrace(d time.Duration) { g.grace.Store(int64(d)) }

// SetGracefulShutdownTimeout changes the grace live, as Serve's light
// updates do: the replicas running keep the new one for their stop, those
// started after get it rather than the one they were built with, and Spec
// says so.
func TestSetGracefulShutdownTimeout(t *testing.T) {
	spec := DeploymentSpec{App: "a", Name: "d", NumReplicas: 1, MaxOngoingRequests: 2,
		GracefulShutdownTimeout: 20 * time.Second, HealthCheckTimeout: time.Second, HealthCheckPeriod: time.Hour,
		Start: func(ctx context.Context, id string, onRelease func()) (Replica, error) {
			g := &graceRecorder{Local: NewLocal(id, http.NotFoundHandler(), 2, onRelease)}
			g.grace.Store(int64(20 * time.Second)) // what the builder captured
			return g, nil
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	defer d.Stop(context.Background())
	if err := d.SetGracefulShutdownTimeout(-time.Second); err == nil {
		t.Error("a negative grace was taken")
	}
	if err := d.SetGracefulShutdownTimeout(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(d.Replicas()[0].(*graceRecorder).grace.Load()); got != 3*time.Second {
		t.Errorf("the running replica's grace is %v, want 3s", got)
	}
	if err := d.Scale(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Replicas() {
		if got := time.Duration(r.(*graceRecorder).grace.Load()); got != 3*time.Second {
			t.Errorf("replica %s's grace is %v, want 3s", r.ID(), got)
		}
	}
	if g := d.Spec().GracefulShutdownTimeout; g != 3*time.Second {
		t.Errorf("Spec's grace is %v", g)
	}
}

// The backoff after a replica's quick exit runs from the exit, whenever the
// starter wakes: a health period's wake-up after an earlier exit must not
// leave a timer that ends the next exit's backoff early (a tester saw a
// replacement start 0.7 s after an exit logged with a 3.2 s backoff). An
// exit during the wait moves its end.
func TestWaitBackoffRunsFromTheFailure(t *testing.T) {
	d := &Deployment{}
	ctx := context.Background()

	// An exit long past: no wait at all.
	d.quickExits, d.lastQuickExit = 3, time.Now().Add(-time.Minute)
	if start := time.Now(); !d.waitBackoff(ctx, time.Time{}) || time.Since(start) > 10*time.Second {
		t.Fatal("waited after a backoff long over")
	}

	// An exit just now: the whole backoff, from it.
	d.quickExits, d.lastQuickExit = 2, time.Now()
	exit := d.lastQuickExit
	d.waitBackoff(ctx, time.Time{})
	if got := time.Since(exit); got < startBackoff(2) {
		t.Fatalf("waited %v after the exit, want at least %v", got, startBackoff(2))
	}

	// Another exit during the wait: its backoff, from it.
	d.quickExits, d.lastQuickExit = 1, time.Now()
	var second time.Time
	timer := time.AfterFunc(startBackoff(1)/2, func() {
		d.mu.Lock()
		d.quickExits, d.lastQuickExit = 2, time.Now()
		second = d.lastQuickExit
		d.mu.Unlock()
	})
	defer timer.Stop()
	d.waitBackoff(ctx, time.Time{})
	d.mu.Lock()
	at := second
	d.mu.Unlock()
	if at.IsZero() || time.Since(at) < startBackoff(2) {
		t.Fatalf("waited %v after the second exit, want at least %v", time.Since(at), startBackoff(2))
	}

	// A failed round here, with nothing counted: the shortest backoff.
	d.quickExits = 0
	failedAt := time.Now()
	d.waitBackoff(ctx, failedAt)
	if got := time.Since(failedAt); got < startBackoff(0) {
		t.Fatalf("waited %v after a failed round, want at least %v", got, startBackoff(0))
	}

	// Given up: no wait, and false.
	d.gaveUp = true
	if d.waitBackoff(ctx, time.Now()) {
		t.Fatal("waitBackoff = true for a deployment that gave up")
	}
}
