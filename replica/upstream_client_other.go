//go:build !linux

package replica

// peekFD is clientConn.alive's look at the socket. Without a portable
// non-blocking peek, an idle connection is taken as alive; one the server
// closed is found on use, and an idempotent request is sent again.
func (cc *clientConn) peekFD(uintptr) bool {
	cc.peekOK = true
	return true
}
