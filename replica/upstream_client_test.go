package replica

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newClient returns an UpstreamClient closed at cleanup.
func newClient(t *testing.T, o TransportOptions) *UpstreamClient {
	t.Helper()
	c := NewUpstreamClient(o)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// countingServer is a raw server that answers each request on a
// connection with the next of answers (the last one repeats; "" hangs up
// instead), after reading the request's head and body, and counts the
// connections it accepted. With closeAfter it closes each connection
// after its first answer.
func countingServer(t *testing.T, closeAfter bool, answers ...string) (url string, conns *atomic.Int64) {
	t.Helper()
	conns = new(atomic.Int64)
	url = rawServer(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			a := answers[min(i, len(answers)-1)]
			if a == "" { // hang up without answering
				_ = c.Close()
				return
			}
			if _, err := io.WriteString(c, a); err != nil || closeAfter {
				_ = c.Close()
				return
			}
		}
	})
	return url, conns
}

// clientGet sends a request through c and reads the whole answer.
func clientGet(t *testing.T, c *UpstreamClient, method, url string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequest(method, url+"/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

// TestUpstreamClientFraming checks each way a response body is delimited,
// and whether the connection is reused after it: two requests in a row,
// counting the connections the server saw.
func TestUpstreamClientFraming(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name, method, answer string
		wantBody             string
		wantCL               int64
		wantTrailer          http.Header
		wantConns            int64
		closeAfter           bool // the server closes after its answer
	}{
		{name: "content-length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
			wantBody: "hello", wantCL: 5, wantConns: 1},
		{name: "content-length twice, one value", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
			wantBody: "hello", wantCL: 5, wantConns: 1},
		{name: "empty content-length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
			wantCL: 0, wantConns: 1},
		{name: "chunked", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
			wantBody: "hello world", wantCL: -1, wantConns: 1},
		{name: "chunked with trailers", answer: "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-Sum: 42\r\nX-Late: yes\r\n\r\n",
			wantBody: "hi", wantCL: -1, wantTrailer: http.Header{"X-Sum": {"42"}, "X-Late": {"yes"}}, wantConns: 1},
		{name: "until close", answer: "HTTP/1.1 200 OK\r\n\r\nall of it",
			wantBody: "all of it", wantCL: -1, wantConns: 2, closeAfter: true},
		{name: "connection close", answer: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
			wantBody: "hi", wantCL: 2, wantConns: 2, closeAfter: true},
		{name: "HTTP/1.0 without keep-alive", answer: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
			wantBody: "hi", wantCL: 2, wantConns: 2, closeAfter: true},
		{name: "HTTP/1.0 keep-alive", answer: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
			wantBody: "hi", wantCL: 2, wantConns: 1},
		{name: "1xx skipped", answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
			wantBody: "hi", wantCL: 2, wantConns: 1},
		{name: "HEAD", method: http.MethodHead, answer: "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
			wantCL: 1000, wantConns: 1},
		{name: "204", answer: "HTTP/1.1 204 No Content\r\n\r\n", wantCL: 0, wantConns: 1},
		{name: "304 with a length", answer: "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", wantCL: 0, wantConns: 1},
		{name: "obs-fold", answer: "HTTP/1.1 200 OK\r\nX-Long: a\r\n  b\r\nContent-Length: 2\r\n\r\nhi",
			wantBody: "hi", wantCL: 2, wantConns: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, conns := countingServer(t, tc.closeAfter, tc.answer)
			c := newClient(t, TransportOptions{})
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			for i := range 2 {
				res, body, err := clientGet(t, c, method, url)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if body != tc.wantBody || res.ContentLength != tc.wantCL {
					t.Fatalf("request %d: body %q length %d, want %q %d", i, body, res.ContentLength, tc.wantBody, tc.wantCL)
				}
				if tc.wantTrailer != nil && !equalHeader(res.Trailer, tc.wantTrailer) {
					t.Errorf("trailer %v, want %v", res.Trailer, tc.wantTrailer)
				}
				if _, ok := res.Header["Transfer-Encoding"]; ok {
					t.Error("Transfer-Encoding left in the header")
				}
				if cl := res.Header["Content-Length"]; len(cl) > 1 {
					t.Errorf("Content-Length %q goes on as %d fields", cl, len(cl))
				}
				if tc.name == "obs-fold" && res.Header.Get("X-Long") != "a b" {
					t.Errorf("X-Long = %q", res.Header.Get("X-Long"))
				}
			}
			if n := conns.Load(); n != tc.wantConns {
				t.Errorf("%d connections, want %d", n, tc.wantConns)
			}
		})
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "|") != strings.Join(b[k], "|") {
			return false
		}
	}
	return true
}

