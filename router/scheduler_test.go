package router

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/serveproxy/serveproxy/replica"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newLocals returns n running replicas with limit max, wired to s.
func newLocals(s *Scheduler, n, max int) []*replica.Local {
	ls := make([]*replica.Local, n)
	hs := make([]replica.Handle, n)
	for i := range ls {
		ls[i] = replica.NewLocal("r"+string(rune('a'+i)), nil, max, s.Notify)
		ls[i].SetState(replica.StateRunning)
		hs[i] = ls[i]
	}
	s.SetReplicas(hs)
	return ls
}

// waitQueued waits (bounded) until n requests are queued.
func waitQueued(t *testing.T, s *Scheduler, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", s.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSchedulerFIFO(t *testing.T) {
	s := NewScheduler(nil, -1)
	newLocals(s, 1, 1)
	_, release, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, rel, err := s.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			rel()
		}()
		waitQueued(t, s, i+1) // arrival order is i's order
	}
	release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served in position %d: not FIFO", got, want)
		}
		want++
	}
}

func TestSchedulerBackPressure(t *testing.T) {
	s := NewScheduler(nil, 2)
	newLocals(s, 2, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var releases []func()
	for range 2 {
		_, rel, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, rel)
	}
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, rel, err := s.Acquire(ctx)
			if err == nil {
				rel()
			}
			errs <- err
		}()
		waitQueued(t, s, i+1)
	}
	_, _, err := s.Acquire(ctx)
	var bp *BackPressureError
	if !errors.As(err, &bp) || bp.Queued != 2 || bp.Limit != 2 {
		t.Fatalf("third waiter: err = %v, want BackPressureError{2, 2}", err)
	}
	for _, rel := range releases {
		rel()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("queued request failed: %v", err)
		}
	}
}

func TestSchedulerCancelWhileQueued(t *testing.T) {
	s := NewScheduler(nil, -1)
	newLocals(s, 1, 1)
	_, release, _ := s.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := s.Acquire(ctx)
		errc <- err
	}()
	waitQueued(t, s, 1)
	got := make(chan struct{})
	go func() {
		_, rel, err := s.Acquire(context.Background())
		if err == nil {
			rel()
		}
		close(got)
	}()
	waitQueued(t, s, 2)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: err = %v, want context.Canceled", err)
	}
	waitQueued(t, s, 1)
	release()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter behind a cancelled one never got the slot")
	}
}

func TestSchedulerNoReplicas(t *testing.T) {
	s := NewScheduler(nil, -1)
	if _, _, err := s.Acquire(context.Background()); !errors.Is(err, ErrNoReplicas) {
		t.Fatalf("err = %v, want ErrNoReplicas", err)
	}
	newLocals(s, 1, 1)
	_, release, _ := s.Acquire(context.Background())
	defer release()
	errc := make(chan error, 1)
	go func() {
		_, _, err := s.Acquire(context.Background())
		errc <- err
	}()
	waitQueued(t, s, 1)
	s.SetReplicas(nil) // every replica gone: waiters fail, they do not hang
	if err := <-errc; !errors.Is(err, ErrNoReplicas) {
		t.Fatalf("waiter: err = %v, want ErrNoReplicas", err)
	}
}

func TestSchedulerNewReplicasServeWaiters(t *testing.T) {
	s := NewScheduler(nil, -1)
	newLocals(s, 1, 1)
	_, release, _ := s.Acquire(context.Background())
	defer release()
	done := make(chan error, 1)
	go func() {
		_, rel, err := s.Acquire(context.Background())
		if err == nil {
			rel()
		}
		done <- err
	}()
	waitQueued(t, s, 1)
	old := s.Replicas()[0]
	extra := replica.NewLocal("extra", nil, 1, s.Notify)
	extra.SetState(replica.StateRunning)
	s.SetReplicas([]replica.Handle{old, extra})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSchedulerLimitNeverExceeded drives many goroutines through a few
// small replicas and checks each replica's own peak against its limit.
func TestSchedulerLimitNeverExceeded(t *testing.T) {
	for max := 1; max <= 5; max++ {
		s := NewScheduler(nil, -1)
		ls := newLocals(s, 3, max)
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					h, rel, err := s.Acquire(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					if n := h.Ongoing(); n > max {
						t.Errorf("ongoing %d > limit %d", n, max)
					}
					rel()
				}
			}()
		}
		wg.Wait()
		for _, l := range ls {
			if l.Peak() > max {
				t.Fatalf("limit %d: replica %s peaked at %d", max, l.ID(), l.Peak())
			}
			if l.Ongoing() != 0 {
				t.Fatalf("replica %s has %d requests after all released", l.ID(), l.Ongoing())
			}
		}
		if s.Queued() != 0 {
			t.Fatalf("queued = %d after the run", s.Queued())
		}
	}
}

