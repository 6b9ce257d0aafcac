package front

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// bufferBeforeHeader is how much of a body waits for the handler's end
// before the header goes: an answer whole by then gets a Content-Length,
// a longer or flushed one is chunked. It is net/http's
// bufferBeforeChunkingSize.
const bufferBeforeHeader = 2048

// outBufferSize is how much output gathers before a write to the socket
// while a body streams (net/http's connection buffer).
const outBufferSize = 4 << 10

// response is the http.ResponseWriter of a request the lean path serves.
// It frames answers as net/http's server does for HTTP/1.1 (see
// net/http's chunkWriter.writeHeader, which it follows rule for rule).
// The header block is written out when the handler calls WriteHeader, a
// snapshot as net/http takes one; the headers that depend on the body
// (Content-Length, a sniffed Content-Type, Transfer-Encoding) follow once
// the first part of the body, or its end, is known.
type response struct {
	c   *conn
	req *http.Request

	header        http.Header // the handler's
	status        int
	wroteHeader   bool  // WriteHeader ran (a final status)
	headerDone    bool  // the whole header block is in out
	contentLength int64 // declared or computed; -1 if unknown
	written       int64 // body bytes the handler wrote
	closeAfter    bool  // the connection closes after this answer
	chunking      bool
	handlerDone   bool
	hijacked      bool
	writeDeadline atomic.Bool // the handler set one: cleared after the answer (set from any goroutine)
	readDeadline  atomic.Bool // likewise, replaced before the next request's read

	// Decided at WriteHeader for the rest of the header block.
	trailers  bool     // declared: the body is chunked
	declared  []string // the names in the Trailer header
	hasTE     bool
	badLength bool // the handler's Content-Length did not parse
	// lengthDropped: the handler set both Content-Length and a
	// Transfer-Encoding; the header goes, the length still counts.
	lengthDropped bool
	teIdentity    bool
	addDate       bool
	sniff         bool // a Content-Type is to be sniffed
	connClose     bool // a "Connection: close" is to be added

	body []byte // the body before the header is done (bufferBeforeHeader)
	out  []byte // bytes for the socket
	werr error  // the first write error: the connection is done
}

// reset readies w for a new request.
func (w *response) reset(req *http.Request) {
	*w = response{c: w.c, req: req, contentLength: -1, body: w.body[:0], out: w.out[:0], declared: w.declared[:0]}
}

// Header implements http.ResponseWriter.
func (w *response) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// WriteHeader implements http.ResponseWriter.
func (w *response) WriteHeader(code int) {
	switch {
	case w.hijacked:
		w.c.s.logf("http: response.WriteHeader on hijacked connection")
		return
	case w.wroteHeader:
		w.c.s.logf("http: superfluous response.WriteHeader call")
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	h := w.Header()
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// An informational answer goes at once, with the headers set so
		// far (103 Early Hints).
		w.out = appendStatusLine(w.out, code)
		w.writeHeaderSubset(h, excludedNoBody)
		w.out = append(w.out, "\r\n"...)
		w.flushOut()
		return
	}
	w.wroteHeader = true
	w.status = code
	if cl := h.Get("Content-Length"); cl != "" {
		v, err := strconv.ParseInt(cl, 10, 64)
		if err == nil && v >= 0 {
			w.contentLength = v
		} else {
			// net/http deletes it from the handler's header, but its
			// snapshot, taken before, still has it: no length of its
			// own then, and the header is sent but for a chunked body.
			w.c.s.logf("http: invalid Content-Length of %q", cl)
			w.badLength = true
		}
	}
	w.startHeader(h)
	if w.badLength {
		h.Del("Content-Length")
	}
}

// excludedNoBody are the headers an answer without a body does not send.
var excludedNoBody = map[string]bool{"Content-Length": true, "Transfer-Encoding": true}

