package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// handlerFunc is a Handler as a function, for a test's own factory.
type handlerFunc func(w http.ResponseWriter, r *http.Request)

func (f handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) { f(w, r) }

func factoryOf(f handlerFunc) Factory {
	return func(json.RawMessage) (Handler, error) { return f, nil }
}

// startHost runs a host on a loopback listener until the test ends.
func startHost(t *testing.T, cfg HostConfig) (*Host, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveHost(t, cfg, l), l.Addr().String()
}

// serveHost runs a host on l until the test ends.
func serveHost(t *testing.T, cfg HostConfig, l net.Listener) *Host {
	t.Helper()
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- h.Serve(l) }()
	t.Cleanup(func() {
		_ = h.Close()
		if err := <-served; !errors.Is(err, ErrHostClosed) {
			t.Errorf("Serve: %v, want ErrHostClosed", err)
		}
	})
	return h
}

// connect connects to a host until the test ends, with every replica
// running.
func connect(t *testing.T, addr string, o HostOptions) *HostConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ConnectHost(ctx, addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for _, r := range c.Replicas() {
		r.SetState(StateRunning)
	}
	return c
}

// hostFrontend is an HTTP server that serves every request on r, as the
// proxy's request path does (one attempt, the error as a status).
func hostFrontend(t *testing.T, r Replica) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		release, ok := r.TryAcquire()
		if !ok {
			http.Error(w, "full at the proxy", http.StatusServiceUnavailable)
			return
		}
		defer release()
		if err := r.Serve(w, req); err != nil {
			http.Error(w, fmt.Sprintf("%T: %v", err, err), http.StatusBadGateway)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// writeRecorder is a ResponseWriter that records whether anything was
// written, and the response.
type writeRecorder struct {
	h       http.Header
	status  int
	body    bytes.Buffer
	touched bool // WriteHeader or Write was called
}

func newWriteRecorder() *writeRecorder { return &writeRecorder{h: make(http.Header)} }

func (w *writeRecorder) Header() http.Header { return w.h }
func (w *writeRecorder) WriteHeader(code int) {
	w.touched = true
	if w.status == 0 {
		w.status = code
	}
}

func (w *writeRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.body.Write(b)
}
func (w *writeRecorder) Flush() {}

// serveOn runs one request on r directly, holding a slot.
func serveOn(t *testing.T, r Replica, req *http.Request) (*writeRecorder, error) {
	t.Helper()
	release, ok := r.TryAcquire()
	if !ok {
		t.Fatalf("%s: no free slot", r.ID())
	}
	defer release()
	w := newWriteRecorder()
	return w, r.Serve(w, req)
}

// echoHandler answers with the request's method, path, query, one header
// and body, and headers of its own.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("X-Reply", "yes")
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "%s %s q=%s h=%s xff=%s cl=%d host=%s body=%s", r.Method, r.URL.Path, r.URL.Query().Get("q"),
		r.Header.Get("X-Test"), r.Header.Get("X-Forwarded-For"), r.ContentLength, r.Host, body)
}

func TestHostRoundTrip(t *testing.T) {
	noLeaks(t)
	_, addr := startHost(t, HostConfig{Name: "echo", Factory: factoryOf(echoHandler), Replicas: 2, MaxOngoing: 4})
	c := connect(t, addr, HostOptions{})
	rs := c.Replicas()
	if len(rs) != 2 || rs[0].ID() != addr+"/echo#0" || rs[1].MaxOngoing() != 4 || rs[0].Host() != addr {
		t.Fatalf("replicas: %d, %s, max %d", len(rs), rs[0].ID(), rs[1].MaxOngoing())
	}
	srv := hostFrontend(t, rs[1])

	big := strings.Repeat("x", 2<<20) // over maxWholeBody: streamed
	tests := []struct {
		name   string
		body   func() io.Reader
		length int64
		want   string
	}{
		{"no body", func() io.Reader { return nil }, 0, "POST /a/b q=1 2 h=t xff=127.0.0.1 cl=0 host=example.test body="},
		{"small body", func() io.Reader { return strings.NewReader("hello") }, 5, "POST /a/b q=1 2 h=t xff=127.0.0.1 cl=5 host=example.test body=hello"},
		{"chunked body", func() io.Reader { return io.MultiReader(strings.NewReader("hel"), strings.NewReader("lo")) }, -1,
			"POST /a/b q=1 2 h=t xff=127.0.0.1 cl=-1 host=example.test body=hello"},
		{"big body", func() io.Reader { return strings.NewReader(big) }, int64(len(big)),
			fmt.Sprintf("POST /a/b q=1 2 h=t xff=127.0.0.1 cl=%d host=example.test body=%s", len(big), big)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/a/b?q=1+2", tt.body())
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = tt.length
			req.Host = "example.test"
			req.Header.Set("X-Test", "t")
			req.Header.Set("Connection", "X-Test2")
			req.Header.Set("X-Test2", "hop")
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			got, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusCreated || string(got) != tt.want {
				t.Fatalf("%d %.200q, want 201 %.200q", res.StatusCode, got, tt.want)
			}
			if res.Header.Get("X-Reply") != "yes" || strings.Join(res.Header["X-Multi"], ",") != "a,b" {
				t.Fatalf("header %v", res.Header)
			}
		})
	}
}

