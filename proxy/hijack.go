package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// hijackedConns are the client connections that handlers took from
// net/http (http.Hijacker): WebSockets, relayed to a replica or served in
// process. net/http's Shutdown neither waits for them nor closes them, so
// the proxy does both: they get the graceful shutdown period, as requests
// do, and are closed when it ends.
type hijackedConns struct {
	mu      sync.Mutex
	conns   map[*hijackedConn]struct{}
	pending int  // Hijack calls under way: their connections are net/http's no more, and not yet here
	closed  bool // closeAll ran: a connection hijacked now is closed at once
}

// hijack takes w's connection from net/http (through http.ResponseController,
// so any writer that unwraps to net/http's will do) and keeps track of it
// until it is closed.
func (s *hijackedConns) hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
	s.mu.Lock()
	s.pending++
	s.mu.Unlock()
	c, brw, err := http.NewResponseController(w).Hijack()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending--
	if err != nil {
		return nil, nil, err
	}
	hc := &hijackedConn{Conn: c, set: s}
	if s.closed {
		_ = c.Close()
		return hc, brw, nil // its handler finds it closed on first use
	}
	if s.conns == nil {
		s.conns = make(map[*hijackedConn]struct{})
	}
	s.conns[hc] = struct{}{}
	return hc, brw, nil
}

// open reports how many connections are hijacked, or being hijacked.
func (s *hijackedConns) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns) + s.pending
}

// wait waits until no connection is hijacked, or ctx is done, and returns
// how many are left.
func (s *hijackedConns) wait(ctx context.Context) int {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		n := s.open()
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
	}
}

// closeAll closes every hijacked connection, and any hijacked from now on.
func (s *hijackedConns) closeAll() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// hijackedConn is a hijacked connection that leaves its set when closed.
type hijackedConn struct {
	net.Conn
	set  *hijackedConns
	once sync.Once
}

// CloseWrite shuts down the writing side of the connection, as
// *net.TCPConn does, for a handler that half-closes (the wrapper would
// hide it otherwise).
func (c *hijackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// Close implements net.Conn.
func (c *hijackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}
