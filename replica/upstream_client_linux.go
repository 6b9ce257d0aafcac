package replica

import (
	"io"
	"net"
	"os"
	"syscall"
)

// peekFD is clientConn.alive's look at the socket, for syscall.RawConn's
// Read: a byte peeked without waiting. EAGAIN means the connection idles
// as it should; 0 bytes is the server's FIN, and data is an answer nobody
// asked for (a 408 before a close): either way it must not be reused.
func (cc *clientConn) peekFD(fd uintptr) bool {
	_, _, err := syscall.Recvfrom(int(fd), cc.pbuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	cc.peekOK = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
	return true
}

// sendThenReadSupported: connIO sends a request from the read of its
// answer (sendThenRead).
const sendThenReadSupported = true

// sendThenRead writes the pending request and reads the first bytes of its
// answer into p, in one syscall.RawConn Read: the write happens after the
// poller's readiness is reset, so an answer arriving at once still wakes
// the wait, and there is no read before it that would find nothing. A
// write that cannot finish at once (the socket's buffer is full) is
// finished, and the answer read, the usual way. Errors are as net.Conn's:
// *net.OpError for a failed write ("write") or read ("read", or the
// poller's "raw-read" for a deadline or a closed connection), io.EOF for
// the server's close.
func (c *connIO) sendThenRead(p []byte) (int, error) {
	var (
		n          int
		werr, rerr error
		sent       bool
	)
	err := c.cc.raw.Read(func(fd uintptr) bool {
		if !sent {
			for c.sent < len(c.pending) {
				m, err := syscall.Write(int(fd), c.unsent())
				if m > 0 {
					c.sent += m
				}
				switch {
				case err == syscall.EINTR:
				case err == syscall.EAGAIN:
					return true // no room now: the rest goes the usual way
				case err != nil:
					werr = err
					return true
				}
			}
			sent = true
			return false // wait for the answer
		}
		for {
			n, rerr = syscall.Read(int(fd), p)
			if rerr != syscall.EINTR {
				break
			}
		}
		return rerr != syscall.EAGAIN
	})
	switch {
	case werr != nil:
		c.done()
		return 0, c.opError("write", werr)
	case err != nil:
		c.done()
		return 0, err
	case !sent:
		if err := c.sendRest(); err != nil {
			return 0, err
		}
		return c.cc.conn.Read(p)
	}
	c.done()
	switch {
	case rerr != nil:
		return 0, c.opError("read", rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// opError wraps a system call's error as net.Conn's methods do.
func (c *connIO) opError(op string, err error) error {
	conn := c.cc.conn
	return &net.OpError{Op: op, Net: "tcp", Source: conn.LocalAddr(), Addr: conn.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}
