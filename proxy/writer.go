package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// statusWriter records the status and whether anything was written, for
// logs, metrics and error mapping. It is pooled: one per request in flight.
type statusWriter struct {
	w           http.ResponseWriter
	status      int
	wroteHeader bool
	// reqBody is the request's body, if it has one, as the handler reads
	// it.
	reqBody *trackedBody
	// fullDuplex is set once the handler read the request body full
	// duplex; expect when the request asked for 100-continue; own when
	// the proxy answers itself, with an error (see closeIfBodyLeft).
	fullDuplex, expect, own bool
	// hijacks keeps the connections handlers take over (see Hijack);
	// switchedAt is when one did.
	hijacks    *hijackedConns
	switchedAt time.Time
	// sent counts the body's bytes written (for the access log, and the
	// send timeout; net/http takes, and drops, a HEAD's: not logged).
	// sendTimeout, if above 0, bounds each write to the client once the
	// response is past what net/http buffers (see armSend); sendArmed is
	// set once the connection's write deadline is, and writeErr is the
	// first failed write.
	sendTimeout time.Duration
	sent        int
	sendArmed   bool
	writeErr    error
}

// writeDeadliner is net/http's response writer, which sets its
// connection's write deadline.
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// bufferedBody is how much of a response body net/http holds before any
// of it goes to the socket (its bufferBeforeChunkingSize): a response no
// longer than that, never flushed, cannot block its handler on a client
// that does not read, and pays nothing for the send timeout.
const bufferedBody = 2048

// armSend sets the connection's write deadline sendTimeout from now, for
// the write about to be made: a client that takes no part of the
// response for that long is taken for gone (nginx's send_timeout), and
// the handler's write fails rather than hold its replica's slot.
func (sw *statusWriter) armSend() {
	if wd, ok := sw.w.(writeDeadliner); ok {
		_ = wd.SetWriteDeadline(time.Now().Add(sw.sendTimeout))
		sw.sendArmed = true
	}
}

// endSend is called once the handler is done with a response whose writes
// were bounded: what net/http still buffers goes out under the deadline,
// so that a client that stops reading at the response's very end is
// recorded as one. (net/http clears the deadline once the response is
// out: the next request on the connection does not inherit it.)
func (sw *statusWriter) endSend() {
	if sw.writeErr == nil {
		_ = sw.FlushError()
	}
}

// sendTimedOut reports whether a write failed at the send timeout.
func (sw *statusWriter) sendTimedOut() bool {
	return sw.sendArmed && sw.writeErr != nil && errors.Is(sw.writeErr, os.ErrDeadlineExceeded)
}

// trackedBody is a request body that records whether it was read to its
// end.
type trackedBody struct {
	rc     io.ReadCloser
	length int64 // the request's ContentLength: -1 if unknown
	// timeout, if above 0, bounds each read from the client (see
	// Options.ClientBodyTimeout) through setDeadline, the connection's
	// read deadline.
	timeout     time.Duration
	setDeadline func(time.Time) error
	// eof, closed and timedOut are read by the handler's goroutine and
	// written by the body reader's, which may be another.
	eof, closed, timedOut atomic.Bool
}

// readDeadliner is net/http's response writer, which sets its
// connection's read deadline.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// Read implements io.Reader.
func (b *trackedBody) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		_ = b.setDeadline(time.Now().Add(b.timeout))
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.eof.Store(true)
		if b.timeout > 0 {
			// net/http's own read for the client's leaving, which starts
			// at the body's end, must not inherit it.
			_ = b.setDeadline(time.Time{})
		}
	case err != nil && b.timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded):
		b.timedOut.Store(true)
	}
	return n, err
}

// Close implements io.Closer.
func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return b.rc.Close()
}

// closeIfBodyLeft marks the response, about to be written, as the
// connection's last when the request body has not been read to its end
// and net/http, writing the header while the handler runs (the body
// behind our wrapper), could not tell what to do with the rest:
//   - the handler read it full duplex: net/http reads at most 256 KiB of
//     the rest after the handler, and does not close the connection for
//     more, so the rest would be read as the next requests (request
//     smuggling); for less, the read it starts at the body's end outlives
//     the request, and the next request on the connection panics
//     ("invalid concurrent Body.Read call", golang/go#68560);
//   - the request asked for 100-continue: net/http would read the body it
//     never asked for, from a client waiting for an answer;
//   - the handler closed it: net/http takes it for read;
//   - the proxy answers itself at the request's deadline (408), or to a
//     body that is not small (a 404, a 503): net/http would read up to
//     256 KiB of it first, from a client that may be sending it slowly,
//     before the answer goes out. A small body it reads at once, and the
//     connection stays (a POST shed with 503 under load).
//
// A replica that answers before the end of the upload (an early 401, a
// failure) costs its client the connection, as with nginx.
func (sw *statusWriter) closeIfBodyLeft() {
	b := sw.reqBody
	if b == nil || b.eof.Load() {
		return
	}
	own := sw.own && (sw.status == http.StatusRequestTimeout || b.length < 0 || b.length > smallRequestBody)
	if sw.fullDuplex || sw.expect || own || b.closed.Load() {
		sw.w.Header().Set("Connection", "close")
	}
}

// smallRequestBody is the most of a request body that the proxy's own
// answer leaves for net/http to read before it goes out (see
// closeIfBodyLeft).
const smallRequestBody = 64 << 10

var statusWriterPool = sync.Pool{New: func() any { return new(statusWriter) }}

func getStatusWriter(w http.ResponseWriter, hijacks *hijackedConns) *statusWriter {
	sw := statusWriterPool.Get().(*statusWriter)
	*sw = statusWriter{w: w, hijacks: hijacks}
	return sw
}

