package replica

import "sync/atomic"

// slots is a replica's max_ongoing_requests, enforced, and its life-cycle
// state: every kind of replica (in process, HTTP server, host actor)
// embeds one. The limit is never exceeded: a slot is taken with a
// compare-and-swap below the limit, and released exactly once. A limit
// lowered live (setMax) leaves the requests over it to finish, and none
// takes a slot until the count is under it.
type slots struct {
	max     atomic.Int64 // a host may announce a new limit on reconnecting
	state   atomic.Int32
	ongoing atomic.Int64
	peak    atomic.Int64
	served  atomic.Uint64

	// release is built once so that TryAcquire allocates nothing.
	release func()
	// onRelease is called after every release. If nil, nothing is notified.
	onRelease func()
}

// init sets the limit and the release hook; call it once, before use.
func (s *slots) init(maxOngoing int, onRelease func()) {
	s.max.Store(int64(maxOngoing))
	s.onRelease = onRelease
	s.release = s.releaseSlot
}

// setMax changes the limit. Lowered, the requests over it finish and no
// new one takes a slot until the count is under it; raised, onRelease is
// told, so that waiting requests take the room at once.
func (s *slots) setMax(n int) {
	s.max.Store(int64(n))
	if s.onRelease != nil {
		s.onRelease()
	}
}

// State returns where the replica is in its life cycle.
func (s *slots) State() State { return State(s.state.Load()) }

// SetState moves the replica to st; only a StateRunning replica takes
// requests.
func (s *slots) SetState(st State) { s.state.Store(int32(st)) }

// Ongoing implements Handle: the requests holding a slot (for a replica
// elsewhere, those this proxy has in flight to it).
func (s *slots) Ongoing() int { return int(s.ongoing.Load()) }

// MaxOngoing implements Handle: the replica's max_ongoing_requests.
func (s *slots) MaxOngoing() int { return int(s.max.Load()) }

// Peak returns the most slots ever held at once: the replica's own count,
// which tests compare with the limit.
func (s *slots) Peak() int { return int(s.peak.Load()) }

// Served returns how many requests the replica has been given.
func (s *slots) Served() uint64 { return s.served.Load() }

// TryAcquire implements Handle. It fails when the replica is full or not
// running.
func (s *slots) TryAcquire() (func(), bool) {
	if State(s.state.Load()) != StateRunning {
		return nil, false
	}
	var n int64 // the count before this slot
	for {
		n = s.ongoing.Load()
		if n >= s.max.Load() {
			return nil, false
		}
		if s.ongoing.CompareAndSwap(n, n+1) {
			break
		}
	}
	// Check the state again now that the slot is held: a drain that began
	// in between has seen the slot (waitIdle) or will, so the request
	// either runs before the replica stops or is refused. And the limit:
	// one lowered in between (setMax) must not let this request start
	// over it once the change is made.
	if State(s.state.Load()) != StateRunning || n >= s.max.Load() {
		s.ongoing.Add(-1) // not releaseSlot: the caller may hold the scheduler's lock
		return nil, false
	}
	held := s.ongoing.Load()
	for p := s.peak.Load(); held > p && !s.peak.CompareAndSwap(p, held); p = s.peak.Load() {
	}
	return s.release, true
}

func (s *slots) releaseSlot() {
	if s.ongoing.Add(-1) < 0 {
		panic("replica: a slot was released twice")
	}
	if s.onRelease != nil {
		s.onRelease()
	}
}
