package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/gctune"
)

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls cond every millisecond for up to 10 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not in 10s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHostKilled: when the host goes, the requests in flight fail as
// unreachable after they were sent (not retryable), new ones fail at once
// as retryable, health checks fail; when it comes back on its address, the
// proxy reconnects and everything serves again.
func TestHostKilled(t *testing.T) {
	noLeaks(t)
	started := make(chan struct{}, 10)
	cfg := HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			started <- struct{}{}
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), Replicas: 2, MaxOngoing: 10}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	h, err := NewHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- h.Serve(l) }()
	logs := &syncBuffer{}
	reach := make(chan bool, 4)
	c := connect(t, addr, HostOptions{Log: zerolog.New(logs), OnReachability: func(_ *HostConn, up bool) { reach <- up }})
	r := c.Replicas()[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	const inFlight = 3
	errs := make(chan error, inFlight)
	for range inFlight {
		go func() {
			_, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/hold", nil))
			errs <- err
		}()
	}
	for range inFlight {
		<-started
	}
	_ = h.Close() // as a kill: listener and connections gone at once
	if err := <-served; !errors.Is(err, ErrHostClosed) {
		t.Fatalf("Serve: %v", err)
	}
	for range inFlight {
		err := <-errs
		var ue *UnreachableError
		if !errors.As(err, &ue) || !ue.Sent || Retryable(err) {
			t.Fatalf("in flight: %v (%T), want a sent *UnreachableError", err, err)
		}
	}
	eventually(t, "the proxy sees the host gone", func() bool { return !c.Connected() })
	if up := <-reach; up {
		t.Fatal("OnReachability said up when the host went")
	}
	// The loss's log lines count what failed with it, one line per
	// connection (found by a tester: an SRE could not tell how many).
	eventually(t, "the loss logged with its requests in flight", func() bool {
		lost := 0
		for line := range strings.SplitSeq(logs.String(), "\n") {
			var e struct {
				Message  string `json:"message"`
				InFlight int    `json:"in_flight"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && strings.HasPrefix(e.Message, "replica host connection lost") {
				lost += e.InFlight
			}
		}
		return lost == inFlight
	})
	// While it is down, its actors take no request: the router sends
	// them elsewhere without trying.
	if release, ok := r.TryAcquire(); ok {
		release()
		t.Fatal("an actor of a host that is down took a slot")
	}
	// One that got its slot just before the loss fails retryably,
	// nothing sent, nothing written.
	w := newWriteRecorder()
	err = r.Serve(w, httptest.NewRequest(http.MethodGet, "/", nil))
	var ue *UnreachableError
	if !errors.As(err, &ue) || ue.Sent || !Retryable(err) || w.touched {
		t.Fatalf("while down: %v, want a retryable *UnreachableError", err)
	}
	if _, err := r.Call(ctx, MethodCheckHealth, nil); !errors.As(err, &ue) {
		t.Fatalf("check_health while down: %v, want unreachable", err)
	}
	for _, res := range NewPool(c.Replicas()[0], c.Replicas()[1]).Broadcast(ctx, Call{Method: MethodCheckHealth}) {
		if !errors.As(res.Err, &ue) {
			t.Fatalf("broadcast check_health while down: %v", res.Err)
		}
	}

	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	serveHost(t, cfg, l2)
	eventually(t, "the proxy reconnects", c.Connected)
	if up := <-reach; !up {
		t.Fatal("OnReachability said down when the host came back")
	}
	if len(reach) != 0 {
		t.Fatalf("OnReachability told %d more times, want once each way", len(reach))
	}
	if w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/", nil)); err != nil || w.body.String() != "ok" {
		t.Fatalf("after the host came back: %q, %v", w.body.String(), err)
	}
	if _, err := r.Call(ctx, MethodCheckHealth, nil); err != nil {
		t.Fatalf("check_health after the host came back: %v", err)
	}
	if s := logs.String(); !strings.Contains(s, "connection lost") || !strings.Contains(s, "reconnected") {
		t.Fatalf("log: %s", s)
	}
}

// hostHelloFrame is a host's hello for one actor "a".
func hostHelloFrame() []byte {
	b, at := startFrame(nil, frameHello, 0, 0)
	b = append(b, hostMagic...)
	b = binary.BigEndian.AppendUint16(b, hostProtocolVersion)
	b = binary.BigEndian.AppendUint32(b, DefaultMaxFrameSize)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = appendStr8(b, "a")
	b = binary.BigEndian.AppendUint32(b, 10)
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeaderLen))
	return b
}

// proxyHelloFrame is a proxy's hello.
func proxyHelloFrame() []byte {
	b, at := startFrame(nil, frameHello, 0, 0)
	b = append(b, hostMagic...)
	b = binary.BigEndian.AppendUint16(b, hostProtocolVersion)
	b = binary.BigEndian.AppendUint32(b, DefaultMaxFrameSize)
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeaderLen))
	return b
}

// fakeHost accepts one connection and runs script on it.
func fakeHost(t *testing.T, script func(nc net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		script(nc)
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}

// readFrame reads one frame's header and body from a raw connection.
func readFrame(nc net.Conn) (frameType, []byte, error) {
	h := make([]byte, frameHeaderLen)
	if _, err := io.ReadFull(nc, h); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(h))
	_, err := io.ReadFull(nc, body)
	return frameType(h[4]), body, err
}

// TestHostProtocolErrors: an oversized, unknown or garbled frame closes
// the connection with a clear error, on either side.
func TestHostProtocolErrors(t *testing.T) {
	noLeaks(t)
	logs := &syncBuffer{}
	_, addr := startHost(t, HostConfig{Factory: NewStatic, Replicas: 1, MaxOngoing: 1, Log: zerolog.New(logs)})

	host := []struct {
		name, want string
		send       func() []byte
	}{
		{"HTTP instead of a hello", "frame over the size limit", func() []byte { return []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }},
		{"a hello of another protocol", "malformed frame", func() []byte {
			b := []byte{0, 0, 0, 4, byte(frameHello), 0, 0, 0, 0, 0, 'a', 'b', 'c', 'd'}
			return b
		}},
		{"an oversized frame", "a 2097152-byte frame", func() []byte {
			return append(proxyHelloFrame(), 0, 0x20, 0, 0, byte(frameRequest), 0, 0, 0, 0, 1)
		}},
		{"an unknown frame type", "unknown frame type 99", func() []byte {
			return append(proxyHelloFrame(), 0, 0, 0, 0, 99, 0, 0, 0, 0, 1)
		}},
		{"a garbled request", "does not parse", func() []byte {
			return append(proxyHelloFrame(), 0, 0, 0, 3, byte(frameRequest), flagEnd, 0, 0, 0, 1, 0, 0, 200)
		}},
		{"a response from a proxy", "a frame of type 3 from a proxy", func() []byte {
			return append(proxyHelloFrame(), 0, 0, 0, 0, byte(frameResponse), 0, 0, 0, 0, 1)
		}},
	}
	for _, tt := range host {
		t.Run("host/"+tt.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := nc.Write(tt.send()); err != nil {
				t.Fatal(err)
			}
			// Whatever the host sent (its hello), the connection ends.
			if _, err := io.Copy(io.Discard, nc); err != nil {
				t.Fatalf("the host did not close the connection: %v", err)
			}
			eventually(t, "the host logs "+tt.want, func() bool { return strings.Contains(logs.String(), tt.want) })
		})
	}

	t.Run("proxy/not a host", func(t *testing.T) {
		addr := fakeHost(t, func(nc net.Conn) {
			_, _ = io.Copy(io.Discard, io.LimitReader(nc, int64(len(proxyHelloFrame()))))
			_, _ = nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		})
		_, err := ConnectHost(context.Background(), addr, HostOptions{})
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("ConnectHost to an HTTP server: %v, want ErrFrameTooLarge", err)
		}
	})

	t.Run("proxy/silent host", func(t *testing.T) {
		addr := fakeHost(t, func(nc net.Conn) { _, _ = io.Copy(io.Discard, nc) })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := ConnectHost(ctx, addr, HostOptions{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ConnectHost to a host that says nothing: %v", err)
		}
	})

	for _, tt := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"oversized", []byte{0, 0x20, 0, 0, byte(frameResponse), 0, 0, 0, 0, 1}, ErrFrameTooLarge},
		{"unknown type", []byte{0, 0, 0, 0, 42, 0, 0, 0, 0, 1}, ErrBadFrame},
		{"data before a response", []byte{0, 0, 0, 1, byte(frameData), 0, 0, 0, 0, 1, 'x'}, ErrBadFrame},
		{"request from a host", []byte{0, 0, 0, 0, byte(frameRequest), 0, 0, 0, 0, 1}, ErrBadFrame},
	} {
		t.Run("proxy/"+tt.name, func(t *testing.T) {
			addr := fakeHost(t, func(nc net.Conn) {
				if typ, _, err := readFrame(nc); err != nil || typ != frameHello {
					return
				}
				_, _ = nc.Write(hostHelloFrame())
				if typ, _, err := readFrame(nc); err != nil || typ != frameRequest {
					return
				}
				_, _ = nc.Write(tt.frame)
				_, _ = io.Copy(io.Discard, nc)
			})
			c := connect(t, addr, HostOptions{})
			_, err := serveOn(t, c.Replicas()[0], httptest.NewRequest(http.MethodGet, "/", nil))
			var ue *UnreachableError
			if !errors.As(err, &ue) || !ue.Sent || !errors.Is(ue.Err, tt.want) {
				t.Fatalf("%v (%T), want a sent *UnreachableError wrapping %v", err, err, tt.want)
			}
			if !errors.Is(c.LastError(), tt.want) {
				t.Fatalf("LastError: %v", c.LastError())
			}
		})
	}
}

// TestHostControl: reconfigure, set_gc, drain, and the request errors: a
// panic, an aborted response, a client gone, a host too slow.
func TestHostControl(t *testing.T) {
	noLeaks(t)
	cancelled := make(chan struct{}, 1)
	mux := http.NewServeMux()
	static, err := NewStatic(json.RawMessage(`{"body": "hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/", static)
	mux.HandleFunc("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/abort", func(w http.ResponseWriter, _ *http.Request) {
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/wait", func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		cancelled <- struct{}{}
	})
	logs := &syncBuffer{}
	// One handler value for every actor: reconfigure reaches it through
	// each actor's Reconfigure.
	h, addr := startHost(t, HostConfig{Factory: func(json.RawMessage) (Handler, error) {
		return reconfigurableMux{mux, static.(*Static)}, nil
	}, Replicas: 2, MaxOngoing: 4, Log: zerolog.New(logs)})
	c := connect(t, addr, HostOptions{ResponseHeaderTimeout: 200 * time.Millisecond})
	r := c.Replicas()[0]
	p := NewPool(c.Replicas()[0], c.Replicas()[1])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, res := range p.Broadcast(ctx, Call{Method: MethodReconfigure, Payload: []byte(`{"body": "bye"}`)}) {
		if res.Err != nil {
			t.Fatalf("reconfigure %s: %v", res.Actor, res.Err)
		}
	}
	if w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/", nil)); err != nil || w.body.String() != "bye" {
		t.Fatalf("after reconfigure: %q, %v", w.body.String(), err)
	}
	for _, res := range p.Broadcast(ctx, Call{Method: MethodReconfigure, Payload: []byte(`{"bogus": 1}`)}) {
		if res.Err == nil || !strings.Contains(res.Err.Error(), "bogus") {
			t.Fatalf("a bad user_config: %v", res.Err)
		}
	}

	t.Run("set_gc", func(t *testing.T) {
		percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
		debug.SetGCPercent(percent)
		t.Cleanup(func() {
			debug.SetGCPercent(percent)
			debug.SetMemoryLimit(limit)
		})
		st, _ := json.Marshal(gctune.State{Percent: 250, MemoryLimitBytes: 1 << 30})
		for _, res := range p.Broadcast(ctx, Call{Method: MethodSetGC, Payload: st}) {
			if res.Err != nil {
				t.Fatalf("set_gc: %v", res.Err)
			}
		}
		if got := debug.SetGCPercent(250); got != 250 || debug.SetMemoryLimit(-1) != 1<<30 {
			t.Fatalf("GOGC %d after set_gc, want 250 and a 1GiB limit", got)
		}
		// A ratio is resolved against the host's own memory, not the
		// proxy's bytes (here far more than this machine has).
		st, _ = json.Marshal(gctune.State{Percent: 250, MemoryLimitBytes: 1 << 50, MemoryLimitRatio: 0.5})
		for _, res := range p.Broadcast(ctx, Call{Method: MethodSetGC, Payload: st}) {
			if res.Err != nil {
				t.Fatalf("set_gc with a ratio: %v", res.Err)
			}
		}
		if got := debug.SetMemoryLimit(-1); got <= 0 || got >= 1<<50 {
			t.Fatalf("memory limit %d after set_gc with ratio 0.5, want half of this machine's memory", got)
		}
		if s := h.gc.State(); s.MemoryLimitRatio != 0.5 || !strings.Contains(s.Note, "0.5 of") {
			t.Fatalf("the host's GC state after a ratio: %+v", s)
		}
		st, _ = json.Marshal(gctune.State{Percent: 250, MemoryLimitRatio: 1.5})
		for _, res := range p.Broadcast(ctx, Call{Method: MethodSetGC, Payload: st}) {
			if res.Err == nil || !strings.Contains(res.Err.Error(), "memory_limit_ratio") {
				t.Fatalf("set_gc with ratio 1.5: %v, want an error naming memory_limit_ratio", res.Err)
			}
		}
		st, _ = json.Marshal(gctune.State{Percent: -1})
		for _, res := range p.Broadcast(ctx, Call{Method: MethodSetGC, Payload: st}) {
			if res.Err == nil || !strings.Contains(res.Err.Error(), "without bound") {
				t.Fatalf("set_gc off with no limit: %v, want refused", res.Err)
			}
		}
	})

	t.Run("panic", func(t *testing.T) {
		w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/panic", nil))
		var re *ReplicaError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "boom") || w.touched {
			t.Fatalf("%v (%T), want a *ReplicaError about boom, nothing written", err, err)
		}
		if strings.Count(err.Error(), "panic") != 1 {
			t.Errorf("%q: want \"panic\" said once", err)
		}
		if !strings.Contains(logs.String(), "handler panicked") {
			t.Fatalf("the host did not log the panic: %s", logs.String())
		}
	})

	t.Run("abort", func(t *testing.T) {
		w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/abort", nil))
		// What the handler had not flushed is dropped, as net/http drops
		// it: the client's connection is cut either way.
		if !errors.Is(err, http.ErrAbortHandler) || !w.touched {
			t.Fatalf("%v, written %v; want ErrAbortHandler after the response began", err, w.touched)
		}
	})

	t.Run("client gone", func(t *testing.T) {
		rctx, rcancel := context.WithCancel(ctx)
		go func() {
			time.Sleep(20 * time.Millisecond)
			rcancel()
		}()
		c2 := connect(t, addr, HostOptions{}) // no header timeout
		_, err := serveOn(t, c2.Replicas()[0], httptest.NewRequest(http.MethodGet, "/wait", nil).WithContext(rctx))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled", err)
		}
		select {
		case <-cancelled:
		case <-time.After(10 * time.Second):
			t.Fatal("the host's handler was not cancelled")
		}
	})

	t.Run("header timeout", func(t *testing.T) {
		_, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/wait", nil))
		var te *TimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("%v, want a *TimeoutError", err)
		}
		<-cancelled // the host was told
	})

	t.Run("drain", func(t *testing.T) {
		for _, res := range p.Broadcast(ctx, Call{Method: MethodDrain}) {
			if res.Err != nil {
				t.Fatal(res.Err)
			}
		}
		for _, rr := range c.Replicas() {
			if rr.State() != StateStopped {
				t.Fatalf("%s: %v after drain", rr.ID(), rr.State())
			}
		}
		if s := h.Actors()[0].State(); s != StateRunning {
			t.Fatalf("the host's actor is %v: a proxy's drain must leave it to other proxies", s)
		}
	})
}

