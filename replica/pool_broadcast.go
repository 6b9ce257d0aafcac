package replica

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// broadcastStall is how long a Broadcast worker may sit in one call before
// Broadcast starts another worker in its place. Broadcast runs its calls
// inline on a few workers because a goroutine per actor costs far more than
// an in-process call (issue 4); a call that takes longer than this is taken
// to be slow or dead. It is well above a healthy in-process call and well
// below any useful deadline.
const broadcastStall = 200 * time.Microsecond

// broadcastChunk is how many actors a Broadcast worker claims at a time, so
// that workers do not share one counter and neighbouring result slots on
// every call: on 2 cores that sharing cost little, but it grows with the
// cores. Within its chunk a worker claims slot by slot from the chunk's own
// counter, so that another worker can take the rest of a chunk whose worker
// is stuck in a call.
const broadcastChunk = 32

// Broadcast sends c to every actor in the pool, or to the actors named by
// only, and returns one Result per actor: in pool order, or in the order of
// only, one per entry. An ID of only not in the pool gets an error wrapping
// ErrUnknownActor. If c.Ref names no payload (it was freed), every Result
// has an error wrapping ErrUnknownRef and no actor is called.
//
// The calls run whether their actors are busy with submitted work or idle,
// and share one payload read-only: c.Payload, or the bytes c.Ref names,
// looked up once. Each call runs with ctx, so give ctx a deadline:
// Broadcast returns when every actor has answered or when ctx ends,
// whichever is first, and an actor that has not answered by then gets ctx's
// error in its Result while the others keep theirs. A panic in an actor's
// Call is a *PanicError in its Result.
//
// The calls run on a few worker goroutines, GOMAXPROCS to start with, each
// claiming actors 32 at a time and calling them inline. Every 200 µs,
// while actors are left unclaimed, Broadcast starts one more
// worker for each worker that has been in one call since the last look. So
// a slow or dead actor holds up only its own answer, and when every call is
// slow the workers double at every stall, towards one per actor. Workers
// stop taking actors once ctx ends; a call still running in an actor that
// ignores ctx finishes into a discarded slot after Broadcast has returned.
//
// The actors of a host process (HostActor) are not called one by one:
// each host's batcher gets one BatchCall naming all of its actors among
// the targets, on a goroutine of its own, with the payload and the Ref it
// came by. Its answers land in its actors' slots, in pool order like the
// others; a host that fails or hangs costs its own actors' slots only.
func (p *Pool) Broadcast(ctx context.Context, c Call, only ...string) []Result {
	return p.broadcastEach(ctx, c, nil, only...)
}

