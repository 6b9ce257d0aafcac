package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
)

// wsBackend is an HTTP server on loopback, a replica in another process as
// the proxy sees it: a WebSocket echo at /ws (refused with 403 at
// /ws-refused), and "ok" elsewhere (its health checks).
type wsBackend struct {
	url string
	mu  sync.Mutex
	hdr http.Header // the last handshake's request header
}

func startWSBackend(t *testing.T) *wsBackend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &wsBackend{url: "http://" + l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ws":
			b.mu.Lock()
			b.hdr = r.Header.Clone()
			b.mu.Unlock()
			w.Header().Set("X-Replica", "echo")
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			c.SetReadLimit(1 << 20)
			for {
				typ, msg, err := c.Read(context.Background())
				if err != nil {
					return
				}
				if err := c.Write(context.Background(), typ, msg); err != nil {
					return
				}
			}
		case "/seen":
			// What reached the replica of an upgrade it was not given.
			_, _ = fmt.Fprintf(w, "%s upgrade=%q connection=%q", r.Method, r.Header.Get("Upgrade"), r.Header.Get("Connection"))
		case "/ws-refused":
			http.Error(w, "no WebSockets for you", http.StatusForbidden)
		case "/ws-reset":
			// Switches, reads a byte, then resets the connection: a
			// replica whose machine went away mid-session.
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			_, _ = brw.ReadByte()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		case "/ws-426":
			w.Header().Set("Upgrade", "websocket")
			w.Header().Set("Connection", "Upgrade")
			http.Error(w, "upgrade, please", http.StatusUpgradeRequired)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return b
}

func (b *wsBackend) header() http.Header {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hdr
}

// dialWS opens a WebSocket to the proxy at path, closed at the end of the
// test.
func dialWS(t *testing.T, tp *testProxy, path string, header http.Header) (*websocket.Conn, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(tp.url, "http")+path, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatalf("WebSocket handshake through the proxy: %v", err)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c, res
}

// echo sends msg on c and checks that it comes back.
func echo(t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write %d bytes: %v", len(msg), err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read the echo of %d bytes: %v", len(msg), err)
	}
	if string(got) != msg {
		t.Fatalf("echo: got %d bytes, want %d", len(got), len(msg))
	}
}

// A WebSocket reaches a replica in another process: the handshake is
// relayed (Connection and Upgrade passed on, X-Forwarded-For set, the
// request id echoed), messages go both ways, and the request is logged as
// 101 once the session ends. Before, the proxy dropped Upgrade as a
// hop-by-hop header and the handshake failed.
func TestWebSocketToUpstream(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}, maxOngoing: 1})
	c, res := dialWS(t, tp, "/ws", http.Header{"X-Request-Id": {"ws-1"}})
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake status %d", res.StatusCode)
	}
	if got := res.Header.Get("X-Request-Id"); got != "ws-1" {
		t.Errorf("X-Request-Id %q, want ws-1", got)
	}
	if got := res.Header.Get("X-Replica"); got != "echo" {
		t.Errorf("the replica's own header: %q, want echo", got)
	}
	for _, msg := range []string{"one", "two", strings.Repeat("x", 100<<10)} {
		echo(t, c, msg)
	}
	h := b.header()
	if h.Get("X-Forwarded-For") != "127.0.0.1" || h.Get("X-Request-Id") != "ws-1" {
		t.Errorf("replica saw X-Forwarded-For %q, X-Request-Id %q", h.Get("X-Forwarded-For"), h.Get("X-Request-Id"))
	}
	// The session holds the replica's one slot: a plain request waits
	// for it, and is served once the session ends.
	type answer struct {
		status int
		body   string
	}
	waited := make(chan answer, 1)
	go func() {
		res, err := http.Get(tp.url + "/")
		if err != nil {
			waited <- answer{body: err.Error()}
			return
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		waited <- answer{res.StatusCode, string(body)}
	}()
	waitFor(t, "the plain request to queue", func() bool {
		return tp.Deployments()[0].Scheduler.Queued() == 1
	})
	if err := c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case a := <-waited:
		if a.status != 200 || a.body != "ok" {
			t.Errorf("the request that waited for the session: %d %q", a.status, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slot stayed taken after the session ended")
	}
	waitFor(t, "the session's access-log line", func() bool {
		return strings.Contains(tp.access.String(), `"request_id":"ws-1"`)
	})
	if line := tp.access.String(); !strings.Contains(line, `"status":101`) {
		t.Errorf("access log: %s", line)
	}
}

// Only a WebSocket handshake (a GET) is relayed: another protocol (h2c, a
// raw tunnel) or an upgrade on another method reaches the replica as a
// plain request, its Upgrade dropped as hop-by-hop.
func TestOnlyWebSocketUpgradesAreRelayed(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}})
	for _, tc := range []struct{ method, upgrade, want string }{
		{"GET", "h2c", `GET upgrade="" connection=""`},
		{"GET", "tcp", `GET upgrade="" connection=""`},
		{"POST", "websocket", `POST upgrade="" connection=""`},
	} {
		req, err := http.NewRequest(tc.method, tp.url+"/seen", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", tc.upgrade)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s with Upgrade: %s: %v", tc.method, tc.upgrade, err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(body) != tc.want {
			t.Errorf("%s with Upgrade: %s: %d %q, want 200 %q", tc.method, tc.upgrade, res.StatusCode, body, tc.want)
		}
	}
}