// startHeader writes the status line and the handler's headers, leaving
// out those net/http's server removes or replaces, and decides the rest.
func (w *response) startHeader(h http.Header) {
	var exclude map[string]bool
	del := func(k string) {
		if _, ok := h[k]; !ok {
			return
		}
		if exclude == nil {
			exclude = map[string]bool{}
		}
		exclude[k] = true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			del(k)
			w.trailers = true
		}
	}
	for _, v := range h["Trailer"] {
		w.trailers = true
		for _, name := range strings.Split(v, ",") {
			if name = http.CanonicalHeaderKey(strings.TrimSpace(name)); name != "" && validTrailer(name) {
				w.declared = append(w.declared, name)
			}
		}
	}
	te := h.Get("Transfer-Encoding")
	w.hasTE = te != ""
	w.teIdentity = te == "identity"
	code := w.status
	isHEAD := w.req.Method == http.MethodHead

	if w.req.Close || h.Get("Connection") == "close" || w.c.s.shuttingDown() {
		w.closeAfter = true
	}
	if bodyAllowedForStatus(code) {
		_, haveType := h["Content-Type"]
		w.sniff = !haveType && h.Get("Content-Encoding") == "" && !w.hasTE
	} else {
		for _, k := range suppressedHeaders(code) {
			del(k)
		}
	}
	_, hasDate := h["Date"]
	w.addDate = !hasDate
	if w.contentLength != -1 && w.hasTE && !w.teIdentity {
		// The header goes; the length still bounds the body and the
		// connection's reuse, as in net/http.
		w.c.s.logf("http: WriteHeader called with both Transfer-Encoding of %q and a Content-Length of %d", te, w.contentLength)
		del("Content-Length")
		w.lengthDropped = true
	}
	if w.badLength && !isHEAD && bodyAllowedForStatus(code) && code != http.StatusNoContent && !w.teIdentity {
		del("Content-Length") // net/http's snapshot kept it; chunking drops it
	}
	switch {
	case isHEAD || !bodyAllowedForStatus(code):
		del("Transfer-Encoding")
	case w.contentLength != -1 && !w.lengthDropped:
		del("Transfer-Encoding")
	case w.teIdentity:
		w.closeAfter = true
		del("Transfer-Encoding")
	case w.hasTE && te == "chunked":
		del("Transfer-Encoding") // written once, by finishHeader
	}
	if w.closeAfter && (w.c.s.shuttingDown() || !hasCloseToken(h.Get("Connection"))) && !isProtocolSwitch(code, h) {
		del("Connection")
		w.connClose = true
	}
	w.out = appendStatusLine(w.out, code)
	w.writeHeaderSubset(h, exclude)
}

// finishHeader ends the header block, p being the first part of the body
// (all of it once the handler is done).
func (w *response) finishHeader(p []byte) {
	w.headerDone = true
	code := w.status
	isHEAD := w.req.Method == http.MethodHead
	autoLength := w.handlerDone && !w.badLength && !w.trailers && !w.hasTE && bodyAllowedForStatus(code) && w.contentLength == -1 && (!isHEAD || len(p) > 0)
	if autoLength {
		w.contentLength = int64(len(p))
	}
	if !isHEAD && bodyAllowedForStatus(code) && code != http.StatusNoContent && (w.contentLength == -1 || w.lengthDropped) && !w.teIdentity {
		w.chunking = true
	}
	out := w.out
	if w.addDate {
		out = append(out, "Date: "...)
		out = appendDate(out)
		out = append(out, "\r\n"...)
	}
	if autoLength {
		out = append(out, "Content-Length: "...)
		out = strconv.AppendInt(out, w.contentLength, 10)
		out = append(out, "\r\n"...)
	}
	if w.sniff && len(p) > 0 {
		out = append(out, "Content-Type: "...)
		out = append(out, http.DetectContentType(p)...)
		out = append(out, "\r\n"...)
	}
	if w.connClose {
		out = append(out, "Connection: close\r\n"...)
	}
	if w.chunking {
		out = append(out, "Transfer-Encoding: chunked\r\n"...)
	}
	w.out = append(out, "\r\n"...)
}

// Write implements http.ResponseWriter.
func (w *response) Write(p []byte) (int, error) { return w.write(len(p), p, "") }

// WriteString implements io.StringWriter.
func (w *response) WriteString(s string) (int, error) { return w.write(len(s), nil, s) }

