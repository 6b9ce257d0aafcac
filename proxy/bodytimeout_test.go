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

	"github.com/serveproxy/serveproxy/replica"
)

// startBodyReader is an upstream replica that reads the whole body and
// answers its length.
func startBodyReader(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		_, _ = io.WriteString(w, "got "+strconv.Itoa(len(b)))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// A client that stalls its upload is answered 408 once no part of the body
// has come for the timeout, its connection closed, and its replica's slot
// freed: before, it held the slot for as long as it liked.
func TestClientBodyTimeout408(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 300 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", targets: []string{startBodyReader(t)}})
	c := dialProxy(t, tp)
	defer c.Close()
	start := time.Now()
	_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusRequestTimeout || !res.Close {
		t.Fatalf("stalled upload: %v, %v; want 408 closing the connection", res, err)
	}
	b, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(b), "PROXY_CLIENT_BODY_TIMEOUT") {
		t.Fatalf("408 body %q does not say which timeout", b)
	}
	t.Logf("408 after %v", time.Since(start).Round(time.Millisecond))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the 408: %v, want the connection closed", err)
	}
	for _, r := range tp.Deployments()[0].Replicas() {
		waitFor(t, "the replica's slot free", func() bool { return r.Ongoing() == 0 })
	}
	waitFor(t, "408 logged", func() bool { return strings.Contains(tp.access.String(), `"status":408`) })
}

// A body that comes slowly, but each part within the timeout, is taken
// whole; and the connection serves the next request after it (the
// deadline does not outlive the body).
func TestClientBodyTimeoutIsBetweenParts(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 400 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", targets: []string{startBodyReader(t)}})
	c := dialProxy(t, tp)
	defer c.Close()
	_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
	for range 5 { // 5 × 150 ms: longer than the timeout in all
		time.Sleep(150 * time.Millisecond)
		_, _ = io.WriteString(c, "x")
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("slow upload within the timeout: %v, %v; want 200", res, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	time.Sleep(600 * time.Millisecond) // idle past the body timeout: the keep-alive's, not the body's
	_, _ = io.WriteString(c, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("next request on the connection: %v, %v; want 200", res, err)
	}
}

// A handler in process that answers without reading the body: its
// client, stalling the upload, gets the answer within the body timeout
// and then the connection closed, with 100-continue or without (before,
// net/http's read of the rest, with no deadline, held both for ever); a
// client that sent its whole body keeps the connection.
func TestUnreadBodyAnsweredAndBounded(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 300 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", factory: replica.NewStatic, userConfig: `{"body":"hi"}`})
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		c := dialProxy(t, tp)
		start := time.Now()
		_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\n"+expect+"Content-Length: 10\r\n\r\nabc")
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("stalled upload to a handler that does not read it (%q): %v, %v; want its 200", expect, res, err)
		}
		b, _ := io.ReadAll(res.Body)
		if string(b) != "hi" {
			t.Fatalf("body %q, want hi", b)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after the answer (%q): %v, want the connection closed", expect, err)
		}
		t.Logf("%q: answered and closed after %v", expect, time.Since(start).Round(time.Millisecond))
		c.Close()
	}

	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	for i := range 2 {
		_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusOK || res.Close {
			t.Fatalf("whole body unread by the handler, request %d: %v, %v; want 200 keeping the connection", i, res, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
}

// A 408 at the request's deadline, its handler still running and its body
// unread, closes the connection at once after it.
func TestRequestTimeoutClosesAStalledUpload(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: time.Minute, RequestTimeout: 300 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", factory: replica.NewSleep, userConfig: `{"ms":5000}`})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled upload past the request timeout: %v, %v; want 408", res, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the 408: %v, want the connection closed", err)
	}
	t.Logf("closed %v after the 408", time.Since(start).Round(time.Millisecond))
}