// TestUpstreamClientMalformed checks that answers that are not HTTP/1.x,
// or whose framing is ambiguous, fail as the replica's error.
func TestUpstreamClientMalformed(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct{ name, answer string }{
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n"},
		{"HTTP/2 preface", "HTTP/2 200\r\n\r\n"},
		{"bad code", "HTTP/1.1 2x0 OK\r\n\r\n"},
		{"differing lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi"},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"},
		{"unsupported coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"},
		{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nhi"},
		{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := countingServer(t, false, tc.answer)
			u := newUpstream(t, url, UpstreamOptions{Transport: newClient(t, TransportOptions{})})
			w := newSpy()
			err := serveOnce(t, u, w, httptest.NewRequest(http.MethodGet, "http://front.test/", nil))
			if _, ok := errors.AsType[*InvalidResponseError](err); !ok {
				t.Fatalf("err = %#v, want *InvalidResponseError (502)", err)
			}
			w.untouched(t)
		})
	}
}

// TestUpstreamClientErrors checks the failures that Upstream.Serve
// classifies, over the client: what may be retried elsewhere and what not.
func TestUpstreamClientErrors(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name      string
		base      func(t *testing.T) string
		method    string
		body      string
		retryable bool
		check     func(t *testing.T, err error)
	}{
		{name: "closed port", base: closedPort, retryable: true, check: func(t *testing.T, err error) {
			var ue *UnreachableError
			if !errors.As(err, &ue) || ue.Sent {
				t.Fatalf("err = %#v, want an unsent *UnreachableError", err)
			}
		}},
		{name: "hangs", base: func(t *testing.T) string {
			return rawServer(t, func(c net.Conn) { _ = readRequestHead(c); _, _ = io.Copy(io.Discard, c) })
		}, check: func(t *testing.T, err error) {
			if _, ok := errors.AsType[*TimeoutError](err); !ok || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %#v, want a *TimeoutError", err)
			}
		}},
		{name: "closes before answering", base: func(t *testing.T) string {
			return rawServer(t, func(c net.Conn) { _ = readRequestHead(c); _ = c.Close() })
		}, check: func(t *testing.T, err error) {
			var ue *UnreachableError
			if !errors.As(err, &ue) || !ue.Sent {
				t.Fatalf("err = %#v, want a sent *UnreachableError", err)
			}
		}},
		{name: "closes mid-head", base: func(t *testing.T) string {
			return rawServer(t, func(c net.Conn) {
				_ = readRequestHead(c)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
				_ = c.Close()
			})
		}, check: func(t *testing.T, err error) {
			// It answered, and broke off: not valid HTTP, not unreachable
			// (it read "could not be reached", found by a tester).
			var ie *InvalidResponseError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), "closed in the middle of the response header") {
				t.Fatalf("err = %#v, want an *InvalidResponseError", err)
			}
		}},
		{name: "closes after a 1xx", base: func(t *testing.T) string {
			return rawServer(t, func(c net.Conn) {
				_ = readRequestHead(c)
				_, _ = io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
				_ = c.Close()
			})
		}, check: func(t *testing.T, err error) {
			// Not "in the middle of the status line": none of it came
			// (found by review).
			var ie *InvalidResponseError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), "closed after a 1xx answer") {
				t.Fatalf("err = %#v, want an *InvalidResponseError", err)
			}
		}},
		{name: "closes mid-status-line", base: func(t *testing.T) string {
			return rawServer(t, func(c net.Conn) {
				_ = readRequestHead(c)
				_, _ = io.WriteString(c, "HTTP/1.1 2")
				_ = c.Close()
			})
		}, check: func(t *testing.T, err error) {
			var ie *InvalidResponseError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), "closed in the middle of the status line") {
				t.Fatalf("err = %#v, want an *InvalidResponseError", err)
			}
		}},
		{name: "POST to a reused connection closed under it", method: http.MethodPost, base: func(t *testing.T) string {
			url, _ := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", "")
			return url
		}, check: func(t *testing.T, err error) {
			var ue *UnreachableError
			if !errors.As(err, &ue) || !ue.Sent {
				t.Fatalf("err = %#v, want a sent *UnreachableError (a POST is not sent twice)", err)
			}
		}},
		{name: "marked 503", body: "kept for the next replica", base: func(t *testing.T) string {
			return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(FullHeader, "1")
				w.WriteHeader(http.StatusServiceUnavailable)
			}).URL
		}, retryable: true, check: func(t *testing.T, err error) {
			if fe, ok := errors.AsType[*FullError](err); !ok || fe.BodyLost {
				t.Fatalf("err = %#v, want a *FullError with its body", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, TransportOptions{ResponseHeaderTimeout: 200 * time.Millisecond, DialTimeout: 2 * time.Second})
			u := newUpstream(t, tc.base(t), UpstreamOptions{Transport: c})
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			if tc.method != "" { // a first request, to leave a connection to reuse
				if err := serveOnce(t, u, newSpy(), httptest.NewRequest(method, "http://front.test/", nil)); err != nil {
					t.Fatal(err)
				}
			}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			w := newSpy()
			err := serveOnce(t, u, w, httptest.NewRequest(method, "http://front.test/", body))
			if err == nil {
				t.Fatal("no error")
			}
			tc.check(t, err)
			if Retryable(err) != tc.retryable {
				t.Errorf("Retryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
			w.untouched(t)
		})
	}
}

