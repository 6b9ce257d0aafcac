package replica

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// websocketToken is the one protocol the proxy lets a request switch to.
// Others (h2c, a raw TCP tunnel) would carry requests past everything the
// proxy does for each one (its headers, limits, timeouts, log and
// metrics): their Upgrade header is dropped as hop-by-hop, and the replica
// sees a plain request.
const websocketToken = "websocket"

// upgradeRequested reports whether r is a WebSocket handshake that the
// proxy relays (RFC 6455 section 4.1; RFC 9110 section 7.8): a GET over
// HTTP/1.1 with no body, "upgrade" among its Connection options and
// "websocket" in its Upgrade header.
func upgradeRequested(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ProtoMajor == 1 && r.ProtoMinor >= 1 &&
		hasToken(r.Header["Upgrade"], websocketToken) && hasToken(r.Header["Connection"], "upgrade") &&
		(r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0)
}

// switchProtocols relays a replica's 101 Switching Protocols to a
// WebSocket handshake: it takes the client's connection from net/http
// (http.Hijacker, found through w's Unwrap), writes it the 101 with the
// replica's header (hop-by-hop fields gone but Connection and Upgrade,
// X-Request-Id kept), and copies bytes both ways until either side closes:
// the WebSocket closing handshake is in the stream, so closing the other
// side then loses nothing. The replica's slot is held all the while: an
// open WebSocket counts against max_ongoing_requests. The request's
// context no longer ends the session once it has switched, so a request
// timeout bounds the handshake alone. The proxy closes the client's side
// at its graceful shutdown timeout, and Close the replica's.
func (u *Upstream) switchProtocols(w http.ResponseWriter, r *http.Request, res *http.Response) error {
	backend, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		return &ReplicaError{Replica: u.id, Err: errors.New("101 Switching Protocols without a connection to switch")}
	}
	if got := res.Header["Upgrade"]; len(got) != 1 || !strings.EqualFold(strings.TrimSpace(got[0]), websocketToken) {
		backend.Close()
		return &InvalidResponseError{Replica: u.id, Err: fmt.Errorf("101 Switching Protocols to %q, asked for %q", strings.Join(got, ", "), websocketToken)}
	}
	if !u.sessions.add(backend) {
		backend.Close()
		return &UnreachableError{Replica: u.id, Sent: true, Err: errors.New("the replica left during the WebSocket handshake")}
	}
	defer u.sessions.remove(backend)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		backend.Close()
		return fmt.Errorf("switching to a WebSocket: %w", err)
	}
	defer conn.Close()
	defer backend.Close()

	hdr := w.Header() // after Hijack: the header the proxy set is in it
	u.copyResponseHeader(hdr, res.Header, res.ProtoMinor)
	// A 1xx has no body to frame (RFC 9110 section 8.6), and the nil
	// Content-Type entry is copyResponseHeader's no-sniff marker.
	delete(hdr, "Content-Length")
	delete(hdr, "Transfer-Encoding")
	if v, ok := hdr["Content-Type"]; ok && v == nil {
		delete(hdr, "Content-Type")
	}
	hdr["Connection"] = connUpgrade
	hdr["Upgrade"] = res.Header["Upgrade"]
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	_ = hdr.Write(brw)
	_, _ = brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		return nil // the client left during the switch: nothing to answer
	}

	toReplica, toClient := make(chan relayEnd, 1), make(chan relayEnd, 1)
	go func() { toReplica <- relay(backend, brw.Reader) }() // what the client sent after its handshake first
	go func() { toClient <- relay(conn, backend) }()
	var end relayEnd
	fromReplica := false
	select {
	case end = <-toReplica:
	case end = <-toClient:
		fromReplica = true
	}
	conn.Close()
	backend.Close()
	// The other direction now ends on the closed connections: its error
	// says nothing.
	if fromReplica {
		<-toReplica
	} else {
		<-toClient
	}
	// A replica that closed, or a client that closed or left, ended the
	// session as sessions end. A replica whose connection broke (reset, a
	// machine gone) is worth a line in the log.
	if err := end.replicaErr(fromReplica); err != nil && !u.sessions.isClosed() {
		return &SessionError{Replica: u.id, Err: err}
	}
	return nil
}

// relayEnd is how one direction of a session ended: the read from its
// source failed (io.EOF for a close), or the write to its destination.
type relayEnd struct {
	readErr, writeErr error
}

// replicaErr is the replica's connection's failure, if it ended the
// session: a failed read of what the replica sends (fromReplica) or a
// failed write to it.
func (e relayEnd) replicaErr(fromReplica bool) error {
	if fromReplica {
		if e.readErr != nil && e.readErr != io.EOF {
			return e.readErr
		}
		return nil
	}
	return e.writeErr
}

// relay copies src to dst until either fails.
func relay(dst io.Writer, src io.Reader) relayEnd {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := *bp
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return relayEnd{writeErr: werr}
			}
		}
		if err != nil {
			return relayEnd{readErr: err}
		}
	}
}

// sessions are a replica's open WebSocket connections, so that Close can
// end them.
type sessions struct {
	mu     sync.Mutex
	open   map[io.Closer]struct{}
	closed bool
}

// add records c, or reports false once closeAll has run.
func (s *sessions) add(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.open == nil {
		s.open = make(map[io.Closer]struct{})
	}
	s.open[c] = struct{}{}
	return true
}

func (s *sessions) remove(c io.Closer) {
	s.mu.Lock()
	delete(s.open, c)
	s.mu.Unlock()
}

// isClosed reports whether closeAll has run.
func (s *sessions) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// closeAll closes every open session, and refuses new ones.
func (s *sessions) closeAll() {
	s.mu.Lock()
	s.closed = true
	open := s.open
	s.open = nil
	s.mu.Unlock()
	for c := range open {
		_ = c.Close()
	}
}