// broadcastEach is Broadcast, telling each, if not nil, of every Result
// as it comes, exactly once, from the goroutine that filled it (a worker,
// a host's batcher, or Broadcast's own at ctx's end: then with ctx's
// error): a health check's round records a replica's answer without
// waiting for one that hangs. A call that answers after ctx's end was told
// with ctx's error; each may run after broadcastEach has returned.
func (p *Pool) broadcastEach(ctx context.Context, c Call, each func(i int, r Result), only ...string) []Result {
	p.mu.Lock()
	targets := p.actors // never written in place
	hosted := p.hosted
	if len(only) > 0 {
		targets = make([]Actor, len(only))
		for i, id := range only {
			targets[i] = p.byID[id] // nil if unknown
		}
	}
	p.mu.Unlock()
	n := len(targets)
	if n == 0 {
		return []Result{}
	}

	b := &broadcast{
		ctx:     ctx,
		targets: targets,
		results: make([]Result, n),
		chunks:  make([]chunk, (n+broadcastChunk-1)/broadcastChunk),
		done:    make(chan struct{}),
		each:    each,
	}
	if each != nil {
		b.told = make([]atomic.Bool, n)
	}
	payload, perr := c.payload(p)
	b.c = Call{Method: c.Method, Payload: payload} // resolved once for every actor
	b.ref = c.Ref
	var groups []hostGroup
	if hosted && perr == nil {
		groups, b.batched = groupByHost(targets)
	}
	left := n
	for i, a := range targets {
		switch {
		case a == nil:
			b.results[i] = Result{Actor: only[i], Err: fmt.Errorf("%w: %q", ErrUnknownActor, only[i])}
		case perr != nil:
			b.results[i] = Result{Actor: a.ID(), Err: perr}
		default:
			continue
		}
		b.chunks[i/broadcastChunk].filled[i%broadcastChunk].Store(true)
		b.tell(i)
		left--
	}
	if left == 0 {
		return b.results
	}
	b.left.Store(int64(left))
	unbatched := left
	for _, g := range groups {
		unbatched -= len(g.slots)
		go b.batch(g)
	}
	if unbatched == 0 {
		// Hosts only: no worker, and nothing for the watchdog to watch.
		select {
		case <-b.done:
			return b.results
		case <-ctx.Done():
			return b.closed()
		}
	}
	// The calling goroutine is not a worker: it must stay free to return at
	// the deadline even if an actor ignores ctx.
	workers := make([]worker, min(unbatched, runtime.GOMAXPROCS(0)))
	for i := range workers {
		go b.work(&workers[i])
	}

	tick := time.NewTicker(broadcastStall)
	defer tick.Stop()
	var watched []watch // made at the first tick: most broadcasts are done by then
	for {
		select {
		case <-b.done:
			return b.results // every slot is filled: no worker writes again
		case <-ctx.Done():
			b.stop.Store(true)
			return b.closed()
		case <-tick.C:
			unclaimed := n - b.claimed()
			if unclaimed == 0 {
				tick.Stop() // every call has a worker: none is needed
				continue
			}
			if watched == nil {
				for i := range workers {
					watched = append(watched, watch{w: &workers[i], chunk: -1})
				}
			}
			for i := range watched { // not the ones appended below: they have only just started
				wt := &watched[i]
				k := wt.w.chunk.Load()
				if k < 0 {
					continue // exited
				}
				claims := b.chunks[k].next.Load()
				if k != wt.chunk || claims != wt.claims {
					wt.chunk, wt.claims = k, claims
					continue
				}
				// No slot of its chunk was claimed since the last tick,
				// and the worker is still in it: it is stuck in one call.
				if unclaimed > 0 {
					unclaimed--
					nw := new(worker)
					watched = append(watched, watch{w: nw, chunk: -1})
					go b.work(nw)
				}
			}
		}
	}
}

// broadcast is one Broadcast's calls, shared by its workers.
type broadcast struct {
	ctx     context.Context
	c       Call    // the payload resolved: c.Ref is the zero Ref
	ref     Ref     // the Ref the payload came by, for the batchers
	targets []Actor // nil for an unknown ID of only, whose slot is filled from the start
	// batched[i] is set when targets[i] is called through its host's
	// batcher, not by a worker; nil when no target is.
	batched []bool

	// results[i] is written once, by the worker that called targets[i],
	// before its filled flag is set; it is read only after that flag is
	// set, or after done is closed.
	results []Result
	chunks  []chunk // chunks[k] holds targets[k*broadcastChunk:][:broadcastChunk]

	// stop is set when Broadcast has returned at ctx's end: workers check
	// it before every call, which costs less than a select on ctx.Done().
	stop atomic.Bool

	nextChunk atomic.Int64  // index of the next chunk to claim
	left      atomic.Int64  // targets whose result is not yet filled
	done      chan struct{} // closed when left reaches 0

	// each, if not nil, is told of each result (see broadcastEach);
	// told[i] is set by whoever tells of slot i: its filler, or
	// closed at ctx's end.
	each func(i int, r Result)
	told []atomic.Bool
}

// tell tells each of slot i's result, filled, unless it was told already
// (with ctx's error, at ctx's end).
func (b *broadcast) tell(i int) {
	if b.each != nil && b.told[i].CompareAndSwap(false, true) {
		b.each(i, b.results[i])
	}
}

// chunk is broadcastChunk consecutive targets of a broadcast.
type chunk struct {
	next   atomic.Int32                  // offset of the next slot to claim; may run past the chunk's end
	filled [broadcastChunk]atomic.Bool   // filled[j]: the slot's result is written
	_      [64 - 4 - broadcastChunk]byte // a cache line of its own, away from the other workers' chunks
}

// worker is where a Broadcast worker is, for the watchdog. Slots are claimed
// one by one from their chunk's counter, so a worker that stays in one chunk
// while that counter stands still is in one call all along: the progress
// costs a store per chunk, not one per call.
type worker struct {
	chunk atomic.Int32 // the chunk the worker is in (0 until it claims one); -1 once it has exited
	_     [64 - 4]byte // a cache line of its own
}

