package replica

import (
	"context"
	"errors"
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
	slots
	id      string
	handler Handler
	// builtWith is the user_config the factory built handler with: a
	// handler without Reconfigure takes a reconfigure to it (a replica
	// host started from the proxy's file is given the file's again).
	builtWith []byte
	// checking is set while a health check runs (see checkHealth).
	checking atomic.Bool
	// stopped is set by the first Stop.
	stopped atomic.Bool
}

var _ Handle = (*Local)(nil)

// NewLocal returns a replica in StateStarting serving h with at most
// maxOngoing requests at a time. onRelease, if not nil, is called each time
// a slot is freed (the router uses it to wake a waiting request).
func NewLocal(id string, h Handler, maxOngoing int, onRelease func()) *Local {
	l := &Local{id: id, handler: h}
	l.init(maxOngoing, onRelease)
	return l
}

// ID implements Handle.
func (l *Local) ID() string { return l.id }

// SetMaxOngoing changes the replica's max_ongoing_requests (see
// Deployment.SetMaxOngoing).
func (l *Local) SetMaxOngoing(n int) { l.setMax(n) }

// Stop implements Stopper: the replica is done (drained, or its requests
// still running at graceful_shutdown_timeout_s), and its handler, if it is
// an io.Closer, is closed once, however often Stop is called. Requests in
// process cannot be cut: a handler still serving some is closed in the
// background once they are done, never under them, and Stop does not wait
// for it (a stream that never ends must not hold up a shutdown).
func (l *Local) Stop(context.Context) error {
	if l.stopped.Swap(true) {
		return nil
	}
	l.SetState(StateStopped) // no request takes a slot from now on
	if l.Ongoing() == 0 {
		return CloseHandler(l.handler)
	}
	go func() {
		_ = waitIdle(context.Background(), l)
		_ = CloseHandler(l.handler) // its caller has moved on: nowhere to report
	}()
	return nil
}

// Handler returns the replica's user code.
func (l *Local) Handler() Handler { return l.handler }

// ErrHandlerExited is the error of a request whose handler ended its
// goroutine (runtime.Goexit, as t.FailNow does) rather than return: no
// recover sees it, so the callers of Local.Serve answer for it, and free
// its slot, on the way out. (The proxy's guard cannot tell it from a
// panic out of a replica that does not recover its own, as Local does:
// one in this package's code, a bug; net/http then logs that panic.)
var ErrHandlerExited = errors.New("the handler ended its goroutine without returning (runtime.Goexit, or a panic its replica did not recover)")

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
