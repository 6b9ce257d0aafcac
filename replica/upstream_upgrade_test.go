package replica

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// serveOnLoopback serves h on 127.0.0.1 until the test ends, and returns
// its address.
func serveOnLoopback(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// frontFor serves u as the proxy does, answering its errors with their
// type's name, and returns the address.
func frontFor(t *testing.T, u *Upstream) string {
	t.Helper()
	return serveOnLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := u.Serve(w, r); err != nil {
			var invalid *InvalidResponseError
			if errors.As(err, &invalid) {
				http.Error(w, "invalid response", http.StatusBadGateway)
				return
			}
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
}

// A replica that switches protocols unasked (to a request without
// Connection: Upgrade, whose Upgrade the proxy dropped) gets no tunnel,
// through net/http's transport too, which does not check (found by
// review): the client gets 502.
func TestUnaskedSwitchIsInvalid(t *testing.T) {
	rude := serveOnLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(io.Discard, brw)
	}))
	for _, tc := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"UpstreamClient", nil},
		{"net/http Transport", NewTransport(TransportOptions{MaxConnsPerReplica: 2})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := NewUpstream("u", "http://"+rude, UpstreamOptions{MaxOngoing: 2, Transport: tc.rt})
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			c, err := net.Dial("tcp", frontFor(t, u))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			// Upgrade without Connection: Upgrade is no upgrade request.
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n")
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", res.StatusCode)
			}
		})
	}
}

// Close ends the replica's WebSocket sessions: a replica that left the
// config (a reload, a DNS change) must not keep them going.
func TestCloseEndsSessions(t *testing.T) {
	echo := serveOnLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if err := c.Write(context.Background(), typ, msg); err != nil {
				return
			}
		}
	}))
	u, err := NewUpstream("u", "http://"+echo, UpstreamOptions{MaxOngoing: 2})
	if err != nil {
		t.Fatal(err)
	}
	front := frontFor(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+front+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != "hi" {
		t.Fatalf("echo: %q %v", msg, err)
	}
	u.Close()
	_, _, err = c.Read(ctx)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "deadline") {
		t.Fatalf("read after Close: %v; want the session ended", err)
	}
}
