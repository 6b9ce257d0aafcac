package replica

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fnActor is an Actor whose Call is a function.
type fnActor struct {
	id string
	fn func(ctx context.Context, method string, payload []byte) ([]byte, error)
}

func (a *fnActor) ID() string   { return a.id }
func (a *fnActor) Host() string { return "" }
func (a *fnActor) Call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	return a.fn(ctx, method, payload)
}

var _ Actor = (*fnActor)(nil)

func echoActor(id string) *fnActor {
	return &fnActor{id: id, fn: func(_ context.Context, _ string, p []byte) ([]byte, error) { return p, nil }}
}

// gates lets a test decide when each call, named by its payload, returns.
type gates struct {
	mu       sync.Mutex
	open     map[string]chan struct{}
	started  chan string // each call's payload as it starts
	returned chan string // each call's payload as it returns
}

func newGates(names ...string) *gates {
	g := &gates{open: map[string]chan struct{}{}, started: make(chan string, 100), returned: make(chan string, 100)}
	for _, n := range names {
		g.open[n] = make(chan struct{})
	}
	return g
}

func (g *gates) actor(id string) *fnActor {
	return &fnActor{id: id, fn: func(ctx context.Context, _ string, p []byte) ([]byte, error) {
		g.mu.Lock()
		ch := g.open[string(p)]
		g.mu.Unlock()
		g.started <- string(p)
		defer func() { g.returned <- string(p) }()
		select {
		case <-ch:
			return p, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
}

// release lets the call named n return and waits until it has.
func (g *gates) release(t *testing.T, n string) {
	t.Helper()
	close(g.open[n])
	if got := recv(t, g.returned); got != n {
		t.Fatalf("call %q returned, want %q", got, n)
	}
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

func submit(t *testing.T, p *Pool, payloads ...string) {
	t.Helper()
	for _, s := range payloads {
		if err := p.Submit(context.Background(), Call{Method: "m", Payload: []byte(s)}); err != nil {
			t.Fatal(err)
		}
	}
}

func get(t *testing.T, next func(context.Context) (Result, error)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Err != nil {
		t.Fatalf("result error: %v", r.Err)
	}
	return string(r.Value)
}

func TestPoolGetNextSubmissionOrder(t *testing.T) {
	g := newGates("0", "1", "2")
	p := NewPool(g.actor("a"), g.actor("b"), g.actor("c"))
	submit(t, p, "0", "1", "2")
	for range 3 {
		recv(t, g.started)
	}
	// Complete in reverse order.
	g.release(t, "2")
	g.release(t, "1")
	g.release(t, "0")
	for _, want := range []string{"0", "1", "2"} {
		if got := get(t, p.GetNext); got != want {
			t.Fatalf("GetNext = %q, want %q", got, want)
		}
	}
	if _, err := p.GetNext(context.Background()); !errors.Is(err, ErrNoPending) {
		t.Fatalf("GetNext on an empty pool: err = %v, want ErrNoPending", err)
	}
	if p.HasNext() {
		t.Fatal("HasNext after every result was returned")
	}
}

func TestPoolGetNextUnorderedCompletionOrder(t *testing.T) {
	g := newGates("0", "1", "2")
	p := NewPool(g.actor("a"), g.actor("b"), g.actor("c"))
	submit(t, p, "0", "1", "2")
	for range 3 {
		recv(t, g.started)
	}
	for _, n := range []string{"2", "0", "1"} {
		close(g.open[n])
		if got := get(t, p.GetNextUnordered); got != n {
			t.Fatalf("GetNextUnordered = %q, want %q", got, n)
		}
	}
	if _, err := p.GetNextUnordered(context.Background()); !errors.Is(err, ErrNoPending) {
		t.Fatalf("err = %v, want ErrNoPending", err)
	}
}

func TestPoolMixedGetNextLosesNothing(t *testing.T) {
	names := []string{"0", "1", "2", "3", "4", "5"}
	g := newGates(names...)
	p := NewPool(g.actor("a"), g.actor("b"), g.actor("c"))
	submit(t, p, names...)
	for _, n := range []string{"5", "4", "3", "2", "1", "0"} {
		close(g.open[n])
	}
	var got []string
	for i := range names {
		if i%2 == 0 {
			got = append(got, get(t, p.GetNextUnordered))
		} else {
			got = append(got, get(t, p.GetNext))
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("results = %v, want each of %v once", got, names)
	}
	if p.HasNext() {
		t.Fatal("HasNext after every result was returned")
	}
}

func TestPoolPendingSubmits(t *testing.T) {
	t.Run("one call per actor", func(t *testing.T) {
		var mu sync.Mutex
		running := map[string]int{}
		total, maxTotal := 0, 0
		mk := func(id string) *fnActor {
			return &fnActor{id: id, fn: func(context.Context, string, []byte) ([]byte, error) {
				mu.Lock()
				running[id]++
				total++
				maxTotal = max(maxTotal, total)
				if running[id] > 1 {
					t.Errorf("actor %s runs %d calls at once", id, running[id])
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				running[id]--
				total--
				mu.Unlock()
				return []byte(id), nil
			}}
		}
		p := NewPool(mk("a"), mk("b"))
		for i := range 20 {
			submit(t, p, fmt.Sprint(i))
		}
		for range 20 {
			get(t, p.GetNext)
		}
		if maxTotal > 2 {
			t.Fatalf("%d calls ran at once on 2 actors", maxTotal)
		}
		if !p.HasFree() {
			t.Fatal("no actor free after all calls returned")
		}
	})
	t.Run("queue is FIFO", func(t *testing.T) {
		names := []string{"0", "1", "2", "3"}
		g := newGates(names...)
		p := NewPool(g.actor("a"))
		submit(t, p, names...)
		if p.HasFree() {
			t.Fatal("HasFree with the only actor busy")
		}
		if !p.HasNext() {
			t.Fatal("HasNext false with calls pending")
		}
		for _, n := range names {
			if got := recv(t, g.started); got != n {
				t.Fatalf("started %q, want %q", got, n)
			}
			g.release(t, n)
		}
		for _, n := range names {
			if got := get(t, p.GetNext); got != n {
				t.Fatalf("GetNext = %q, want %q", got, n)
			}
		}
	})
}

func TestPoolPushPop(t *testing.T) {
	a := echoActor("a")
	p := NewPool(a)
	if got, ok := p.PopIdle(); !ok || got != a {
		t.Fatalf("PopIdle = %v, %v; want a, true", got, ok)
	}
	if _, ok := p.PopIdle(); ok {
		t.Fatal("PopIdle on an empty pool succeeded")
	}
	if p.HasFree() || len(p.Actors()) != 0 {
		t.Fatal("popped actor still in the pool")
	}
	submit(t, p, "queued")
	b := echoActor("b")
	if err := p.Push(b); err != nil {
		t.Fatal(err)
	}
	r, err := p.GetNext(context.Background())
	if err != nil || r.Actor != "b" || string(r.Value) != "queued" {
		t.Fatalf("GetNext = %+v, %v; want b's answer to the queued call", r, err)
	}
	if err := p.Push(echoActor("b")); !errors.Is(err, ErrDuplicateActor) {
		t.Fatalf("duplicate Push: err = %v, want ErrDuplicateActor", err)
	}
	if err := p.Push(nil); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("Push(nil): err = %v, want one naming the nil actor", err)
	}
	func() {
		defer func() {
			if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "actor 1 of 2 is nil") {
				t.Errorf("NewPool with a nil actor: panic %v, want one naming it", v)
			}
		}()
		NewPool(echoActor("c"), nil)
	}()
	if err := p.Push(a); err != nil {
		t.Fatal(err)
	}
	if ids := actorIDs(p.Actors()); !slices.Equal(ids, []string{"b", "a"}) {
		t.Fatalf("Actors = %v, want [b a]", ids)
	}

	// A busy actor is not idle: PopIdle leaves it.
	g := newGates("x")
	q := NewPool(g.actor("busy"))
	submit(t, q, "x")
	recv(t, g.started)
	if _, ok := q.PopIdle(); ok {
		t.Fatal("PopIdle removed a busy actor")
	}
	g.release(t, "x")
	get(t, q.GetNext)
}

func actorIDs(as []Actor) []string {
	var ids []string
	for _, a := range as {
		ids = append(ids, a.ID())
	}
	return ids
}

func TestPoolErrors(t *testing.T) {
	p := NewPool()
	if _, err := p.GetNext(context.Background()); !errors.Is(err, ErrNoPending) {
		t.Fatalf("GetNext: err = %v, want ErrNoPending", err)
	}
	if _, err := p.GetNextUnordered(context.Background()); !errors.Is(err, ErrNoPending) {
		t.Fatalf("GetNextUnordered: err = %v, want ErrNoPending", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Submit(ctx, Call{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit with a done ctx: err = %v", err)
	}

	boom := errors.New("boom")
	q := NewPool(
		&fnActor{id: "fail", fn: func(context.Context, string, []byte) ([]byte, error) { return nil, boom }},
		&fnActor{id: "panic", fn: func(context.Context, string, []byte) ([]byte, error) { panic("oops") }},
	)
	submit(t, q, "1", "2")
	var sawBoom, sawPanic bool
	for range 2 {
		r, err := q.GetNext(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var pe *PanicError
		switch {
		case errors.Is(r.Err, boom) && r.Actor == "fail":
			sawBoom = true
		case errors.As(r.Err, &pe) && r.Actor == "panic":
			sawPanic = true
		default:
			t.Fatalf("unexpected result %+v", r)
		}
	}
	if !sawBoom || !sawPanic {
		t.Fatalf("saw boom %v, panic %v", sawBoom, sawPanic)
	}
	if !q.HasFree() {
		t.Fatal("a panicking actor was lost")
	}

	defer func() {
		if recover() == nil {
			t.Fatal("NewPool with duplicate IDs did not panic")
		}
	}()
	NewPool(echoActor("x"), echoActor("x"))
}

func TestPoolGetNextCancelKeepsResult(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(*Pool) func(context.Context) (Result, error)
	}{
		{"GetNext", func(p *Pool) func(context.Context) (Result, error) { return p.GetNext }},
		{"GetNextUnordered", func(p *Pool) func(context.Context) (Result, error) { return p.GetNextUnordered }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGates("x")
			p := NewPool(g.actor("a"))
			submit(t, p, "x")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if _, err := tc.next(p)(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want DeadlineExceeded", err)
			}
			if !p.HasNext() {
				t.Fatal("the cancelled wait dropped the pending result")
			}
			g.release(t, "x")
			if got := get(t, tc.next(p)); got != "x" {
				t.Fatalf("result = %q, want x", got)
			}
		})
	}
}

func TestPoolQueuedCallCancelled(t *testing.T) {
	g := newGates("first")
	p := NewPool(g.actor("a"))
	submit(t, p, "first")
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Submit(ctx, Call{Payload: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	cancel()
	g.release(t, "first")
	get(t, p.GetNext)
	r, err := p.GetNext(context.Background())
	if err != nil || !errors.Is(r.Err, context.Canceled) || r.Actor != "" {
		t.Fatalf("cancelled queued call: %+v, %v; want a Canceled result that never ran", r, err)
	}
}

// A queued call whose ctx ends is answered then, as Submit promises, not
// when an actor frees up: with every actor busy, or with none at all
// (found by review).
func TestPoolQueuedCallAnsweredAtCancel(t *testing.T) {
	g := newGates("first")
	busy := NewPool(g.actor("a"))
	submit(t, busy, "first")
	defer g.release(t, "first")
	for name, p := range map[string]*Pool{"every actor busy": busy, "no actors": NewPool()} {
		ctx, cancel := context.WithCancel(context.Background())
		if err := p.Submit(ctx, Call{Payload: []byte("queued")}); err != nil {
			t.Fatal(err)
		}
		cancel()
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := p.GetNextUnordered(wctx)
		wcancel()
		if err != nil || !errors.Is(r.Err, context.Canceled) || r.Actor != "" {
			t.Errorf("%s: %+v, %v; want the cancelled call's Canceled result at once", name, r, err)
		}
	}
}

// A submitted call that calls runtime.Goexit is answered with a
// *PanicError, and its actor goes on with the queue: it had been lost,
// with the call's result (found by review).
func TestPoolGoexitInACall(t *testing.T) {
	a := &fnActor{id: "a", fn: func(_ context.Context, _ string, p []byte) ([]byte, error) {
		if string(p) == "x" {
			runtime.Goexit()
		}
		return p, nil
	}}
	p := NewPool(a)
	submit(t, p, "x", "y")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := p.GetNext(ctx)
	var pe *PanicError
	if err != nil || !errors.As(r.Err, &pe) || r.Actor != "a" {
		t.Fatalf("the call that ran Goexit: %+v, %v; want a PanicError from a", r, err)
	}
	if r, err := p.GetNext(ctx); err != nil || string(r.Value) != "y" {
		t.Fatalf("the call queued behind it: %+v, %v", r, err)
	}
	if !p.HasFree() {
		t.Fatal("the actor is not idle again")
	}
}

// uncomparableActor cannot be compared with ==: it has a slice field and
// value receivers.
type uncomparableActor struct {
	id   string
	tags []string
}

func (a uncomparableActor) ID() string   { return a.id }
func (a uncomparableActor) Host() string { return "" }
func (a uncomparableActor) Call(_ context.Context, _ string, p []byte) ([]byte, error) {
	return p, nil
}

// PopIdle finds the actor by ID: comparing interface values panicked for
// an actor type that cannot be compared, and left the pool inconsistent
// (found by review).
func TestPoolPopIdleUncomparable(t *testing.T) {
	p := NewPool(uncomparableActor{id: "a", tags: []string{"x"}}, uncomparableActor{id: "b"})
	a, ok := p.PopIdle()
	if !ok || len(p.Actors()) != 1 || p.Actors()[0].ID() == a.ID() {
		t.Fatalf("PopIdle: %v %v, the pool has %v", a, ok, p.Actors())
	}
}

// sleepActor answers its payload after (10 - payload) ms, so that later
// payloads finish first.
func sleepActor(id string) *fnActor {
	return &fnActor{id: id, fn: func(ctx context.Context, _ string, p []byte) ([]byte, error) {
		var i int
		fmt.Sscan(string(p), &i)
		select {
		case <-time.After(time.Duration(10-i) * time.Millisecond):
			return p, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
}

func payloads(n int) ([][]byte, []string) {
	var ps [][]byte
	var names []string
	for i := range n {
		ps = append(ps, []byte(fmt.Sprint(i)))
		names = append(names, fmt.Sprint(i))
	}
	return ps, names
}

func TestPoolMap(t *testing.T) {
	ps, names := payloads(10)
	p := NewPool(sleepActor("a"), sleepActor("b"), sleepActor("c"))
	ctx := context.Background()

	var got []string
	for r, err := range p.Map(ctx, "m", ps) {
		if err != nil || r.Err != nil {
			t.Fatal(err, r.Err)
		}
		got = append(got, string(r.Value))
	}
	if !slices.Equal(got, names) {
		t.Fatalf("Map = %v, want %v", got, names)
	}

	got = got[:0]
	for r, err := range p.MapUnordered(ctx, "m", ps) {
		if err != nil || r.Err != nil {
			t.Fatal(err, r.Err)
		}
		got = append(got, string(r.Value))
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("MapUnordered = %v, want each of %v", got, names)
	}
	if p.HasNext() {
		t.Fatal("Map's results leaked into GetNext's")
	}
}

func TestPoolMapEarlyBreak(t *testing.T) {
	defer goleak.VerifyNone(t)
	ps, _ := payloads(10)
	for _, tc := range []struct {
		name string
		seq  func(*Pool) func(func(Result, error) bool)
	}{
		{"Map", func(p *Pool) func(func(Result, error) bool) { return p.Map(context.Background(), "m", ps) }},
		{"MapUnordered", func(p *Pool) func(func(Result, error) bool) {
			return p.MapUnordered(context.Background(), "m", ps)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Payload 0 answers at once; the rest wait for cancellation.
			var calls atomic.Int32
			mk := func(id string) *fnActor {
				return &fnActor{id: id, fn: func(ctx context.Context, _ string, p []byte) ([]byte, error) {
					calls.Add(1)
					if string(p) == "0" {
						return p, nil
					}
					<-ctx.Done()
					return nil, ctx.Err()
				}}
			}
			p := NewPool(mk("a"), mk("b"))
			n := 0
			for r, err := range tc.seq(p) {
				if err != nil || string(r.Value) != "0" {
					t.Fatalf("first result %+v, %v", r, err)
				}
				n++
				break
			}
			if n != 1 {
				t.Fatalf("got %d results", n)
			}
			// The loop returned only after its running calls did.
			if len(p.Actors()) != 2 || !p.HasFree() {
				t.Fatal("actors not idle after the loop")
			}
			if _, ok := p.PopIdle(); !ok {
				t.Fatal("actor busy")
			}
			if _, ok := p.PopIdle(); !ok {
				t.Fatal("actor busy")
			}
			if c := calls.Load(); c > 3 {
				t.Fatalf("%d calls ran; the queued ones should have been dropped", c)
			}
		})
	}
}

func TestPoolMapContextCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	ps, _ := payloads(5)
	g := newGates()
	p := NewPool(g.actor("a"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var errs []error
	for r, err := range p.Map(ctx, "m", ps) {
		if err == nil {
			t.Fatalf("unexpected result %+v", r)
		}
		errs = append(errs, err)
	}
	if len(errs) != 1 || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("errors = %v, want one DeadlineExceeded", errs)
	}
	if !p.HasFree() {
		t.Fatal("actor still busy")
	}
}

func TestBroadcast(t *testing.T) {
	boom := errors.New("boom")
	release := make(chan struct{})
	var slowDone sync.WaitGroup
	slowDone.Add(1)
	t.Cleanup(func() { close(release); slowDone.Wait() })

	actors := []Actor{
		echoActor("h1"),
		&fnActor{id: "fail", fn: func(context.Context, string, []byte) ([]byte, error) { return nil, boom }},
		echoActor("h2"),
		// slow ignores ctx: Broadcast must not wait for it.
		&fnActor{id: "slow", fn: func(context.Context, string, []byte) ([]byte, error) {
			defer slowDone.Done()
			<-release
			return []byte("late"), nil
		}},
		&fnActor{id: "panic", fn: func(context.Context, string, []byte) ([]byte, error) { panic("oops") }},
		echoActor("h3"),
	}
	p := NewPool(actors...)
	payload := []byte("shared payload")
	const deadline = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	rs := p.Broadcast(ctx, Call{Method: "check_health", Payload: payload})
	if el := time.Since(start); el < deadline/2 || el > 2*time.Second {
		t.Fatalf("Broadcast took %v, want about the %v deadline", el, deadline)
	}
	if ids := resultIDs(rs); !slices.Equal(ids, actorIDs(actors)) {
		t.Fatalf("results for %v, want pool order %v", ids, actorIDs(actors))
	}
	for _, r := range rs {
		var pe *PanicError
		switch r.Actor {
		case "fail":
			if !errors.Is(r.Err, boom) {
				t.Errorf("fail: err = %v", r.Err)
			}
		case "slow":
			if !errors.Is(r.Err, context.DeadlineExceeded) || r.Value != nil {
				t.Errorf("slow: %+v, want DeadlineExceeded", r)
			}
		case "panic":
			if !errors.As(r.Err, &pe) {
				t.Errorf("panic: err = %v, want *PanicError", r.Err)
			}
		default:
			if r.Err != nil || &r.Value[0] != &payload[0] {
				t.Errorf("%s: %+v, want the shared payload back", r.Actor, r)
			}
		}
	}
}

func resultIDs(rs []Result) []string {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.Actor)
	}
	return ids
}

func TestBroadcastSubsetAndBusyActors(t *testing.T) {
	var called sync.Map
	unblock := make(chan struct{})
	working := make(chan struct{})
	mk := func(id string) *fnActor {
		return &fnActor{id: id, fn: func(ctx context.Context, m string, p []byte) ([]byte, error) {
			if m == "m" { // submitted work holds the actor until unblocked
				close(working)
				<-unblock
				return nil, nil
			}
			called.Store(id, true)
			return p, nil
		}}
	}
	p := NewPool(mk("a"), mk("b"), mk("c"))
	submit(t, p, "w") // one actor is now busy with submitted work
	recv(t, working)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs := p.Broadcast(ctx, Call{Method: "stats"}, "c", "nope", "a")
	if ids := resultIDs(rs); !slices.Equal(ids, []string{"c", "nope", "a"}) {
		t.Fatalf("results for %v, want [c nope a]", ids)
	}
	if rs[0].Err != nil || rs[2].Err != nil || !errors.Is(rs[1].Err, ErrUnknownActor) {
		t.Fatalf("results %+v", rs)
	}
	if _, ok := called.Load("b"); ok {
		t.Fatal("b was not named but was called")
	}

	// The whole pool, the busy actor included, answers without waiting for
	// the submitted call.
	rs = p.Broadcast(ctx, Call{Method: "stats"})
	for _, r := range rs {
		if r.Err != nil {
			t.Fatalf("Broadcast with a busy actor: %+v", rs)
		}
	}
	if len(rs) != 3 {
		t.Fatalf("%d results, want 3", len(rs))
	}
	close(unblock)
	get(t, p.GetNext)
}

func TestBroadcastHungActorsCostOnlyTheirSlots(t *testing.T) {
	defer goleak.VerifyNone(t)
	release := make(chan struct{})
	var hungDone sync.WaitGroup
	hung := func(id string) *fnActor {
		hungDone.Add(1)
		return &fnActor{id: id, fn: func(context.Context, string, []byte) ([]byte, error) {
			defer hungDone.Done()
			<-release // ignores ctx
			return []byte("late"), nil
		}}
	}
	start := time.Now()
	var lastFast atomic.Int64 // ns after start of the last fast answer
	var actors []Actor
	for i := range 200 {
		if i == 10 { // back to back, so that both workers of 2 cores stall at once
			actors = append(actors, hung("hung0"), hung("hung1"))
		}
		actors = append(actors, &fnActor{id: fmt.Sprint("fast", i), fn: func(_ context.Context, _ string, p []byte) ([]byte, error) {
			lastFast.Store(int64(time.Since(start)))
			return p, nil
		}})
	}
	p := NewPool(actors...)
	const deadline = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	rs := p.Broadcast(ctx, Call{Method: "m", Payload: []byte("ok")})
	el := time.Since(start)
	close(release)
	hungDone.Wait()

	if el < deadline/2 || el > deadline+2*time.Second {
		t.Fatalf("Broadcast took %v, want about the %v deadline", el, deadline)
	}
	if last := time.Duration(lastFast.Load()); last > deadline/2 {
		t.Fatalf("last fast answer at %v: the hung actors held up the others", last)
	}
	if ids := resultIDs(rs); !slices.Equal(ids, actorIDs(actors)) {
		t.Fatalf("results for %v, want pool order", ids)
	}
	for _, r := range rs {
		if strings.HasPrefix(r.Actor, "hung") {
			if !errors.Is(r.Err, context.DeadlineExceeded) || r.Value != nil {
				t.Errorf("%s: %+v, want DeadlineExceeded", r.Actor, r)
			}
		} else if r.Err != nil || string(r.Value) != "ok" {
			t.Errorf("%s: %+v, want ok", r.Actor, r)
		}
	}
}

// TestBroadcastFailingSlowPanicking runs one broadcast over several chunks
// of actors with failing, slow and panicking ones among them: each gets its
// own answer in its own slot, and the slow one holds up no other.
func TestBroadcastFailingSlowPanicking(t *testing.T) {
	defer goleak.VerifyNone(t)
	boom := errors.New("boom")
	const slowFor = 100 * time.Millisecond
	start := time.Now()
	var lastFast, slowEnd atomic.Int64 // ns after start
	kinds := map[int]string{5: "slow", 6: "fail", 31: "panic", 32: "panic", 33: "panic", 50: "goexit", 70: "fail", 99: "panic"}
	var actors []Actor
	for i := range 100 {
		id := fmt.Sprint(i)
		var fn func(context.Context, string, []byte) ([]byte, error)
		switch kinds[i] {
		case "slow":
			fn = func(ctx context.Context, _ string, p []byte) ([]byte, error) {
				defer func() { slowEnd.Store(int64(time.Since(start))) }()
				select {
				case <-time.After(slowFor):
					return []byte("slow " + id), nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		case "fail":
			fn = func(context.Context, string, []byte) ([]byte, error) { return nil, fmt.Errorf("%s: %w", id, boom) }
		case "panic":
			fn = func(context.Context, string, []byte) ([]byte, error) { panic("oops " + id) }
		case "goexit":
			fn = func(context.Context, string, []byte) ([]byte, error) { runtime.Goexit(); return nil, nil }
		default:
			fn = func(_ context.Context, _ string, p []byte) ([]byte, error) {
				lastFast.Store(int64(time.Since(start)))
				return []byte(id), nil
			}
		}
		actors = append(actors, &fnActor{id: id, fn: fn})
	}
	p := NewPool(actors...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs := p.Broadcast(ctx, Call{Method: "check_health"})
	if el := time.Since(start); el < slowFor || el > 5*time.Second {
		t.Fatalf("Broadcast took %v, want about the slow actor's %v", el, slowFor)
	}
	if ids := resultIDs(rs); !slices.Equal(ids, actorIDs(actors)) {
		t.Fatalf("results for %v, want pool order", ids)
	}
	if fast, slow := time.Duration(lastFast.Load()), time.Duration(slowEnd.Load()); fast >= slow {
		t.Errorf("last fast answer at %v, slow answer at %v: the slow actor held up others", fast, slow)
	}
	for i, r := range rs {
		var pe *PanicError
		switch kinds[i] {
		case "slow":
			if r.Err != nil || string(r.Value) != "slow "+r.Actor {
				t.Errorf("slow %s: %+v", r.Actor, r)
			}
		case "fail":
			if !errors.Is(r.Err, boom) || !strings.HasPrefix(r.Err.Error(), r.Actor+":") {
				t.Errorf("fail %s: err = %v", r.Actor, r.Err)
			}
		case "panic":
			if !errors.As(r.Err, &pe) || pe.Value != "oops "+r.Actor || len(pe.Stack) == 0 || r.Value != nil {
				t.Errorf("panic %s: %+v, want its *PanicError with a stack", r.Actor, r)
			}
		case "goexit":
			// Said as Submit says it, not "panic: <nil>".
			if !errors.As(r.Err, &pe) || pe.Value != "runtime.Goexit" {
				t.Errorf("goexit %s: %+v, want a *PanicError saying runtime.Goexit", r.Actor, r)
			}
		default:
			if r.Err != nil || string(r.Value) != r.Actor {
				t.Errorf("%s: %+v", r.Actor, r)
			}
		}
	}
}

// TestBroadcastSlowActorsGetWorkers checks that when every call is slow,
// Broadcast adds workers instead of calling 200 slow actors two at a time
// (which would take 200 * 20ms / 2 = 2s).
func TestBroadcastSlowActorsGetWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	var actors []Actor
	for i := range 200 {
		actors = append(actors, &fnActor{id: fmt.Sprint(i), fn: func(ctx context.Context, _ string, p []byte) ([]byte, error) {
			select {
			case <-time.After(20 * time.Millisecond):
				return p, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	}
	p := NewPool(actors...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	rs := p.Broadcast(ctx, Call{Method: "m", Payload: []byte("ok")})
	if el := time.Since(start); el > time.Second {
		t.Errorf("Broadcast to 200 actors of 20ms each took %v", el)
	}
	for _, r := range rs {
		if r.Err != nil || string(r.Value) != "ok" {
			t.Fatalf("%s: %+v", r.Actor, r)
		}
	}
}

// TestBroadcastWhileMembershipChanges runs broadcasts, submits, pushes and
// pops at once, for the race detector.
func TestBroadcastWhileMembershipChanges(t *testing.T) {
	defer goleak.VerifyNone(t)
	var actors []Actor
	for i := range 100 {
		actors = append(actors, echoActor(fmt.Sprint(i)))
	}
	p := NewPool(actors...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 50 {
				rs := p.Broadcast(ctx, Call{Method: "stats", Payload: []byte("s")})
				for _, r := range rs {
					if r.Err != nil || string(r.Value) != "s" {
						t.Errorf("%+v", r)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			if a, ok := p.PopIdle(); ok {
				if err := p.Push(a); err != nil {
					t.Error(err)
				}
			}
			if err := p.Submit(ctx, Call{Method: "m", Payload: []byte(fmt.Sprint(i))}); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	for p.HasNext() {
		get(t, p.GetNext)
	}
}

func TestForeachBroadcast(t *testing.T) {
	boom := errors.New("boom")
	actors := []Actor{
		echoActor("a"),
		&fnActor{id: "fail", fn: func(context.Context, string, []byte) ([]byte, error) { return nil, boom }},
		&fnActor{id: "slow", fn: func(_ context.Context, _ string, p []byte) ([]byte, error) {
			time.Sleep(20 * time.Millisecond)
			return p, nil
		}},
		&fnActor{id: "panic", fn: func(context.Context, string, []byte) ([]byte, error) { panic("oops") }},
		echoActor("b"),
	}
	payload := []byte("encode me")
	rs := ForeachBroadcast(context.Background(), actors, Call{Method: "m", Payload: payload})
	if ids := resultIDs(rs); !slices.Equal(ids, actorIDs(actors)) {
		t.Fatalf("results for %v, want %v", ids, actorIDs(actors))
	}
	var pe *PanicError
	if !errors.Is(rs[1].Err, boom) || !errors.As(rs[3].Err, &pe) {
		t.Fatalf("fail: %v, panic: %v", rs[1].Err, rs[3].Err)
	}
	seen := map[*byte]bool{&payload[0]: true}
	for _, i := range []int{0, 2, 4} {
		r := rs[i]
		if r.Err != nil || string(r.Value) != string(payload) || seen[&r.Value[0]] {
			t.Fatalf("%s: %+v, want its own copy of the payload", r.Actor, r)
		}
		seen[&r.Value[0]] = true
	}
}

// TestRef passes a payload by reference through every path: each call gets
// the very bytes given to Put, until Free.
func TestRef(t *testing.T) {
	defer goleak.VerifyNone(t)
	var calls atomic.Int64
	mk := func(id string) *fnActor {
		return &fnActor{id: id, fn: func(_ context.Context, _ string, p []byte) ([]byte, error) {
			calls.Add(1)
			return p, nil
		}}
	}
	actors := []Actor{mk("a"), mk("b"), mk("c")}
	p := NewPool(actors...)
	payload := []byte("user_config: big")
	ref := p.Put(payload)
	c := Call{Method: "reconfigure", Ref: ref}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	same := func(path string, rs []Result) {
		t.Helper()
		if len(rs) != len(actors) {
			t.Fatalf("%s: %d results", path, len(rs))
		}
		for _, r := range rs {
			if r.Err != nil || len(r.Value) != len(payload) || &r.Value[0] != &payload[0] {
				t.Fatalf("%s: %s: %+v, want the bytes put", path, r.Actor, r)
			}
		}
	}
	same("Broadcast", p.Broadcast(ctx, c))
	same("ForeachBroadcast", ForeachBroadcast(ctx, actors, c))
	if err := p.Submit(ctx, c); err != nil {
		t.Fatal(err)
	}
	if r, err := p.GetNext(ctx); err != nil || r.Err != nil || &r.Value[0] != &payload[0] {
		t.Fatalf("Submit: %+v, %v", r, err)
	}

	other := NewPool(mk("x"))
	other.Free(ref) // not other's: does nothing
	same("Broadcast after another pool's Free", p.Broadcast(ctx, c))

	bad := p.Broadcast(ctx, Call{Method: "m", Payload: []byte("x"), Ref: ref})
	for _, r := range bad {
		if r.Err == nil || errors.Is(r.Err, ErrUnknownRef) {
			t.Fatalf("a Call with a Payload and a Ref: %+v", r)
		}
	}

	p.Free(ref)
	p.Free(ref) // twice: does nothing
	before := calls.Load()
	rs := p.Broadcast(ctx, c, "b", "nope")
	if !errors.Is(rs[0].Err, ErrUnknownRef) || rs[0].Actor != "b" || !errors.Is(rs[1].Err, ErrUnknownActor) {
		t.Fatalf("Broadcast of a freed Ref: %+v", rs)
	}
	for _, r := range ForeachBroadcast(ctx, actors, c) {
		if !errors.Is(r.Err, ErrUnknownRef) {
			t.Fatalf("ForeachBroadcast of a freed Ref: %+v", r)
		}
	}
	if err := p.Submit(ctx, c); err != nil {
		t.Fatal(err)
	}
	if r, err := p.GetNext(ctx); err != nil || !errors.Is(r.Err, ErrUnknownRef) {
		t.Fatalf("Submit of a freed Ref: %+v, %v", r, err)
	}
	if n := calls.Load() - before; n != 0 {
		t.Fatalf("%d actors called with a freed Ref", n)
	}

	if r2 := p.Put(nil); r2 == ref {
		t.Fatal("a Ref id was reused")
	}
}

// fakeBatcher is a HostBatcher that counts its calls and answers each
// actor with "<id>:<payload>", unless fn says otherwise.
type fakeBatcher struct {
	host  string
	calls atomic.Int64
	fn    func(ctx context.Context, ids []string) []Result // nil: the default answer

	mu    sync.Mutex
	ids   [][]string // the ids of each call
	refs  []Ref      // the Ref of each call
	freed []Ref
}

func (b *fakeBatcher) Host() string { return b.host }

func (b *fakeBatcher) BatchCall(ctx context.Context, method string, payload []byte, ref Ref, ids []string) []Result {
	b.calls.Add(1)
	b.mu.Lock()
	b.ids = append(b.ids, slices.Clone(ids))
	b.refs = append(b.refs, ref)
	b.mu.Unlock()
	if b.fn != nil {
		return b.fn(ctx, ids)
	}
	rs := make([]Result, len(ids))
	for i, id := range ids {
		rs[i].Value = []byte(id + ":" + method + ":" + string(payload))
	}
	return rs
}

func (b *fakeBatcher) freeRef(r Ref) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freed = append(b.freed, r)
}

// hostedActor is an actor of a fakeBatcher's host. Its own Call is never
// to be used by a Broadcast.
type hostedActor struct {
	id     string
	hb     *fakeBatcher
	direct *atomic.Int64
}

func (a *hostedActor) ID() string           { return a.id }
func (a *hostedActor) Host() string         { return a.hb.host }
func (a *hostedActor) Batcher() HostBatcher { return a.hb }
func (a *hostedActor) Call(context.Context, string, []byte) ([]byte, error) {
	a.direct.Add(1)
	return []byte("direct"), nil
}

var _ HostActor = (*hostedActor)(nil)

// hostedPool is a pool of 3 hosts' actors, 4 each, between in-process
// ones, in an order that mixes them.
func hostedPool(direct *atomic.Int64) (*Pool, []*fakeBatcher, []Actor) {
	hosts := []*fakeBatcher{{host: "h0:1"}, {host: "h1:1"}, {host: "h2:1"}}
	var actors []Actor
	for i := range 4 {
		for h, hb := range hosts {
			actors = append(actors, &hostedActor{id: fmt.Sprintf("h%d/%d", h, i), hb: hb, direct: direct})
		}
		actors = append(actors, echoActor(fmt.Sprintf("local%d", i)))
	}
	return NewPool(actors...), hosts, actors
}

func TestBroadcastBatchesPerHost(t *testing.T) {
	defer goleak.VerifyNone(t)
	var direct atomic.Int64
	p, hosts, actors := hostedPool(&direct)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	rs := p.Broadcast(ctx, Call{Method: "m", Payload: []byte("x")})
	if got, want := resultIDs(rs), actorIDs(actors); !slices.Equal(got, want) {
		t.Fatalf("results %v, want pool order %v", got, want)
	}
	for i, r := range rs {
		want := actors[i].ID() + ":m:x"
		if strings.HasPrefix(actors[i].ID(), "local") {
			want = "x"
		}
		if r.Err != nil || string(r.Value) != want {
			t.Fatalf("%s: %q, %v; want %q", r.Actor, r.Value, r.Err, want)
		}
	}
	for h, hb := range hosts {
		want := []string{fmt.Sprintf("h%d/0", h), fmt.Sprintf("h%d/1", h), fmt.Sprintf("h%d/2", h), fmt.Sprintf("h%d/3", h)}
		if hb.calls.Load() != 1 || !slices.Equal(hb.ids[0], want) {
			t.Fatalf("host %s: %d calls, ids %v; want 1 call for %v", hb.host, hb.calls.Load(), hb.ids, want)
		}
	}
	if direct.Load() != 0 {
		t.Fatalf("%d hosted actors called one by one", direct.Load())
	}

	// A subset: one call per host named, none for the others.
	rs = p.Broadcast(ctx, Call{Method: "m"}, "h1/3", "local0", "nope", "h1/0")
	if rs[0].Actor != "h1/3" || string(rs[0].Value) != "h1/3:m:" || !errors.Is(rs[2].Err, ErrUnknownActor) || rs[3].Actor != "h1/0" {
		t.Fatalf("subset: %+v", rs)
	}
	if n0, n1 := hosts[0].calls.Load(), hosts[1].calls.Load(); n0 != 1 || n1 != 2 || !slices.Equal(hosts[1].ids[1], []string{"h1/3", "h1/0"}) {
		t.Fatalf("subset: calls %d %d, ids %v", n0, n1, hosts[1].ids)
	}

	// Hosts only: no worker runs.
	rs = p.Broadcast(ctx, Call{Method: "m"}, "h2/0", "h2/1")
	if len(rs) != 2 || rs[1].Err != nil || string(rs[1].Value) != "h2/1:m:" {
		t.Fatalf("hosts only: %+v", rs)
	}

	// A Ref reaches the batchers as itself, with its bytes; Free reaches
	// each batcher once.
	ref := p.Put([]byte("big"))
	rs = p.Broadcast(ctx, Call{Method: "m", Ref: ref})
	if string(rs[0].Value) != "h0/0:m:big" || hosts[0].refs[len(hosts[0].refs)-1] != ref {
		t.Fatalf("by Ref: %q, ref %v", rs[0].Value, hosts[0].refs)
	}
	p.Free(ref)
	for _, hb := range hosts {
		if !slices.Equal(hb.freed, []Ref{ref}) {
			t.Fatalf("host %s freed %v, want the Ref once", hb.host, hb.freed)
		}
	}
	rs = p.Broadcast(ctx, Call{Method: "m", Ref: ref})
	if !errors.Is(rs[0].Err, ErrUnknownRef) || hosts[0].calls.Load() != 2 {
		t.Fatalf("a freed Ref: %v, %d calls", rs[0].Err, hosts[0].calls.Load())
	}

	// An actor with no host is called on its own even if it could batch.
	nohost := &hostedActor{id: "solo", hb: &fakeBatcher{host: ""}, direct: &direct}
	if rs := NewPool(nohost).Broadcast(ctx, Call{Method: "m"}); string(rs[0].Value) != "direct" {
		t.Fatalf("an actor with Host \"\": %+v", rs)
	}
}

// TestBroadcastDeadHostCostsItsSlots: a host that hangs, one that panics
// and one that answers short cost their own actors' slots only.
func TestBroadcastDeadHostCostsItsSlots(t *testing.T) {
	defer goleak.VerifyNone(t)
	var direct atomic.Int64
	p, hosts, actors := hostedPool(&direct)
	gate := make(chan struct{})
	hosts[0].fn = func(ctx context.Context, ids []string) []Result {
		<-gate // ignores ctx, as a host that is gone might
		return nil
	}
	hosts[1].fn = func(context.Context, []string) []Result { panic("batcher bug") }
	hosts[2].fn = func(_ context.Context, ids []string) []Result { return make([]Result, len(ids)-1) }
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	rs := p.Broadcast(ctx, Call{Method: "m", Payload: []byte("x")})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Broadcast took %v", d)
	}
	close(gate)
	for i, r := range rs {
		id := actors[i].ID()
		var pe *PanicError
		switch {
		case r.Actor != id:
			t.Fatalf("slot %d: %s, want %s", i, r.Actor, id)
		case strings.HasPrefix(id, "local"):
			if r.Err != nil {
				t.Fatalf("%s: %v", id, r.Err)
			}
		case strings.HasPrefix(id, "h0/"):
			if !errors.Is(r.Err, context.DeadlineExceeded) {
				t.Fatalf("%s on the hung host: %v", id, r.Err)
			}
		case strings.HasPrefix(id, "h1/"):
			if !errors.As(r.Err, &pe) || pe.Value != "batcher bug" {
				t.Fatalf("%s on the panicking host: %v", id, r.Err)
			}
		case id == "h2/3":
			if r.Err == nil || !strings.Contains(r.Err.Error(), "answered for 3 of 4") {
				t.Fatalf("%s, left out by its host: %v", id, r.Err)
			}
		default:
			if r.Err != nil {
				t.Fatalf("%s: %v", id, r.Err)
			}
		}
	}
}

// Calls that run runtime.Goexit end their workers' goroutines, with as
// many of them as there are workers: the other actors are called all the
// same (a tester: with two workers and the first two actors calling
// Goexit, the others were never called and Broadcast waited for ctx).
func TestBroadcastGoexitOnEveryWorker(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	var actors []Actor
	for i := range n + 3 {
		id := fmt.Sprintf("a%d", i)
		fn := func(context.Context, string, []byte) ([]byte, error) { return []byte(id), nil }
		if i < n {
			fn = func(context.Context, string, []byte) ([]byte, error) { runtime.Goexit(); return nil, nil }
		}
		actors = append(actors, &fnActor{id: id, fn: fn})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, r := range NewPool(actors...).Broadcast(ctx, Call{Method: "stats"}) {
		var pe *PanicError
		if i < n && !errors.As(r.Err, &pe) || i >= n && (r.Err != nil || string(r.Value) != r.Actor) {
			t.Errorf("%s: %+v (err %v)", actors[i].ID(), r, r.Err)
		}
	}
}

// A Ref made by another pool names nothing here, as the doc says: its
// Free there would not end it here (a tester: it was resolved).
func TestRefOfAnotherPool(t *testing.T) {
	echo := &fnActor{id: "a", fn: func(_ context.Context, _ string, p []byte) ([]byte, error) { return p, nil }}
	p, q := NewPool(echo), NewPool()
	ref := q.Put([]byte("q's"))
	if rs := p.Broadcast(context.Background(), Call{Method: "m", Ref: ref}); len(rs) != 1 || !errors.Is(rs[0].Err, ErrUnknownRef) {
		t.Errorf("Broadcast with another pool's Ref: %+v, want ErrUnknownRef", rs)
	}
	p.Submit(context.Background(), Call{Method: "m", Ref: ref})
	if r, err := p.GetNext(context.Background()); err != nil || !errors.Is(r.Err, ErrUnknownRef) {
		t.Errorf("Submit with another pool's Ref: %+v, %v; want ErrUnknownRef", r, err)
	}
}

// broadcastEach tells of every result once, as it comes: a fast actor's
// before a slow one answers, a slow one's at ctx's end with ctx's error,
// and never again when it answers after.
func TestBroadcastEachTellsOnce(t *testing.T) {
	release := make(chan struct{})
	slowDone := make(chan struct{})
	fast := &fnActor{id: "fast", fn: func(context.Context, string, []byte) ([]byte, error) { return []byte("f"), nil }}
	slow := &fnActor{id: "slow", fn: func(context.Context, string, []byte) ([]byte, error) {
		defer close(slowDone)
		<-release // ignores ctx
		return []byte("s"), nil
	}}
	p := NewPool(fast, slow)
	var mu sync.Mutex
	told := map[string][]error{}
	fastTold := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-fastTold; cancel() }() // ends the broadcast once the fast one is told: the slow one is not
	p.broadcastEach(ctx, Call{Method: "m"}, func(i int, r Result) {
		mu.Lock()
		defer mu.Unlock()
		told[r.Actor] = append(told[r.Actor], r.Err)
		if r.Actor == "fast" {
			close(fastTold)
		}
	})
	close(release)
	<-slowDone
	time.Sleep(10 * time.Millisecond) // a late tell would come now
	mu.Lock()
	defer mu.Unlock()
	if len(told["fast"]) != 1 || told["fast"][0] != nil {
		t.Errorf("fast told %v, want once, with no error", told["fast"])
	}
	if len(told["slow"]) != 1 || !errors.Is(told["slow"][0], context.Canceled) {
		t.Errorf("slow told %v, want once, with ctx's error", told["slow"])
	}
}