// TestUpstreamClientStaleRetry reuses a connection that the server closes
// on reading the next request, without answering: an idempotent request
// is sent again on a new connection, as net/http does.
func TestUpstreamClientStaleRetry(t *testing.T) {
	leakCheck(t)
	url, conns := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", "")
	c := newClient(t, TransportOptions{})
	for i := range 3 {
		if _, body, err := clientGet(t, c, http.MethodGet, url); err != nil || body != "hi" {
			t.Fatalf("request %d: %q, %v", i, body, err)
		}
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (each reuse found closed, and retried)", n)
	}
}

// TestUpstreamClientPeek leaves a connection idle until the server closes
// it: the next request, a POST that could not be retried, goes on a new
// connection.
func TestUpstreamClientPeek(t *testing.T) {
	leakCheck(t)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}))
	backend.Config.IdleTimeout = 30 * time.Millisecond
	backend.Start()
	t.Cleanup(backend.Close)
	c := newClient(t, TransportOptions{})
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, backend.URL, strings.NewReader("body"))
		res, err := c.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || string(b) != "body" {
			t.Fatalf("request %d: %q, %v", i, b, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestUpstreamClientConnLimit runs more requests at once than the client
// may have connections: they wait their turn, and the server never sees
// more connections than the limit.
func TestUpstreamClientConnLimit(t *testing.T) {
	leakCheck(t)
	const limit, workers, each = 2, 8, 10
	var inFlight, peak, conns atomic.Int64
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		inFlight.Add(-1)
		_, _ = io.WriteString(w, "hi")
	}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	backend.Start()
	t.Cleanup(backend.Close)
	c := newClient(t, TransportOptions{MaxConnsPerReplica: limit})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Go(func() {
			for range each {
				if _, body, err := clientGet(t, c, http.MethodGet, backend.URL); err != nil || body != "hi" {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 || peak.Load() > limit || conns.Load() > limit {
		t.Fatalf("%d failed, peak %d, %d connections; limit %d", failed.Load(), peak.Load(), conns.Load(), limit)
	}

	// A request waiting for a connection gives up with its context.
	block := make(chan struct{})
	slow := newBackend(t, func(w http.ResponseWriter, r *http.Request) { <-block })
	one := newClient(t, TransportOptions{MaxConnsPerReplica: 1})
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, slow.URL, nil)
		res, err := one.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	time.Sleep(20 * time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, slow.URL, nil)
	if _, err := one.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting for a connection: %v, want the context's deadline", err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestUpstreamClientIdleTimeout checks that idle connections are closed
// after IdleConnTimeout, with no request to notice.
func TestUpstreamClientIdleTimeout(t *testing.T) {
	leakCheck(t)
	closed := make(chan struct{}, 1)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed <- struct{}{}
		}
	}
	backend.Start()
	t.Cleanup(backend.Close)
	c := newClient(t, TransportOptions{IdleConnTimeout: 50 * time.Millisecond})
	if _, _, err := clientGet(t, c, http.MethodGet, backend.URL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle connection was not closed")
	}
}

// TestUpstreamClientEarlyAnswer sends a large body to a server that
// answers without reading it: the answer comes through.
func TestUpstreamClientEarlyAnswer(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	})
	c := newClient(t, TransportOptions{})
	req, _ := http.NewRequest(http.MethodPost, backend.URL, bytes.NewReader(make([]byte, 8<<20)))
	res, err := c.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large\n" {
		t.Fatalf("%d %q", res.StatusCode, b)
	}
}