// A replica that refuses the upgrade answers as it likes, and the client
// gets that answer.
func TestWebSocketRefusedByReplica(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(tp.url, "http")+"/ws-refused", nil)
	if err == nil {
		_ = c.CloseNow()
		t.Fatal("handshake succeeded; the replica refused it")
	}
	if res == nil || res.StatusCode != http.StatusForbidden {
		t.Fatalf("want the replica's 403, got %v (%v)", res, err)
	}
	// A 426 keeps the Upgrade header it must have, hop-by-hop as it is,
	// with the "Connection: upgrade" that goes with it (RFC 9110 7.8; it
	// was dropped, found by a tester).
	res, body := get(t, tp.url+"/ws-426")
	if res.StatusCode != http.StatusUpgradeRequired || res.Header.Get("Upgrade") != "websocket" || res.Header.Get("Connection") != "Upgrade" {
		t.Errorf("426: %d, Upgrade %q, Connection %q (%q)", res.StatusCode, res.Header.Get("Upgrade"), res.Header.Get("Connection"), body)
	}
}

// A session whose replica's connection breaks (a reset, not a close) is
// logged with why, still as 101; one that ends by a close has no error.
func TestWebSocketReplicaResetIsLogged(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /ws-reset HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Request-Id: reset-1\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", res, err)
	}
	_, _ = c.Write([]byte("x"))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("read a byte from a session whose replica reset it")
	}
	waitFor(t, "the session's log line", func() bool { return strings.Contains(tp.access.String(), `"request_id":"reset-1"`) })
	for _, line := range strings.Split(tp.access.String(), "\n") {
		if strings.Contains(line, `"request_id":"reset-1"`) &&
			(!strings.Contains(line, `"status":101`) || !strings.Contains(line, "the replica's connection broke")) {
			t.Errorf("log line: %s", line)
		}
	}

	rid := tp.Deployments()[0].Replicas()[0].ID()
	counted := `serve_deployment_error_counter_total{application="ws",deployment="ws-dep",replica="` + rid + `",route="/"} 1`
	if _, m := get(t, tp.adminURL+"/metrics"); !strings.Contains(m, counted) {
		t.Errorf("metrics lack %s", counted)
	}

	// A close by the client is a session's end, not an error.
	ws, _ := dialWS(t, tp, "/ws", http.Header{"X-Request-Id": {"closed-1"}})
	echo(t, ws, "hi")
	_ = ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "the closed session's log line", func() bool { return strings.Contains(tp.access.String(), `"request_id":"closed-1"`) })
	for _, line := range strings.Split(tp.access.String(), "\n") {
		if strings.Contains(line, `"request_id":"closed-1"`) && strings.Contains(line, `"error"`) {
			t.Errorf("a closed session logged an error: %s", line)
		}
	}
	if _, m := get(t, tp.adminURL+"/metrics"); !strings.Contains(m, counted) {
		t.Errorf("after a closed session, metrics lack %s", counted)
	}
}

// A client may offer other protocols beside websocket: the replica is
// offered websocket alone, and its 101 relayed (found by an exploratory
// run: it had been a 502).
func TestWebSocketAmongOtherProtocols(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: h2c, websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Upgrade") != "websocket" || res.Header.Get("Sec-Websocket-Accept") == "" {
		t.Fatalf("%d %v", res.StatusCode, res.Header)
	}
	if got := b.header().Get("Upgrade"); got != "websocket" {
		t.Errorf("replica was offered %q, want websocket alone", got)
	}
}

