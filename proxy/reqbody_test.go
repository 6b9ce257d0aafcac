package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// unreadBodyProxy serves handlers that never read the request body: an
// upstream server, the built-in static, a large answer (its header goes
// out while the handler runs; with an explicit WriteHeader too), one that
// closes the connection, one that closes the body, and one that answers,
// then takes its time.
func unreadBodyProxy(t *testing.T, bodyTimeout time.Duration) *testProxy {
	t.Helper()
	big := strings.Repeat("b", 5000)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	early := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "early")
	})}
	go func() { _ = early.Serve(l) }()
	t.Cleanup(func() { _ = early.Close() })
	return startProxy(t, Options{ClientBodyTimeout: bodyTimeout},
		testDeployment{app: "up", prefix: "/up", targets: []string{"http://" + l.Addr().String()}},
		testDeployment{app: "static", prefix: "/static", factory: static("hi")},
		testDeployment{app: "big", prefix: "/big", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, big)
		})},
		testDeployment{app: "bigheader", prefix: "/bigheader", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, big)
		})},
		testDeployment{app: "bye", prefix: "/bye", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, "bye")
		})},
		testDeployment{app: "closer", prefix: "/closer", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer r.Body.Close()
			_, _ = io.WriteString(w, "ok")
		})},
		testDeployment{app: "slow", prefix: "/slow", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, big)
			w.(http.Flusher).Flush()
			time.Sleep(3 * bodyTimeout / 2)
			_, _ = io.WriteString(w, "done")
		})},
	)
}

// readAnswer reads one response from br within a generous bound, with its
// body.
func readAnswer(t *testing.T, c net.Conn, br *bufio.Reader, what string) (*http.Response, string, time.Duration) {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s: reading the answer's body: %v", what, err)
	}
	return res, string(b), time.Since(start)
}

// A client that stalls its upload to a handler that never reads it gets
// its answer within the client body timeout, on a connection that then
// closes: net/http read what was left of the body before answering, with
// no deadline, for as long as the client liked (found by a tester).
func TestStalledUploadToAHandlerThatDoesNotReadIt(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tp := unreadBodyProxy(t, timeout)
	// 100 bytes announced (under the 256 KiB net/http reads), and a
	// million (over it: net/http reads none after the handler, but did
	// while it ran, for the large answers).
	for _, length := range []int{100, 1000000} {
		for _, path := range []string{"/up", "/static", "/big", "/bigheader", "/bye", "/closer", "/nope"} {
			c := dialProxy(t, tp)
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(length)+"\r\n\r\n0123456789")
			res, _, took := readAnswer(t, c, br, path)
			if !res.Close {
				t.Errorf("%s, %d bytes: answered %d keeping the connection, with the rest of its body still to come", path, length, res.StatusCode)
			}
			t.Logf("%s, %d bytes: %d after %v", path, length, res.StatusCode, took.Round(time.Millisecond))
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("%s, %d bytes: after the answer: %v, want the connection closed", path, length, err)
			}
			c.Close()
		}
	}
}

// A body sent whole, though the handler never reads it, keeps the
// connection, and the deadline that bounded it does not outlive it: a
// later request on the connection that takes longer than the timeout is
// not cut (net/http's read for the client's leaving would cancel it).
func TestUnreadWholeBodyKeepsTheConnection(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tp := unreadBodyProxy(t, timeout)
	c := dialProxy(t, tp)
	defer c.Close()
	br := bufio.NewReader(c)
	for _, path := range []string{"/up", "/static", "/big", "/closer", "/slow", "/nope", "/slow", "/up"} {
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
		res, body, _ := readAnswer(t, c, br, path)
		if res.Close {
			t.Fatalf("%s: answered %d closing the connection; the whole body had come", path, res.StatusCode)
		}
		if path == "/slow" && !strings.HasSuffix(body, "done") {
			t.Fatalf("%s: the answer was cut after %d bytes", path, len(body))
		}
	}
	waitFor(t, "no request recorded as its client's leaving", func() bool { return strings.Count(tp.access.String(), "\n") == 8 })
	if s := tp.access.String(); strings.Contains(s, `"status":499`) {
		t.Fatalf("a request on a kept connection was taken for its client's leaving:\n%s", s)
	}
}

// Where the connection closes after the answer anyway (the client asked,
// HTTP/1.0) and where the client waits to be asked for its body (Expect:
// 100-continue), the answer does not wait for the body: with a body
// timeout of a minute, it comes at once, and no 100 Continue before it.
func TestUnreadBodyAnsweredAtOnceWhenTheConnectionCloses(t *testing.T) {
	tp := unreadBodyProxy(t, time.Minute)
	for name, head := range map[string]string{
		"Connection: close":               "POST /static HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n0123456789",
		"HTTP/1.0":                        "POST /static HTTP/1.0\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"Expect":                          "POST /static HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n",
		"Expect, big":                     "POST /big HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n",
		"the handler's Connection: close": "POST /bye HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"HTTP/1.0 keep-alive, streamed":   "POST /big HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 100\r\n\r\n0123456789",
	} {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, head)
		res, _, took := readAnswer(t, c, br, name)
		c.Close()
		if res.StatusCode != http.StatusOK || !res.Close {
			t.Errorf("%s: %d, closing %v; want 200 closing the connection", name, res.StatusCode, res.Close)
		}
		if took > 10*time.Second {
			t.Errorf("%s: the answer took %v: it waited for the body", name, took)
		}
	}
}

// A handler that closes its body after a read of it timed out is answered
// at once: the deadline stays past, and net/http's read of the rest fails
// (found by review: it waited a second timeout).
func TestBodyClosedAfterATimedOutRead(t *testing.T) {
	const timeout = 500 * time.Millisecond
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer r.Body.Close()
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, "bad body", http.StatusBadRequest)
				return
			}
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	defer c.Close()
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	res, _, took := readAnswer(t, c, br, "/rd")
	t.Logf("%d after %v", res.StatusCode, took.Round(time.Millisecond))
	if took > 3*timeout/2+time.Second {
		t.Errorf("answered after %v, with a body timeout of %v: Close waited again", took.Round(time.Millisecond), timeout)
	}
}

// A read of a body already closed (or at its end) leaves no deadline on
// the connection: it would fire in net/http's read for the client's
// leaving, and cancel the next request on the kept connection (found by
// review).
func TestReadAfterCloseLeavesNoDeadline(t *testing.T) {
	const timeout = 200 * time.Millisecond
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "rr", prefix: "/rr", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "ok")
			r.Body.Close()
			_, _ = r.Body.Read(make([]byte, 1))
			time.Sleep(3 * timeout)
		})},
		ctxProbe)
	c := dialProxy(t, tp)
	defer c.Close()
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rr HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	if res, _, _ := readAnswer(t, c, br, "/rr"); res.Close {
		t.Fatal("the whole body had come, yet the connection closes")
	}
	_, _ = io.WriteString(c, "GET /ctx HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body, _ := readAnswer(t, c, br, "/ctx"); body != "live" {
		t.Fatalf("the next request on the kept connection: %q, want \"live\"", body)
	}
}

// An HTTP/1.0 keep-alive request whose whole body the handler left gets
// its whole answer, a slow one too, and its connection closes after it
// (see TestHTTP10RequestWithBodyClosesItsConnection).
func TestHTTP10KeepAliveUnreadBody(t *testing.T) {
	tp := unreadBodyProxy(t, 200*time.Millisecond)
	for i, path := range []string{"/static", "/slow"} {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 10\r\n\r\n0123456789")
		res, body, _ := readAnswer(t, c, br, path)
		c.Close()
		if path == "/slow" && !strings.HasSuffix(body, "done") {
			t.Fatalf("%s: the answer was cut after %d bytes", path, len(body))
		}
		if !res.Close {
			t.Fatalf("request %d, %s: the connection kept after an HTTP/1.0 request with a body", i+1, path)
		}
	}
}

// A stalled upload to an upstream that answered before reading it is a
// 408, every time: the failing read cancels the request's context inside
// net/http before it returns, and the replica's "context canceled" read
// as the client's leaving (499, no answer) now and then (found by a
// repeated run).
func TestStalledUploadToAnUpstreamIsAlways408(t *testing.T) {
	tp := unreadBodyProxy(t, 200*time.Millisecond)
	for i := range 10 {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
		res, _, _ := readAnswer(t, c, br, "/up")
		c.Close()
		if res.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("try %d: %d, want 408", i+1, res.StatusCode)
		}
	}
}

// ctxProbe is a deployment at /ctx that answers "live", or "cancelled: "
// and why if its request's context has ended already: for the next
// request on a kept connection, which a deadline left behind would cancel.
var ctxProbe = testDeployment{app: "ctx", prefix: "/ctx", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if err := r.Context().Err(); err != nil {
		_, _ = io.WriteString(w, "cancelled: "+err.Error())
		return
	}
	_, _ = io.WriteString(w, "live")
})}

// The wait for a body the handler left unread is part of the request: its
// answer goes out only after it, so its latency counts it, and a client
// that leaves during it got nothing: a 499, not the 200 its handler made
// (found by a tester: a 1 s wait logged as 0.03 ms, a client gone as 200).
func TestUnreadBodyWaitIsRecorded(t *testing.T) {
	tp := unreadBodyProxy(t, 5*time.Second)
	for _, path := range []string{"/static", "/nope"} {
		// Sent whole, slowly: answered once the rest came.
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow"+path+"\r\nContent-Length: 20\r\n\r\n0123456789")
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(c, "0123456789")
		readAnswer(t, c, bufio.NewReader(c), path)
		c.Close()

		// Gone before the rest came.
		c = dialProxy(t, tp)
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone"+path+"\r\nContent-Length: 100\r\n\r\n0123456789")
		time.Sleep(100 * time.Millisecond)
		c.Close()
	}
	// A malformed body is no client gone: its client waits, and gets the
	// answer.
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "POST /static HTTP/1.1\r\nHost: x\r\nX-Request-Id: malformed\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
	if res, _, _ := readAnswer(t, c, bufio.NewReader(c), "/static"); res.StatusCode != http.StatusOK {
		t.Errorf("a malformed chunked body: %d, want the handler's 200", res.StatusCode)
	}
	c.Close()

	var lines map[string]map[string]any
	waitFor(t, "five access-log lines", func() bool { lines = accessLines(tp); return len(lines) == 5 })
	// The replica's own latency is its work: done before the body came
	// (found by review).
	_, metrics := get(t, tp.adminURL+"/metrics")
	var within, count string
	for l := range strings.Lines(metrics) {
		if strings.HasPrefix(l, `serve_deployment_processing_latency_ms_bucket{application="static"`) && strings.Contains(l, `le="200"`) {
			within = strings.Fields(l)[1]
		}
		if strings.HasPrefix(l, `serve_deployment_processing_latency_ms_count{application="static"`) {
			count = strings.Fields(l)[1]
		}
	}
	if count == "" || within != count {
		t.Errorf("the static replica's latencies: %s of %s within 200 ms, want all: its wait for the body counted", within, count)
	}
	for _, path := range []string{"/static", "/nope"} {
		if l := lines["slow"+path]; l["latency_ms"].(float64) < 250 {
			t.Errorf("%s, its body whole after 300 ms: latency_ms %v, want the wait in it: %v", path, l["latency_ms"], l)
		}
		l := lines["gone"+path]
		if msg, _ := l["error"].(string); l["status"] != float64(StatusClientClosedRequest) || l["bytes"] != float64(0) || !strings.Contains(msg, "client left") {
			t.Errorf("%s, its client gone before its body came whole: %v, want a 499 with no bytes, saying why", path, l)
		}
	}
}

// A client that leaves (or half-closes) before the end of the body it
// declared is a 499 with no bytes on a route whose handler reads the body
// too, as on one whose handler does not (above): a tester saw the echo
// handler's 400 for the short read recorded instead.
func TestClientGoneMidBodyReadIs499(t *testing.T) {
	readAll := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "reading request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	tp := startProxy(t, Options{ClientBodyTimeout: time.Minute}, testDeployment{app: "echo", prefix: "/", factory: readAll}) // the binary's default
	for _, how := range []string{"closed", "half-closed"} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nX-Request-Id: "+how+"\r\nContent-Length: 1000\r\n\r\n0123456789")
		time.Sleep(100 * time.Millisecond)
		if how == "closed" {
			c.Close()
		} else {
			_ = c.(*net.TCPConn).CloseWrite()
			if b, _ := io.ReadAll(c); len(b) != 0 {
				t.Errorf("half-closed: got %q, want nothing", b)
			}
			c.Close()
		}
	}
	var lines map[string]map[string]any
	waitFor(t, "two access-log lines", func() bool { lines = accessLines(tp); return len(lines) == 2 })
	for how, l := range lines {
		if msg, _ := l["error"].(string); l["status"] != float64(StatusClientClosedRequest) || l["bytes"] != float64(0) || !strings.Contains(msg, "client left before the end of its request body") {
			t.Errorf("%s mid-body: %v, want a 499 with no bytes, saying why", how, l)
		}
	}
}

// PROXY_REQUEST_TIMEOUT bounds the read of a body the handler left unread
// too, end to end: at it the answer goes out, closing the connection (a
// tester: a static handler's answer waited 2.5 s for the body with a
// timeout of 1 s).
func TestRequestTimeoutBoundsTheUnreadBody(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: time.Minute, RequestTimeout: 300 * time.Millisecond},
		testDeployment{app: "static", prefix: "/", factory: static("hi")})
	c := dialProxy(t, tp)
	defer c.Close()
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	res, _, took := readAnswer(t, c, bufio.NewReader(c), "/")
	if res.StatusCode != http.StatusOK || !res.Close || took > 5*time.Second {
		t.Errorf("%d after %v, close %v; want the handler's 200 at the request timeout, closing the connection", res.StatusCode, took, res.Close)
	}
}
