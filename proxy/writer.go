package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
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
	// reqClose is set when the client asked for the connection to close
	// after the answer (Connection: close, HTTP/1.0 without keep-alive);
	// http10 for an HTTP/1.0 request, head for a HEAD; closeSet when
	// closeIfBodyLeft did; settled once settleBody is done.
	reqClose, http10, head, closeSet, settled bool
	// headerOut is set once the response's header went out while the
	// handler ran (see settleBody).
	headerOut bool
	// hdrCloses and hdrFramed are what net/http reads of the header when
	// it is written (its snapshot): see closesAfter.
	hdrCloses, hdrFramed bool

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
	// cutAtDeadline is set when the request timeout cut a write in
	// progress (see deadlineWriter.close): its failure is no client's.
	cutAtDeadline bool
	// deadline is the request timeout's end (zero if none): it bounds the
	// read of a body left unread too (see settleBody).
	deadline time.Time
	writeErr error
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
	return sw.sendArmed && !sw.cutAtDeadline && sw.writeErr != nil && errors.Is(sw.writeErr, os.ErrDeadlineExceeded)
}

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
		sw.snapHeader()
	}
	sw.w.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (sw *statusWriter) Write(b []byte) (int, error) {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
		sw.closeIfBodyLeft()
		sw.snapHeader()
	}
	if sw.sent+len(b) > bufferedBody {
		sw.settleBody(false) // the header goes out with this write
		if sw.sendTimeout > 0 {
			sw.armSend()
		}
	}
	n, err := sw.w.Write(b)
	sw.sent += n
	if err != nil && sw.writeErr == nil {
		sw.writeErr = err
	}
	return n, err
}

// answerWhole reports whether the handler wrote all of its answer: one
// with no body (to a HEAD, a 1xx, 204 or 304), or all of the body its
// Content-Length declared.
func (sw *statusWriter) answerWhole(head bool) bool {
	if head || !bodyAllowed(sw.status) {
		return true
	}
	n, ok := declaredLength(sw.w.Header())
	return ok && sw.sent >= n
}

// declaredLength is the body length h's Content-Length declares, if it
// declares one.
func declaredLength(h http.Header) (int, bool) {
	v := h["Content-Length"]
	if len(v) == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(v[0])
	return n, err == nil
}

// Flush implements http.Flusher, so that streamed responses stream.
func (sw *statusWriter) Flush() { _ = sw.FlushError() }

// FlushError is Flush with the error of the write it made (net/http's
// own, which http.ResponseController.Flush finds here).
func (sw *statusWriter) FlushError() error {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
		sw.closeIfBodyLeft()
		sw.snapHeader()
	}
	sw.settleBody(false)
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
	if b := sw.reqBody; sw.wroteHeader && b != nil && !b.eof.Load() {
		// net/http took its header already: the Connection: close that
		// full duplex needs (see closeIfBodyLeft) cannot be added.
		return errFullDuplexAfterHeader
	}
	sw.fullDuplex = true
	return http.NewResponseController(sw.w).EnableFullDuplex()
}

// SetReadDeadline lets a handler bound its reads of the request body
// itself (http.ResponseController finds it here): the earlier of its
// deadline and the client body timeout applies to each read, and only the
// timeout's makes the request a 408.
func (sw *statusWriter) SetReadDeadline(t time.Time) error {
	if b := sw.reqBody; b != nil {
		var ns int64
		if !t.IsZero() {
			ns = t.UnixNano()
		}
		b.handlerDeadline.Store(ns)
	}
	return http.NewResponseController(sw.w).SetReadDeadline(t)
}

var errFullDuplexAfterHeader = errors.New("EnableFullDuplex after WriteHeader, with the request body unread, is not supported")

