package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/serveproxy/serveproxy/replica"
)

// ErrNoReplicas is returned when the deployment has no routable replica at
// all, so that a request is answered at once instead of waiting for ever.
var ErrNoReplicas = errors.New("no replicas are available")

// BackPressureError is returned when max_queued_requests requests are
// already waiting for a replica.
type BackPressureError struct {
	Queued int // requests waiting when this one arrived
	Limit  int // the deployment's max_queued_requests
}

// Error implements error.
func (e *BackPressureError) Error() string {
	return fmt.Sprintf("request dropped due to backpressure (num_queued_requests=%d, max_queued_requests=%d)", e.Queued, e.Limit)
}

// Scheduler puts each request of one deployment on a replica with a free
// slot. The fast path reads an immutable snapshot of replicas and takes a
// slot with one compare-and-swap: no lock, no allocation. When every replica
// is full, requests wait in FIFO order and each freed slot is handed to the
// oldest waiter; once MaxQueued requests wait, more are refused with a
// *BackPressureError.
type Scheduler struct {
	picker    Picker
	maxQueued int // < 0: no limit

	replicas atomic.Pointer[[]replica.Handle]
	// pending counts waiters and requests about to become one. A release
	// decrements a replica's ongoing count and then reads pending; a waiter
	// increments pending and then looks for a slot: whichever runs second
	// sees the other, so no freed slot is missed (see Notify).
	pending atomic.Int64
	queued  atomic.Int64 // the queue's length, for metrics

	// mu guards the queue: a doubly linked list of waiters, oldest first,
	// so that a waiter that gives up leaves it at once.
	mu         sync.Mutex
	head, tail *waiter
	live       int
	// backingOff counts the requests waiting out a Backoff: queued too,
	// though not in the list (no freed slot of ours is theirs to take).
	backingOff int
}

// waiter is a request parked until a slot is handed to it.
type waiter struct {
	grant      chan grant // buffered 1
	prev, next *waiter    // guarded by Scheduler.mu
	queued     bool       // in the queue; guarded by Scheduler.mu
}

type grant struct {
	h       replica.Handle
	release func()
	err     error
}

var waiterPool = sync.Pool{New: func() any { return &waiter{grant: make(chan grant, 1)} }}

// NewScheduler returns a scheduler with no replicas. maxQueued < 0 means no
// limit. If picker is nil, a PowerOfTwo is used.
func NewScheduler(picker Picker, maxQueued int) *Scheduler {
	if picker == nil {
		picker = &PowerOfTwo{}
	}
	s := &Scheduler{picker: picker, maxQueued: maxQueued}
	s.replicas.Store(&[]replica.Handle{})
	return s
}

// SetReplicas replaces the snapshot of routable replicas. Waiting requests
// get the new replicas' free slots; with none left, they fail with
// ErrNoReplicas.
func (s *Scheduler) SetReplicas(hs []replica.Handle) {
	snap := append([]replica.Handle(nil), hs...)
	s.replicas.Store(&snap)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(snap) == 0 {
		for w := s.popLocked(); w != nil; w = s.popLocked() {
			w.grant <- grant{err: ErrNoReplicas}
		}
		return
	}
	s.dispatchLocked()
}

// Replicas returns the current snapshot. The caller must not modify it.
func (s *Scheduler) Replicas() []replica.Handle { return *s.replicas.Load() }

// Queued returns how many requests are waiting for a slot.
func (s *Scheduler) Queued() int { return int(s.queued.Load()) }

// Acquire returns a replica with a slot held for the caller, and the
// function that frees it. It waits while every replica is full, until a
// slot frees or ctx is done; it fails at once with ErrNoReplicas or a
// *BackPressureError.
func (s *Scheduler) Acquire(ctx context.Context) (replica.Handle, func(), error) {
	if h, release, ok := s.TryAcquire(); ok {
		return h, release, nil
	}
	return s.acquireSlow(ctx)
}

// TryAcquire is Acquire's fast path: a replica with a slot held for the
// caller and the function that frees it, if one is free and no request is
// waiting ahead; ok is false otherwise, and nothing is held. It never
// blocks. A caller that must tell a queued request from one served at once
// (to time the wait) calls it before Acquire.
func (s *Scheduler) TryAcquire() (h replica.Handle, release func(), ok bool) {
	if s.pending.Load() != 0 {
		return nil, nil, false
	}
	return s.tryPick()
}

// TryAcquireExcept is TryAcquire for a request that replicas in tried
// refused: a free slot on another replica, the one with fewest requests in
// flight, if there is one. It does not wait behind queued requests (the
// request was let in already) and never blocks.
func (s *Scheduler) TryAcquireExcept(tried []replica.Handle) (replica.Handle, func(), bool) {
	for {
		var best replica.Handle
		for _, h := range *s.replicas.Load() {
			if slices.Contains(tried, h) || !hasFree(h) {
				continue
			}
			if best == nil || h.Ongoing() < best.Ongoing() {
				best = h
			}
		}
		if best == nil {
			return nil, nil, false
		}
		if release, ok := best.TryAcquire(); ok {
			return best, release, true
		}
		tried = append(tried[:len(tried):len(tried)], best) // taken meanwhile: the next
	}
}