// A header value the host protocol cannot carry (over 64 KiB) is a
// *HeaderTooLargeError (431), not a replica failure, and the connection
// goes on serving (found by an exploratory run).
func TestHostHeaderTooLarge(t *testing.T) {
	noLeaks(t)
	_, addr := startHost(t, HostConfig{Name: "echo", Factory: factoryOf(echoHandler), Replicas: 1, MaxOngoing: 4})
	c := connect(t, addr, HostOptions{})
	srv := hostFrontend(t, c.Replicas()[0])
	for _, size := range []int{100 << 10, 10} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/a", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Long", strings.Repeat("x", size))
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if size > 0xffff && !strings.Contains(string(body), "*replica.HeaderTooLargeError") {
			t.Fatalf("a %d-byte header: %d %q, want a *HeaderTooLargeError", size, res.StatusCode, body)
		}
		if size <= 0xffff && res.StatusCode != http.StatusCreated {
			t.Fatalf("the next request: %d %q", res.StatusCode, body)
		}
	}
}

// Forwarded and X-Real-IP, a client's own word for its address, are
// dropped from a peer that is not trusted, as X-Forwarded-For is replaced.
func TestHostDropsForgedForwarded(t *testing.T) {
	noLeaks(t)
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%q %q", r.Header.Get("Forwarded"), r.Header.Get("X-Real-Ip"))
	}), Replicas: 1, MaxOngoing: 1})
	c := connect(t, addr, HostOptions{})
	srv := hostFrontend(t, c.Replicas()[0])
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.Header.Set("Forwarded", "for=6.6.6.6")
	req.Header.Set("X-Real-Ip", "6.6.6.6")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != `"" ""` {
		t.Fatalf("the replica saw %s, want neither header", body)
	}
}

func TestHostBigResponse(t *testing.T) {
	noLeaks(t)
	big := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB: many data frames, past the window
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		for b := big; len(b) > 0; b = b[min(len(b), 7000):] {
			_, _ = w.Write(b[:min(len(b), 7000)])
		}
	}), Replicas: 1, MaxOngoing: 1})
	c := connect(t, addr, HostOptions{})
	srv := hostFrontend(t, c.Replicas()[0])
	res, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("%d bytes, %v; want %d bytes", len(got), err, len(big))
	}
}

// TestHostStreaming: chunks of a flushed response reach the client while
// the handler still runs, and a streamed request body reaches the handler
// chunk by chunk while the response streams back (full duplex).
func TestHostStreaming(t *testing.T) {
	noLeaks(t)
	next := make(chan struct{})
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/duplex" {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			buf := make([]byte, 100)
			for {
				n, err := r.Body.Read(buf)
				if n > 0 {
					fmt.Fprintf(w, "got %s;", buf[:n])
					w.(http.Flusher).Flush()
				}
				if err != nil {
					return
				}
			}
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}), Replicas: 1, MaxOngoing: 2})
	c := connect(t, addr, HostOptions{})
	srv := hostFrontend(t, c.Replicas()[0])

	t.Run("events", func(t *testing.T) {
		res, err := srv.Client().Get(srv.URL + "/events")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		buf := make([]byte, 100)
		for i := range 3 {
			// The handler waits on next: this chunk came before it ended.
			n, err := io.ReadAtLeast(res.Body, buf, len("data: 0\n\n"))
			if err != nil || string(buf[:n]) != fmt.Sprintf("data: %d\n\n", i) {
				t.Fatalf("chunk %d: %q, %v", i, buf[:n], err)
			}
			next <- struct{}{}
		}
		if rest, _ := io.ReadAll(res.Body); len(rest) != 0 {
			t.Fatalf("after the events: %q", rest)
		}
	})

	t.Run("duplex", func(t *testing.T) {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/duplex", pr)
		done := make(chan *http.Response, 1)
		go func() {
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		if _, err := pw.Write([]byte("one")); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res == nil {
			t.FailNow()
		}
		defer res.Body.Close()
		buf := make([]byte, 100)
		n, err := io.ReadAtLeast(res.Body, buf, len("got one;"))
		if err != nil || string(buf[:n]) != "got one;" {
			t.Fatalf("%q, %v", buf[:n], err)
		}
		_, _ = pw.Write([]byte("two"))
		n, err = io.ReadAtLeast(res.Body, buf, len("got two;"))
		if err != nil || string(buf[:n]) != "got two;" {
			t.Fatalf("%q, %v", buf[:n], err)
		}
		pw.Close()
		if rest, err := io.ReadAll(res.Body); err != nil || len(rest) != 0 {
			t.Fatalf("rest %q, %v", rest, err)
		}
	})
}

