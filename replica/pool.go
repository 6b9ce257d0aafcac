package replica

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Actor is the pool's view of an actor: something that takes a call and
// answers it. Local replicas and, later, replicas in other processes are both
// actors.
type Actor interface {
	// ID names the actor; it is unique within a pool.
	ID() string
	// Host names the host process the actor lives in, "" for an in-process
	// actor. Broadcast gives the actors of one host one batched call when
	// they are HostActors (issue 4).
	Host() string
	// Call runs method with payload and returns the answer. It must honour
	// ctx. The payload may be shared with other actors and must not be
	// modified.
	Call(ctx context.Context, method string, payload []byte) ([]byte, error)
}

// HostBatcher is one host process as the pool's batch path sees it: it
// takes one call for several of its actors at once, and sends it as one
// request (HostConn, for a replica host of this project). Broadcast gives
// each batcher one BatchCall naming its actors, instead of a Call each.
type HostBatcher interface {
	// Host names the host process, as its actors' Host does.
	Host() string
	// BatchCall runs method with payload on the actors named by ids, all of
	// them the batcher's, and returns one Result per id, in the order of
	// ids, each with its own error. It must honour ctx. payload is shared
	// read-only. ref is the Ref the payload was passed by, the zero Ref if
	// it came by value: a batcher may send a Ref's bytes to its host once
	// and name the Ref after that.
	BatchCall(ctx context.Context, method string, payload []byte, ref Ref, ids []string) []Result
}

// HostActor is an actor that shares a host process, and so a batched
// call, with other actors. Broadcast batches an actor whose Host is not ""
// and whose Batcher is not nil.
type HostActor interface {
	Actor
	// Batcher returns the actor's host; it is the same for every actor of
	// that host.
	Batcher() HostBatcher
}

// refFreer is a HostBatcher that keeps Refs' bytes at its host: Pool.Free
// tells it to drop them there too.
type refFreer interface {
	freeRef(Ref)
}

// Call is one method call for an actor.
type Call struct {
	Method string
	// Payload is the encoded argument. A Broadcast shares one Payload
	// read-only among all its actors: it is encoded once, by the caller.
	Payload []byte
	// Ref, if not the zero Ref, passes the argument by reference instead: the
	// actor gets the payload put under Ref with Pool.Put. Payload must then
	// be nil.
	Ref Ref
}

// Ref is a handle to a payload put into a pool once, with Pool.Put, so that
// calls can name it instead of carrying it: Ray's ObjectRef argument. It is
// small and cheap to copy into every call; the zero Ref names nothing.
//
// In process, resolving a Ref is a map lookup and the actor gets the very
// bytes given to Put. Broadcast resolves it once for all its actors; a
// submitted call, or ForeachBroadcast, resolves it per call, as a Ray actor
// fetches an ObjectRef argument for each task. For the actors of a replica
// host (HostActor) a Ref is what the wire carries: Broadcast hands it to
// the host's batcher, which sends the bytes with the first call naming the
// Ref on each of its connections, and the host keeps them under an id that
// every later call carries instead; Free drops the bytes there too. A Ref
// is only meaningful to the pool that made it.
type Ref struct {
	pool *Pool
	id   uint64
}

// payload returns the bytes the call's actor gets: Payload, or what Ref
// names.
func (c Call) payload() ([]byte, error) {
	if c.Ref.pool == nil {
		return c.Payload, nil
	}
	if c.Payload != nil {
		return nil, errRefAndPayload
	}
	return c.Ref.pool.resolve(c.Ref)
}

// Result is an actor's answer to one call.
type Result struct {
	Actor string // ID of the actor that ran the call; "" if none did
	Value []byte
	Err   error // the call's own error; a panic in Call is a *PanicError
}

