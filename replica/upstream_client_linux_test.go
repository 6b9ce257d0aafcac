package replica

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestUpstreamClientSendWithFullSocket sends requests whose heads outgrow
// a small socket buffer to a server slow to read them, so that the head's
// last part, sent by the read of the answer (connIO.sendThenRead), meets a
// full buffer and is finished the usual way: every answer still comes, on
// one connection.
func TestUpstreamClientSendWithFullSocket(t *testing.T) {
	leakCheck(t)
	var conns atomic.Int64
	// Small buffers on both sides and a server that reads 4 KiB a
	// millisecond: the client's socket is full most of the time.
	small := func(opt int) func(_, _ string, rc syscall.RawConn) error {
		return func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 4096) }); err != nil {
				return err
			}
			return serr
		}
	}
	lc := net.ListenConfig{Control: small(syscall.SO_RCVBUF)}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		conns.Add(1)
		br := bufio.NewReaderSize(slowReader{c}, 4096)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if len(req.Header.Get("X-Big")) != 256<<10 {
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}()
	url := "http://" + ln.Addr().String()
	c := newClient(t, TransportOptions{})
	c.dialer.Control = small(syscall.SO_SNDBUF)
	big := strings.Repeat("b", 256<<10)
	for i := range 3 {
		req, err := http.NewRequest(http.MethodGet, url+"/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Big", big)
		res, err := c.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || string(b) != "ok" {
			t.Fatalf("request %d: %d %q, %v", i, res.StatusCode, b, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests in a row, want 1", n)
	}
}

// slowReader reads at most 4 KiB a millisecond.
type slowReader struct{ r io.Reader }

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	return s.r.Read(p[:min(len(p), 4096)])
}
