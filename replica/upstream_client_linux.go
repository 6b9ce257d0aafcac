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

// sendAwaitingAnswer writes p, a request's whole head (a request without a
// body), and returns once the socket has something to read, or once the
// wait ends otherwise (the read deadline, the connection closed): the
// read that follows meets that end. A read made at once after a write
// finds nothing yet, the replica having had no time to answer, and costs
// a system call that only says so before the goroutine parks (one in
// seven of what a small forwarded request costs the proxy, see "Speed
// of forwarding" in the README). syscall.RawConn's Read readies the
// poller for the socket before its callback runs, so the write goes out
// in the callback: an answer that comes at once is not missed.
//
// What the callback could not write (the socket's buffer full, an
// error) goes out by the connection's Write, which waits under its write
// deadline and reports an error as any write does.
func (cc *clientConn) sendAwaitingAnswer(p []byte) (int, error) {
	cc.pending, cc.sent = p, -1
	_ = cc.raw.Read(cc.sendWait) // an end of the wait is the read's to meet
	n := max(cc.sent, 0)
	cc.pending = nil
	if n == len(p) {
		return n, nil
	}
	m, err := cc.conn.Write(p[n:])
	return n + m, err
}

// sendThenWait is sendAwaitingAnswer's callback: the first call writes
// and asks to wait for the socket to be readable if it wrote everything;
// the call after the wait ends it.
func (cc *clientConn) sendThenWait(fd uintptr) bool {
	if cc.sent >= 0 {
		return true
	}
	for {
		n, err := syscall.Write(int(fd), cc.pending)
		if err == syscall.EINTR {
			continue
		}
		cc.sent = max(n, 0)
		return err != nil || n < len(cc.pending)
	}
}
