package front_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Found by a review and a black-box tester of the lean front; each test
// runs against both servers (impls), net/http's checking the test.

// closedWithin reports whether the server closes c within d, and what it
// sent before.
func closedWithin(c net.Conn, d time.Duration) (bool, string) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false, string(b)
	}
	return true, string(b)
}

func dialTo(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

var hi = func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hi") }

// ReadHeaderTimeout bounds a head from the connection's accept (a client
// that sends nothing), and a head that comes in parts from its first
// byte, whatever the idle timeout: a slowloris is cut after 200 ms, not
// after the 5 s keep-alive timeout (both were 5 s, or never without an
// idle timeout).
func TestReadHeaderTimeoutBoundsHeads(t *testing.T) {
	for _, im := range impls {
		for _, idle := range []time.Duration{0, 5 * time.Second} {
			cfg := serverConfig{ReadHeaderTimeout: 200 * time.Millisecond, IdleTimeout: idle}
			rs := im.start(t, http.HandlerFunc(hi), cfg)
			silent := dialTo(t, rs.addr)
			if closed, _ := closedWithin(silent, 2*time.Second); !closed {
				t.Errorf("%s, idle timeout %v: a silent new connection still open after 2 s", im.name, idle)
			}
			slow := dialTo(t, rs.addr)
			_, _ = io.WriteString(slow, "GET / HTTP/1.1\r\n")
			if closed, got := closedWithin(slow, 2*time.Second); !closed || got != "" {
				t.Errorf("%s, idle timeout %v: half a head: closed %v, sent %q; want closed with nothing", im.name, idle, closed, got)
			}
			// The same on a kept-alive connection's second request.
			kept := dialTo(t, rs.addr)
			br := bufio.NewReader(kept)
			_, _ = io.WriteString(kept, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
				t.Fatalf("%s: first request: %v", im.name, err)
			}
			_, _ = io.WriteString(kept, "GET / HTTP/1.1\r\n")
			if closed, _ := closedWithin(kept, 2*time.Second); !closed {
				t.Errorf("%s, idle timeout %v: half of a second head: still open after 2 s", im.name, idle)
			}
		}
	}
}

// A head that comes in parts slower than the idle timeout but within
// ReadHeaderTimeout is answered: the idle timeout ends with its first
// byte (it was cut at the idle timeout, silently).
func TestSlowHeadWithinReadHeaderTimeout(t *testing.T) {
	for _, im := range impls {
		rs := im.start(t, http.HandlerFunc(hi), serverConfig{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 300 * time.Millisecond})
		c := dialTo(t, rs.addr)
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\n")
		time.Sleep(600 * time.Millisecond)
		_, _ = io.WriteString(c, "Host: x\r\nConnection: close\r\n\r\n")
		if _, got := closedWithin(c, 3*time.Second); !strings.HasPrefix(got, "HTTP/1.1 200 OK") {
			t.Errorf("%s: a head in two parts 600 ms apart got %q, want a 200", im.name, got)
		}
	}
}

// Shutdown closes a kept-alive connection in the middle of its next head
// (it is not a request in flight yet) and returns at once: a head sent
// after the answer, one that came in the same write as the request
// before it, and one net/http was handed (a bare LF). It used to wait
// for the whole grace period, or 5 s for a handed-over one.
func TestShutdownClosesHalfReadHeads(t *testing.T) {
	for _, im := range impls {
		for _, tc := range []struct{ name, first, after string }{
			{"after the answer", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET / HT"},
			{"with the request before", "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHo", ""},
			{"handed to net/http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET / HTTP/1.1\nHo"},
		} {
			rs := im.start(t, http.HandlerFunc(hi), serverConfig{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second})
			c := dialTo(t, rs.addr)
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, tc.first)
			if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
				t.Fatalf("%s, %s: first request: %v", im.name, tc.name, err)
			}
			if tc.after != "" {
				_, _ = io.WriteString(c, tc.after)
			}
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			start := time.Now()
			err := rs.shutdown(ctx)
			cancel()
			if err != nil || time.Since(start) > 3*time.Second {
				t.Errorf("%s, %s: Shutdown with half a head pending: %v after %v, want nil at once", im.name, tc.name, err, time.Since(start))
			}
		}
	}
}