// watch is what the watchdog saw of a worker at the last tick.
type watch struct {
	w      *worker
	chunk  int32 // w.chunk; -1 before the first look
	claims int32 // that chunk's next
}

// work claims chunks in turn, then any slots still unclaimed in other
// workers' chunks (behind a call that is slow), and calls their actors until
// none is left or Broadcast has returned at ctx's end.
func (b *broadcast) work(w *worker) {
	// Filled slots are counted here and added to left once, on the way out:
	// a shared counter written on every call would cost more than the call.
	filled := int64(0)
	returned := false
	defer func() {
		if !returned {
			// A call ran runtime.Goexit, which ends this goroutine once
			// its slot is filled (drainCalls): another goes on with the
			// slots left, which no worker might claim otherwise.
			go b.work(w)
		} else {
			w.chunk.Store(-1)
		}
		if filled > 0 && b.left.Add(-filled) == 0 {
			close(b.done)
		}
	}()
	b.claim(w, &filled)
	returned = true
}

// claim claims chunks in turn, then any slots still unclaimed in other
// workers' chunks, and calls their actors (see work).
func (b *broadcast) claim(w *worker, filled *int64) {
	for {
		k := int(b.nextChunk.Add(1) - 1)
		if k >= len(b.chunks) {
			break
		}
		if !b.drain(w, k, filled) {
			return
		}
	}
	for k := range b.chunks {
		if !b.drain(w, k, filled) {
			return
		}
	}
}

// drain claims and calls chunk k's slots until none is left, and reports
// false if Broadcast has returned at ctx's end.
func (b *broadcast) drain(w *worker, k int, filled *int64) bool {
	for {
		if ok, panicked := b.drainCalls(w, k, filled); !panicked {
			return ok
		}
	}
}

// drainCalls is drain until a call panics: the panic becomes a *PanicError
// in that actor's slot, and drain goes on with the rest of the chunk. It
// recovers once per run of calls, not once per call, because a deferred
// recover around every call cost more than an in-process call (issue 4).
func (b *broadcast) drainCalls(w *worker, k int, filled *int64) (ok, panicked bool) {
	ch := &b.chunks[k]
	base := k * broadcastChunk
	size := int32(min(broadcastChunk, len(b.targets)-base))
	if ch.next.Load() >= size {
		return true, false // claimed already: most chunks, when stealing
	}
	w.chunk.Store(int32(k))
	// Locals: the loop would otherwise reload them through b after every
	// atomic operation.
	ctx, c, stop, batched := b.ctx, b.c, &b.stop, b.batched
	targets, results := b.targets[base:base+int(size)], b.results[base:base+int(size)]
	calling := int32(-1) // the slot whose call is running
	defer func() {
		if calling < 0 {
			return
		}
		// The call panicked, or called runtime.Goexit (recover returns nil
		// and the worker still exits, but its slot is filled).
		v := recover()
		if v == nil {
			v = "runtime.Goexit" // as Submit's say
		}
		r := &results[calling]
		r.Value, r.Err = nil, &PanicError{Value: v, Stack: debug.Stack()}
		r.Actor = targets[calling].ID()
		ch.filled[calling].Store(true)
		b.tell(base + int(calling))
		*filled++
		panicked = true
	}()
	for {
		if stop.Load() {
			return false, false
		}
		j := ch.next.Add(1) - 1
		if j >= size {
			return true, false
		}
		a := targets[j]
		if a == nil || batched != nil && batched[base+int(j)] {
			continue // unknown ID, filled by Broadcast; or its host's batcher calls it
		}
		calling = j
		v, err := a.Call(ctx, c.Method, c.Payload)
		calling = -1
		r := &results[j]
		r.Value, r.Err = v, err
		r.Actor = a.ID() // field by field: cheaper under GC than copying a Result in
		ch.filled[j].Store(true)
		b.tell(base + int(j))
		*filled++
	}
}

// hostGroup is the targets of one Broadcast that live in one host.
type hostGroup struct {
	hb    HostBatcher
	slots []int // indexes into targets, in pool order
}