func putStatusWriter(sw *statusWriter) {
	sw.w = nil
	statusWriterPool.Put(sw)
}

// Header implements http.ResponseWriter.
func (sw *statusWriter) Header() http.Header { return sw.w.Header() }

// WriteHeader implements http.ResponseWriter.
func (sw *statusWriter) WriteHeader(code int) {
	if !sw.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		// 1xx informational headers may precede the real one; a 101 is
		// final, as net/http has it (a WebSocket handler writes it
		// before it hijacks the connection).
		sw.status, sw.wroteHeader = code, true
		sw.closeIfBodyLeft()
	}
	sw.w.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (sw *statusWriter) Write(b []byte) (int, error) {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
		sw.closeIfBodyLeft()
	}
	if sw.sendTimeout > 0 && sw.sent+len(b) > bufferedBody {
		sw.armSend()
	}
	n, err := sw.w.Write(b)
	sw.sent += n
	if err != nil && sw.writeErr == nil {
		sw.writeErr = err
	}
	return n, err
}

// Flush implements http.Flusher, so that streamed responses stream.
func (sw *statusWriter) Flush() { _ = sw.FlushError() }

// FlushError is Flush with the error of the write it made (net/http's
// own, which http.ResponseController.Flush finds here).
func (sw *statusWriter) FlushError() error {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
		sw.closeIfBodyLeft()
	}
	if sw.sendTimeout > 0 {
		sw.armSend()
	}
	var err error
	switch f := sw.w.(type) {
	case interface{ FlushError() error }:
		err = f.FlushError()
	case http.Flusher:
		f.Flush()
	}
	if err != nil && sw.writeErr == nil {
		sw.writeErr = err
	}
	return err
}

// EnableFullDuplex lets the handler read the request body while it writes
// the response (http.ResponseController finds it here), and records that
// it did.
func (sw *statusWriter) EnableFullDuplex() error {
	sw.fullDuplex = true
	return http.NewResponseController(sw.w).EnableFullDuplex()
}

// Hijack implements http.Hijacker: a handler (a WebSocket, relayed to a
// replica in another process or served in process) takes the connection
// over. It is kept track of, for the graceful shutdown, and the request is
// recorded as 101 Switching Protocols.
func (sw *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := sw.hijacks.hijack(sw.w)
	if err == nil {
		sw.status, sw.wroteHeader = http.StatusSwitchingProtocols, true
		sw.switchedAt = time.Now()
	}
	return c, brw, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.w }

// deadlineWriter stands between a handler running in its own goroutine and
// the real writer, when a request timeout is set. Once the proxy gives up
// on the handler (close), the handler's writes go nowhere: net/http forbids
// touching a ResponseWriter after ServeHTTP has returned.
type deadlineWriter struct {
	// mu guards header, closed and the use of w.
	mu       sync.Mutex
	w        *statusWriter
	header   http.Header // the handler's own, copied to w on the first write
	closed   bool
	hijacked bool // the handler took the connection over
}

func newDeadlineWriter(w *statusWriter) *deadlineWriter {
	return &deadlineWriter{w: w, header: make(http.Header)}
}

// Header implements http.ResponseWriter. The map is the handler's own, so
// that the proxy can answer 408 without racing on it.
func (dw *deadlineWriter) Header() http.Header { return dw.header }

func (dw *deadlineWriter) copyHeaderLocked() {
	if dw.w.wroteHeader {
		return
	}
	dst := dw.w.Header()
	for k, v := range dw.header {
		dst[k] = v
	}
}

// WriteHeader implements http.ResponseWriter.
func (dw *deadlineWriter) WriteHeader(code int) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return
	}
	dw.copyHeaderLocked()
	dw.w.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (dw *deadlineWriter) Write(b []byte) (int, error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return 0, http.ErrHandlerTimeout
	}
	dw.copyHeaderLocked()
	return dw.w.Write(b)
}

// Flush implements http.Flusher.
func (dw *deadlineWriter) Flush() {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return
	}
	dw.copyHeaderLocked()
	dw.w.Flush()
}

// EnableFullDuplex lets the handler read the request body while it writes
// the response (http.ResponseController finds it here), as a replica in
// another process needs to stream both ways.
func (dw *deadlineWriter) EnableFullDuplex() error {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return http.ErrHandlerTimeout
	}
	return http.NewResponseController(dw.w).EnableFullDuplex()
}

// Hijack implements http.Hijacker. A handler that took its connection
// over is no longer bound by the request's deadline (see close): the
// timeout bounds a WebSocket's handshake, not the session. The header it
// reads from now on is the response's own, with what the proxy set (the
// request id) and what it had set itself.
func (dw *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return nil, nil, http.ErrHandlerTimeout
	}
	c, brw, err := dw.w.Hijack()
	if err != nil {
		return nil, nil, err
	}
	dst := dw.w.Header()
	for k, v := range dw.header {
		dst[k] = v
	}
	dw.header, dw.hijacked = dst, true
	return c, brw, nil
}

// close stops the handler's writes, and reports whether the handler had
// hijacked its connection: then the proxy waits for it to return.
func (dw *deadlineWriter) close() (hijacked bool) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	dw.closed = true
	return dw.hijacked
}

// finish is close for a handler that has returned, with err. What it
// set in the header after writing it (its trailers, which net/http reads
// from the header map once ServeHTTP returns) is passed on, and so is the
// header of a handler that returned nil without writing (an empty 200
// with its headers). A failed handler's header, never written, is not:
// the proxy answers for it.
func (dw *deadlineWriter) finish(err error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.w.wroteHeader || err == nil {
		dst := dw.w.Header()
		for k, v := range dw.header {
			dst[k] = v
		}
	}
	dw.closed = true
}