// TestUpstreamClientRequest checks what reaches the server: the request
// line, Host, framing of bodies of known and unknown length, request
// trailers, and header values that would split the message refused.
func TestUpstreamClientRequest(t *testing.T) {
	leakCheck(t)
	type seen struct {
		method, uri, host, body, trailer string
		cl                               int64
		te                               []string
	}
	got := make(chan seen, 1)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, string(b), r.Trailer.Get("X-T"), r.ContentLength, r.TransferEncoding}
	})
	c := newClient(t, TransportOptions{})
	do := func(req *http.Request) seen {
		t.Helper()
		res, err := c.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return <-got
	}

	req, _ := http.NewRequest(http.MethodPut, backend.URL+"/a%2Fb/c?q=1&r=%20", strings.NewReader("twelve bytes"))
	req.Host = "front.test"
	if s := do(req); s.method != http.MethodPut || s.uri != "/a%2Fb/c?q=1&r=%20" || s.host != "front.test" || s.body != "twelve bytes" || s.cl != 12 {
		t.Errorf("known length: %+v", s)
	}

	req, _ = http.NewRequest(http.MethodPost, backend.URL, io.NopCloser(strings.NewReader("streamed")))
	req.ContentLength = -1
	req.Trailer = http.Header{"X-T": nil}
	req.Body = &trailerBody{r: strings.NewReader("streamed"), set: func() { req.Trailer.Set("X-T", "done") }}
	if s := do(req); s.body != "streamed" || s.cl != -1 || len(s.te) != 1 || s.trailer != "done" {
		t.Errorf("unknown length: %+v", s)
	}

	req, _ = http.NewRequest(http.MethodPost, backend.URL, nil)
	if s := do(req); s.cl != 0 || s.body != "" {
		t.Errorf("empty POST: %+v", s)
	}

	req, _ = http.NewRequest(http.MethodGet, backend.URL, nil)
	req.Header.Set("X-Evil", "a\r\nX-Injected: 1")
	if _, err := c.RoundTrip(req); err == nil {
		t.Error("a header value with CRLF was sent")
	}
}

