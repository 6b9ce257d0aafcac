package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// trackedBody is a request body that records whether it was read to its
// end, and bounds the wait for each part of it (see settleBody).
type trackedBody struct {
	rc     io.ReadCloser
	length int64 // the request's ContentLength: -1 if unknown
	// timeout, if above 0, bounds each read from the client (see
	// Options.ClientBodyTimeout) through setDeadline, the connection's
	// read deadline.
	timeout     time.Duration
	setDeadline func(time.Time) error
	// expect is set for a request that asked for 100-continue; read once
	// the handler read it (net/http then asked the client for it).
	expect   bool
	read     atomic.Bool
	limitHit atomic.Bool // read past PROXY_MAX_BODY_BYTES
	// got counts the bytes read; eof, closed and timedOut are set as they
	// happen. All are read by the handler's goroutine and written by the
	// body reader's, which may be another.
	got                   atomic.Int64
	eof, closed, timedOut atomic.Bool
	// cut is set when a read failed at the handler's own deadline: as
	// after a timed out one, the rest is not read.
	cut atomic.Bool
	// gone is set when a read failed for the connection closing or
	// breaking before the body's end (see connectionGone).
	gone atomic.Bool
	// readDeadline is the deadline of the read in progress (Unix
	// nanoseconds), 0 when none is: see stalled. handlerDeadline is the
	// read deadline the handler set itself, 0 if none (see
	// statusWriter.SetReadDeadline).
	readDeadline, handlerDeadline atomic.Int64
}

// stalled reports whether the client stalled its body: a read timed out,
// or one in progress is past its deadline. (The failing read cancels the
// request's context inside net/http, before it returns here: a replica
// may see the context end first.)
func (b *trackedBody) stalled() bool {
	if b.timedOut.Load() {
		return true
	}
	d := b.readDeadline.Load()
	return d != 0 && time.Now().UnixNano() >= d
}

// readDeadliner is net/http's response writer, which sets its
// connection's read deadline.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// Read implements io.Reader.
func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	// Not after the body's end or its Close: nothing is read from the
	// client then (net/http's body answers at once), and a deadline left
	// would fire in net/http's read for the client's leaving.
	var ours int64 // the proxy's deadline for this read
	if b.timeout > 0 && !b.eof.Load() && !b.closed.Load() {
		d := time.Now().Add(b.timeout)
		ours = d.UnixNano()
		if hd := b.handlerDeadline.Load(); hd != 0 && hd < ours {
			d = time.Unix(0, hd)
		} else {
			b.readDeadline.Store(d.UnixNano())
			defer b.readDeadline.Store(0) // a panic in the read too
		}
		_ = b.setDeadline(d)
	}
	n, err := b.rc.Read(p)
	b.got.Add(int64(n))
	if err != nil && err != io.EOF && connectionGone(err) {
		b.gone.Store(true)
	}
	switch {
	case err == io.EOF:
		b.eof.Store(true)
		fallthrough
	case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
		if b.timeout > 0 {
			// No more to wait for: the body's end (net/http's read for
			// the client's leaving, started there, clears it as well),
			// or a read net/http failed without the client (a body it
			// closed), which must not leave it running.
			_ = b.setDeadline(time.Time{})
		}
	case err != nil && b.timeout > 0:
		// The handler's own deadline, if it came first (set before the
		// read or during it), is no stall of the client's: no 408. Either
		// way the connection cannot go on (net/http ended its context).
		if hd := b.handlerDeadline.Load(); hd != 0 && (ours == 0 || hd <= ours) {
			b.cut.Store(true)
		} else {
			b.timedOut.Store(true)
		}
	}
	return n, err
}

// Close implements io.Closer. net/http's Close reads what is left of a
// small body, to keep the connection: from a client that stalls, for as
// long as it likes, in the handler's goroutine. It is bounded by the
// timeout, once (at once for a 100-continue body never asked for: the
// connection closes anyway); then the deadline goes, whatever came of
// it, as net/http reads no more of a closed body.
func (b *trackedBody) Close() error {
	if b.closed.Swap(true) || b.timeout <= 0 || b.eof.Load() || b.timedOut.Load() || b.cut.Load() {
		// (After a timed out read the deadline is past: net/http's read
		// of the rest fails at once, as it should.)
		return b.rc.Close()
	}
	d := time.Now().Add(b.timeout)
	if b.expect && !b.read.Load() {
		d = time.Now() // never asked for: the connection closes anyway
	}
	_ = b.setDeadline(d)
	err := b.rc.Close()
	_ = b.setDeadline(time.Time{})
	return err
}

