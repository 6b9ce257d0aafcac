package router

import (
	"math/rand/v2"

	"github.com/serveproxy/serveproxy/replica"
)

// Picker chooses a replica for the next request from a snapshot of routable
// replicas. It returns nil when none has a free slot. It must not block.
type Picker interface {
	Pick(replicas []replica.Handle) replica.Handle
}

// PowerOfTwo picks two replicas at random and takes the one with fewer
// requests in flight, as Ray Serve's router does; among replicas with a
// free slot only.
type PowerOfTwo struct {
	// IntN returns a uniform random int in [0, n). If nil, math/rand/v2's
	// IntN is used; tests set it for determinism.
	IntN func(n int) int
}

var _ Picker = (*PowerOfTwo)(nil)

func (p *PowerOfTwo) intN(n int) int {
	if p.IntN != nil {
		return p.IntN(n)
	}
	return rand.IntN(n)
}

func hasFree(h replica.Handle) bool { return h.Ongoing() < h.MaxOngoing() }

// Pick implements Picker.
func (p *PowerOfTwo) Pick(replicas []replica.Handle) replica.Handle {
	n := len(replicas)
	switch n {
	case 0:
		return nil
	case 1:
		if hasFree(replicas[0]) {
			return replicas[0]
		}
		return nil
	}
	i := p.intN(n)
	j := p.intN(n - 1)
	if j >= i {
		j++ // j is uniform over the others
	}
	a, b := replicas[i], replicas[j]
	fa, fb := hasFree(a), hasFree(b)
	switch {
	case fa && fb:
		if b.Ongoing() < a.Ongoing() {
			return b
		}
		return a
	case fa:
		return a
	case fb:
		return b
	}
	// Both sampled replicas are full: take the first free one after i, so
	// that nil means that none is free.
	for k := 1; k < n; k++ {
		if h := replicas[(i+k)%n]; hasFree(h) {
			return h
		}
	}
	return nil
}