var (
	// ErrNoPending is returned by GetNext and GetNextUnordered when no
	// submitted call is left to return (Ray's StopIteration).
	ErrNoPending = errors.New("replica: no pending results")
	// ErrUnknownActor is the Result.Err of a Broadcast to an ID not in the
	// pool.
	ErrUnknownActor = errors.New("replica: unknown actor")
	// ErrDuplicateActor is returned by Push for an actor whose ID is already
	// in the pool.
	ErrDuplicateActor = errors.New("replica: actor already in pool")
	// ErrUnknownRef is the Result.Err of a call whose Ref names no payload:
	// it was freed.
	ErrUnknownRef = errors.New("replica: unknown payload reference")

	errRefAndPayload = errors.New("replica: a Call with a Ref must have a nil Payload")
)

// task is one submitted call, from Submit or from a Map.
type task struct {
	ctx   context.Context
	call  Call
	index uint64 // submission index: the pool's for Submit, the payload's for Map

	// Written under Pool.mu before the task is reported.
	res  Result
	done bool

	sink chan<- *task  // a Map's completions; nil for Submit's tasks, which report to the pool
	elem *list.Element // the task in Pool.completed, once done; Submit's tasks only

	// Under Pool.mu: queued while in Pool.queue; stopCancel (Submit's
	// tasks only) ends the wait for ctx that answers it from there.
	queued     bool
	stopCancel func() bool
}

// Pool runs calls on a set of actors, like Ray's ray.util.ActorPool: Submit
// gives a call to an idle actor, or queues it (FIFO) until one is idle, and
// each actor runs one submitted call at a time. Results come back in
// submission order (GetNext) or completion order (GetNextUnordered); mixing
// the two loses nothing. Unlike Ray, an actor is idle again as soon as its
// call completes, not when its result is fetched.
//
// Broadcast is the separate control path: the same call to every actor at
// once, whether busy or idle. Put keeps a payload that calls then pass by
// reference (Call.Ref), until Free.
//
// A Pool is safe for concurrent use.
type Pool struct {
	// mu guards the fields below, up to refMu.
	mu        sync.Mutex
	actors    []Actor          // pool order; copied on write, so a read slice stays valid
	byID      map[string]Actor // every actor in actors
	idle      []Actor          // members with no submitted call running; used as a stack
	queue     []*task          // submitted, waiting for an idle actor, FIFO
	tasks     map[uint64]*task // Submit's tasks not yet returned, by submission index
	nextIndex uint64           // submission index of the next Submit
	nextRet   uint64           // lowest submission index GetNext may still return
	completed list.List        // Submit's done, unreturned tasks, in completion order
	changed   chan struct{}    // closed at the next completion; nil when nobody waits
	// hosted is set once an actor that may be batched (a HostActor) joins:
	// only then does Broadcast look for hosts, so that a pool of
	// in-process actors pays nothing for batching.
	hosted bool

	// refMu guards refs and lastRef, the payloads put with Put. It is not mu
	// so that resolving a Ref never waits behind submitted work.
	refMu   sync.RWMutex
	refs    map[uint64][]byte // by Ref id
	lastRef uint64            // id of the latest Ref; ids are never reused
}

// NewPool returns a pool of the given actors, all idle, in that order. It
// panics if two actors share an ID.
func NewPool(actors ...Actor) *Pool {
	p := &Pool{
		actors: slices.Clip(slices.Clone(actors)),
		byID:   make(map[string]Actor, len(actors)),
		tasks:  make(map[uint64]*task),
		refs:   make(map[uint64][]byte),
	}
	for i := len(actors) - 1; i >= 0; i-- { // so that the first actor is popped first
		a := actors[i]
		if _, dup := p.byID[a.ID()]; dup {
			panic(fmt.Sprintf("replica.NewPool: %v: %q", ErrDuplicateActor, a.ID()))
		}
		p.byID[a.ID()] = a
		p.idle = append(p.idle, a)
		p.hosted = p.hosted || batcherOf(a) != nil
	}
	return p
}

// batcherOf returns a's host batcher, or nil if a is not to be batched.
func batcherOf(a Actor) HostBatcher {
	ha, ok := a.(HostActor)
	if !ok || ha.Host() == "" {
		return nil
	}
	return ha.Batcher()
}