// groupByHost finds the targets that their host's batcher calls, grouped
// by batcher in the order their hosts first appear, and marks them.
func groupByHost(targets []Actor) ([]hostGroup, []bool) {
	var groups []hostGroup
	var batched []bool
	index := make(map[HostBatcher]int)
	for i, a := range targets {
		if a == nil {
			continue
		}
		hb := batcherOf(a)
		if hb == nil {
			continue
		}
		if batched == nil {
			batched = make([]bool, len(targets))
		}
		batched[i] = true
		g, ok := index[hb]
		if !ok {
			g = len(groups)
			index[hb] = g
			groups = append(groups, hostGroup{hb: hb})
		}
		groups[g].slots = append(groups[g].slots, i)
	}
	return groups, batched
}

// batch makes g's one BatchCall and fills its actors' slots. A panic in
// BatchCall is a *PanicError in each of them; a batcher that answers for
// fewer actors than it was given fails the rest.
func (b *broadcast) batch(g hostGroup) {
	ids := make([]string, len(g.slots))
	for k, i := range g.slots {
		ids[k] = b.targets[i].ID()
	}
	rs, perr := func() (rs []Result, perr error) {
		defer func() {
			if v := recover(); v != nil {
				perr = &PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		return g.hb.BatchCall(b.ctx, b.c.Method, b.c.Payload, b.ref, ids), nil
	}()
	for k, i := range g.slots {
		r := &b.results[i]
		switch {
		case perr != nil:
			r.Value, r.Err = nil, perr
		case k < len(rs):
			r.Value, r.Err = rs[k].Value, rs[k].Err
		default:
			r.Value, r.Err = nil, fmt.Errorf("replica: host %s answered for %d of %d actors", g.hb.Host(), len(rs), len(ids))
		}
		r.Actor = ids[k]
		b.chunks[i/broadcastChunk].filled[i%broadcastChunk].Store(true)
		b.tell(i)
	}
	if b.left.Add(-int64(len(g.slots))) == 0 {
		close(b.done)
	}
}

// claimed returns how many slots workers have claimed.
func (b *broadcast) claimed() int {
	sum := 0
	for k := range b.chunks {
		size := min(broadcastChunk, len(b.targets)-k*broadcastChunk)
		sum += min(int(b.chunks[k].next.Load()), size)
	}
	return sum
}

// closed returns a copy of the results for a Broadcast whose ctx has ended:
// the filled slots as they are, ctx's error in the others. Answers that come
// later land in b.results, which nobody reads any more.
func (b *broadcast) closed() []Result {
	rs := make([]Result, len(b.results))
	for i := range rs {
		if b.chunks[i/broadcastChunk].filled[i%broadcastChunk].Load() {
			rs[i] = b.results[i]
			continue // told by its filler
		}
		rs[i] = Result{Actor: b.targets[i].ID(), Err: b.ctx.Err()}
		if b.each != nil && b.told[i].CompareAndSwap(false, true) {
			b.each(i, rs[i]) // its answer, if it comes, is told no more
		}
	}
	return rs
}

// ForeachBroadcast is the baseline that Broadcast is measured against, and
// nothing else: production code broadcasts with Pool.Broadcast. It is the
// seed's foreach_remote,
//
//	refs = [a.method.remote(encode(arg)) for a in actors]; ray.get(refs)
//
// in Go: for each actor in turn it encodes c's argument for that actor (a
// copy of c.Payload; for a Ref, just the handle, which each call resolves on
// its own) and submits the call on a goroutine of its own, as Ray submits
// one task per actor; then it waits until every actor has answered. It
// returns one Result per actor, in the order of actors, each with its own
// error; a panic is a *PanicError. Unlike Broadcast it has no deadline of its
// own: like ray.get without a timeout, it waits for the slowest actor.
func ForeachBroadcast(ctx context.Context, actors []Actor, c Call) []Result {
	results := make([]Result, len(actors))
	var wg sync.WaitGroup
	for i, a := range actors {
		arg := c
		if c.Ref == (Ref{}) {
			arg.Payload = bytes.Clone(c.Payload) // encoded for this actor
		}
		wg.Go(func() {
			r := &results[i]
			r.Value, r.Err = safeCall(ctx, nil, a, arg)
			r.Actor = a.ID()
		})
	}
	wg.Wait()
	return results
}

// safeCall calls a with c's payload, resolving c.Ref if it has one (made
// by pool in, or any if nil), and turns a panic into a *PanicError.
func safeCall(ctx context.Context, in *Pool, a Actor, c Call) (v []byte, err error) {
	payload, err := c.payload(in)
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return a.Call(ctx, c.Method, payload)
}