// TestHostOutOfOrder: on one connection, a slow request does not hold up
// fast ones, which are answered while it runs.
func TestHostOutOfOrder(t *testing.T) {
	noLeaks(t)
	gate := make(chan struct{})
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, r.URL.Path)
	}), Replicas: 1, MaxOngoing: 100})
	c := connect(t, addr, HostOptions{Conns: 1})
	r := c.Replicas()[0]
	slow := make(chan string, 1)
	go func() {
		w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/slow", nil))
		if err != nil {
			t.Error(err)
		}
		slow <- w.body.String()
	}()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			path := fmt.Sprintf("/fast/%d", i)
			w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, path, nil))
			if err != nil || w.body.String() != path {
				t.Errorf("%s: %q, %v", path, w.body.String(), err)
			}
		})
	}
	wg.Wait()
	select {
	case got := <-slow:
		t.Fatalf("the slow request finished first: %q", got)
	default:
	}
	close(gate)
	if got := <-slow; got != "/slow" {
		t.Fatalf("slow: %q", got)
	}
}

// TestHostLimit: the proxy never sends an actor more than its limit, the
// actor's own count peaks at the limit, and a request over it (from a
// second proxy) is refused as full, with nothing written.
func TestHostLimit(t *testing.T) {
	noLeaks(t)
	const limit = 3
	var running, peak atomic.Int64
	gate := make(chan struct{})
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if r.URL.Path == "/hold" {
			select {
			case <-gate:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "ok")
	}), Replicas: 1, MaxOngoing: limit})

	c := connect(t, addr, HostOptions{})
	r := c.Replicas()[0]
	var wg sync.WaitGroup
	var served, refused atomic.Int64
	for range 40 {
		wg.Go(func() {
			for range 25 {
				release, ok := r.TryAcquire()
				if !ok {
					refused.Add(1)
					continue
				}
				w := newWriteRecorder()
				err := r.Serve(w, httptest.NewRequest(http.MethodGet, "/", nil))
				release()
				if err != nil {
					t.Error(err)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	if p := h.Actors()[0].Peak(); p > limit || peak.Load() > limit || r.(*hostReplica).Peak() > limit {
		t.Fatalf("peaks: host actor %d, handler %d, proxy %d; limit %d", p, peak.Load(), r.(*hostReplica).Peak(), limit)
	}
	t.Logf("%d served, %d refused at the proxy; peak %d of %d", served.Load(), refused.Load(), h.Actors()[0].Peak(), limit)

	// A second proxy fills the actor; the first's request is refused by
	// the host.
	other := connect(t, addr, HostOptions{})
	var holding sync.WaitGroup
	for range limit {
		holding.Go(func() {
			if _, err := serveOn(t, other.Replicas()[0], httptest.NewRequest(http.MethodGet, "/hold", nil)); err != nil {
				t.Error(err)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.Actors()[0].Ongoing() < limit && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("body"))
	w, err := serveOn(t, r, req)
	var full *FullError
	if !errors.As(err, &full) || !Retryable(err) || w.touched || len(w.h) != 0 {
		t.Fatalf("over the limit: %v (%T), written %v %v; want a retryable *FullError, nothing written", err, err, w.touched, w.h)
	}
	if b, _ := io.ReadAll(req.Body); string(b) != "body" {
		t.Fatalf("the refused request's body for a retry: %q", b)
	}
	// A streamed body is not read at all.
	req = httptest.NewRequest(http.MethodPost, "/", io.MultiReader(strings.NewReader("streamed")))
	req.ContentLength = -1
	if _, err = serveOn(t, r, req); !errors.As(err, &full) || !Retryable(err) {
		t.Fatalf("over the limit, streamed: %v", err)
	}
	if b, _ := io.ReadAll(req.Body); string(b) != "streamed" {
		t.Fatalf("the refused request's streamed body: %q", b)
	}
	close(gate)
	holding.Wait()
}

// frameCounter counts the frames in a byte stream, by type.
type frameCounter struct {
	mu      sync.Mutex
	pending []byte
	counts  map[frameType]int
	flags   map[frameType][]byte
}

func (fc *frameCounter) feed(p []byte) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.counts == nil {
		fc.counts, fc.flags = make(map[frameType]int), make(map[frameType][]byte)
	}
	fc.pending = append(fc.pending, p...)
	for len(fc.pending) >= frameHeaderLen {
		n := int(binary.BigEndian.Uint32(fc.pending))
		if len(fc.pending) < frameHeaderLen+n {
			return
		}
		typ := frameType(fc.pending[4])
		fc.counts[typ]++
		fc.flags[typ] = append(fc.flags[typ], fc.pending[5])
		fc.pending = fc.pending[frameHeaderLen+n:]
	}
}

func (fc *frameCounter) count(typ frameType) int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.counts[typ]
}

func (fc *frameCounter) flagsOf(typ frameType) []byte {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return bytes.Clone(fc.flags[typ])
}

// countingConn counts a connection's writes, and the frames it reads.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
	read   *frameCounter
}

func (c *countingConn) Write(p []byte) (int, error) {
	if c.writes != nil {
		c.writes.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.read != nil && n > 0 {
		c.read.feed(p[:n])
	}
	return n, err
}

// countingListener wraps every accepted connection.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
	read   *frameCounter
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: l.writes, read: l.read}, nil
}

// healthCounter is a handler that counts its health checks.
type healthCounter struct {
	checks *atomic.Int64
	fail   *atomic.Bool
}

func (h *healthCounter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "hi")
}
func (h *healthCounter) CheckHealth(context.Context) error {
	h.checks.Add(1)
	if h.fail.Load() {
		return errors.New("unwell")
	}
	return nil
}

// TestHostBroadcastBatched: a Broadcast over the replicas of two hosts and
// an in-process one reaches every actor with one control frame per host,
// results in pool order; a Ref's bytes go to each host once.
func TestHostBroadcastBatched(t *testing.T) {
	noLeaks(t)
	var checks atomic.Int64
	var fail atomic.Bool
	mk := func() (string, *frameCounter) {
		fc := &frameCounter{}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serveHost(t, HostConfig{Factory: func(json.RawMessage) (Handler, error) {
			return &healthCounter{checks: &checks, fail: &fail}, nil
		}, Replicas: 3, MaxOngoing: 1}, &countingListener{Listener: l, read: fc})
		return l.Addr().String(), fc
	}
	addrA, fcA := mk()
	addrB, fcB := mk()
	a, b := connect(t, addrA, HostOptions{}), connect(t, addrB, HostOptions{})
	local := NewLocal("local", &healthCounter{checks: &checks, fail: &fail}, 1, nil)
	local.SetState(StateRunning)
	var actors []Actor
	for i := range 3 { // interleaved, so that pool order is not host order
		actors = append(actors, a.Replicas()[i], b.Replicas()[i])
	}
	actors = append(actors, local)
	p := NewPool(actors...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	rs := p.Broadcast(ctx, Call{Method: MethodCheckHealth})
	if got, want := resultIDs(rs), actorIDs(actors); !slices.Equal(got, want) {
		t.Fatalf("results %v, want pool order %v", got, want)
	}
	for _, r := range rs {
		if r.Err != nil {
			t.Fatalf("%s: %v", r.Actor, r.Err)
		}
	}
	if n := checks.Load(); n != 7 {
		t.Fatalf("%d health checks, want 7", n)
	}
	if na, nb := fcA.count(frameControl), fcB.count(frameControl); na != 1 || nb != 1 {
		t.Fatalf("control frames: %d to host A, %d to host B; want 1 each", na, nb)
	}

	fail.Store(true)
	for _, r := range p.Broadcast(ctx, Call{Method: MethodCheckHealth}, a.Replicas()[2].ID(), "local") {
		if r.Err == nil || !strings.Contains(r.Err.Error(), "unwell") {
			t.Fatalf("%s: %v, want unwell", r.Actor, r.Err)
		}
	}
	fail.Store(false)

	// Stats: the proxy's ids and states, the host's counts.
	for i, r := range p.Broadcast(ctx, Call{Method: MethodStats}) {
		var s Stats
		if err := json.Unmarshal(r.Value, &s); err != nil || s.ID != actors[i].ID() || s.MaxOngoing != 1 || s.State != StateRunning {
			t.Fatalf("stats of %s: %+v, %v", actors[i].ID(), s, err)
		}
	}

	// A Ref: its bytes once per host connection, then the id only.
	ref := p.Put([]byte(`{"ignored": true}`))
	for range 2 {
		for _, r := range p.Broadcast(ctx, Call{Method: MethodReconfigure, Ref: ref}) {
			if !errors.Is(r.Err, ErrNotReconfigurable) {
				t.Fatalf("%s: %v, want ErrNotReconfigurable", r.Actor, r.Err)
			}
		}
	}
	for _, fc := range []*frameCounter{fcA, fcB} {
		fl := fc.flagsOf(frameControl)
		if n := len(fl); n < 2 || fl[n-2] != flagPayload || fl[n-1] != 0 || bytes.Count(fl, []byte{flagPayload}) != 1 {
			t.Fatalf("control frames' flags %v: want the payload on the first by Ref only", fl)
		}
	}
	p.Free(ref)
	deadline := time.Now().Add(10 * time.Second)
	for (fcA.count(frameFree) != 1 || fcB.count(frameFree) != 1) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if fcA.count(frameFree) != 1 || fcB.count(frameFree) != 1 {
		t.Fatal("Free sent no free frame to the hosts")
	}

	// Unknown method: the host's actors' own error.
	for _, r := range p.Broadcast(ctx, Call{Method: "nope"}) {
		if !errors.Is(r.Err, ErrUnknownMethod) {
			t.Fatalf("%s: %v, want ErrUnknownMethod", r.Actor, r.Err)
		}
	}
}

// noLeaks checks, once the test and its cleanups are done, that no
// goroutine is left: registered first, it runs after every other cleanup.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// TestHostConns: with several connections to a host (requests go round
// robin over them), every request is answered, and a broadcast is still
// one frame.
func TestHostConns(t *testing.T) {
	noLeaks(t)
	fc := &frameCounter{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	serveHost(t, HostConfig{Factory: factoryOf(echoHandler), Replicas: 2, MaxOngoing: 50}, &countingListener{Listener: l, read: fc, writes: &writes})
	c := connect(t, l.Addr().String(), HostOptions{Conns: 3})
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			r := c.Replicas()[i%2]
			w, err := serveOn(t, r, httptest.NewRequest(http.MethodPut, fmt.Sprintf("/%d", i), strings.NewReader("b")))
			if want := fmt.Sprintf("PUT /%d q= h= xff=192.0.2.1 cl=1 host=example.com body=b", i); err != nil || w.body.String() != want {
				t.Errorf("%q, %v; want %q", w.body.String(), err, want)
			}
		})
	}
	wg.Wait()
	if n := fc.count(frameHello); n != 3 {
		t.Fatalf("%d connections said hello, want 3", n)
	}
	if n := fc.count(frameRequest); n != 60 {
		t.Fatalf("%d request frames, want 60", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, res := range NewPool(c.Replicas()[0], c.Replicas()[1]).Broadcast(ctx, Call{Method: MethodCheckHealth}) {
		if res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if n := fc.count(frameControl); n != 1 {
		t.Fatalf("%d control frames for one broadcast, want 1", n)
	}
}

// With Via set, the proxy's entry follows the client's on one line, both
// ways, as for upstreams.
func TestHostVia(t *testing.T) {
	noLeaks(t)
	_, addr := startHost(t, HostConfig{Name: "via", Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Via", "1.1 app")
		_, _ = io.WriteString(w, strings.Join(r.Header.Values("Via"), "|"))
	}), Replicas: 1, MaxOngoing: 4})
	c := connect(t, addr, HostOptions{Via: "serveproxy"})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("Via", "1.0 fred")
	w, err := serveOn(t, c.Replicas()[0], req)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.body.String(); got != "1.0 fred, 1.1 serveproxy" {
		t.Errorf("request Via at the host = %q, want one line", got)
	}
	if got := w.h.Values("Via"); len(got) != 1 || got[0] != "1.1 app, 1.1 serveproxy" {
		t.Errorf("response Via = %q, want one line", got)
	}
}

// A host logs, at Info, each proxy connection it takes and loses, with
// how many it holds (it was at Debug, found by a tester: an operator could
// not see which proxies reached it).
func TestHostLogsProxyConnections(t *testing.T) {
	logs := &syncBuffer{}
	_, addr := startHost(t, HostConfig{Factory: NewStatic, Replicas: 1, MaxOngoing: 1, Log: zerolog.New(logs).Level(zerolog.InfoLevel)})
	c := connect(t, addr, HostOptions{})
	eventually(t, "the connection logged", func() bool {
		return strings.Contains(logs.String(), `"message":"replica host: proxy connected"`)
	})
	c.Close()
	eventually(t, "the disconnection logged", func() bool {
		return strings.Contains(logs.String(), `"connections":0,"message":"replica host: proxy disconnected"`)
	})
}

// hangingCheck is a handler whose health check waits for its context's
// end when hang is set.
type hangingCheck struct{ hang bool }

func (h *hangingCheck) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "hi")
}
func (h *hangingCheck) CheckHealth(ctx context.Context) error {
	if h.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// One actor whose health check hangs fails its check alone: the host
// answers for the others before the caller's deadline. Before, the host
// answered at the same deadline as the caller's, which gave up first, and
// every actor of the host failed: three such rounds took the whole host
// out of routing for one hung actor.
func TestHostHungActorFailsItsCheckAlone(t *testing.T) {
	noLeaks(t)
	var built atomic.Int32
	_, addr := startHost(t, HostConfig{Factory: func(json.RawMessage) (Handler, error) {
		return &hangingCheck{hang: built.Add(1) == 1}, nil
	}, Replicas: 3, MaxOngoing: 1})
	c := connect(t, addr, HostOptions{})
	actors := make([]Actor, 0, 3)
	for _, r := range c.Replicas() {
		actors = append(actors, r)
	}
	p := NewPool(actors...)
	for round := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		rs := p.Broadcast(ctx, Call{Method: MethodCheckHealth})
		cancel()
		failed := 0
		for _, r := range rs {
			if r.Err != nil {
				failed++
				// Or the last round's check, cut at the host's deadline,
				// still returning.
				if !errors.Is(r.Err, context.DeadlineExceeded) && !errors.Is(r.Err, ErrCheckInFlight) {
					t.Fatalf("round %d: %s: %v, want its deadline", round, r.Actor, r.Err)
				}
			}
		}
		if failed != 1 {
			t.Fatalf("round %d: %d of 3 actors failed their checks, want the hung one alone: %v", round, failed, rs)
		}
	}
}

