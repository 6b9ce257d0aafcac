//go:build !linux

package replica

// peekFD is clientConn.alive's look at the socket. Without a portable
// non-blocking peek, an idle connection is taken as alive; one the server
// closed is found on use, and an idempotent request is sent again.
func (cc *clientConn) peekFD(uintptr) bool {
	cc.peekOK = true
	return true
}

// sendAwaitingAnswer writes p, a request's whole head. Elsewhere than on
// linux it is a plain write, and the read that follows waits for the
// answer.
func (cc *clientConn) sendAwaitingAnswer(p []byte) (int, error) {
	return cc.conn.Write(p)
}

// sendThenWait is unused elsewhere than on linux.
func (cc *clientConn) sendThenWait(uintptr) bool { return true }
