package proxy

import (
	"net/http"
	"strconv"
	"sync"
)

// statusWriter records the status and whether anything was written, for
// logs, metrics and error mapping. It is pooled: one per request in flight.
type statusWriter struct {
	w           http.ResponseWriter
	status      int
	wroteHeader bool
	// written counts the body bytes written.
	written int64
	// fullDuplex is set once the handler read the request body full
	// duplex; closing once the proxy answered for it on a connection
	// that closes after (see finishBody).
	fullDuplex, closing bool
}

var statusWriterPool = sync.Pool{New: func() any { return new(statusWriter) }}

func getStatusWriter(w http.ResponseWriter) *statusWriter {
	sw := statusWriterPool.Get().(*statusWriter)
	*sw = statusWriter{w: w}
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
	if !sw.wroteHeader && code >= 200 {
		// 1xx informational headers may precede the real one.
		sw.status, sw.wroteHeader = code, true
	}
	sw.w.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (sw *statusWriter) Write(b []byte) (int, error) {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
	}
	n, err := sw.w.Write(b)
	sw.written += int64(n)
	return n, err
}

// complete reports whether the body written is all that the response's
// Content-Length announced: the client has the whole answer once it is
// flushed.
func (sw *statusWriter) complete() bool {
	cl := sw.w.Header()["Content-Length"]
	if len(cl) != 1 {
		return false
	}
	n, err := strconv.ParseInt(cl[0], 10, 64)
	return err == nil && n == sw.written
}

// Flush implements http.Flusher, so that streamed responses stream.
func (sw *statusWriter) Flush() {
	if !sw.wroteHeader {
		sw.status, sw.wroteHeader = http.StatusOK, true
	}
	if f, ok := sw.w.(http.Flusher); ok {
		f.Flush()
	}
}

// EnableFullDuplex lets the handler read the request body while it writes
// the response (http.ResponseController finds it here), and records that
// it did.
func (sw *statusWriter) EnableFullDuplex() error {
	sw.fullDuplex = true
	return http.NewResponseController(sw.w).EnableFullDuplex()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.w }

// deadlineWriter stands between a handler running in its own goroutine and
// the real writer, when a request timeout is set. Once the proxy gives up
// on the handler (close), the handler's writes go nowhere: net/http forbids
// touching a ResponseWriter after ServeHTTP has returned.
type deadlineWriter struct {
	// mu guards header, closed and the use of w.
	mu     sync.Mutex
	w      *statusWriter
	header http.Header // the handler's own, copied to w on the first write
	closed bool
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

// close stops the handler's writes.
func (dw *deadlineWriter) close() {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	dw.closed = true
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
