package replica

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime/debug"
	"slices"
	"sync"
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
	// Method names what the actor is to do (MethodCheckHealth, MethodStats,
	// ... for replicas; any name an Actor of one's own knows).
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
// is only meaningful to the pool that made it: another pool's calls with it
// fail with ErrUnknownRef (ForeachBroadcast, which has no pool, takes any).
type Ref struct {
	pool *Pool
	id   uint64
}

// payload returns the bytes the call's actor gets: Payload, or what Ref
// names. A Ref made by another pool than in (nil for any) names nothing
// here: its Free there would not end it here.
func (c Call) payload(in *Pool) ([]byte, error) {
	if c.Ref.pool == nil {
		return c.Payload, nil
	}
	if c.Payload != nil {
		return nil, errRefAndPayload
	}
	if in != nil && c.Ref.pool != in {
		return nil, fmt.Errorf("%w: %d was made by another pool", ErrUnknownRef, c.Ref.id)
	}
	return c.Ref.pool.resolve(c.Ref)
}

// Result is an actor's answer to one call.
type Result struct {
	Actor string // ID of the actor that ran the call; "" if none did
	Value []byte // the actor's answer, nil with Err
	Err   error  // the call's own error; a panic in Call is a *PanicError
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
// A Pool is safe for concurrent use. Make one with NewPool: the zero Pool
// is not ready for use.
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
// panics if an actor is nil or two share an ID.
func NewPool(actors ...Actor) *Pool {
	p := &Pool{
		actors: slices.Clip(slices.Clone(actors)),
		byID:   make(map[string]Actor, len(actors)),
		tasks:  make(map[uint64]*task),
		refs:   make(map[uint64][]byte),
	}
	for i := len(actors) - 1; i >= 0; i-- { // so that the first actor is popped first
		a := actors[i]
		if a == nil {
			panic(fmt.Sprintf("replica.NewPool: actor %d of %d is nil", i, len(actors)))
		}
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
			r.Value, r.Err = safeCall(t.ctx, p, a, t.call)
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
// with a's ID is already in the pool, and an error if a is nil.
func (p *Pool) Push(a Actor) error {
	if a == nil {
		return errors.New("replica: Pool.Push: the actor is nil")
	}
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
