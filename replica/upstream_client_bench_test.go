package replica

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkUpstreamServeClient is BenchmarkUpstreamServe's upstream case
// over UpstreamClient instead of net/http's Transport: same backends, same
// load, so that the two read side by side under -bench BenchmarkUpstreamServe.
func BenchmarkUpstreamServeClient(b *testing.B) {
	const maxOngoing = 100
	nethttp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("hi"))
	}))
	defer nethttp.Close()
	raw, stopRaw := rawHiBackend(b)
	defer stopRaw()

	for _, backend := range []struct{ name, url string }{{"net-http", nethttp.URL}, {"raw", raw}} {
		b.Run(backend.name+"/upstream-client", func(b *testing.B) {
			c := NewUpstreamClient(TransportOptions{MaxConnsPerReplica: maxOngoing})
			defer c.CloseIdleConnections()
			u, err := NewUpstream("bench", backend.url, UpstreamOptions{MaxOngoing: maxOngoing, Transport: c})
			if err != nil {
				b.Fatal(err)
			}
			defer u.Close()
			b.ReportAllocs()
			b.SetParallelism(8)
			cpu0 := processCPU()
			defer func() { b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op") }()
			b.RunParallel(func(pb *testing.PB) {
				r := httptest.NewRequest(http.MethodGet, "http://proxy.test/", nil)
				r.RemoteAddr = "127.0.0.1:40000"
				r.Header.Set("User-Agent", "bench")
				r.Header.Set("X-Request-Id", "0123456789abcdef")
				w := &benchWriter{h: make(http.Header)}
				for pb.Next() {
					clear(w.h)
					w.status = 0
					if err := u.Serve(w, r); err != nil {
						b.Error(err)
						return
					}
					if w.status != http.StatusOK {
						b.Errorf("status %d", w.status)
						return
					}
				}
			})
		})
	}
}