// Hijack implements http.Hijacker: a handler (a WebSocket, relayed to a
// replica in another process or served in process) takes the connection
// over. It is kept track of, for the graceful shutdown, and the request is
// recorded as 101 Switching Protocols.
func (sw *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if sw.wroteHeader {
		sw.settleBody(false) // net/http's Hijack flushes the header
	}
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
	// mu guards header, closed, what is held and the use of w.
	mu       sync.Mutex
	w        *statusWriter
	header   http.Header // the handler's own, copied to w as the answer begins
	closed   bool
	hijacked bool // the handler took the connection over
	// expired is set at the deadline, before mu is taken: a write to
	// come goes nowhere, and one in progress (writing counts them),
	// which holds mu for as long as its client takes to read, is cut
	// by a write deadline in the past.
	expired atomic.Bool
	writing atomic.Int32
	// refused is set when a Write came after the deadline and went
	// nowhere: a handler that then returned did not finish its answer.
	refused atomic.Bool

	// The answer's beginning is held here, as net/http holds it (up to
	// bufferedBody bytes of body, the header with them), until the
	// handler writes past that, flushes or returns: at the deadline, an
	// answer still held is dropped for a clean 408. One in net/http's
	// buffer could be neither sent nor taken back: the connection was
	// cut with nothing sent, and a tester's Go client sent its GET again.
	// heldCode is the status WriteHeader gave (0 for none); heldHeader
	// the header as it was then, or at the first write; begun is set
	// once what was held went to w.
	heldCode   int
	heldHeader http.Header
	held       *[]byte
	begun      bool
}

// heldPool holds the bodies deadline writers hold.
var heldPool = sync.Pool{New: func() any { b := make([]byte, 0, bufferedBody); return &b }}

func newDeadlineWriter(w *statusWriter) *deadlineWriter {
	return &deadlineWriter{w: w, header: make(http.Header)}
}

// holdHeaderLocked takes the header the answer goes out with, when the
// handler decides it (its WriteHeader, first write or flush): what it
// sets after is not sent, as with net/http, but for its trailers. mu must
// be held.
func (dw *deadlineWriter) holdHeaderLocked() {
	if dw.heldHeader == nil {
		dw.heldHeader = dw.header.Clone()
	}
}

// beginAnswerLocked hands what the handler has written so far to w: the
// answer has begun. mu must be held.
func (dw *deadlineWriter) beginAnswerLocked() error {
	dw.begun = true
	if !dw.w.wroteHeader {
		h := dw.heldHeader
		if h == nil {
			h = dw.header // a Flush or Hijack before anything was written
		}
		maps.Copy(dw.w.Header(), h)
	}
	if dw.heldCode != 0 {
		dw.w.WriteHeader(dw.heldCode)
	}
	if dw.held == nil {
		return nil
	}
	_, err := dw.w.Write(*dw.held)
	dw.dropHeldLocked()
	return err
}

// dropHeldLocked gives back the held body. mu must be held.
func (dw *deadlineWriter) dropHeldLocked() {
	if dw.held != nil {
		*dw.held = (*dw.held)[:0]
		heldPool.Put(dw.held)
		dw.held = nil
	}
}

// Header implements http.ResponseWriter. The map is the handler's own, so
// that the proxy can answer 408 without racing on it.
func (dw *deadlineWriter) Header() http.Header { return dw.header }

// WriteHeader implements http.ResponseWriter.
func (dw *deadlineWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// In the handler's goroutine, as net/http does: later, in the
		// proxy's, it would be no panic of the handler's.
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed || dw.expired.Load() {
		return
	}
	if dw.begun || code < 200 && code != http.StatusSwitchingProtocols {
		// An informational header (103 Early Hints) goes out at once, as
		// net/http sends it.
		if !dw.w.wroteHeader {
			maps.Copy(dw.w.Header(), dw.header)
		}
		dw.w.WriteHeader(code)
		return
	}
	if dw.heldHeader == nil {
		// Not after a Write's implicit 200: net/http keeps that one (a
		// review: "partial", then http.Error's 500, went out a 500).
		dw.heldCode = code
		dw.holdHeaderLocked()
	}
}

// Write implements http.ResponseWriter.
func (dw *deadlineWriter) Write(b []byte) (int, error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed || dw.expired.Load() {
		// Bytes that went nowhere: the answer is cut. (A flush refused
		// is not: the bytes written before the deadline go out as the
		// handler returns.)
		dw.refused.Store(true)
		return 0, http.ErrHandlerTimeout
	}
	if !dw.begun {
		dw.holdHeaderLocked()
		if err := dw.heldWriteErrLocked(len(b)); err != nil {
			return 0, err
		}
		if dw.held == nil {
			dw.held = heldPool.Get().(*[]byte)
		}
		if len(*dw.held)+len(b) <= bufferedBody {
			*dw.held = append(*dw.held, b...)
			return len(b), nil
		}
	}
	if !dw.beginWriteLocked() {
		dw.refused.Store(true)
		return 0, http.ErrHandlerTimeout
	}
	defer dw.writing.Add(-1)
	if !dw.begun {
		if err := dw.beginAnswerLocked(); err != nil {
			return 0, err
		}
	}
	return dw.w.Write(b)
}

