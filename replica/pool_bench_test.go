package replica

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkBroadcast compares Broadcast with the seed's foreach_remote
// baseline: encode (copy) the payload for each actor and call the actors one
// at a time. Both are timed until every actor has had the call.
func BenchmarkBroadcast(b *testing.B) {
	for _, size := range []int{0, 1 << 20} {
		for _, n := range []int{50, 400, 950} {
			var got atomic.Int64
			actors := make([]Actor, n)
			for i := range actors {
				actors[i] = &fnActor{id: fmt.Sprint("a", i), fn: func(_ context.Context, _ string, p []byte) ([]byte, error) {
					got.Add(1)
					return nil, nil
				}}
			}
			payload := bytes.Repeat([]byte{'x'}, size)
			ctx := context.Background()
			name := fmt.Sprintf("payload=%d/actors=%d", size, n)
			check := func(b *testing.B) {
				if g := got.Swap(0); g != int64(b.N*n) {
					b.Fatalf("%d calls, want %d", g, b.N*n)
				}
			}

			b.Run(name+"/path=broadcast", func(b *testing.B) {
				p := NewPool(actors...)
				c := Call{Method: "reconfigure", Payload: payload}
				got.Store(0)
				b.ReportAllocs()
				for b.Loop() {
					p.Broadcast(ctx, c)
				}
				check(b)
			})
			b.Run(name+"/path=foreach", func(b *testing.B) {
				got.Store(0)
				b.ReportAllocs()
				for b.Loop() {
					for _, a := range actors {
						enc := bytes.Clone(payload) // encoded per actor
						if _, err := a.Call(ctx, "reconfigure", enc); err != nil {
							b.Fatal(err)
						}
					}
				}
				check(b)
			})
		}
	}
}

// BenchmarkBroadcastNop is BenchmarkBroadcast's no-payload case with actors
// that share no state, so that the calls' own cache traffic (the shared call
// counter there) does not hide Broadcast's cost.
func BenchmarkBroadcastNop(b *testing.B) {
	for _, n := range []int{50, 400, 950} {
		actors := make([]Actor, n)
		for i := range actors {
			actors[i] = &fnActor{id: fmt.Sprint("a", i), fn: func(context.Context, string, []byte) ([]byte, error) {
				return nil, nil
			}}
		}
		ctx := context.Background()
		b.Run(fmt.Sprintf("actors=%d/path=broadcast", n), func(b *testing.B) {
			p := NewPool(actors...)
			b.ReportAllocs()
			for b.Loop() {
				p.Broadcast(ctx, Call{Method: "reconfigure"})
			}
		})
		b.Run(fmt.Sprintf("actors=%d/path=foreach", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, a := range actors {
					if _, err := a.Call(ctx, "reconfigure", nil); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
