//go:build !linux

package replica

// peekFD is clientConn.alive's look at the socket. Without a portable
// non-blocking peek, an idle connection is taken as alive; one the server
// closed is found on use, and an idempotent request is sent again.
func (cc *clientConn) peekFD(uintptr) bool {
	cc.peekOK = true
	return true
}

// sendThenReadSupported: elsewhere a request is written when its head is
// flushed (connIO is not used).
const sendThenReadSupported = false

func (c *connIO) sendThenRead(p []byte) (int, error) {
	if err := c.sendRest(); err != nil {
		return 0, err
	}
	return c.cc.conn.Read(p)
}