// Backoff makes a request wait d before it tries the replicas again, after
// each it tried refused it as full: their slots were taken by requests
// this scheduler does not see (another proxy's, in front of the same
// replica hosts). It waits as a queued request does, counted in Queued and
// against MaxQueued (a *BackPressureError once that many wait), and ends
// early with ctx's error.
func (s *Scheduler) Backoff(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	if n := s.live + s.backingOff; s.maxQueued >= 0 && n >= s.maxQueued {
		s.mu.Unlock()
		return &BackPressureError{Queued: n, Limit: s.maxQueued}
	}
	s.backingOff++
	s.queued.Store(int64(s.live + s.backingOff))
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.backingOff--
		s.queued.Store(int64(s.live + s.backingOff))
		s.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryPick asks the picker a few times: a slot it saw free may be taken by
// another request before our compare-and-swap.
func (s *Scheduler) tryPick() (replica.Handle, func(), bool) {
	snap := *s.replicas.Load()
	for range 3 {
		h := s.picker.Pick(snap)
		if h == nil {
			return nil, nil, false
		}
		if release, ok := h.TryAcquire(); ok {
			return h, release, true
		}
	}
	return nil, nil, false
}

// tryAny is tryPick, then a scan of every replica: it fails only when no
// replica had a free slot.
func (s *Scheduler) tryAny() (replica.Handle, func(), bool) {
	if h, release, ok := s.tryPick(); ok {
		return h, release, true
	}
	for _, h := range *s.replicas.Load() {
		if release, ok := h.TryAcquire(); ok {
			return h, release, true
		}
	}
	return nil, nil, false
}

func (s *Scheduler) acquireSlow(ctx context.Context) (replica.Handle, func(), error) {
	s.mu.Lock()
	s.pending.Add(1)
	// Take a free slot only if nobody is ahead of us: FIFO.
	if s.live == 0 {
		if h, release, ok := s.tryAny(); ok {
			s.pending.Add(-1)
			s.mu.Unlock()
			return h, release, nil
		}
	}
	if len(*s.replicas.Load()) == 0 {
		s.pending.Add(-1)
		s.mu.Unlock()
		return nil, nil, ErrNoReplicas
	}
	if n := s.live + s.backingOff; s.maxQueued >= 0 && n >= s.maxQueued {
		s.pending.Add(-1)
		err := &BackPressureError{Queued: n, Limit: s.maxQueued}
		s.mu.Unlock()
		return nil, nil, err
	}
	w := waiterPool.Get().(*waiter)
	s.pushLocked(w)
	s.mu.Unlock()

	select {
	case g := <-w.grant:
		waiterPool.Put(w)
		return g.h, g.release, g.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.queued {
		s.removeLocked(w)
		s.mu.Unlock()
		waiterPool.Put(w)
		return nil, nil, ctx.Err()
	}
	s.mu.Unlock()
	// A slot was handed to us as ctx ended: pass it on.
	g := <-w.grant
	waiterPool.Put(w)
	if g.release != nil {
		g.release()
	}
	return nil, nil, ctx.Err()
}

// pushLocked queues w as the newest waiter. Its pending count was taken
// by the caller.
func (s *Scheduler) pushLocked(w *waiter) {
	w.prev, w.next, w.queued = s.tail, nil, true
	if s.tail != nil {
		s.tail.next = w
	} else {
		s.head = w
	}
	s.tail = w
	s.live++
	s.queued.Store(int64(s.live + s.backingOff))
}

// removeLocked takes w out of the queue and drops its pending count.
func (s *Scheduler) removeLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		s.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		s.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	s.live--
	s.pending.Add(-1)
	s.queued.Store(int64(s.live + s.backingOff))
}

// popLocked removes and returns the oldest waiter, or nil.
func (s *Scheduler) popLocked() *waiter {
	w := s.head
	if w != nil {
		s.removeLocked(w)
	}
	return w
}

// Notify is called after a replica frees a slot. With nobody waiting it
// costs one atomic load; otherwise the freed slot goes to the oldest waiter.
func (s *Scheduler) Notify() {
	if s.pending.Load() == 0 {
		return
	}
	s.mu.Lock()
	s.dispatchLocked()
	s.mu.Unlock()
}

// dispatchLocked hands free slots to waiters, oldest first.
func (s *Scheduler) dispatchLocked() {
	for s.live > 0 {
		h, release, ok := s.tryAny()
		if !ok {
			return
		}
		w := s.popLocked()
		w.grant <- grant{h: h, release: release}
	}
}