// TestUpstreamClientCancel checks that a request's context ending closes
// its connection, while it waits for the head and while the body streams.
func TestUpstreamClientCancel(t *testing.T) {
	leakCheck(t)
	gone := make(chan struct{}, 2)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/body" {
			_, _ = io.WriteString(w, "first")
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done() // the client's close of the connection
		gone <- struct{}{}
	})
	c := newClient(t, TransportOptions{})
	for _, path := range []string{"/head", "/body"} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, backend.URL+path, nil)
		time.AfterFunc(50*time.Millisecond, cancel)
		res, err := c.RoundTrip(req)
		if err == nil {
			_, err = io.ReadAll(res.Body)
			res.Body.Close()
		}
		if err == nil {
			t.Fatalf("%s: no error after the cancel", path)
		}
		select {
		case <-gone:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the server did not see the connection close", path)
		}
		cancel()
	}
}

// FuzzUpstreamClientResponse reads arbitrary bytes as a response: the
// client must not panic, and what it accepts net/http accepts too, with
// the same status.
func FuzzUpstreamClientResponse(f *testing.F) {
	f.Add("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
	f.Add("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X\r\n\r\n2\r\nhi\r\n0\r\nX: 1\r\n\r\n")
	f.Add("HTTP/1.0 100 Continue\r\n\r\nHTTP/1.0 204 No Content\r\n\r\n")
	f.Add("HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n")
	f.Fuzz(func(t *testing.T, in string) {
		cc := &clientConn{br: bufio.NewReaderSize(strings.NewReader(in), 64), pool: &connPool{c: &UpstreamClient{}}}
		b := new(responseBody)
		req := httptest.NewRequest(http.MethodGet, "http://x/", nil)
		if _, err := cc.readHead(req, b); err != nil {
			return
		}
		want, err := http.ReadResponse(bufio.NewReader(strings.NewReader(in)), req)
		if err != nil {
			if !strings.Contains(in, "\n ") && !strings.Contains(in, "\n\t") { // net/http rejects obs-fold
				t.Fatalf("accepted %q, which net/http rejects: %v", in, err)
			}
			return
		}
		if want.StatusCode >= 200 && want.StatusCode != b.res.StatusCode { // net/http returns a 1xx as it is
			t.Fatalf("status %d, net/http %d", b.res.StatusCode, want.StatusCode)
		}
	})
}

// TestUpstreamClientForgetsGoneReplicas checks that an Upstream closed
// (its replica left the deployment) takes its pool out of the shared
// client: idle connections closed at once, one in use closed when its
// request ends, and nothing kept per address once gone.
func TestUpstreamClientForgetsGoneReplicas(t *testing.T) {
	leakCheck(t)
	var closedConns atomic.Int64
	release := make(chan struct{})
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
	}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closedConns.Add(1)
		}
	}
	backend.Start()
	t.Cleanup(backend.Close)
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before backend.Close, which waits for handlers
	c := newClient(t, TransportOptions{})
	u, err := NewUpstream("u1", backend.URL, UpstreamOptions{MaxOngoing: 4, Transport: c})
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, backend.URL+"/slow", nil)
		res, err := c.RoundTrip(req)
		if err == nil {
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		slow <- err
	}()
	openConns := func() (open, idle int) {
		c.mu.RLock()
		p := c.pools[poolKey{host: strings.TrimPrefix(backend.URL, "http://")}]
		c.mu.RUnlock()
		if p == nil {
			return 0, 0
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.open, len(p.idle)
	}
	eventually(t, "the slow request on its connection", func() bool {
		open, _ := openConns()
		return open == 1
	})
	// A second request while the first holds its connection: a second
	// connection, idle after it.
	if _, _, err := clientGet(t, c, http.MethodGet, backend.URL); err != nil {
		t.Fatal(err)
	}
	if open, idle := openConns(); open != 2 || idle != 1 {
		t.Fatalf("%d connections open, %d idle; want 2 and 1", open, idle)
	}
	u.Close()
	c.mu.RLock()
	n := len(c.pools)
	c.mu.RUnlock()
	if n != 0 {
		t.Errorf("the client keeps %d pools after its only replica left", n)
	}
	eventually(t, "the idle connection closed", func() bool { return closedConns.Load() == 1 })
	unblock()
	if err := <-slow; err != nil {
		t.Fatalf("the request in flight failed: %v", err)
	}
	eventually(t, "the connection in use closed after its request", func() bool { return closedConns.Load() == 2 })
}