// write is Write of p or WriteString of s, as net/http's: its buffer of
// bufferBeforeHeader bytes in front of the framing is a bufio.Writer's,
// which passes a large p on whole when it is empty and cuts a large s
// in pieces of its size.
func (w *response) write(n int, p []byte, s string) (int, error) {
	if w.hijacked {
		if n > 0 {
			w.c.s.logf("http: response.Write on hijacked connection")
		}
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if n == 0 {
		return 0, nil
	}
	if !bodyAllowedForStatus(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(n)
	if w.contentLength != -1 && w.written > w.contentLength {
		return 0, http.ErrContentLength
	}
	for len(p)+len(s) > bufferBeforeHeader-len(w.body) && w.werr == nil {
		if p != nil && len(w.body) == 0 {
			w.writeBody(p)
			return n, w.werr
		}
		var k int
		if p != nil {
			k = copy(w.body[len(w.body):bufferBeforeHeader], p)
			p = p[k:]
		} else {
			k = copy(w.body[len(w.body):bufferBeforeHeader], s)
			s = s[k:]
		}
		w.body = w.body[:len(w.body)+k]
		w.writeBody(w.body)
		w.body = w.body[:0]
	}
	if w.werr != nil {
		return 0, w.werr
	}
	w.body = append(w.body, p...)
	w.body = append(w.body, s...)
	return n, nil
}

// writeBody frames one part of the body (after the header, if not out).
func (w *response) writeBody(p []byte) {
	if !w.headerDone {
		w.finishHeader(p)
	}
	if w.req.Method == http.MethodHead || len(p) == 0 {
		return
	}
	if w.chunking {
		w.out = strconv.AppendInt(w.out, int64(len(p)), 16)
		w.out = append(w.out, "\r\n"...)
		w.appendOut(p)
		w.out = append(w.out, "\r\n"...)
		return
	}
	w.appendOut(p)
}

// appendOut adds p to what goes out, writing when the buffer fills; a
// large p goes to the socket as it is.
func (w *response) appendOut(p []byte) {
	if len(w.out)+len(p) > outBufferSize {
		w.flushOut()
		if len(p) >= outBufferSize {
			if w.werr == nil {
				_, w.werr = w.c.rwc.Write(p)
				w.failed()
			}
			return
		}
	}
	w.out = append(w.out, p...)
}

// flushOut writes what is gathered to the socket.
func (w *response) flushOut() {
	if len(w.out) > 0 && w.werr == nil {
		_, w.werr = w.c.rwc.Write(w.out)
		w.failed()
	}
	w.out = w.out[:0]
}

// failed closes the connection after a write failed, and ends the
// request's context, as net/http does: the client is gone, or cannot
// tell where the answer broke off.
func (w *response) failed() {
	if w.werr != nil {
		_ = w.c.rwc.Close()
		w.c.mu.Lock()
		cancel := w.c.cancel
		w.c.mu.Unlock()
		cancel()
	}
}

// Flush implements http.Flusher.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError sends what the handler wrote so far (http.ResponseController
// finds it here).
func (w *response) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	w.frameBuffered()
	w.flushOut()
	return w.werr
}

// frameBuffered puts what the handler wrote so far in out, after the
// header (written now if it was not).
func (w *response) frameBuffered() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(w.body) > 0 {
		w.writeBody(w.body)
		w.body = w.body[:0]
	} else if !w.headerDone {
		w.finishHeader(nil)
	}
}

// finish ends the answer once the handler has returned: the header if
// not out, the body, the last chunk and the trailers.
func (w *response) finish() {
	w.handlerDone = true
	w.frameBuffered()
	if w.chunking {
		w.out = append(w.out, "0\r\n"...)
		if t := w.finalTrailers(); t != nil {
			w.writeHeaderSubset(t, nil)
		}
		w.out = append(w.out, "\r\n"...)
	}
	w.flushOut()
}

// finalTrailers are the trailers the handler set, as net/http gathers
// them: keys with http.TrailerPrefix, and the names it declared.
func (w *response) finalTrailers() http.Header {
	var t http.Header
	for k, vv := range w.header {
		if kk, found := strings.CutPrefix(k, http.TrailerPrefix); found {
			if t == nil {
				t = make(http.Header)
			}
			t[kk] = vv
		}
	}
	for _, k := range w.declared {
		if t == nil {
			t = make(http.Header)
		}
		for _, v := range w.header[k] {
			t.Add(k, v)
		}
	}
	return t
}

// reusable reports whether the connection may serve another request.
func (w *response) reusable() bool {
	if w.closeAfter || w.werr != nil {
		return false
	}
	return w.req.Method == http.MethodHead || w.contentLength == -1 || !bodyAllowedForStatus(w.status) || w.contentLength == w.written
}

// Hijack implements http.Hijacker: the handler takes the connection,
// with any bytes the client sent after the request.
func (w *response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.handlerDone {
		panic("net/http: Hijack called after ServeHTTP finished")
	}
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.wroteHeader {
		if !w.headerDone {
			w.finishHeader(nil)
		}
		w.flushOut()
	}
	w.body = w.body[:0]
	w.hijacked = true
	rwc := w.c.hijack()
	return rwc, bufio.NewReadWriter(bufio.NewReader(rwc), bufio.NewWriter(rwc)), nil
}

// CloseNotify implements the deprecated http.CloseNotifier, as net/http's
// writer does: the channel receives once the request's context ends
// while the handler runs (its client left).
func (w *response) CloseNotify() <-chan bool {
	ch := make(chan bool, 1)
	ctx := w.req.Context()
	go func() {
		<-ctx.Done()
		ch <- true
	}()
	return ch
}

// SetReadDeadline sets the connection's read deadline
// (http.ResponseController finds it here).
func (w *response) SetReadDeadline(t time.Time) error {
	w.readDeadline.Store(true)
	return w.c.rwc.SetReadDeadline(t)
}

