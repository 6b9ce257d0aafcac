package replica

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		runChild(mode) // the test binary as a replica process (process_test.go)
		return
	}
	goleak.VerifyTestMain(m)
}

func TestLocalLimit(t *testing.T) {
	l := NewLocal("r", nil, 2, nil)
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("a starting replica took a request")
	}
	l.SetState(StateRunning)
	r1, ok1 := l.TryAcquire()
	r2, ok2 := l.TryAcquire()
	_, ok3 := l.TryAcquire()
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("acquires = %v %v %v, want true true false", ok1, ok2, ok3)
	}
	r1()
	if l.Ongoing() != 1 {
		t.Fatalf("ongoing = %d, want 1", l.Ongoing())
	}
	r2()
	l.SetState(StateDraining)
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("a draining replica took a request")
	}
	if l.Peak() != 2 {
		t.Fatalf("peak = %d, want 2", l.Peak())
	}
}

func TestLocalConcurrentLimit(t *testing.T) {
	l := NewLocal("r", nil, 3, nil)
	l.SetState(StateRunning)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if rel, ok := l.TryAcquire(); ok {
					rel()
				}
			}
		}()
	}
	wg.Wait()
	if l.Peak() > 3 || l.Ongoing() != 0 {
		t.Fatalf("peak %d ongoing %d, want peak <= 3 and 0 ongoing", l.Peak(), l.Ongoing())
	}
}

type panicky struct{}

func (panicky) ServeHTTP(http.ResponseWriter, *http.Request) { panic("boom") }

