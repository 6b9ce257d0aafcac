package replica

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// The benchmarks below are the seed's four tables (issue 4), each comparing
// Broadcast with ForeachBroadcast, the seed's foreach_remote. Both are timed
// until every actor has answered. The actors share no state, so that the
// calls' own cache traffic does not hide the paths' costs.

// nopActors returns n in-process actors whose Call does nothing.
func nopActors(n int) []Actor {
	actors := make([]Actor, n)
	for i := range actors {
		actors[i] = &fnActor{id: fmt.Sprint("a", i), fn: func(context.Context, string, []byte) ([]byte, error) {
			return nil, nil
		}}
	}
	return actors
}

// benchPaths runs c through both paths on n fresh actors; c may name a Ref
// of the pool that mk returns.
func benchPaths(b *testing.B, n int, mk func(p *Pool) Call) {
	b.Helper()
	actors := nopActors(n)
	p := NewPool(actors...)
	c := mk(p)
	ctx := context.Background()
	for _, path := range []struct {
		name string
		f    func() []Result
	}{
		{"broadcast", func() []Result { return p.Broadcast(ctx, c) }},
		{"foreach", func() []Result { return ForeachBroadcast(ctx, actors, c) }},
	} {
		b.Run("path="+path.name, func(b *testing.B) {
			b.ReportAllocs()
			var rs []Result
			for b.Loop() {
				rs = path.f()
			}
			if len(rs) != n {
				b.Fatalf("%d results, want %d", len(rs), n)
			}
			for _, r := range rs {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		})
	}
}

// BenchmarkBroadcastPayload is table 1: payload size at 400 actors.
func BenchmarkBroadcastPayload(b *testing.B) {
	for _, size := range []int{10, 1 << 20, 8 << 20} {
		payload := bytes.Repeat([]byte{'x'}, size)
		b.Run(fmt.Sprintf("payload=%d/actors=400", size), func(b *testing.B) {
			benchPaths(b, 400, func(*Pool) Call { return Call{Method: "reconfigure", Payload: payload} })
		})
	}
}

// BenchmarkBroadcastActors is table 2: actor count at 1 MiB.
func BenchmarkBroadcastActors(b *testing.B) {
	payload := bytes.Repeat([]byte{'x'}, 1<<20)
	for _, n := range []int{50, 400, 950} {
		b.Run(fmt.Sprintf("payload=1MiB/actors=%d", n), func(b *testing.B) {
			benchPaths(b, n, func(*Pool) Call { return Call{Method: "reconfigure", Payload: payload} })
		})
	}
}

// BenchmarkBroadcastNop is table 3: actor count with no payload.
func BenchmarkBroadcastNop(b *testing.B) {
	for _, n := range []int{50, 400, 950} {
		b.Run(fmt.Sprintf("actors=%d", n), func(b *testing.B) {
			benchPaths(b, n, func(*Pool) Call { return Call{Method: "check_health"} })
		})
	}
}

// BenchmarkBroadcastRef is table 4: actor count with a 1 MiB payload passed
// by reference, put once before the clock starts.
func BenchmarkBroadcastRef(b *testing.B) {
	payload := bytes.Repeat([]byte{'x'}, 1<<20)
	for _, n := range []int{50, 400, 950} {
		b.Run(fmt.Sprintf("ref=1MiB/actors=%d", n), func(b *testing.B) {
			benchPaths(b, n, func(p *Pool) Call { return Call{Method: "reconfigure", Ref: p.Put(payload)} })
		})
	}
}
