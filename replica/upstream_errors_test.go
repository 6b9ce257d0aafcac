package replica

import (
	"errors"
	"net"
	"net/http/httptest"
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
