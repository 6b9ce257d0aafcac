package replica

import "syscall"

// peekFD is clientConn.alive's look at the socket, for syscall.RawConn's
// Read: a byte peeked without waiting. EAGAIN means the connection idles
// as it should; 0 bytes is the server's FIN, and data is an answer nobody
// asked for (a 408 before a close): either way it must not be reused.
func (cc *clientConn) peekFD(fd uintptr) bool {
	_, _, err := syscall.Recvfrom(int(fd), cc.pbuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	cc.peekOK = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
	return true
}
