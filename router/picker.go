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
	// Both sampled replicas are full: two others at random among the free
	// ones (reservoir sampling: one pass, no allocation), the less loaded
	// of them, so that nil means that none is free. (The first free one
	// after i, as before, went by position, not load: a review's idle
	// replica was picked less often than a busier one.)
	var c, d replica.Handle
	free := 0
	for k, h := range replicas {
		if k == i || k == j || !hasFree(h) {
			continue
		}
		free++
		switch {
		case free == 1:
			c = h
		case free == 2:
			d = h
		default:
			// Each of the free ones seen so far is kept with
			// probability 2/free.
			switch p.intN(free) {
			case 0:
				c = h
			case 1:
				d = h
			}
		}
	}
	if d != nil && d.Ongoing() < c.Ongoing() {
		return d
	}
	return c
}
