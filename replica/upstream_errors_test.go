package replica

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
)

// Only a replica that cannot be reached at all leaves routing: a write
// that failed on one kept-alive connection (the replica closed it) is
// retried elsewhere without taking the replica out for a health period
// (found by review).
func TestUnreachableDown(t *testing.T) {
	u := &Upstream{id: "u"}
	for _, c := range []struct {
		name string
		err  error
		down bool
	}{
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"write on a closed connection", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
	} {
		err := u.roundTripError(httptest.NewRequest("POST", "/", nil), c.err, true)
		var ue *UnreachableError
		if !errors.As(err, &ue) || ue.Sent || ue.Down != c.down {
			t.Errorf("%s: %#v, want an unsent *UnreachableError with Down %v", c.name, err, c.down)
		}
	}
}

// A replica that dies of a request it read whole, on a reused connection,
// looks like one that closed the idle connection as it was reused: the
// transport sends an idempotent request again on a new connection. When
// that one is refused, the request was still sent once, and the replica
// may have died of it: it must not go to another replica, which it could
// kill too (a "poison" request), but be answered 502.
func TestDeadAfterReadingIsNotRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_ = ln.Close() // dies of the second request: nothing listens now
	})
	u := newUpstream(t, "http://"+ln.Addr().String(), UpstreamOptions{})
	for i, want := range []bool{true, false} {
		rec := httptest.NewRecorder()
		err := serveOnce(t, u, rec, httptest.NewRequest(http.MethodGet, "/x", nil))
		if want != (err == nil) {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if err != nil && Retryable(err) {
			t.Fatalf("request %d, which the replica read before it died: retryable (%v)", i+1, err)
		}
		if ue, ok := errors.AsType[*UnreachableError](err); err != nil && (!ok || !ue.Down) {
			t.Fatalf("request %d: %#v, want an UnreachableError with the replica down (refused)", i+1, err)
		}
	}
}