// TestUpstreamClientKeepsPoolOfReaddedReplica: a replica re-added on the
// same address (DNS flapping) while its old Upstream drains shares the
// pool, which goes only when the last of them is closed.
func TestUpstreamClientKeepsPoolOfReaddedReplica(t *testing.T) {
	leakCheck(t)
	backend := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(backend.Close)
	c := newClient(t, TransportOptions{})
	old, err := NewUpstream("old", backend.URL, UpstreamOptions{MaxOngoing: 4, Transport: c})
	if err != nil {
		t.Fatal(err)
	}
	readded, err := NewUpstream("new", backend.URL, UpstreamOptions{MaxOngoing: 4, Transport: c})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := clientGet(t, c, http.MethodGet, backend.URL); err != nil {
		t.Fatal(err)
	}
	pools := func() int {
		c.mu.RLock()
		defer c.mu.RUnlock()
		return len(c.pools)
	}
	old.Close()
	old.Close() // twice: still one release
	if n := pools(); n != 1 {
		t.Fatalf("%d pools after the old Upstream closed, want the re-added one's 1", n)
	}
	readded.Close()
	if n := pools(); n != 0 {
		t.Fatalf("%d pools after both closed, want 0", n)
	}
}

// slowBody gives n chunks of "x", gap apart.
type slowBody struct {
	n   int
	gap time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(b.gap)
	b.n--
	p[0] = 'x'
	return 1, nil
}

// The response header timeout begins once the request's body is sent, as
// net/http's does: an upload that takes longer than it is no timeout,
// whether its length is known or not; a replica slow to answer is.
func TestUpstreamClientTimeoutAfterUpload(t *testing.T) {
	leakCheck(t)
	base := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		_, _ = w.Write([]byte(strconv.Itoa(len(b))))
	}).URL
	c := newClient(t, TransportOptions{ResponseHeaderTimeout: 200 * time.Millisecond, DialTimeout: 2 * time.Second})
	u := newUpstream(t, base, UpstreamOptions{Transport: c})
	for _, length := range []int64{10, -1} {
		r := httptest.NewRequest(http.MethodPost, "http://front.test/", &slowBody{n: 10, gap: 50 * time.Millisecond})
		r.ContentLength = length
		w := newSpy()
		if err := serveOnce(t, u, w, r); err != nil || w.body.String() != "10" {
			t.Errorf("an upload of 500 ms (length %d) with a timeout of 200 ms: %q, %v; want it answered", length, w.body.String(), err)
		}
	}
	r := httptest.NewRequest(http.MethodPost, "http://front.test/slow", strings.NewReader("x"))
	if err := serveOnce(t, u, newSpy(), r); !errors.As(err, new(*TimeoutError)) {
		t.Errorf("a replica answering after 1 s, with a timeout of 200 ms: %v, want a *TimeoutError", err)
	}
}

// An answer without a Content-Type goes on without one: the front
// server does not sniff one the replica never said.
func TestUpstreamNoContentTypeAdded(t *testing.T) {
	leakCheck(t)
	url, _ := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n<html>", "")
	u := newUpstream(t, url, UpstreamOptions{Transport: newClient(t, TransportOptions{})})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := serveOnce(t, u, w, r); err != nil {
			t.Error(err)
		}
	}))
	defer front.Close()
	resp, err := http.Get(front.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct, ok := resp.Header["Content-Type"]; ok || string(body) != "<html>" {
		t.Errorf("Content-Type %q (set %v), body %q; want none, as the replica sent", ct, ok, body)
	}
}