// SetWriteDeadline sets the connection's write deadline
// (http.ResponseController finds it here).
func (w *response) SetWriteDeadline(t time.Time) error {
	w.writeDeadline.Store(true)
	return w.c.rwc.SetWriteDeadline(t)
}

// EnableFullDuplex is a no-op: the requests the lean path serves have no
// body to read while the answer is written.
func (w *response) EnableFullDuplex() error { return nil }

// writeHeaderSubset appends h's fields but those in exclude, as
// http.Header.WriteSubset writes them: sorted by name, a name that is no
// token skipped, newlines in values made spaces, values trimmed. A header
// of up to 16 names (the usual) is sorted here, on the stack.
func (w *response) writeHeaderSubset(h http.Header, exclude map[string]bool) {
	if len(h) == 0 {
		return
	}
	if len(h) > 16 {
		_ = h.WriteSubset((*appendWriter)(&w.out), exclude)
		return
	}
	var names [16]string
	n := 0
	for k := range h {
		if !exclude[k] {
			names[n] = k
			n++
		}
	}
	for i := 1; i < n; i++ {
		for j := i; j > 0 && names[j] < names[j-1]; j-- {
			names[j], names[j-1] = names[j-1], names[j]
		}
	}
	out := w.out
	for _, k := range names[:n] {
		if !validToken([]byte(k)) {
			continue
		}
		for _, v := range h[k] {
			out = append(out, k...)
			out = append(out, ": "...)
			out = appendFieldValue(out, v)
			out = append(out, "\r\n"...)
		}
	}
	w.out = out
}

// appendFieldValue appends v with CR and LF made spaces, then trimmed of
// spaces and tabs, as http.Header.Write writes a value.
func appendFieldValue(b []byte, v string) []byte {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return append(b, v...)
}

// appendWriter is an io.Writer (and io.StringWriter) appending to a slice.
type appendWriter []byte

func (a *appendWriter) Write(p []byte) (int, error) {
	*a = append(*a, p...)
	return len(p), nil
}

func (a *appendWriter) WriteString(s string) (int, error) {
	*a = append(*a, s...)
	return len(s), nil
}

// appendStatusLine appends an HTTP/1.1 status line.
func appendStatusLine(b []byte, code int) []byte {
	if code == http.StatusOK {
		return append(b, "HTTP/1.1 200 OK\r\n"...)
	}
	b = append(b, "HTTP/1.1 "...)
	if text := http.StatusText(code); text != "" {
		b = strconv.AppendInt(b, int64(code), 10)
		b = append(b, ' ')
		b = append(b, text...)
		return append(b, "\r\n"...)
	}
	return fmt.Appendf(b, "%03d status code %d\r\n", code, code)
}

// bodyAllowedForStatus reports whether an answer with this status has a
// body.
func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199, status == http.StatusNoContent, status == http.StatusNotModified:
		return false
	}
	return true
}

// suppressedHeaders are the headers an answer with this status does not
// send.
func suppressedHeaders(status int) []string {
	switch {
	case status == http.StatusNotModified:
		return []string{"Content-Type", "Content-Length", "Transfer-Encoding"}
	case !bodyAllowedForStatus(status):
		return []string{"Content-Length", "Transfer-Encoding"}
	}
	return nil
}

// hasCloseToken reports whether a Connection header's value holds the
// token close, as net/http's hasToken finds it (spaces, tabs and commas
// separate tokens).
func hasCloseToken(v string) bool {
	const token = "close"
	for sp := 0; sp+len(token) <= len(v); sp++ {
		if sp > 0 && !isTokenBoundary(v[sp-1]) {
			continue
		}
		if end := sp + len(token); end != len(v) && !isTokenBoundary(v[end]) {
			continue
		}
		if asciiEqualFold(v[sp:sp+len(token)], token) {
			return true
		}
	}
	return false
}

func isTokenBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }

// isProtocolSwitch reports whether an answer switches protocols (a 101
// with Upgrade), whose Connection header net/http leaves alone.
func isProtocolSwitch(code int, h http.Header) bool {
	if code != http.StatusSwitchingProtocols || h.Get("Upgrade") == "" {
		return false
	}
	for _, v := range h["Connection"] {
		for opt := range strings.SplitSeq(v, ",") {
			if asciiEqualFold(strings.TrimSpace(opt), "upgrade") {
				return true
			}
		}
	}
	return false
}

// validTrailer reports whether a declared trailer may be sent (net/http
// drops the fields a trailer must not carry).
func validTrailer(name string) bool {
	if strings.HasPrefix(name, "If-") {
		return false
	}
	switch name {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Range", "Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards", "Pragma",
		"Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Range", "Realm", "Te",
		"Trailer", "Transfer-Encoding", "Www-Authenticate":
		return false
	}
	return true
}