// Flush implements http.Flusher.
func (dw *deadlineWriter) Flush() {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if !dw.beginWriteLocked() {
		return
	}
	defer dw.writing.Add(-1)
	if !dw.begun {
		dw.holdHeaderLocked()
		if dw.beginAnswerLocked() != nil {
			return
		}
	}
	dw.w.Flush()
}

// heldWriteErrLocked is the error net/http's Write gives for n more bytes of
// the answer held: none for a status without a body, none past the
// declared Content-Length. mu must be held.
func (dw *deadlineWriter) heldWriteErrLocked(n int) error {
	if dw.heldCode != 0 && !bodyAllowed(dw.heldCode) {
		return http.ErrBodyNotAllowed
	}
	if declared, ok := declaredLength(dw.heldHeader); ok {
		held := 0
		if dw.held != nil {
			held = len(*dw.held)
		}
		if held+n > declared {
			return http.ErrContentLength
		}
	}
	return nil
}

// beginWriteLocked counts a write that may reach the connection, unless
// the deadline passed; false if it did. mu must be held.
func (dw *deadlineWriter) beginWriteLocked() bool {
	if dw.closed || dw.expired.Load() {
		return false
	}
	// Counted, then expired read again: close reads them the other way
	// round, so that it sees this write or this write sees it.
	dw.writing.Add(1)
	if dw.expired.Load() {
		dw.writing.Add(-1)
		return false
	}
	return true
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

// SetReadDeadline lets the handler bound its reads of the body (see
// statusWriter.SetReadDeadline).
func (dw *deadlineWriter) SetReadDeadline(t time.Time) error {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed {
		return http.ErrHandlerTimeout
	}
	return dw.w.SetReadDeadline(t)
}

// Hijack implements http.Hijacker. A handler that took its connection
// over is no longer bound by the request's deadline (see close): the
// timeout bounds a WebSocket's handshake, not the session. The header it
// reads from now on is the response's own, with what the proxy set (the
// request id) and what it had set itself.
func (dw *deadlineWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if dw.closed || dw.expired.Load() {
		// Past the deadline: close may be setting the write deadline of
		// a write it saw, which must not land on a taken connection.
		return nil, nil, http.ErrHandlerTimeout
	}
	if !dw.begun {
		// net/http's Hijack sends a header written before it (a 101).
		if err := dw.beginAnswerLocked(); err != nil {
			return nil, nil, err
		}
	}
	c, brw, err := dw.w.Hijack()
	if err != nil {
		return nil, nil, err
	}
	dst := dw.w.Header()
	maps.Copy(dst, dw.header)
	dw.header, dw.hijacked = dst, true
	return c, brw, nil
}

// close stops the handler's writes at the deadline, cutting one in
// progress, and reports whether the handler had hijacked its connection
// (then the proxy waits for it to return) and whether it cut a write.
// Before, a write to a client reading slowly (20 MB, 64 KiB at a time)
// held the deadline back for as long as it took: the request then stood
// as a 200 at three times its timeout.
func (dw *deadlineWriter) close() (hijacked, cut bool) {
	dw.expired.Store(true)
	if dw.writing.Load() > 0 {
		cut = true
		_ = http.NewResponseController(dw.w).SetWriteDeadline(time.Now())
	}
	dw.mu.Lock()
	defer dw.mu.Unlock()
	dw.closed = true
	dw.w.cutAtDeadline = cut
	dw.dropHeldLocked() // not begun: the proxy answers 408
	return dw.hijacked, cut
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
	if err == nil && !dw.begun && !dw.closed {
		_ = dw.beginAnswerLocked() // its failure is the statusWriter's to note
	}
	dw.dropHeldLocked() // a failed handler's answer, not begun: the proxy answers for it
	if dw.w.wroteHeader || err == nil {
		maps.Copy(dw.w.Header(), dw.header)
	}
	dw.closed = true
}
