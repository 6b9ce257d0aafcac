package replica

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// upgradeRequested reports whether r asks to switch protocols on its
// connection (RFC 9110 section 7.8), a WebSocket handshake say: HTTP/1.1,
// "Upgrade" among the Connection options, an Upgrade header, and no body
// (a body would have to be sent whole before the switch, and no client
// that upgrades sends one).
func upgradeRequested(r *http.Request) bool {
	return r.ProtoAtLeast(1, 1) && len(r.Header["Upgrade"]) > 0 && hasToken(r.Header["Connection"], "upgrade") &&
		(r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0)
}

// switchProtocols relays a replica's 101 Switching Protocols: it takes the
// client's connection from net/http (http.Hijacker, found through w's
// Unwrap), writes it the 101 with the replica's header (hop-by-hop fields
// gone but Connection and Upgrade, X-Request-Id kept), and copies bytes
// both ways until either side closes. The replica's slot is held all the
// while: an open WebSocket counts against max_ongoing_requests. The
// request's context no longer ends the session once it has switched, so a
// request timeout bounds the handshake alone. The proxy closes the client's side at
// its graceful shutdown timeout.
func (u *Upstream) switchProtocols(w http.ResponseWriter, r *http.Request, res *http.Response) error {
	backend, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		return &ReplicaError{Replica: u.id, Err: errors.New("101 Switching Protocols without a connection to switch")}
	}
	asked, got := strings.TrimSpace(r.Header.Get("Upgrade")), strings.TrimSpace(res.Header.Get("Upgrade"))
	if got == "" || !strings.EqualFold(asked, got) {
		backend.Close()
		return &InvalidResponseError{Replica: u.id, Err: fmt.Errorf("101 Switching Protocols to %q, asked for %q", got, asked)}
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		backend.Close()
		return fmt.Errorf("switching protocols to %q: %w", got, err)
	}
	defer conn.Close()
	defer backend.Close()

	hdr := w.Header() // after Hijack: the header the proxy set is in it
	u.copyResponseHeader(hdr, res.Header)
	if v, ok := hdr["Content-Type"]; ok && v == nil {
		delete(hdr, "Content-Type") // copyResponseHeader's no-sniff marker
	}
	hdr["Connection"] = connUpgrade
	hdr["Upgrade"] = res.Header["Upgrade"]
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n")
	_ = hdr.Write(brw)
	_, _ = brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		return nil // the client left during the switch: nothing to answer
	}

	// Either side closing ends the session: a WebSocket's closing
	// handshake is in the stream, so nothing is lost by closing the other.
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(backend, brw.Reader) // what the client sent after its handshake first
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, backend)
		done <- struct{}{}
	}()
	<-done
	conn.Close()
	backend.Close()
	<-done
	return nil
}
