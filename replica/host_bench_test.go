package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
)

// syscallConn counts a connection's Write and Read calls: each is one
// system call on a TCP connection.
type syscallConn struct {
	net.Conn
	writes, reads *atomic.Int64
}

func (c *syscallConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (c *syscallConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

type syscallListener struct {
	net.Listener
	writes, reads *atomic.Int64
}

func (l *syscallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &syscallConn{Conn: c, writes: l.writes, reads: l.reads}, nil
}

// BenchmarkHostRoundTrip serves GET / through a replica host's replicas
// (HostConn, one connection) to a host of 8 static "hi" actors on
// loopback, from parallel goroutines as a loaded proxy does: 16 and 64
// requests in flight. It reports the system calls per request on each
// side (a write or read of the connection is one), and the CPU time of
// the whole process (proxy side and host) per request.
func BenchmarkHostRoundTrip(b *testing.B) {
	for _, inFlight := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) {
			var hostWrites, hostReads, proxyWrites, proxyReads atomic.Int64
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			h, err := NewHost(HostConfig{Name: "static", Factory: NewStatic, UserConfig: json.RawMessage(`{"body": "hi"}`), Replicas: 8, MaxOngoing: 100})
			if err != nil {
				b.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- h.Serve(&syscallListener{Listener: l, writes: &hostWrites, reads: &hostReads}) }()
			defer func() {
				_ = h.Close()
				<-served
			}()
			c, err := ConnectHost(context.Background(), l.Addr().String(), HostOptions{
				Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &syscallConn{Conn: nc, writes: &proxyWrites, reads: &proxyReads}, nil
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			rs := c.Replicas()
			for _, r := range rs {
				r.SetState(StateRunning)
			}
			var next atomic.Uint32

			// client is one client's loop: it sends requests, round robin
			// over the replicas, until more says stop.
			client := func(more func() bool) {
				req := httptest.NewRequest(http.MethodGet, "http://proxy.test/", nil)
				req.RemoteAddr = "127.0.0.1:40000"
				req.Header.Set("User-Agent", "bench")
				req.Header.Set("X-Request-Id", "0123456789abcdef")
				w := &benchWriter{h: make(http.Header)}
				i := int(next.Add(1))
				for more() {
					var release func()
					var r Replica
					for ok := false; !ok; i++ {
						r = rs[i%len(rs)]
						release, ok = r.TryAcquire()
					}
					clear(w.h)
					w.status = 0
					err := r.Serve(w, req)
					release()
					if err != nil || w.status != http.StatusOK {
						b.Errorf("status %d, %v", w.status, err)
						return
					}
				}
			}

			b.ReportAllocs()
			hostWrites.Store(0)
			hostReads.Store(0)
			proxyWrites.Store(0)
			proxyReads.Store(0)
			cpu0 := processCPU()
			b.ResetTimer()
			if inFlight == 1 {
				n := 0
				client(func() bool { n++; return n <= b.N })
			} else {
				// RunParallel runs parallelism x GOMAXPROCS clients.
				b.SetParallelism(max(inFlight/runtime.GOMAXPROCS(0), 1))
				b.RunParallel(func(pb *testing.PB) { client(pb.Next) })
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(processCPU()-cpu0)/n, "cpu-ns/op")
			b.ReportMetric(float64(proxyWrites.Load())/n, "proxy-writes/op")
			b.ReportMetric(float64(proxyReads.Load())/n, "proxy-reads/op")
			b.ReportMetric(float64(hostWrites.Load())/n, "host-writes/op")
			b.ReportMetric(float64(hostReads.Load())/n, "host-reads/op")
		})
	}
}