// Submit runs c on an idle actor, or queues it until one is idle. It never
// waits for an actor. The call runs with ctx; a call still queued when ctx
// ends completes then with ctx's error, without running. A call that
// panics or calls runtime.Goexit completes with a *PanicError. Submit
// returns ctx's error, and submits nothing, if ctx is already done.
func (p *Pool) Submit(ctx context.Context, c Call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &task{ctx: ctx, call: c, index: p.nextIndex}
	p.nextIndex++
	p.tasks[t.index] = t
	p.dispatchLocked(t)
	if t.queued {
		// Answered at ctx's end, not when an actor frees up (which may
		// be never: a pool with no actors).
		t.stopCancel = context.AfterFunc(ctx, func() { p.cancelQueued(t) })
	}
	return nil
}

// cancelQueued completes t, a Submit's task, with its ctx's error if it is
// still queued.
func (p *Pool) cancelQueued(t *task) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !t.queued {
		return // an actor took it: it sees ctx's end itself
	}
	p.queue = slices.DeleteFunc(p.queue, func(q *task) bool { return q == t })
	t.queued = false
	p.finishLocked(t, Result{Err: t.ctx.Err()})
}

// dispatchLocked starts t on an idle actor or queues it.
func (p *Pool) dispatchLocked(t *task) {
	if n := len(p.idle); n > 0 {
		a := p.idle[n-1]
		p.idle = p.idle[:n-1]
		go p.run(a, t)
		return
	}
	t.queued = true
	p.queue = append(p.queue, t)
}

// run runs t on a, then whatever is queued, until the queue is empty and a is
// idle again. It is the only goroutine using a for submitted work.
func (p *Pool) run(a Actor, t *task) {
	var calling *task
	defer func() {
		if calling == nil {
			return
		}
		// Its call ran runtime.Goexit, which ends this goroutine (a panic
		// is recovered in safeCall): the task is answered, and the actor
		// goes on in a goroutine of its own.
		p.mu.Lock()
		p.finishLocked(calling, Result{Actor: a.ID(), Err: &PanicError{Value: "runtime.Goexit", Stack: debug.Stack()}})
		next := p.nextLocked(a)
		p.mu.Unlock()
		if next != nil {
			go p.run(a, next)
		}
	}()
	for t != nil {
		var r Result
		if err := t.ctx.Err(); err != nil {
			r.Err = err // cancelled while queued: never ran
		} else {
			r.Actor = a.ID()
			calling = t
			r.Value, r.Err = safeCall(t.ctx, a, t.call)
			calling = nil
		}
		p.mu.Lock()
		p.finishLocked(t, r)
		t = p.nextLocked(a)
		p.mu.Unlock()
	}
}

// nextLocked returns the next queued task for a, or nil with a idle again.
func (p *Pool) nextLocked(a Actor) *task {
	if len(p.queue) > 0 {
		return p.popQueueLocked()
	}
	p.idle = append(p.idle, a)
	return nil
}

func (p *Pool) popQueueLocked() *task {
	t := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	if len(p.queue) == 0 {
		p.queue = nil
	}
	t.queued = false
	if t.stopCancel != nil {
		t.stopCancel()
	}
	return t
}