func TestPowerOfTwoPrefersLessLoaded(t *testing.T) {
	s := NewScheduler(nil, -1)
	ls := newLocals(s, 2, 10)
	for range 5 {
		ls[0].TryAcquire()
	}
	seq := []int{0, 0} // picks replicas 0 and 1
	p := &PowerOfTwo{IntN: func(int) int { v := seq[0]; seq = seq[1:]; return v }}
	if h := p.Pick(s.Replicas()); h != ls[1] {
		t.Fatalf("picked %v, want the idle replica", h)
	}
	// A full replica is never picked, even when both samples land on it.
	for range 5 {
		ls[0].TryAcquire()
	}
	p.IntN = func(int) int { return 0 }
	for range 3 {
		ls[1].TryAcquire()
	}
	if h := p.Pick(s.Replicas()); h != ls[1] {
		t.Fatalf("picked %v, want the replica with free slots", h)
	}
}

func BenchmarkPowerOfTwoPick(b *testing.B) {
	s := NewScheduler(nil, -1)
	newLocals(s, 16, 100)
	p := &PowerOfTwo{}
	hs := s.Replicas()
	b.ReportAllocs()
	for b.Loop() {
		p.Pick(hs)
	}
}

func BenchmarkSchedulerAcquireRelease(b *testing.B) {
	s := NewScheduler(nil, -1)
	newLocals(s, 16, 100)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, rel, err := s.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			rel()
		}
	})
}

// TryAcquire takes a free slot, fails at once when none is free, and a
// slot freed while a request waits goes to the waiter, not to TryAcquire.
func TestSchedulerTryAcquire(t *testing.T) {
	s := NewScheduler(nil, -1)
	newLocals(s, 1, 1)
	h, release, ok := s.TryAcquire()
	if !ok || h == nil {
		t.Fatal("TryAcquire on a free replica failed")
	}
	if _, _, ok := s.TryAcquire(); ok {
		t.Fatal("TryAcquire past max_ongoing_requests succeeded")
	}
	got := make(chan error, 1)
	go func() {
		_, rel, err := s.Acquire(context.Background())
		if err == nil {
			rel()
		}
		got <- err
	}()
	waitQueued(t, s, 1)
	release() // hands the slot to the waiter
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	_, release, ok = s.TryAcquire()
	if !ok {
		t.Fatal("TryAcquire after the queue emptied failed")
	}
	release()
}

func TestSchedulerTryAcquireExcept(t *testing.T) {
	s := NewScheduler(nil, -1)
	ls := newLocals(s, 3, 1)
	tried := []replica.Handle{ls[0], ls[1]}
	for range 20 {
		h, rel, ok := s.TryAcquireExcept(tried)
		if !ok || h != ls[2] {
			t.Fatalf("TryAcquireExcept(a, b) = %v, %v; want c", h, ok)
		}
		rel()
	}
	_, relC, _ := s.TryAcquireExcept(tried) // c is full now
	if h, _, ok := s.TryAcquireExcept(tried); ok {
		t.Fatalf("TryAcquireExcept with every other replica full = %v, want none", h.ID())
	}
	relC()
}

// A request backing off after refusals counts as queued, against the
// limit, until its wait ends or its context does.
func TestSchedulerBackoffCountsAsQueued(t *testing.T) {
	s := NewScheduler(nil, 1)
	newLocals(s, 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Backoff(ctx, time.Hour) }()
	waitQueued(t, s, 1)
	var bp *BackPressureError
	if err := s.Backoff(context.Background(), time.Millisecond); !errors.As(err, &bp) || bp.Queued != 1 {
		t.Fatalf("a second Backoff with one waiting and a limit of 1: %v, want BackPressureError", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Backoff after its context ended: %v", err)
	}
	waitQueued(t, s, 0)
	if err := s.Backoff(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Backoff with room: %v", err)
	}
}

// When both replicas drawn are full, the pick is still the less loaded of
// two free ones, not the first free one by position: over every draw of
// two among three full replicas, one with a slot left and one idle, the
// idle one is picked whenever both drawn are full (a review: the busier
// one was picked 12 times in 20, by its place in the list).
func TestPowerOfTwoBothFullPicksByLoad(t *testing.T) {
	s := NewScheduler(nil, -1)
	ls := newLocals(s, 5, 4)
	for k, held := range []int{4, 4, 4, 3, 0} {
		for range held {
			if _, ok := ls[k].TryAcquire(); !ok {
				t.Fatal("acquire")
			}
		}
	}
	hs := s.Replicas()
	picks := map[string]int{}
	n := len(hs)
	for i := range n {
		for j := range n - 1 {
			calls := 0
			p := &PowerOfTwo{IntN: func(int) int {
				calls++
				if calls == 1 {
					return i
				}
				return j
			}}
			picks[p.Pick(hs).ID()]++
		}
	}
	busier, idle := picks[ls[3].ID()], picks[ls[4].ID()]
	// Drawn with a full one, each free replica is taken (6 draws each);
	// drawn together, the idle one (2); both full, the idle one (6).
	if busier != 6 || idle != 14 {
		t.Errorf("over all %d draws: the replica with one slot left picked %d times, the idle one %d; want 6 and 14", n*(n-1), busier, idle)
	}
}
