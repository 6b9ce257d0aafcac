package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A handler that writes its header, then hijacks, with a stalled upload,
// gets its connection within the body timeout: net/http's Hijack flushes
// the header, and would read the rest of the body with no deadline (found
// by review).
func TestHijackAfterWriteHeaderStalledBody(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "hj", prefix: "/hj", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Upgrade", "x")
			w.Header().Set("Connection", "Upgrade")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("switched")
			_ = brw.Flush()
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /hj HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	line, err := br.ReadString('\n')
	t.Logf("%q %v after %v", line, err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("no 101 within 5 s (body timeout %v): %v", timeout, err)
	}
}

// A handler that sets Connection: close after WriteHeader (net/http
// ignores it: its header is a snapshot) and streams, with a stalled
// upload, is answered within the body timeout: the proxy reads the header
// as net/http took it (found by review).
func TestConnectionCloseAfterWriteHeader(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "late", prefix: "/late", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Header().Set("Connection", "close") // no effect in net/http
			_, _ = io.WriteString(w, big)
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 5 s (body timeout %v): %v", timeout, err)
	}
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, time.Since(start).Round(time.Millisecond))
}

// A handler's read after net/http read the body to its end and closed it
// (ErrBodyReadAfterClose) leaves no deadline to fire in net/http's
// background read, which would cancel the request's context and the
// connection's (found by review).
func TestReadAfterNetHTTPClosedTheBody(t *testing.T) {
	const timeout = 200 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "late", prefix: "/late", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, big)
			_, err := r.Body.Read(make([]byte, 1))
			t.Logf("read after the header: %v", err)
			time.Sleep(3 * timeout)
			if err := r.Context().Err(); err != nil {
				t.Errorf("the request's context ended while its handler ran: %v", err)
			}
			_, _ = io.WriteString(w, "done")
		})},
		testDeployment{app: "ctx", prefix: "/ctx", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := r.Context().Err(); err != nil {
				_, _ = io.WriteString(w, "cancelled: "+err.Error())
				return
			}
			_, _ = io.WriteString(w, "live")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, body, _ := readAnswer(t, c, br, "/late")
	t.Logf("/late: %d close=%v %d bytes", res.StatusCode, res.Close, len(body))
	if res.Close {
		return
	}
	_, _ = io.WriteString(c, "GET /ctx HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body, _ := readAnswer(t, c, br, "/ctx"); body != "live" {
		t.Errorf("the next request on the kept connection: %q, want \"live\"", body)
	}
}
