package replica

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"sync/atomic"
)

// State is a replica's place in its life cycle.
type State int32

// The states of a replica, in order.
const (
	StateStarting State = iota // built, not yet routable
	StateRunning               // takes requests
	StateDraining              // takes no new requests, finishes the ones it has
	StateStopped               // done
)

// String returns the state's name as Serve spells it.
func (s State) String() string {
	switch s {
	case StateStarting:
		return "STARTING"
	case StateRunning:
		return "RUNNING"
	case StateDraining:
		return "DRAINING"
	case StateStopped:
		return "STOPPED"
	}
	return "UNKNOWN"
}

// Local is an in-process replica: an actor running one Handler that enforces
// its own max_ongoing_requests. The limit is never exceeded: a slot is taken
// with a compare-and-swap below the limit, and released exactly once.
type Local struct {
	id      string
	handler Handler
	max     int64

	state   atomic.Int32
	ongoing atomic.Int64
	peak    atomic.Int64
	served  atomic.Uint64
	// checking is set while a health check runs (see checkHealth).
	checking atomic.Bool

	// release is built once so that TryAcquire allocates nothing.
	release func()
	// onRelease is called after every release. If nil, nothing is notified.
	onRelease func()
}

var _ Handle = (*Local)(nil)

// NewLocal returns a replica in StateStarting serving h with at most
// maxOngoing requests at a time. onRelease, if not nil, is called each time
// a slot is freed (the router uses it to wake a waiting request).
func NewLocal(id string, h Handler, maxOngoing int, onRelease func()) *Local {
	l := &Local{id: id, handler: h, max: int64(maxOngoing), onRelease: onRelease}
	l.release = l.releaseSlot
	return l
}

// ID implements Handle.
func (l *Local) ID() string { return l.id }

// Handler returns the replica's user code.
func (l *Local) Handler() Handler { return l.handler }

// State returns where the replica is in its life cycle.
func (l *Local) State() State { return State(l.state.Load()) }

// SetState moves the replica to s.
func (l *Local) SetState(s State) { l.state.Store(int32(s)) }

// Ongoing implements Handle.
func (l *Local) Ongoing() int { return int(l.ongoing.Load()) }

// MaxOngoing implements Handle.
func (l *Local) MaxOngoing() int { return int(l.max) }

// Peak returns the most requests the replica has ever held at once: the
// replica's own count, which tests compare with the limit.
func (l *Local) Peak() int { return int(l.peak.Load()) }

// Served returns how many requests the replica has run.
func (l *Local) Served() uint64 { return l.served.Load() }

// TryAcquire implements Handle. It fails when the replica is full or not
// running.
func (l *Local) TryAcquire() (func(), bool) {
	if State(l.state.Load()) != StateRunning {
		return nil, false
	}
	for {
		n := l.ongoing.Load()
		if n >= l.max {
			return nil, false
		}
		if l.ongoing.CompareAndSwap(n, n+1) {
			break
		}
	}
	// Check the state again now that the slot is held: a drain that began
	// in between has seen the slot (waitIdle) or will, so the request
	// either runs before the replica stops or is refused.
	if State(l.state.Load()) != StateRunning {
		l.ongoing.Add(-1) // not releaseSlot: the caller may hold the scheduler's lock
		return nil, false
	}
	n := l.ongoing.Load()
	for p := l.peak.Load(); n > p && !l.peak.CompareAndSwap(p, n); p = l.peak.Load() {
	}
	return l.release, true
}

func (l *Local) releaseSlot() {
	if l.ongoing.Add(-1) < 0 {
		panic("replica: a slot was released twice")
	}
	if l.onRelease != nil {
		l.onRelease()
	}
}

// Serve implements Handle: it runs the handler, turning a panic into an
// error so that one bad request costs a 500, not the process, and the
// caller always gets to release the slot. A panic with
// http.ErrAbortHandler (net/http's way to abort a response, as
// httputil.ReverseProxy does when a backend dies mid-body) is returned
// wrapped, for the caller to abort the connection; any other is a
// *PanicError.
func (l *Local) Serve(w http.ResponseWriter, r *http.Request) (err error) {
	l.served.Add(1)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				err = fmt.Errorf("replica %s: handler aborted the response: %w", l.id, http.ErrAbortHandler)
				return
			}
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	l.handler.ServeHTTP(w, r)
	return nil
}