// finishLocked records t's result and reports it to its Map or to waiters.
func (p *Pool) finishLocked(t *task, r Result) {
	t.res, t.done = r, true
	if t.sink != nil {
		t.sink <- t // buffered for every task of its Map: never blocks
		return
	}
	t.elem = p.completed.PushBack(t)
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// returnLocked removes a Submit task whose result is being returned.
func (p *Pool) returnLocked(t *task) Result {
	delete(p.tasks, t.index)
	p.completed.Remove(t.elem)
	return t.res
}

// waitLocked returns a channel closed at the next completion.
func (p *Pool) waitLocked() <-chan struct{} {
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// GetNext returns the result of the earliest submitted call not yet
// returned, waiting for it to complete if need be. It returns ErrNoPending if
// no submitted call is left, and ctx's error if ctx ends first; the result is
// then kept for a later GetNext.
func (p *Pool) GetNext(ctx context.Context) (Result, error) {
	for {
		p.mu.Lock()
		for p.nextRet < p.nextIndex && p.tasks[p.nextRet] == nil {
			p.nextRet++ // already returned by GetNextUnordered
		}
		if p.nextRet == p.nextIndex {
			p.mu.Unlock()
			return Result{}, ErrNoPending
		}
		t := p.tasks[p.nextRet]
		if t.done {
			r := p.returnLocked(t)
			p.mu.Unlock()
			return r, nil
		}
		ch := p.waitLocked()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
}

// GetNextUnordered returns the result of the submitted call that completed
// first among those not yet returned, waiting for one if need be. Errors are
// as for GetNext.
func (p *Pool) GetNextUnordered(ctx context.Context) (Result, error) {
	for {
		p.mu.Lock()
		if e := p.completed.Front(); e != nil {
			r := p.returnLocked(e.Value.(*task))
			p.mu.Unlock()
			return r, nil
		}
		if len(p.tasks) == 0 {
			p.mu.Unlock()
			return Result{}, ErrNoPending
		}
		ch := p.waitLocked()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
}

// HasNext reports whether a submitted call's result is left to return:
// queued, running or done.
func (p *Pool) HasNext() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.tasks) > 0
}

// HasFree reports whether an actor is idle, so that a Submit would run at
// once.
func (p *Pool) HasFree() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle) > 0
}

// PopIdle removes an idle actor from the pool and returns it; ok is false if
// no actor is idle.
func (p *Pool) PopIdle() (a Actor, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil, false
	}
	a = p.idle[n-1]
	p.idle = p.idle[:n-1]
	delete(p.byID, a.ID())
	// By ID: an actor type need not be comparable.
	i := slices.IndexFunc(p.actors, func(x Actor) bool { return x.ID() == a.ID() })
	p.actors = slices.Concat(p.actors[:i], p.actors[i+1:]) // a new slice: Broadcasts may hold the old one
	return a, true
}

// Push adds a to the end of the pool. It takes the oldest queued call at
// once, if any. Push returns an error wrapping ErrDuplicateActor if an actor
// with a's ID is already in the pool.
func (p *Pool) Push(a Actor) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.byID[a.ID()]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateActor, a.ID())
	}
	p.byID[a.ID()] = a
	p.actors = append(slices.Clip(p.actors), a) // a new array: Broadcasts may hold the old one
	p.hosted = p.hosted || batcherOf(a) != nil
	if len(p.queue) > 0 {
		go p.run(a, p.popQueueLocked())
	} else {
		p.idle = append(p.idle, a)
	}
	return nil
}

// Put keeps payload in the pool and returns a Ref naming it, for calls to
// pass by reference (Call.Ref) until Free. The pool keeps payload itself, not
// a copy: it is shared read-only by every call that names the Ref and must
// not be modified.
func (p *Pool) Put(payload []byte) Ref {
	p.refMu.Lock()
	defer p.refMu.Unlock()
	p.lastRef++
	p.refs[p.lastRef] = payload
	return Ref{pool: p, id: p.lastRef}
}

// Free drops the payload r names, in the pool and at the hosts its
// batchers sent it to. Calls that resolve r afterwards fail with
// ErrUnknownRef; calls that already have the bytes keep them. Free does
// nothing if r is not p's or is already freed.
func (p *Pool) Free(r Ref) {
	if r.pool != p {
		return
	}
	p.refMu.Lock()
	delete(p.refs, r.id)
	p.refMu.Unlock()
	p.mu.Lock()
	actors, hosted := p.actors, p.hosted
	p.mu.Unlock()
	if !hosted {
		return
	}
	seen := make(map[HostBatcher]bool)
	for _, a := range actors {
		if hb := batcherOf(a); hb != nil && !seen[hb] {
			seen[hb] = true
			if f, ok := hb.(refFreer); ok {
				f.freeRef(r)
			}
		}
	}
}

// resolve returns the payload r, one of p's Refs, names.
func (p *Pool) resolve(r Ref) ([]byte, error) {
	p.refMu.RLock()
	payload, ok := p.refs[r.id]
	p.refMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownRef, r.id)
	}
	return payload, nil
}

// Actors returns the pool's actors in pool order.
func (p *Pool) Actors() []Actor {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.actors)
}

