package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// writeBytes answers ?bytes=N with N bytes of 'x', in 32 KiB writes, and
// stops at the first write that fails.
func writeBytes(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("bytes"))
	w.Header().Set("Content-Length", strconv.Itoa(n))
	chunk := []byte(strings.Repeat("x", 32<<10))
	for n > 0 {
		c := chunk[:min(n, len(chunk))]
		if _, err := w.Write(c); err != nil {
			return
		}
		n -= len(c)
	}
}

// startBigServer is an upstream replica answering as writeBytes does.
func startBigServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(writeBytes)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// stalledReader asks tp for a response far larger than the sockets'
// buffers and never reads it.
func stalledReader(t *testing.T, tp *testProxy) {
	t.Helper()
	c := dialProxy(t, tp)
	_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
	_, _ = io.WriteString(c, "GET /big?bytes=268435456 HTTP/1.1\r\nHost: x\r\n\r\n")
}

// A client that stops reading a response is taken for gone once it has
// taken none of it for the send timeout: its replica's slot is freed for
// the next request (before, it was held for as long as the client kept its
// connection open), and its line says 499 and why. In process and for a
// replica in another process alike.
func TestClientSendTimeoutFreesTheSlot(t *testing.T) {
	for _, kind := range []string{"in process", "upstream"} {
		t.Run(kind, func(t *testing.T) {
			td := testDeployment{app: "a", prefix: "/", maxOngoing: 1}
			if kind == "upstream" {
				td.targets = []string{startBigServer(t)}
			} else {
				td.factory = handlerFunc(writeBytes)
			}
			tp := startProxy(t, Options{ClientSendTimeout: 300 * time.Millisecond}, td)
			start := time.Now()
			stalledReader(t, tp)
			waitFor(t, "the stalled request's line", func() bool { return strings.Contains(tp.access.String(), `"status":499`) })
			t.Logf("slot freed %v after the stalled request", time.Since(start).Round(time.Millisecond))
			line := tp.access.String()
			if !strings.Contains(line, "PROXY_CLIENT_SEND_TIMEOUT") {
				t.Fatalf("access log %q does not say the client stopped reading", line)
			}
			res, body := get(t, tp.url+"/small?bytes=10")
			if res.StatusCode != http.StatusOK || body != strings.Repeat("x", 10) {
				t.Fatalf("next request: %d %q, want 200 and its body", res.StatusCode, body)
			}
		})
	}
}

// The deadline is between writes, not over the response: a stream whose
// events each come within the timeout runs for longer than it.
func TestClientSendTimeoutIsBetweenWrites(t *testing.T) {
	events := 6
	tp := startProxy(t, Options{ClientSendTimeout: 300 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range events {
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
			}
		})})
	res, body := get(t, tp.url+"/")
	if want := strings.Count(body, "data: "); res.StatusCode != http.StatusOK || want != events {
		t.Fatalf("stream: %d with %d events, want 200 with %d", res.StatusCode, want, events)
	}
}

// A connection whose response armed the deadline serves its next request
// after an idle wait longer than the timeout: the deadline ends with the
// response it bounded (net/http clears it; this keeps it so).
func TestClientSendTimeoutEndsWithItsResponse(t *testing.T) {
	tp := startProxy(t, Options{ClientSendTimeout: 200 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", factory: handlerFunc(writeBytes)})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	for i, size := range []int{100 << 10, 10} {
		if i > 0 {
			time.Sleep(700 * time.Millisecond)
		}
		_, _ = fmt.Fprintf(c, "GET /?bytes=%d HTTP/1.1\r\nHost: x\r\n\r\n", size)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the connection: %v", i+1, err)
		}
		b, err := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || len(b) != size || err != nil {
			t.Fatalf("request %d: %d with %d bytes (%v), want 200 with %d", i+1, res.StatusCode, len(b), err, size)
		}
	}
}

// A client that leaves during its answer is recorded 499, in process as for
// a replica in another process: not the 200 its answer began with, which
// it never had whole.
func TestClientGoneMidAnswer499(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(writeBytes)})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /?bytes=268435456 HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := io.ReadFull(c, make([]byte, 64<<10)); err != nil {
		t.Fatalf("reading the answer's start: %v", err)
	}
	_ = c.Close()
	waitFor(t, "the line of the request left mid-answer", func() bool { return strings.Contains(tp.access.String(), `"status":`) })
	if line := tp.access.String(); !strings.Contains(line, `"status":499`) {
		t.Fatalf("access log %q, want 499", line)
	}
}

// The request timeout cuts a write in progress to a client that reads
// slowly, or not at all: the request is a 408 at its deadline, its
// connection cut. Before, the deadline waited for the write to end (a
// tester's 20 MB echo to a slow reader stood as a 200 at three times its
// timeout; one to a client that read nothing, a 499 at the send timeout).
func TestRequestTimeoutCutsAWriteInProgress(t *testing.T) {
	td := testDeployment{app: "a", prefix: "/", maxOngoing: 1, factory: handlerFunc(writeBytes)}
	tp := startProxy(t, Options{RequestTimeout: 300 * time.Millisecond, ClientSendTimeout: time.Minute}, td)
	start := time.Now()
	stalledReader(t, tp)
	waitFor(t, "the stalled request's line", func() bool { return strings.Contains(tp.access.String(), `"status":`) })
	line := tp.access.String()
	if !strings.Contains(line, `"status":408`) {
		t.Fatalf("access log %q, want a 408", line)
	}
	t.Logf("recorded %v after the request", time.Since(start).Round(time.Millisecond))
	res, body := get(t, tp.url+"/small?bytes=10")
	if res.StatusCode != http.StatusOK || body != strings.Repeat("x", 10) {
		t.Fatalf("next request: %d %q, want 200 and its body: the slot is free", res.StatusCode, body)
	}
}
