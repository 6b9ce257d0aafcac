package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// The control calls a deployment controller broadcasts to its replicas
// through its Pool: the methods every replica actor answers.
const (
	// MethodCheckHealth runs the replica's health check; no payload. A
	// nil error is healthy.
	MethodCheckHealth = "check_health"
	// MethodReconfigure gives the replica a new user_config, the payload
	// (JSON).
	MethodReconfigure = "reconfigure"
	// MethodStats answers the replica's Stats as JSON; no payload.
	MethodStats = "stats"
	// MethodDrain makes the replica take no new requests and returns once
	// the ones it has are done (or ctx ends); no payload.
	MethodDrain = "drain"
	// MethodSetGC retunes the garbage collector of the replica's process;
	// the payload is a gctune update as JSON.
	MethodSetGC = "set_gc"
)

var (
	// ErrNotReconfigurable is a replica's answer to MethodReconfigure when
	// its handler has no Reconfigure method, so it cannot take a user_config.
	ErrNotReconfigurable = errors.New("the replicas take no user_config (command and upstream replicas never do; a Go handler does with a Reconfigure method)")
	// ErrUnknownMethod is a replica's answer to a control method it does not
	// know.
	ErrUnknownMethod = errors.New("unknown control method")
	// ErrCheckInFlight is a replica's answer to MethodCheckHealth while its
	// previous check is still running: a hung check counts as a failure
	// each period, and costs one goroutine, not one per period.
	ErrCheckInFlight = errors.New("the previous health check has not returned")
)

// Stats is a replica's answer to MethodStats: its own counts.
type Stats struct {
	ID    string `json:"id"`    // the replica's
	State State  `json:"state"` // where it is in its life cycle
	// Ongoing is how many requests the replica is running now.
	Ongoing int `json:"ongoing"`
	// Queued is how many requests wait at the replica itself for a slot:
	// always 0 in process, where requests wait in the router's queue.
	Queued int `json:"queued"`
	// Peak is the most requests the replica has run at once.
	Peak int `json:"peak"`
	// MaxOngoing is the replica's max_ongoing_requests.
	MaxOngoing int `json:"max_ongoing_requests"`
	// Served is how many requests the replica has run.
	Served uint64 `json:"served"`
}

// MarshalText implements encoding.TextMarshaler: a state is its name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	for st := StateStarting; st <= StateStopped; st++ {
		if st.String() == string(b) {
			*s = st
			return nil
		}
	}
	return fmt.Errorf("unknown replica state %q", b)
}

// Replica is what a deployment controller manages: a Handle the router
// routes requests to, an Actor the pool sends control calls to, and a
// place in the life cycle.
type Replica interface {
	Handle
	Actor
	// State returns where the replica is in its life cycle.
	State() State
	// SetState moves the replica to s; only a running replica takes
	// requests.
	SetState(s State)
}

var _ Replica = (*Local)(nil)

// Host implements Actor: "", an in-process actor.
func (l *Local) Host() string { return "" }

// Call implements Actor: it answers the control methods (MethodCheckHealth
// and the others). The caller, the Pool, turns a panic into a *PanicError.
func (l *Local) Call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	switch method {
	case MethodCheckHealth:
		return nil, l.checkHealth(ctx)
	case MethodReconfigure:
		rc, ok := l.handler.(Reconfigurer)
		if ok {
			return nil, rc.Reconfigure(ctx, payload)
		}
		if same, err := SameUserConfig(payload, l.builtWith); err == nil && same {
			return nil, nil // what it has already
		}
		return nil, ErrNotReconfigurable
	case MethodStats:
		return json.Marshal(l.Stats())
	case MethodDrain:
		return nil, drain(ctx, l)
	case MethodSetGC:
		// An in-process replica shares the proxy's garbage collector,
		// which the proxy tunes itself (PUT /-/gc).
		return nil, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownMethod, method)
}

// SameUserConfig reports whether a and b are the same JSON value, whatever
// their spacing and key order (a config from flags and the same from YAML
// are spelled differently), or both empty. The error is a's or b's that is
// not JSON.
func SameUserConfig(a, b json.RawMessage) (bool, error) {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b), nil
	}
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		return false, err
	}
	return reflect.DeepEqual(va, vb), nil
}

// Stats returns the replica's own counts.
func (l *Local) Stats() Stats { return statsOf(l) }

// checkHealth runs the handler's health check, if it has one: a handler
// without one is healthy while it runs.
func (l *Local) checkHealth(ctx context.Context) error {
	hc, ok := l.handler.(HealthChecker)
	if !ok {
		return nil
	}
	if !l.checking.CompareAndSwap(false, true) {
		return ErrCheckInFlight
	}
	defer l.checking.Store(false)
	return hc.CheckHealth(ctx)
}

// counted is what answering MethodStats and MethodDrain needs of a replica,
// local or remote.
type counted interface {
	ID() string
	State() State
	SetState(State)
	Ongoing() int
	MaxOngoing() int
	Peak() int
	Served() uint64
}

// statsOf returns r's own counts.
func statsOf(r counted) Stats {
	return Stats{
		ID:         r.ID(),
		State:      r.State(),
		Ongoing:    r.Ongoing(),
		Peak:       r.Peak(),
		MaxOngoing: r.MaxOngoing(),
		Served:     r.Served(),
	}
}

// drain stops r taking requests and waits for the ones it holds; once they
// are done it is stopped.
func drain(ctx context.Context, r counted) error {
	if r.State() == StateStopped {
		return nil
	}
	r.SetState(StateDraining)
	if err := waitIdle(ctx, r); err != nil {
		return err
	}
	r.SetState(StateStopped)
	return nil
}