// reconfigurableMux is a mux whose user_config goes to a Static.
type reconfigurableMux struct {
	*http.ServeMux
	s *Static
}

func (m reconfigurableMux) Reconfigure(ctx context.Context, cfg json.RawMessage) error {
	return m.s.Reconfigure(ctx, cfg)
}

// TestHostShutdown: Shutdown refuses new requests as full (retryable), lets
// those in flight finish, then closes the connections.
func TestHostShutdown(t *testing.T) {
	noLeaks(t)
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			started <- struct{}{}
			<-gate
		}
		_, _ = io.WriteString(w, "done")
	}), Replicas: 1, MaxOngoing: 4})
	c := connect(t, addr, HostOptions{})
	r := c.Replicas()[0]
	held := make(chan *writeRecorder, 1)
	go func() {
		w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/hold", nil))
		if err != nil {
			t.Error(err)
		}
		held <- w
	}()
	<-started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- h.Shutdown(ctx)
	}()
	eventually(t, "draining", func() bool { return h.Actors()[0].State() == StateDraining })
	// The host's goaway takes its actors out of this proxy's routing at
	// once, while the request in flight still runs.
	eventually(t, "out of routing", func() bool { return !c.Connected() })
	if release, ok := r.TryAcquire(); ok {
		release()
		close(gate)
		t.Fatal("a replica of a host shutting down takes requests")
	}
	close(gate)
	if w := <-held; w.body.String() != "done" {
		t.Fatalf("the request in flight: %q", w.body.String())
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	eventually(t, "disconnected", func() bool { return !c.Connected() })
}

