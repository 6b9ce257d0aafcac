package replica

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A spec no deployment can run with is refused by name, not run: a zero
// MaxOngoingRequests had every request wait forever in silence, a zero
// HealthCheckTimeout replaced healthy replicas every few checks, a nil
// Factory panicked at the first start (found by a tester using the Go
// API).
func TestDeploymentSpecValidate(t *testing.T) {
	factory := Factory(func(json.RawMessage) (Handler, error) {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), nil
	})
	good := func() DeploymentSpec {
		return DeploymentSpec{App: "a", Name: "d", Factory: factory, NumReplicas: 1, MaxOngoingRequests: 5,
			HealthCheckPeriod: 10 * time.Second, HealthCheckTimeout: 30 * time.Second, GracefulShutdownTimeout: 20 * time.Second}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("Serve's defaults: %v", err)
	}
	for _, c := range []struct {
		change func(*DeploymentSpec)
		want   string
	}{
		{func(s *DeploymentSpec) { s.App = "" }, "App is empty"},
		{func(s *DeploymentSpec) { s.Name = "" }, "Name is empty"},
		{func(s *DeploymentSpec) { s.Factory = nil }, "none of Factory, Start or Connect is set"},
		{func(s *DeploymentSpec) { s.NumReplicas = -1 }, "NumReplicas is -1"},
		{func(s *DeploymentSpec) { s.MaxOngoingRequests = 0 }, "MaxOngoingRequests is 0, must be 1 or more"},
		{func(s *DeploymentSpec) { s.HealthCheckPeriod = -time.Second }, "HealthCheckPeriod is -1s"},
		{func(s *DeploymentSpec) { s.HealthCheckTimeout = 0 }, "HealthCheckTimeout is 0s, must be above 0"},
		{func(s *DeploymentSpec) { s.GracefulShutdownTimeout = -time.Second }, "GracefulShutdownTimeout is -1s"},
		{func(s *DeploymentSpec) { s.MaxConstructorRetryCount = -1 }, "MaxConstructorRetryCount is -1"},
	} {
		s := good()
		c.change(&s)
		d, err := NewDeployment(context.Background(), s, Hooks{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			if d != nil {
				_ = d.Stop(context.Background())
			}
			t.Errorf("NewDeployment: %v, want an error saying %q", err, c.want)
		}
	}
}

// closingHandler counts its Close calls.
type closingHandler struct {
	http.HandlerFunc
	closes *atomic.Int32
	twice  *atomic.Bool
	closed atomic.Bool
}

func (c *closingHandler) Close() error {
	if c.closed.Swap(true) {
		c.twice.Store(true)
	}
	c.closes.Add(1)
	return nil
}

// Every handler a deployment or a replica host built is closed once its
// replica stops, scaled away or at the end, and never twice: handlers
// holding goroutines or models had leaked them (found by a tester).
func TestHandlersClosedWhenTheirReplicasStop(t *testing.T) {
	var built, closes atomic.Int32
	var twice atomic.Bool
	factory := func(json.RawMessage) (Handler, error) {
		built.Add(1)
		return &closingHandler{HandlerFunc: func(http.ResponseWriter, *http.Request) {}, closes: &closes, twice: &twice}, nil
	}
	d, err := NewDeployment(context.Background(), DeploymentSpec{
		App: "a", Name: "d", Factory: factory, NumReplicas: 3, MaxOngoingRequests: 1,
		HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second,
	}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	if err := d.Scale(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for closes.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := closes.Load(); got != 2 {
		t.Fatalf("after a scale from 3 to 1: %d handlers closed, want 2", got)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if closes.Load() != built.Load() || twice.Load() {
		t.Fatalf("after Stop: %d built, %d closed (twice: %v)", built.Load(), closes.Load(), twice.Load())
	}

	built.Store(0)
	closes.Store(0)
	h, err := NewHost(HostConfig{Name: "h", Factory: factory, Replicas: 2, MaxOngoing: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	if closes.Load() != 2 || built.Load() != 2 || twice.Load() {
		t.Fatalf("after a host's Shutdown and Close: %d built, %d closed (twice: %v)", built.Load(), closes.Load(), twice.Load())
	}
}

// A request in process cannot be cut: a handler still serving one when
// graceful_shutdown_timeout_s runs out is closed once it returns, never
// under it (a handler that frees its model in Close would fail
// mid-request), and the deployment's Stop does not wait for it.
func TestHandlerNotClosedUnderARunningRequest(t *testing.T) {
	var closes atomic.Int32
	var twice, closedWhileServing atomic.Bool
	var h *closingHandler
	entered, release := make(chan struct{}), make(chan struct{})
	h = &closingHandler{closes: &closes, twice: &twice, HandlerFunc: func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
		closedWhileServing.Store(h.closed.Load())
	}}
	d, err := NewDeployment(context.Background(), DeploymentSpec{
		App: "a", Name: "d", Factory: func(json.RawMessage) (Handler, error) { return h, nil }, NumReplicas: 1, MaxOngoingRequests: 1,
		HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: 50 * time.Millisecond,
	}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	l := d.Replicas()[0].(*Local)
	done, ok := l.TryAcquire()
	if !ok {
		t.Fatal("the only replica refused a request")
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer done()
		_ = l.Serve(nil, nil)
	}()
	<-entered
	// The proxy's shutdown gives Stop graceful_shutdown_timeout_s.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := d.Stop(ctx); err == nil {
		t.Fatal("Stop = nil with a request still running at its deadline")
	}
	if closes.Load() != 0 {
		t.Fatal("the handler was closed while it served a request")
	}
	close(release)
	<-served
	deadline := time.Now().Add(10 * time.Second)
	for closes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if closes.Load() != 1 || twice.Load() || closedWhileServing.Load() {
		t.Fatalf("after the request: closed %d times (twice: %v, while serving: %v), want once, after it", closes.Load(), twice.Load(), closedWhileServing.Load())
	}
}
