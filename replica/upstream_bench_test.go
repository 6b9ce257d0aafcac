package replica

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"
)

// benchWriter is a ResponseWriter that keeps nothing: the benchmark measures
// the forwarding, not a recorder.
type benchWriter struct {
	h      http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) Flush()                      {}

// BenchmarkUpstreamServe forwards GET / to a "hi" backend through an
// Upstream, and through httputil.ReverseProxy over a transport tuned the
// same way (issue 5's baseline), from parallel goroutines as a loaded proxy
// does. The handlers are called directly, so the proxy's own server is left
// out. Two backends: net/http's server (as in the comparison), and a
// raw responder that costs almost nothing, which shows the forwarding's own
// cost.
func BenchmarkUpstreamServe(b *testing.B) {
	const maxOngoing = 100
	nethttp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("hi"))
	}))
	defer nethttp.Close()
	raw, stopRaw := rawHiBackend(b)
	defer stopRaw()

	run := func(b *testing.B, serve func(w http.ResponseWriter, r *http.Request)) {
		b.ReportAllocs()
		b.SetParallelism(8) // 8 x GOMAXPROCS requests in flight, like wrk -c
		cpu0 := processCPU()
		defer func() {
			// CPU time of the whole process (proxy side and backend), which
			// other load on a shared machine disturbs less than ns/op.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		}()
		b.RunParallel(func(pb *testing.PB) {
			r := httptest.NewRequest(http.MethodGet, "http://proxy.test/", nil)
			r.RemoteAddr = "127.0.0.1:40000"
			r.Header.Set("User-Agent", "bench")
			r.Header.Set("X-Request-Id", "0123456789abcdef")
			w := &benchWriter{h: make(http.Header)}
			for pb.Next() {
				clear(w.h)
				w.status = 0
				serve(w, r)
				if w.status != http.StatusOK {
					b.Errorf("status %d", w.status)
					return
				}
			}
		})
	}

	for _, backend := range []struct{ name, url string }{{"net-http", nethttp.URL}, {"raw", raw}} {
		b.Run(backend.name+"/upstream", func(b *testing.B) {
			tr := NewTransport(TransportOptions{MaxConnsPerReplica: maxOngoing})
			defer tr.CloseIdleConnections()
			u, err := NewUpstream("bench", backend.url, UpstreamOptions{MaxOngoing: maxOngoing, Transport: tr})
			if err != nil {
				b.Fatal(err)
			}
			defer u.Close()
			run(b, func(w http.ResponseWriter, r *http.Request) {
				if err := u.Serve(w, r); err != nil {
					b.Error(err)
				}
			})
		})

		b.Run(backend.name+"/httputil.ReverseProxy", func(b *testing.B) {
			target, _ := url.Parse(backend.url)
			tr := &http.Transport{
				Proxy:                 nil,
				MaxIdleConns:          0,
				MaxIdleConnsPerHost:   maxOngoing,
				MaxConnsPerHost:       maxOngoing,
				IdleConnTimeout:       90 * time.Second,
				DisableCompression:    true,
				ExpectContinueTimeout: time.Second,
			}
			defer tr.CloseIdleConnections()
			rp := &httputil.ReverseProxy{
				Rewrite: func(pr *httputil.ProxyRequest) {
					pr.SetURL(target)
					pr.Out.Host = pr.In.Host
					pr.SetXForwarded()
				},
				Transport:  tr,
				BufferPool: bufferPool{},
			}
			run(b, rp.ServeHTTP)
		})
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bufferPool gives ReverseProxy pooled buffers, as a tuned deployment
// would: without one it allocates 32 KiB per request.
type bufferPool struct{}

func (bufferPool) Get() []byte  { return *copyBufPool.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBufPool.Put(&b) }

// rawHiBackend answers every request on a keep-alive connection with a
// fixed "hi", reading only as far as the end of the header block.
func rawHiBackend(b *testing.B) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nhi")
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if bytes.Equal(line, []byte("\r\n")) {
						if _, err := c.Write(resp); err != nil {
							return
						}
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String(), func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}