// An answer to HEAD announces the length of the body a GET would get, and
// has none: it is passed on as it is, where reading the small body whole
// had failed it with a 500 (found by an exploratory run).
func TestUpstreamHeadWithContentLength(t *testing.T) {
	leakCheck(t)
	url, _ := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\n")
	u := newUpstream(t, url, UpstreamOptions{Transport: newClient(t, TransportOptions{})})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := serveOnce(t, u, w, r); err != nil {
			t.Error(err)
		}
	}))
	defer front.Close()
	for range 2 { // and the connection is reused after it
		resp, err := http.Head(front.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != 5 {
			t.Fatalf("HEAD: %d, Content-Length %d; want 200 with the replica's 5", resp.StatusCode, resp.ContentLength)
		}
	}
}

// Bytes a server sent past its answer's end (here a body on a 204) are
// not taken for the start of the next answer on the connection, which
// another client's request would have met as a malformed response (found
// by an exploratory run): the connection is not reused.
func TestUpstreamClientBytesAfterTheAnswer(t *testing.T) {
	leakCheck(t)
	var conns, requests atomic.Int64
	url := rawServer(t, func(c net.Conn) {
		conns.Add(1)
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
			if requests.Add(1) == 1 {
				answer = "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"
			}
			if _, err := io.WriteString(c, answer); err != nil {
				return
			}
		}
	})
	c := newClient(t, TransportOptions{})
	if res, _, err := clientGet(t, c, http.MethodGet, url); err != nil || res.StatusCode != 204 {
		t.Fatalf("the 204: %v, %v", res, err)
	}
	if res, body, err := clientGet(t, c, http.MethodGet, url); err != nil || body != "hi" {
		t.Fatalf("the next request: %v, %q, %v", res, body, err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the one with bytes left over is not reused", n)
	}
}

// A POST, which cannot be sent again once it met a stale connection, has
// the idle connection it reuses checked first, however briefly it idled:
// a server that closed it meanwhile (a graceful restart closing idle
// ones) gives it a new one rather than a 502. (The check cannot see a
// close still on its way; the test waits for it, with the check by idle
// time put off.)
func TestUpstreamClientPostChecksReuse(t *testing.T) {
	leakCheck(t)
	defer func(d time.Duration) { stalePeekAfter = d }(stalePeekAfter)
	stalePeekAfter = time.Hour
	url, conns := countingServer(t, true, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	c := newClient(t, TransportOptions{})
	u := newUpstream(t, url, UpstreamOptions{Transport: c})
	for i := range 3 {
		w := newSpy()
		if err := serveOnce(t, u, w, httptest.NewRequest(http.MethodPost, "http://front.test/", strings.NewReader("hello"))); err != nil || w.body.String() != "ok" {
			t.Fatalf("POST %d, each on a connection the server closed after its answer: %q, %v", i, w.body.String(), err)
		}
		time.Sleep(20 * time.Millisecond) // the server's close arrives
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections for 3 POSTs, want 3", n)
	}
}

// A replica that stops reading a large upload is a timeout too: each
// write of the body may wait for it up to the response header timeout.
func TestUpstreamClientStalledReplicaTimesOut(t *testing.T) {
	leakCheck(t)
	stop := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		_ = readRequestHead(c)
		<-stop // reads no more
	})
	t.Cleanup(func() { close(stop) })
	c := newClient(t, TransportOptions{ResponseHeaderTimeout: 200 * time.Millisecond, DialTimeout: 2 * time.Second})
	u := newUpstream(t, url, UpstreamOptions{Transport: c})
	r := httptest.NewRequest(http.MethodPost, "http://front.test/", bytes.NewReader(make([]byte, 64<<20)))
	start := time.Now()
	if err := serveOnce(t, u, newSpy(), r); !errors.As(err, new(*TimeoutError)) {
		t.Errorf("an upload to a replica that stopped reading: %v, want a *TimeoutError", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
}