func TestLocalPanic(t *testing.T) {
	l := NewLocal("r", panicky{}, 1, nil)
	err := l.Serve(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "boom" || len(pe.Stack) == 0 {
		t.Fatalf("err = %v, want a PanicError with a stack", err)
	}
}

func serve(t *testing.T, h Handler, req *http.Request) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestStatic(t *testing.T) {
	h, err := NewStatic(json.RawMessage(`{"body":"hello","status":201,"content_type":"text/html"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp := serve(t, h, httptest.NewRequest("GET", "/", nil))
	if resp.StatusCode != 201 || body(t, resp) != "hello" || resp.Header.Get("Content-Type") != "text/html" {
		t.Fatalf("got %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body(t, resp))
	}
	if err := h.(Reconfigurer).Reconfigure(context.Background(), json.RawMessage(`{"body":"v2"}`)); err != nil {
		t.Fatal(err)
	}
	if got := body(t, serve(t, h, httptest.NewRequest("GET", "/", nil))); got != "v2" {
		t.Fatalf("after reconfigure: %q, want v2", got)
	}
}

func TestBuiltinConfigErrors(t *testing.T) {
	tests := []struct {
		name    string
		f       Factory
		cfg     string
		wantErr string
	}{
		{"static unknown field", NewStatic, `{"bdy":"x"}`, `unknown field "bdy"`},
		{"static bad status", NewStatic, `{"status":42}`, "status must be 200..599"},
		{"static interim status", NewStatic, `{"status":103}`, "status must be 200..599"},
		{"static status past 599", NewStatic, `{"status":600}`, "status must be 200..599"},
		{"static wrong type", NewStatic, `{"body":1}`, "static: user_config"},
		{"static 204 with a body", NewStatic, `{"status":204,"body":"hello"}`, `status 204 has no body, got body "hello"`},
		{"static content type with a line break", NewStatic, `{"content_type":"text/plain\r\nX-Evil: 1"}`, `content_type must be a media type`},
		{"static empty content type", NewStatic, `{"content_type":""}`, `content_type must be a media type`},
		{"static content type of no subtype", NewStatic, `{"content_type":"garbage"}`, `content_type must be a media type (text/html; charset=utf-8), got "garbage": no type/subtype`},
		{"sleep over a day", NewSleep, `{"ms":86400001}`, `ms must be 0 to 86400000 (a day), got 86400001`},
		{"sleep negative", NewSleep, `{"ms":-1}`, "ms must be 0 to 86400000 (a day), got -1"},
		{"sleep past a day", NewSleep, `{"ms":1e13}`, "ms must be 0 to 86400000 (a day), got 10000000000000"},
		{"sleep unknown", NewSleep, `{"seconds":1}`, `unknown field "seconds"`},
		{"echo takes none", NewEcho, `{"x":1}`, `unknown field "x"`},
		{"static key twice", NewStatic, `{"body":"a","body":"b"}`, `field "body" given twice`},
		{"sleep more after the object", NewSleep, `{"ms":1}garbage`, "more after the JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.f(json.RawMessage(tt.cfg))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestEcho(t *testing.T) {
	h, _ := NewEcho(nil)
	req := httptest.NewRequest("POST", "/p?q=1", strings.NewReader("payload"))
	req.Header.Set("X-A", "b")
	var got echoResponse
	if err := json.Unmarshal([]byte(body(t, serve(t, h, req))), &got); err != nil {
		t.Fatal(err)
	}
	if got.Method != "POST" || got.Path != "/p" || got.Query["q"][0] != "1" || got.Headers["X-A"][0] != "b" || got.Body != "payload" {
		t.Fatalf("echo = %+v", got)
	}
}

func TestSleepHonoursCancel(t *testing.T) {
	h, _ := NewSleep(json.RawMessage(`{"ms": 60000, "body": "late"}`))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("sleep did not return after its request was cancelled")
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	if _, err := r.Lookup("static"); err != nil {
		t.Fatal(err)
	}
	_, err := r.Lookup("nope")
	if err == nil || !strings.Contains(err.Error(), `unknown handler "nope"`) || !strings.Contains(err.Error(), "static") {
		t.Fatalf("err = %v, want it to name the handler and list the registered ones", err)
	}
	if err := r.Register("static", NewStatic); err == nil {
		t.Fatal("registering a name twice succeeded")
	}
	for _, name := range []string{"my model", "a/b", "x#1", "host", ""} {
		if err := r.Register(name, NewStatic); err == nil {
			t.Errorf("Register(%q) succeeded", name)
		}
	}
	if err := r.Register("model-v2.1_b", NewStatic); err != nil {
		t.Errorf("Register of a plain name: %v", err)
	}
}

// flaky fails its health checks while failing is set.
type flaky struct {
	failing *atomic.Bool
}

func (flaky) ServeHTTP(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }
func (f flaky) CheckHealth(context.Context) error {
	if f.failing.Load() {
		return errors.New("sick")
	}
	return nil
}

func TestDeploymentReplacesUnhealthyReplica(t *testing.T) {
	var failing atomic.Bool
	var built atomic.Int32
	var mu sync.Mutex
	var snapshots [][]Handle
	d, err := NewDeployment(context.Background(), DeploymentSpec{
		App: "app", Name: "dep", NumReplicas: 2, MaxOngoingRequests: 1,
		HealthCheckPeriod: 5 * time.Millisecond, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second,
		Factory: func(json.RawMessage) (Handler, error) {
			// Only the first replica ever fails.
			if built.Add(1) == 1 {
				return flaky{&failing}, nil
			}
			return flaky{new(atomic.Bool)}, nil
		},
	}, Hooks{OnChange: func(hs []Handle) { mu.Lock(); snapshots = append(snapshots, hs); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	first := d.Replicas()[0]
	failing.Store(true)
	deadline := time.Now().Add(10 * time.Second)
	// Retired first, replaced next: wait for both.
	for slices.Contains(d.Replicas(), Replica(first)) || d.Running() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the unhealthy replica was not replaced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if first.State() != StateStopped {
		t.Fatalf("replaced replica is %v, want STOPPED", first.State())
	}
	mu.Lock()
	defer mu.Unlock()
	last := snapshots[len(snapshots)-2] // the one before Stop emptied it
	for _, h := range last {
		if h == Handle(first) {
			t.Fatal("the unhealthy replica is still routable")
		}
	}
	if len(last) != 2 {
		t.Fatalf("routable replicas = %d, want 2 (the replacement is in)", len(last))
	}
}

func BenchmarkLocalAcquireRelease(b *testing.B) {
	l := NewLocal("r", nil, 100, nil)
	l.SetState(StateRunning)
	b.ReportAllocs()
	for b.Loop() {
		rel, _ := l.TryAcquire()
		rel()
	}
}

// TestPlainJSONError: a user_config or admin body of the wrong type is
// told in JSON's words, naming the field, not Go's types.
func TestPlainJSONError(t *testing.T) {
	_, err := NewSleep(json.RawMessage(`{"ms": "fast"}`))
	if err == nil || !strings.Contains(err.Error(), "ms: want a number, got a JSON string") || strings.Contains(err.Error(), "sleepConfig") {
		t.Fatalf("sleep with ms a string: %v", err)
	}
	var v struct {
		N []int `json:"n"`
	}
	err = PlainJSONError(json.Unmarshal([]byte(`{"n": {}}`), &v))
	if err == nil || err.Error() != "n: want an array, got a JSON object" {
		t.Fatalf("an object for an array: %v", err)
	}
	if e := errors.New("other"); PlainJSONError(e) != e {
		t.Fatal("another error was rewritten")
	}
	// An unknown field without encoding/json's "json: " (every caller
	// says what it decoded), and no error is no error.
	dec := json.NewDecoder(strings.NewReader(`{"m": 1}`))
	dec.DisallowUnknownFields()
	if err := PlainJSONError(dec.Decode(&v)); err == nil || err.Error() != `unknown field "m"` {
		t.Fatalf("an unknown field: %v", err)
	}
	if err := PlainJSONError(nil); err != nil {
		t.Fatalf("PlainJSONError(nil) = %v", err)
	}
}

// A factory that returns no Handler and no error is refused where its
// config is checked and where a replica is built (a tester: -check said ok
// and every request failed with a nil dereference), a typed nil too.
func TestFactoryNilHandlerRefused(t *testing.T) {
	type myHandler struct{ http.Handler }
	for name, f := range map[string]Factory{
		"nil":       func(json.RawMessage) (Handler, error) { return nil, nil },
		"typed nil": func(json.RawMessage) (Handler, error) { return (*myHandler)(nil), nil },
	} {
		if err := f.Check(nil); err == nil || !strings.Contains(err.Error(), "nil Handler") {
			t.Errorf("%s: Check = %v, want the nil Handler refused", name, err)
		}
		// A replica that cannot be built is logged and tried again later.
		logs := &syncBuffer{}
		d, err := NewDeployment(context.Background(), DeploymentSpec{App: "a", Name: "d", Factory: f, NumReplicas: 1, MaxOngoingRequests: 1, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second}, Hooks{Log: zerolog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		if n := d.Running(); n != 0 || !strings.Contains(logs.String(), "nil Handler") {
			t.Errorf("%s: %d replicas running, want none and the nil Handler logged: %s", name, n, logs.String())
		}
		_ = d.Stop(context.Background())
	}
	if err := Factory(NewStatic).Check(nil); err != nil {
		t.Errorf("a real handler: %v", err)
	}
}

// A factory that fails while the first replicas are built (the config
// checked: a model that failed to load) fails that replica's start, not
// the deployment: it is tried again in the background, as later builds
// are (a tester: the proxy exited, its other applications never served).
func TestFirstBuildFailureRetried(t *testing.T) {
	var calls atomic.Int32
	logs := &syncBuffer{}
	d, err := NewDeployment(context.Background(), DeploymentSpec{
		App: "a", Name: "d", NumReplicas: 2, MaxOngoingRequests: 1,
		HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second,
		Factory: func(json.RawMessage) (Handler, error) {
			if calls.Add(1) == 2 {
				return nil, errors.New("the model did not load")
			}
			return NewStatic(nil)
		},
	}, Hooks{Log: zerolog.New(logs)})
	if err != nil {
		t.Fatalf("NewDeployment: %v, want the failed build retried", err)
	}
	if n := len(d.Replicas()); n != 1 {
		t.Errorf("%d replicas after the first builds, want 1", n)
	}
	d.Start()
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	eventually(t, "the second replica built on a retry", func() bool { return d.Running() == 2 })
	if !strings.Contains(logs.String(), "the model did not load") {
		t.Errorf("the failed build is not logged: %s", logs.String())
	}
}
