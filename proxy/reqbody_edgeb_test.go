package proxy

import (
	"bufio"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// EnableFullDuplex after WriteHeader, with the body unread, is refused:
// the Connection: close that full duplex needs cannot be added then, and
// net/http's read of the rest after the handler would outlive the request
// (golang/go#68560) or leave its bytes to be read as the next request
// (found by review).
func TestFullDuplexAfterWriteHeader(t *testing.T) {
	logs := &syncBuffer{}
	defer func() {
		time.Sleep(200 * time.Millisecond)
		t.Logf("server log (%d): %.1500s", len(logs.String()), logs.String())
	}()
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second, Log: zerolog.New(logs)},
		testDeployment{app: "fd", prefix: "/fd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).EnableFullDuplex()
			_, _ = io.WriteString(w, "ok")
		})},
		testDeployment{app: "s", prefix: "/s", factory: static("hi")})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /fd HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, _, _ := readAnswer(t, c, br, "/fd")
	t.Logf("/fd: %d close=%v", res.StatusCode, res.Close)
	if res.Close {
		return
	}
	_, _ = io.WriteString(c, "GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	res2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the next request on the kept connection: %v", err)
	}
	t.Logf("/s: %d", res2.StatusCode)
}

// A handler that closes the body (sent whole) before it writes keeps the
// connection: net/http's Close read it to its end.
func TestClosedWholeBodyKeepsConnection(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second},
		testDeployment{app: "cl", prefix: "/cl", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body.Close()
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /cl HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, _, _ := readAnswer(t, c, br, "/cl")
	if res.Close {
		t.Errorf("closes the connection; the whole body had come and was read by Close")
	}
}

// Expect: 100-continue and a handler that closes the body it never read
// (defer r.Body.Close()) is answered at once: net/http's Close would wait
// for a body it never asked for, up to the body timeout, on a connection
// that closes anyway (found by review).
func TestExpectAndDeferredClose(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "cl", prefix: "/cl", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer r.Body.Close()
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /cl HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
	res, _, took := readAnswer(t, c, br, "/cl")
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the answer waited %v for a body the client was never asked for", took.Round(time.Millisecond))
	}
}