// The request timeout bounds the handshake, not the session: a WebSocket
// lives past it.
func TestWebSocketOutlivesRequestTimeout(t *testing.T) {
	b := startWSBackend(t)
	tp := startProxy(t, Options{RequestTimeout: 100 * time.Millisecond}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}})
	c, _ := dialWS(t, tp, "/ws", nil)
	echo(t, c, "before")
	time.Sleep(300 * time.Millisecond) // three timeouts
	echo(t, c, "after")
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatalf("close: %v", err)
	}
	waitFor(t, "the session's access-log line", func() bool { return strings.Contains(tp.access.String(), `"status":101`) })
}

// At shutdown an open WebSocket keeps working through the graceful period
// and is closed when it ends; the proxy then stops. net/http's Shutdown
// neither waits for nor closes hijacked connections.
func TestWebSocketClosedAtGracefulShutdown(t *testing.T) {
	b := startWSBackend(t)
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)}, testDeployment{app: "ws", prefix: "/", targets: []string{b.url}, grace: 2 * time.Second})
	c, _ := dialWS(t, tp, "/ws", nil)
	echo(t, c, "before")

	stopped := make(chan error, 1)
	go func() { stopped <- tp.stop() }()
	waitFor(t, "draining", func() bool { return tp.draining.Load() })
	echo(t, c, "while draining")
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not stop with a WebSocket open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := c.Read(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read after shutdown: %v; want the connection closed", err)
	}
	if !strings.Contains(logs.String(), "upgraded connections") {
		t.Errorf("no log line for the WebSocket closed at shutdown:\n%s", logs.String())
	}
}

// An in-process handler may hijack its connection under a request timeout
// too, and is not cut at the deadline.
func TestInProcessHijackUnderRequestTimeout(t *testing.T) {
	tp := startProxy(t, Options{RequestTimeout: 100 * time.Millisecond}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer c.Close()
		time.Sleep(300 * time.Millisecond) // past the deadline
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nlater\n")
		_ = brw.Flush()
	})})
	res, body := get(t, tp.url+"/")
	if res.StatusCode != 200 || body != "later\n" {
		t.Fatalf("got %d %q, want the hijacker's 200", res.StatusCode, body)
	}
}

// An in-process handler that panics after taking its connection over is
// logged as such, its request as 101 (no 500 can be sent), and its replica
// serves on.
func TestPanicAfterHijack(t *testing.T) {
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/hijack" {
			_, _ = w.Write([]byte("ok"))
			return
		}
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		_ = c.Close()
		panic("after the hijack")
	})})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /hijack HTTP/1.1\r\nHost: x\r\nX-Request-Id: p-1\r\n\r\n")
	if n, _ := c.Read(make([]byte, 1)); n != 0 {
		t.Fatal("read an answer from a hijacked connection closed by its handler")
	}
	waitFor(t, "the log line", func() bool { return strings.Contains(tp.access.String(), `"request_id":"p-1"`) })
	if !strings.Contains(tp.access.String(), `"status":101`) || !strings.Contains(logs.String(), "handler panicked after taking its connection over") {
		t.Errorf("access log:\n%s\nlog:\n%s", tp.access.String(), logs.String())
	}
	if res, body := get(t, tp.url+"/"); res.StatusCode != 200 || body != "ok" {
		t.Errorf("after the panic: %d %q", res.StatusCode, body)
	}
}

// A handler's hijacked connection half-closes as a TCP connection does:
// the client reads the end of the answer and may still write.
func TestHijackedConnCloseWrite(t *testing.T) {
	got := make(chan string, 1)
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbye")
		_ = brw.Flush()
		cw, ok := c.(interface{ CloseWrite() error })
		if !ok || cw.CloseWrite() != nil {
			got <- "no CloseWrite"
			return
		}
		line, _ := brw.ReadString('\n')
		got <- line
	})})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	all, err := io.ReadAll(c) // ends at the half-close
	if err != nil || !strings.HasSuffix(string(all), "bye") {
		t.Fatalf("read %q, %v", all, err)
	}
	_, _ = io.WriteString(c, "still here\n")
	select {
	case line := <-got:
		if line != "still here\n" {
			t.Fatalf("the handler read %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler read nothing after its half-close")
	}
}
