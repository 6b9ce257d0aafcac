package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A request with both Content-Length and Transfer-Encoding is framed by
// its chunks, and its connection closes after its answer (RFC 9112, 6.1):
// to a front end that framed it by its length, the rest is another request.
// net/http drops the length unseen and kept the connection, so a tester's
// one request got two answers, the second to a request smuggled in its body.
func TestChunkedRequestClosesItsConnection(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	c := dialProxy(t, tp)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 43\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"0\r\n\r\nGET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n")
	all, err := io.ReadAll(c) // to the connection's close
	if err != nil {
		t.Fatalf("reading to the close: %v (read %q)", err, all)
	}
	if n := strings.Count(string(all), "HTTP/1.1 "); n != 1 || !strings.Contains(string(all), "Connection: close") {
		t.Fatalf("%d answers to one request with Content-Length and Transfer-Encoding, want one with Connection: close:\n%s", n, all)
	}
}

// An HTTP/1.0 request's Transfer-Encoding is dropped unseen by net/http,
// which frames the body by its Content-Length: its connection closes after
// its answer, keep-alive or not, so the rest, the smuggled request of a
// tester, is never read as one.
func TestHTTP10RequestWithBodyClosesItsConnection(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	c := dialProxy(t, tp)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST /te10 HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"3d\r\nGET /SMUGGLED HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n\r\n0\r\n\r\n")
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading to the close: %v (read %q)", err, all)
	}
	if n := strings.Count(string(all), "HTTP/1.0 ") + strings.Count(string(all), "HTTP/1.1 "); n != 1 {
		t.Fatalf("%d answers to one HTTP/1.0 request with a body, want one, then the close:\n%s", n, all)
	}
}

// The same holds for a handler that writes nothing, answered with
// net/http's implicit empty 200 (a review: it kept the connection, and the
// smuggled request was served).
func TestChunkedRequestImplicit200ClosesItsConnection(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		tp := startProxy(t, Options{RequestTimeout: timeout}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
		})})
		for _, req := range []string{
			"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 43\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST /a HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n3d\r\nGET /SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			c := dialProxy(t, tp)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, req)
			all, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("timeout %v: reading to the close: %v (read %q)", timeout, err, all)
			}
			if n := strings.Count(string(all), " 200 OK"); n != 1 {
				t.Fatalf("timeout %v: %d answers, want one, then the close:\n%s", timeout, n, all)
			}
		}
	}
}
