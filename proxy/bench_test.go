package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/replica"
)

// nopWriter is a ResponseWriter that keeps nothing, so that the benchmark
// counts the proxy's allocations, not a recorder's.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkServeApp measures the in-process request path (route, schedule,
// replica, metrics, access log) without the network.
func BenchmarkServeApp(b *testing.B) {
	for _, accessLog := range []bool{false, true} {
		name := "access_log=off"
		if accessLog {
			name = "access_log=on"
		}
		b.Run(name, func(b *testing.B) {
			d, err := NewDeployment(replica.DeploymentSpec{
				App: "default", Name: "hello", Factory: static("hi"), NumReplicas: 16, MaxOngoingRequests: 100,
				HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second,
			}, -1, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			opts := Options{Applications: []*Application{{Name: "default", RoutePrefix: "/", Deployments: []*Deployment{d}}}}
			if accessLog {
				opts.AccessLog = io.Discard
			}
			p, err := New(opts)
			if err != nil {
				b.Fatal(err)
			}
			p.Start()
			defer p.Close()
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Request-ID", "fixed")
			w := &nopWriter{h: make(http.Header)}
			b.ReportAllocs()
			for b.Loop() {
				p.serveApp(w, req)
			}
		})
	}
}
