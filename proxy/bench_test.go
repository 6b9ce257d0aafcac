package proxy

import (
	"context"
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
			var accessOut io.Writer
			if accessLog {
				accessOut = io.Discard
			}
			p := benchProxy(b, accessOut)
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

// benchProxy starts the seed's app (static "hi", 16 replicas of 100) with
// its access log written to accessLog, off if nil.
func benchProxy(b *testing.B, accessLog io.Writer) *Proxy {
	b.Helper()
	d, err := NewDeployment(context.Background(), replica.DeploymentSpec{
		App: "default", Name: "hello", Factory: static("hi"), NumReplicas: 16, MaxOngoingRequests: 100,
		HealthCheckPeriod: time.Hour, HealthCheckTimeout: time.Second,
	}, -1, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{
		Applications: []*Application{{Name: "default", RoutePrefix: "/", Deployments: []*Deployment{d}}},
		AccessLog:    accessLog,
	})
	if err != nil {
		b.Fatal(err)
	}
	p.Start()
	b.Cleanup(func() {
		_ = p.Stop(context.Background())
		_ = p.Close()
	})
	return p
}

// BenchmarkServeAppParallel is BenchmarkServeApp's access_log=on case from
// every P at once, generating request ids as for a client that sends none:
// what the shared counters and histograms cost when cores contend for them.
func BenchmarkServeAppParallel(b *testing.B) {
	p := benchProxy(b, io.Discard)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest("GET", "/", nil)
		w := &nopWriter{h: make(http.Header)}
		for pb.Next() {
			delete(req.Header, requestIDHeader)
			clear(w.h)
			p.serveApp(w, req)
		}
	})
}
