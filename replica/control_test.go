package replica

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// hanging is a handler whose health check never returns until release is
// closed, and ignores its context.
type hanging struct{ release chan struct{} }

func (hanging) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (h hanging) CheckHealth(context.Context) error {
	<-h.release
	return nil
}

func TestLocalControlCalls(t *testing.T) {
	ctx := context.Background()
	st, _ := NewStatic(json.RawMessage(`{"body":"v1"}`))
	l := NewLocal("r", st, 3, nil)
	l.SetState(StateRunning)

	if _, err := l.Call(ctx, MethodCheckHealth, nil); err != nil {
		t.Fatalf("check_health of a handler without a check: %v", err)
	}
	if _, err := l.Call(ctx, MethodReconfigure, []byte(`{"body":"v2"}`)); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	st.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Body.String() != "v2" {
		t.Fatalf("after reconfigure: %q", rec.Body.String())
	}
	if _, err := l.Call(ctx, "explode", nil); !errors.Is(err, ErrUnknownMethod) {
		t.Fatalf("unknown method: %v", err)
	}
	echo := NewLocal("e", Echo{}, 1, nil)
	if _, err := echo.Call(ctx, MethodReconfigure, []byte(`{}`)); !errors.Is(err, ErrNotReconfigurable) {
		t.Fatalf("reconfigure echo: %v", err)
	}
	// A handler without Reconfigure takes the user_config it was built
	// with again, however spelled: a replica host started from the
	// proxy's file is given the file's at connect.
	built := NewLocal("b", Echo{}, 1, nil)
	built.builtWith = []byte(`{"a": 1, "b": [true, "x"]}`)
	for _, tc := range []struct {
		payload string
		want    error
	}{
		{`{"b":[true,"x"],"a":1.0}`, nil},
		{`{"a": 2, "b": [true, "x"]}`, ErrNotReconfigurable},
		{`{"a": 1}`, ErrNotReconfigurable},
		{`not json`, ErrNotReconfigurable},
	} {
		if _, err := built.Call(ctx, MethodReconfigure, []byte(tc.payload)); !errors.Is(err, tc.want) {
			t.Errorf("reconfigure to %s, built with %s: %v, want %v", tc.payload, built.builtWith, err, tc.want)
		}
	}

	release, _ := l.TryAcquire()
	raw, err := l.Call(ctx, MethodStats, nil)
	var s Stats
	if err != nil || json.Unmarshal(raw, &s) != nil {
		t.Fatalf("stats: %s %v", raw, err)
	}
	if s != (Stats{ID: "r", State: StateRunning, Ongoing: 1, Peak: 1, MaxOngoing: 3}) {
		t.Fatalf("stats = %+v", s)
	}

	// drain refuses new requests at once and returns when the held one is done.
	drained := make(chan error, 1)
	go func() {
		_, err := l.Call(ctx, MethodDrain, nil)
		drained <- err
	}()
	waitState(t, l, StateDraining)
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("a draining replica took a request")
	}
	release()
	if err := <-drained; err != nil || l.State() != StateStopped {
		t.Fatalf("drain = %v, state %v", err, l.State())
	}
}

func waitState(t *testing.T, l *Local, s State) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.State() != s {
		if time.Now().After(deadline) {
			t.Fatalf("state = %v, want %v", l.State(), s)
		}
		time.Sleep(time.Millisecond)
	}
}

// A hung health check costs one goroutine: the next checks fail at once.
func TestHealthCheckInFlight(t *testing.T) {
	h := hanging{release: make(chan struct{})}
	l := NewLocal("r", h, 1, nil)
	p := NewPool(l)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if r := p.Broadcast(ctx, Call{Method: MethodCheckHealth})[0]; !errors.Is(r.Err, context.DeadlineExceeded) {
		t.Fatalf("hung check = %v, want the deadline", r.Err)
	}
	if r := p.Broadcast(context.Background(), Call{Method: MethodCheckHealth})[0]; !errors.Is(r.Err, ErrCheckInFlight) {
		t.Fatalf("second check = %v, want ErrCheckInFlight", r.Err)
	}
	close(h.release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := p.Broadcast(context.Background(), Call{Method: MethodCheckHealth})[0]
		if r.Err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("check after the hung one returned: %v", r.Err)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestStateText(t *testing.T) {
	for s := StateStarting; s <= StateStopped; s++ {
		b, _ := s.MarshalText()
		var got State
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Fatalf("%v round trip: %v %v", s, got, err)
		}
	}
	var s State
	if err := s.UnmarshalText([]byte("ASLEEP")); err == nil {
		t.Fatal("unknown state accepted")
	}
}