// A host actor's reconfigure that outlives its caller's deadline is no
// rejection, as for an in-process replica: the host, given a tenth less
// time, answers with its deadline while the caller's is still live, and
// that was counted as every replica refusing (the old user_config put
// back while the actors applied the new one).
func TestHostReconfigureDeadlineIsNotRejection(t *testing.T) {
	var mu sync.Mutex
	var actors []*slowReconf
	_, addr := startHost(t, HostConfig{Factory: func(json.RawMessage) (Handler, error) {
		h := &slowReconf{delay: time.Second}
		mu.Lock()
		actors = append(actors, h)
		mu.Unlock()
		return h, nil
	}, Replicas: 2, MaxOngoing: 1})
	d := startDeployment(t, DeploymentSpec{Targets: []string{addr},
		Connect: func(ctx context.Context, id, target string, onRelease func()) ([]Replica, error) {
			hc, err := ConnectHost(ctx, target, HostOptions{OnRelease: onRelease})
			if err != nil {
				return nil, err
			}
			t.Cleanup(hc.Close)
			return hc.Replicas(), nil
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := d.Reconfigure(ctx, json.RawMessage(`{"v":2}`)); err != nil {
		t.Fatalf("Reconfigure past its deadline = %v, want no rejection", err)
	}
	if got := string(d.Spec().UserConfig); got != `{"v":2}` {
		t.Fatalf("user_config after a slow reconfigure = %s, want the new one", got)
	}
	// As the actors did, a little later.
	mu.Lock()
	defer mu.Unlock()
	for i, h := range actors {
		deadline := time.Now().Add(10 * time.Second)
		for h.seen.Load() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got, _ := h.seen.Load().(string); got != `{"v":2}` {
			t.Fatalf("actor %d applied %q, want the new user_config", i, got)
		}
	}
}
