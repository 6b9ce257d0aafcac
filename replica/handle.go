package replica

import (
	"fmt"
	"net/http"
)

// Handle is what the router holds for each replica, local or remote.
type Handle interface {
	// ID names the replica in logs and metrics.
	ID() string
	// TryAcquire takes a slot if the replica has one free; it never blocks.
	// The returned release must be called exactly once, when the request is
	// done.
	TryAcquire() (release func(), ok bool)
	// Ongoing is the number of requests holding a slot: exact for local
	// replicas, the best known count for remote ones.
	Ongoing() int
	// MaxOngoing is the replica's max_ongoing_requests.
	MaxOngoing() int
	// Serve runs the request on the replica. The caller holds a slot.
	Serve(w http.ResponseWriter, r *http.Request) error
}

// AnswerBatcher is implemented by the replicas whose answers are best
// written out in bursts under load (Upstream, so handlers upstream and
// command). The proxy yields (runtime.Gosched) once such a replica has
// answered, its slot released, before its server writes the answer out:
// the answers of the requests that were ready with this one then leave
// together, and their clients wake once for several. (In process, and in
// front of replica hosts, the yield measured no gain and cost CPU.)
type AnswerBatcher interface {
	// BatchAnswers reports whether to yield before the answer goes out.
	BatchAnswers() bool
}

// PanicError is returned by Serve when the handler panicked, and is a
// Pool's Result when an actor's Call panicked (or called runtime.Goexit).
// The replica, and the pool, keep serving.
type PanicError struct {
	Value any    // what the handler or actor panicked with
	Stack []byte // the goroutine's stack at the panic
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }
