package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// unreadBodyProxy serves handlers that never read the request body: an
// upstream server, the built-in static, a large answer (its header goes out while the handler
// runs), one that closes the body, and one that answers, then takes its
// time.
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
	for _, path := range []string{"/up", "/static", "/big", "/closer", "/nope"} {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
		res, _, took := readAnswer(t, c, br, path)
		if !res.Close {
			t.Errorf("%s: answered %d keeping the connection, with 90 bytes of its body still to come", path, res.StatusCode)
		}
		t.Logf("%s: %d after %v", path, res.StatusCode, took.Round(time.Millisecond))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s: after the answer: %v, want the connection closed", path, err)
		}
		c.Close()
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
		"Connection: close": "POST /static HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n0123456789",
		"HTTP/1.0":          "POST /static HTTP/1.0\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"Expect":            "POST /static HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n",
		"Expect, big":       "POST /big HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n",
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
