package replica

// connIO is what a plain TCP clientConn's bufio reader and writer work on.
// It exists to save a system call per request: a request without a body
// is not written when its head is flushed, but by the read that waits for
// its answer (sendThenRead), which writes it and then waits for the socket
// to turn readable. Writing and then reading makes a read that finds
// nothing yet (EAGAIN) before the wait: one call more, every request.
type connIO struct {
	cc *clientConn
	// deferred is set while a head is flushed to be sent with its read.
	deferred bool
	// pending holds what was written while deferred, from sent on not yet
	// sent; the next read sends it.
	pending []byte
	sent    int
}

// Write implements io.Writer.
func (c *connIO) Write(p []byte) (int, error) {
	if c.deferred {
		c.pending = append(c.pending, p...)
		return len(p), nil
	}
	return c.cc.conn.Write(p)
}

// Read implements io.Reader: with a request pending, it sends it first.
func (c *connIO) Read(p []byte) (int, error) {
	if c.sent == len(c.pending) {
		return c.cc.conn.Read(p)
	}
	return c.sendThenRead(p)
}

// unsent is what is left to send of the pending request.
func (c *connIO) unsent() []byte { return c.pending[c.sent:] }

// done forgets the pending request, sent or given up on.
func (c *connIO) done() { c.pending, c.sent = c.pending[:0], 0 }

// sendRest writes what is left of the pending request the usual way.
func (c *connIO) sendRest() error {
	defer c.done()
	_, err := c.cc.conn.Write(c.unsent())
	return err
}

// flushHead sends the request head buffered in cc.bw, or, when the
// response can be read through connIO and nothing unasked is buffered,
// keeps it for the read of the response to send.
func (cc *clientConn) flushHead() error {
	if cc.io == nil || cc.br.Buffered() > 0 {
		return cc.bw.Flush()
	}
	cc.io.deferred = true
	err := cc.bw.Flush()
	cc.io.deferred = false
	return err
}
