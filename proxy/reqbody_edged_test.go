package proxy

import (
	"bufio"
	"io"
	"net/http"
	"testing"
	"time"
)

// The handler's own read deadline (http.ResponseController) applies when
// it is earlier than the body timeout's (found by review: each read
// replaced it).
func TestHandlersOwnReadDeadline(t *testing.T) {
	got := make(chan time.Duration, 1)
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			start := time.Now()
			_, _ = io.ReadAll(r.Body)
			got <- time.Since(start)
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_, _, _ = readAnswer(t, c, br, "/rd")
	if d := <-got; d > time.Second {
		t.Errorf("the handler's 200 ms read deadline failed its read after %v", d.Round(time.Millisecond))
	}
}

// A chunked body over PROXY_MAX_BODY_BYTES is answered 413 at once,
// closing the connection: net/http's own limit, which would, cannot be
// told through the proxy's writer, and the answer waited for a drain of
// the rest (found by review).
func TestOverLimitChunked413(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second, MaxBodyBytes: 5},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
	res, _, took := readAnswer(t, c, br, "/rd")
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, took.Round(time.Millisecond))
}