// The wait for a host's answer begins once the request's body is sent: a
// streamed upload that takes longer than ResponseHeaderTimeout is no
// timeout; an actor slow to answer is.
func TestHostTimeoutAfterUpload(t *testing.T) {
	noLeaks(t)
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		_, _ = w.Write([]byte(strconv.Itoa(len(b))))
	}), Replicas: 1, MaxOngoing: 4})
	c := connect(t, addr, HostOptions{ResponseHeaderTimeout: 200 * time.Millisecond})
	r := c.Replicas()[0]
	req := httptest.NewRequest(http.MethodPost, "/", &slowBody{n: 10, gap: 50 * time.Millisecond})
	req.ContentLength = -1
	if w, err := serveOn(t, r, req); err != nil || w.body.String() != "10" {
		t.Errorf("an upload of 500 ms with a timeout of 200 ms: %q, %v; want it answered", w.body.String(), err)
	}
	if _, err := serveOn(t, r, httptest.NewRequest(http.MethodPost, "/slow", strings.NewReader("x"))); !errors.As(err, new(*TimeoutError)) {
		t.Errorf("an actor answering after 1 s, with a timeout of 200 ms: %v, want a *TimeoutError", err)
	}
}

// An actor that takes no more of a streamed upload, and does not answer,
// is a timeout: the waits for credit count, as the wait for the answer
// does.
func TestHostStalledUploadTimesOut(t *testing.T) {
	noLeaks(t)
	release := make(chan struct{})
	_, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		select { // reads none of the body
		case <-release:
		case <-r.Context().Done():
		}
	}), Replicas: 1, MaxOngoing: 4})
	t.Cleanup(func() { close(release) })
	c := connect(t, addr, HostOptions{ResponseHeaderTimeout: 200 * time.Millisecond})
	req := httptest.NewRequest(http.MethodPost, "/", io.LimitReader(zeros{}, 64<<20))
	req.ContentLength = -1
	start := time.Now()
	if _, err := serveOn(t, c.Replicas()[0], req); !errors.As(err, new(*TimeoutError)) {
		t.Errorf("an upload the actor takes none of: %v, want a *TimeoutError", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