// maxDrainBytes is the most of a body left unread that net/http reads
// after the handler, to keep the connection (its maxPostHandlerReadBytes);
// past it, it closes the connection.
const maxDrainBytes = 256 << 10

// lingerTimeout bounds net/http's read of a body's rest after the answer,
// on a connection that then closes: it reads so that the close does not
// reset a connection whose client is still sending (which can lose it the
// answer), and an answer delimited by the close (HTTP/1.0's) ends only
// then. net/http waits as long before closing a connection whose body it
// gave up on (its rstAvoidanceDelay).
const lingerTimeout = 500 * time.Millisecond

// settleBody bounds what net/http reads of a request body that the handler
// left unread, before the response's header goes out: net/http reads up
// to maxDrainBytes of it, to keep the connection, with no deadline. A
// client that stalls its upload would never get its answer (a static
// handler's, a 404), and would hold the connection. Here the rest is read
// first, within one client body timeout: to its end, and the connection
// stays; or not, and a deadline already past makes net/http's own read
// fail at once, so that it answers and closes the connection.
//
// It runs once: when the response's header is about to go out while the
// handler runs (a write past what net/http buffers, a flush, a hijack), or
// when the handler is done (handlerDone). Not while a handler reads full
// duplex, and not where the connection closes after the answer
// (closeIfBodyLeft, closesAfter): there net/http reads the rest only after
// the answer is out, and lingerTimeout then bounds that. Never through
// the 100-continue reader, which would ask the client for the body. A
// drain that fails while the handler runs cancels the request's context,
// as any failed read of its body does.
//
// No deadline is set once the body has reached its end: net/http's read
// for the client's leaving runs from there, and a deadline that fires in
// it cancels the connection's context, and every later request's on it.
//
// It returns errClientLeftDuringBody when the drain at the handler's end
// found the client gone (its connection closed or broken before the body
// came whole, not a stall at the deadline): the answer has nowhere to go.
func (sw *statusWriter) settleBody(handlerDone bool) error {
	if !handlerDone {
		sw.headerOut = true
	}
	b := sw.reqBody
	if b == nil || sw.settled {
		return nil
	}
	if b.eof.Load() {
		sw.settled = true // nothing to wait for
		return nil
	}
	if b.closed.Load() || b.timeout <= 0 {
		// Nothing to bound here: the handler closed it (net/http's Close
		// read what it would), or no timeout is set.
		if handlerDone {
			sw.settled = true
			if sw.fullDuplex || sw.expect || sw.closeSet || sw.closesAfter(true) {
				sw.lingerAtClose()
			}
		}
		return nil
	}
	if b.stalled() || b.cut.Load() {
		// A read failed (or is failing) at a deadline, the proxy's or the
		// handler's (which it may have moved since): net/http's read of
		// the rest must fail too, and close the connection.
		sw.settled = true
		_ = b.setDeadline(time.Now())
		sw.lingerAtClose()
		return nil
	}
	if sw.fullDuplex || sw.expect || sw.closeSet || sw.closesAfter(handlerDone) {
		if handlerDone {
			sw.settled = true
			_ = b.setDeadline(time.Now().Add(min(b.timeout, lingerTimeout)))
			sw.lingerAtClose()
		}
		return nil
	}
	sw.settled = true
	if b.length >= 0 && b.length-b.got.Load() > maxDrainBytes {
		// net/http sees that much left at once, and closes the
		// connection without reading any (it finds its own body in its
		// request: the handler's is a copy).
		return nil
	}
	until := time.Now().Add(b.timeout)
	if !sw.deadline.IsZero() && sw.deadline.Before(until) {
		until = sw.deadline // PROXY_REQUEST_TIMEOUT is the request's, end to end
	}
	_ = b.setDeadline(until)
	_, err := io.CopyN(io.Discard, b.rc, maxDrainBytes+1)
	if err == io.EOF {
		b.eof.Store(true)
		_ = b.setDeadline(time.Time{})
		return nil
	}
	if handlerDone && connectionGone(err) {
		return fmt.Errorf("%w: %w", errClientLeftDuringBody, err)
	}
	// Stalled, broken, or longer than net/http would read: the
	// connection cannot serve another request. (A client still sending
	// may see it reset before it reads the answer, as for any body a
	// server gives up on.)
	_ = b.setDeadline(time.Now())
	sw.lingerAtClose()
	return nil
}

