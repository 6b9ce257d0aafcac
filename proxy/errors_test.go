package proxy

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/serveproxy/serveproxy/replica"
)

// A 502's body says which of its causes it was: a replica that could not
// be reached, one whose connection broke once it had the request (it read
// "could not be reached" for a replica killed mid-request, found by a
// tester), one whose answer was not valid HTTP.
func TestBadGatewayMessages(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{&replica.UnreachableError{Replica: "r", Down: true, Err: errors.New("connection refused")}, "Bad Gateway: the replica could not be reached"},
		{&replica.UnreachableError{Replica: "r", Err: errors.New("broken pipe")}, "Bad Gateway: the replica could not be reached"},
		{&replica.UnreachableError{Replica: "r", Sent: true, Err: io.ErrUnexpectedEOF}, "Bad Gateway: the connection to the replica broke before it answered"},
		{&replica.InvalidResponseError{Replica: "r", Err: errors.New("status line")}, "Bad Gateway: the replica's answer was not valid HTTP"},
	} {
		if got := errorMessage(http.StatusBadGateway, tt.err); got != tt.want {
			t.Errorf("errorMessage(502, %v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