// A client that leaves a slow handler is noticed though bytes follow its
// request (a pipelined request, a stray CRLF): the read that watches
// comes after them. It was not watched at all.
func TestClientGoneBehindPipelinedBytes(t *testing.T) {
	for _, im := range impls {
		for _, after := range []string{"GET /next HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n"} {
			res := make(chan bool, 1)
			rs := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
					res <- true
				case <-time.After(3 * time.Second):
					res <- false
				}
			}), serverConfig{})
			c := dialTo(t, rs.addr)
			_, _ = io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"+after)
			time.Sleep(100 * time.Millisecond)
			_ = c.Close()
			if !<-res {
				t.Errorf("%s: followed by %q, the client's leaving did not end the context in 3 s", im.name, after)
			}
		}
	}
}

// The watch of one request never reads for the next: a handler done just
// as its watch's timer fires, then a slow one while the client sends a
// third request, once had two reads race for that request's first byte
// (the handler saw "ET /c"; a review's reproduction, in 17 of 40 rounds).
func TestWatchesDoNotOverlap(t *testing.T) {
	for _, im := range impls {
		var mu sync.Mutex
		var seen []string
		rs := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Method+" "+r.URL.Path)
			mu.Unlock()
			switch r.URL.Path {
			case "/a":
				time.Sleep(10 * time.Millisecond) // as long as the watch waits
			case "/b":
				time.Sleep(60 * time.Millisecond)
			}
			_, _ = io.WriteString(w, "ok")
		}), serverConfig{})
		for round := range 20 {
			mu.Lock()
			seen = nil
			mu.Unlock()
			c := dialTo(t, rs.addr)
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
			time.Sleep(3 * time.Millisecond)
			_, _ = io.WriteString(c, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
			time.Sleep(40 * time.Millisecond)
			_, _ = io.WriteString(c, "GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
			for range 3 {
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, res.Body)
			}
			_ = c.Close()
			mu.Lock()
			got := strings.Join(seen, ", ")
			mu.Unlock()
			if got != "GET /a, GET /b, GET /c" {
				t.Fatalf("%s, round %d: the handler saw %q", im.name, round, got)
			}
		}
	}
}

// A head the client stops sending in the middle of (its side closed) is
// answered 400, by net/http; the lean front closed without a word.
func TestTruncatedHeadGets400(t *testing.T) {
	for _, im := range impls {
		rs := im.start(t, http.HandlerFunc(hi), serverConfig{})
		for _, head := range []string{"GET / HTTP/1.1\r\nHost: x\r\n", "GET / HT", "\r\n"} {
			c := dialTo(t, rs.addr)
			_, _ = io.WriteString(c, head)
			_ = c.(*net.TCPConn).CloseWrite()
			if _, got := closedWithin(c, 3*time.Second); !strings.HasPrefix(got, "HTTP/1.1 400 Bad Request") {
				t.Errorf("%s: %q then the client's FIN: got %q, want a 400", im.name, head, got)
			}
		}
	}
}

// The idle timeout still closes a busy connection once it idles, though
// its deadline is set at most every idle/8 (for 400 ms, 50 ms): not
// before 400-50 ms of idling, and well within 3 s.
func TestIdleTimeoutAfterBusyConnection(t *testing.T) {
	for _, im := range impls {
		rs := im.start(t, http.HandlerFunc(hi), serverConfig{IdleTimeout: 400 * time.Millisecond})
		c := dialTo(t, rs.addr)
		br := bufio.NewReader(c)
		for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: %v", im.name, err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
		}
		idle := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := br.ReadByte()
		waited := time.Since(idle)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: still open after idling 3 s", im.name)
		}
		if waited < 350*time.Millisecond {
			t.Errorf("%s: closed after idling %v, before its idle timeout (400 ms, less 50 ms)", im.name, waited)
		}
	}
}