// connectionGone reports whether a read of a request body failed for its
// connection closing or breaking (not a stall at the deadline, nor a
// malformed body, whose client still waits for its answer).
func connectionGone(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// errClientLeftMidBody is why a request whose client's connection closed
// (or half-closed) before the end of the body it declared is a 499.
var errClientLeftMidBody = errors.New("the client left before the end of its request body")

// errClientLeftMidAnswer is why a request whose client left while an
// in-process handler's answer was under way is a 499.
var errClientLeftMidAnswer = errors.New("the client left before the end of its answer")

// errClientLeftDuringBody is why a request whose answer was ready got
// none: its client left while the rest of its body was read (settleBody).
var errClientLeftDuringBody = errors.New("the client left while the rest of its request body was read, before its answer could go out")

// lingerAtClose has net/http half-close the connection after the answer
// and wait lingerTimeout (its rstAvoidanceDelay) before closing it, as it
// does when it gives up on a body of its own: closed at once with a body
// still coming, the connection is reset, and a client still sending (curl)
// fails on its send before it reads the answer. net/http does not wait
// for a body behind its 100-continue reader, nor for one whose read of
// the rest failed short of its 256 KiB (found by a tester: a 401 to a
// 50 MB upload with Expect was lost 4 times in 20). The way to ask for it
// is what http.MaxBytesReader does past its limit; nothing is read.
func (sw *statusWriter) lingerAtClose() {
	_, _ = http.MaxBytesReader(sw.w, io.NopCloser(oneByte{}), 0).Read(make([]byte, 1))
}

// oneByte is a reader with a byte always there: past a MaxBytesReader's
// limit of 0 at once.
type oneByte struct{}

func (oneByte) Read(p []byte) (int, error) { return copy(p, "x"), nil }

// closesAfter reports whether net/http reads the rest of the body only
// after the answer is out, closing the connection after it: the client
// asked (Connection: close, HTTP/1.0 without keep-alive), or the handler
// did. An HTTP/1.0 keep-alive answer, once the handler is done: net/http
// closes the connection unless it can frame the answer, and then reads
// the rest itself, under lingerTimeout. While the handler runs, such an
// answer with a length (a Content-Length, a HEAD's, a 204's) keeps the
// connection, and net/http would read the rest as the header goes out.
func (sw *statusWriter) closesAfter(handlerDone bool) bool {
	h := sw.w.Header()
	closes, framed := sw.headerSays(h)
	if sw.wroteHeader {
		closes, framed = sw.hdrCloses, sw.hdrFramed
	}
	if sw.reqClose || closes {
		return true
	}
	if !sw.http10 {
		return false
	}
	if handlerDone && !sw.headerOut && h["Transfer-Encoding"] == nil && h["Trailer"] == nil {
		// net/http gives a header still unsent a Content-Length of its
		// own (all of the body is in its buffer): a keep-alive answer.
		framed = true
	}
	return !framed
}

// snapHeader records what net/http reads of the header as it is written:
// it ignores the handler's changes after.
func (sw *statusWriter) snapHeader() {
	if sw.reqBody == nil {
		return // nothing to settle: not on the path of a GET
	}
	sw.hdrCloses, sw.hdrFramed = sw.headerSays(sw.w.Header())
}

// headerSays reports what h, the response's header, tells net/http:
// whether the connection closes after it, and whether the answer has a
// length it can frame it by (for HTTP/1.0 keep-alive).
func (sw *statusWriter) headerSays(h http.Header) (closes, framed bool) {
	return connectionCloses(h), sw.head || h["Content-Length"] != nil || !bodyAllowed(sw.status)
}

// bodyAllowed is net/http's bodyAllowedForStatus.
func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// connectionCloses reports whether h, a response's header, says the
// connection closes after it, as net/http reads it.
func connectionCloses(h http.Header) bool {
	// Exactly as chunkWriter.writeHeader reads it: its first value, and
	// only "close" (not "Close", nor "keep-alive, close").
	v := h["Connection"]
	return len(v) > 0 && v[0] == "close"
}

// closeIfBodyLeft marks the response, about to be written, as the
// connection's last when the request body has not been read to its end
// and net/http, writing the header, would not do with the rest what it
// should:
//   - the handler read it full duplex: net/http reads the rest after the
//     handler (up to 256 KiB) and keeps the connection if that read
//     fails, so the rest would be read as the next requests (request
//     smuggling); when it reaches the end, the read it starts there
//     outlives the request, and the next request on the connection panics
//     ("invalid concurrent Body.Read call", golang/go#68560);
//   - the request asked for 100-continue: net/http would read the body it
//     never asked for, from a client waiting for an answer;
//   - a handler read past PROXY_MAX_BODY_BYTES: net/http's own limit
//     would close the connection, but it cannot be told;
//   - the proxy answers itself at the request's deadline (408), or to a
//     body that is not small (a 404, a 503): net/http would read up to
//     256 KiB of it first, from a client that may be sending it slowly,
//     before the answer goes out. A small body it reads at once, and the
//     connection stays (a POST shed with 503 under load).
//
// A replica that answers before the end of the upload (an early 401, a
// failure) costs its client the connection, as with nginx. So does any
// chunked request (see below).
func (sw *statusWriter) closeIfBodyLeft() {
	b := sw.reqBody
	if b != nil && (b.length < 0 || sw.http10) {
		// A chunked body: net/http drops a Content-Length beside it
		// unseen, and RFC 9112 (6.1) has the server close the connection
		// after such a request, as the rest may be another request to a
		// front end that framed it by that length (a tester's two
		// answers to one). Any chunked request's connection closes. So
		// does an HTTP/1.0 request's with a body: net/http drops its
		// Transfer-Encoding unseen (golang/go#12785), framing it by its
		// length, and RFC 9112 has that connection closed too.
		sw.w.Header().Set("Connection", "close")
		sw.closeSet = true
		return
	}
	if b == nil || b.eof.Load() {
		return
	}
	own := sw.own && (sw.status == http.StatusRequestTimeout || b.length < 0 || b.length > smallRequestBody)
	if sw.fullDuplex || sw.expect || own || b.limitHit.Load() {
		sw.w.Header().Set("Connection", "close")
		sw.closeSet = true
	}
}

// smallRequestBody is the most of a request body that the proxy's own
// answer leaves for net/http to read before it goes out (see
// closeIfBodyLeft).
const smallRequestBody = 64 << 10

// limitedBody is a body under http.MaxBytesReader whose error past the
// limit names the setting, for the handler that answers with it (the
// built-in echo): the client learns which limit it met. The error still
// unwraps to the *http.MaxBytesError.
type limitedBody struct {
	io.ReadCloser
	tb *trackedBody // marked past the limit: net/http's requestTooLarge is out of reach
}

// bodyLimitError is limitedBody's error past the limit.
type bodyLimitError struct{ *http.MaxBytesError }

func (e bodyLimitError) Error() string {
	return fmt.Sprintf("request body too large: the limit is %d bytes (PROXY_MAX_BODY_BYTES)", e.Limit)
}

func (e bodyLimitError) Unwrap() error { return e.MaxBytesError }

// Read implements io.Reader.
func (l limitedBody) Read(p []byte) (int, error) {
	n, err := l.ReadCloser.Read(p)
	if mbe, ok := err.(*http.MaxBytesError); ok {
		if l.tb != nil {
			l.tb.limitHit.Store(true)
		}
		err = bodyLimitError{mbe}
	}
	return n, err
}