// Map submits method with each payload, like Submit, and yields their results
// in payload order. The error it yields is the pool's, not a call's: ctx's
// error, once, after which the sequence ends. Map's calls share the pool's
// actors and queue with Submit but their results are Map's alone: GetNext
// never sees them.
//
// Each range over the sequence submits the payloads anew. Ending the range
// early drops the calls still queued, cancels those running and waits for
// them to return, so no call of the Map outlives its loop.
func (p *Pool) Map(ctx context.Context, method string, payloads [][]byte) iter.Seq2[Result, error] {
	return p.mapSeq(ctx, method, payloads, true)
}

// MapUnordered is Map yielding results in completion order.
func (p *Pool) MapUnordered(ctx context.Context, method string, payloads [][]byte) iter.Seq2[Result, error] {
	return p.mapSeq(ctx, method, payloads, false)
}

func (p *Pool) mapSeq(parent context.Context, method string, payloads [][]byte, ordered bool) iter.Seq2[Result, error] {
	return func(yield func(Result, error) bool) {
		n := len(payloads)
		if n == 0 {
			return
		}
		ctx, cancel := context.WithCancel(parent)
		defer cancel()
		sink := make(chan *task, n)
		tasks := make([]task, n)
		p.mu.Lock()
		for i := range tasks {
			t := &tasks[i]
			t.ctx, t.call, t.index, t.sink = ctx, Call{Method: method, Payload: payloads[i]}, uint64(i), sink
			p.dispatchLocked(t)
		}
		p.mu.Unlock()

		received := 0
		defer func() {
			if received < n {
				p.abandon(sink, n-received, cancel)
			}
		}()
		got := make([]bool, n) // ordered only: received, not yet yielded
		next := 0              // ordered only: next payload to yield
		for next < n {
			if ordered && got[next] {
				if !yield(tasks[next].res, nil) {
					return
				}
				next++
				continue
			}
			select {
			case t := <-sink:
				received++
				if ordered {
					got[t.index] = true
					continue
				}
				next++
				if !yield(t.res, nil) {
					return
				}
			case <-parent.Done():
				yield(Result{}, parent.Err())
				return
			}
		}
	}
}

// abandon ends a Map whose loop stopped with left of its calls unreported:
// it drops those still queued, cancels the running ones and waits for them.
func (p *Pool) abandon(sink chan *task, left int, cancel context.CancelFunc) {
	p.mu.Lock()
	kept := p.queue[:0]
	for _, t := range p.queue {
		if t.sink == sink {
			left--
		} else {
			kept = append(kept, t)
		}
	}
	clear(p.queue[len(kept):])
	p.queue = kept
	p.mu.Unlock()
	cancel()
	for ; left > 0; left-- {
		<-sink
	}
}

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
// claiming actors broadcastChunk at a time and calling them inline. At every
// broadcastStall, while actors are left unclaimed, Broadcast starts one more
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
	}
	payload, perr := c.payload()
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
	defer func() {
		w.chunk.Store(-1)
		if filled > 0 && b.left.Add(-filled) == 0 {
			close(b.done)
		}
	}()
	for {
		k := int(b.nextChunk.Add(1) - 1)
		if k >= len(b.chunks) {
			break
		}
		if !b.drain(w, k, &filled) {
			return
		}
	}
	for k := range b.chunks {
		if !b.drain(w, k, &filled) {
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
		r := &results[calling]
		r.Value, r.Err = nil, &PanicError{Value: recover(), Stack: debug.Stack()}
		r.Actor = targets[calling].ID()
		ch.filled[calling].Store(true)
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
		} else {
			rs[i] = Result{Actor: b.targets[i].ID(), Err: b.ctx.Err()}
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
			r.Value, r.Err = safeCall(ctx, a, arg)
			r.Actor = a.ID()
		})
	}
	wg.Wait()
	return results
}

// safeCall calls a with c's payload, resolving c.Ref if it has one, and
// turns a panic into a *PanicError.
func safeCall(ctx context.Context, a Actor, c Call) (v []byte, err error) {
	payload, err := c.payload()
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
