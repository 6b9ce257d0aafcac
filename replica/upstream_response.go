package replica

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"
)

// fieldSpan is one header field of a response head being read: its name
// and where its value is in the value scratch.
type fieldSpan struct {
	key        string
	start, end int
}

// errMalformed is a response that is not HTTP/1.x.
type errMalformed struct{ what string }

func (e *errMalformed) Error() string { return "upstream client: malformed response: " + e.what }

// readHead reads the status line and header block of req's answer into
// res (1xx answers skipped), and how its body is framed into the
// responseBody around res.
func (cc *clientConn) readHead(req *http.Request, b *responseBody) (answered bool, err error) {
	res := &b.res
	for n1xx := 0; ; n1xx++ {
		line, err := cc.readLine(maxResponseHeaderBytes)
		if len(line) > 0 || answered {
			answered = true
		}
		if err != nil {
			switch {
			case len(line) > 0 && err == io.EOF:
				// Not unreachable: it answered, and broke off its answer.
				err = &errMalformed{"the connection closed in the middle of the status line"}
			case answered && err == io.EOF:
				err = &errMalformed{"the connection closed after a 1xx answer, before the final one"}
			}
			return answered, err
		}
		answered = true
		code, major, minor, reason, ok := parseStatusLine(line)
		if !ok {
			return true, &errMalformed{fmt.Sprintf("status line %q", truncate(line))}
		}
		res.StatusCode = code
		res.ProtoMajor, res.ProtoMinor = major, minor
		res.Proto = "HTTP/1.1"
		if minor == 0 {
			res.Proto = "HTTP/1.0"
		}
		if code == 200 && reason == "OK" {
			res.Status = "200 OK"
		} else {
			res.Status = strconv.Itoa(code) + " " + reason
		}
		if err := cc.readHeader(res); err != nil {
			if err == io.ErrUnexpectedEOF {
				// Not unreachable: it answered, and broke off its head. (A
				// trailer section broken off is a body cut short.)
				err = &errMalformed{"the connection closed in the middle of the response header"}
			}
			return true, err
		}
		if code >= 100 && code <= 199 {
			if code == http.StatusSwitchingProtocols {
				if req.Header["Upgrade"] == nil {
					return true, &errMalformed{"101 Switching Protocols to a request that asked for no upgrade"}
				}
				// What follows is the new protocol's: no body framing.
				res.Request = req
				return true, nil
			}
			if n1xx >= max1xxResponses {
				return true, &errMalformed{"too many 1xx responses"}
			}
			continue
		}
		break
	}
	res.Request = req
	return true, frame(req, b)
}

// frame sets how b's response body is delimited, from its header (RFC 9112
// section 6): ContentLength, TransferEncoding, Close, the announced
// Trailer keys, and b's own state.
func frame(req *http.Request, b *responseBody) error {
	res := &b.res
	h := res.Header
	conn := h["Connection"]
	if res.ProtoMinor == 0 {
		res.Close = !hasToken(conn, "keep-alive")
	} else {
		res.Close = hasToken(conn, "close")
	}
	b.remaining = -1
	res.ContentLength = -1
	te, hasTE := h["Transfer-Encoding"]
	if hasTE {
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
			return &errMalformed{fmt.Sprintf("unsupported Transfer-Encoding %q", te)}
		}
		delete(h, "Transfer-Encoding")
		delete(h, "Content-Length")
		res.TransferEncoding = chunkedTE
	}
	cl := int64(-1)
	if vv := h["Content-Length"]; len(vv) > 0 {
		for _, v := range vv[1:] {
			if strings.TrimSpace(v) != strings.TrimSpace(vv[0]) {
				return &errMalformed{"differing Content-Length values"}
			}
		}
		n, ok := parseContentLength(strings.TrimSpace(vv[0]))
		if !ok {
			return &errMalformed{fmt.Sprintf("Content-Length %q", vv[0])}
		}
		cl = n
		// Repeats of one value go on as one field, as RFC 9110 (8.6) has
		// a recipient that accepts them do: forwarded as they came, they
		// were two to the client (found by a tester).
		h["Content-Length"] = vv[:1:1]
	}
	if !bodyAllowed(req.Method, res.StatusCode) {
		b.remaining = 0
		switch {
		case req.Method == http.MethodHead:
			res.ContentLength = cl
		default:
			res.ContentLength = 0
		}
		return nil
	}
	switch {
	case hasTE:
		b.chunked = true
		if tr := h["Trailer"]; len(tr) > 0 {
			res.Trailer = make(http.Header)
			for _, v := range tr {
				for f := range strings.SplitSeq(v, ",") {
					if f = strings.TrimSpace(f); f != "" {
						res.Trailer[http.CanonicalHeaderKey(f)] = nil
					}
				}
			}
			delete(h, "Trailer")
		}
	case cl >= 0:
		b.remaining = cl
		res.ContentLength = cl
	default:
		res.Close = true // the body ends with the connection
	}
	return nil
}

var chunkedTE = []string{"chunked"}

// parseContentLength parses 1*DIGIT (no sign, as RFC 9110 section 8.6
// has it, where strconv would take "+0").
func parseContentLength(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' || n > (1<<63-1-9)/10 {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// readLine returns the next line of the head without its CRLF (or LF). It
// points into the reader's buffer or the connection's scratch, valid until
// the next read.
func (cc *clientConn) readLine(limit int) ([]byte, error) {
	line, err := cc.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		cc.line = append(cc.line[:0], line...)
		for err == bufio.ErrBufferFull {
			if len(cc.line) > limit {
				return cc.line, &errMalformed{"response head too long"}
			}
			line, err = cc.br.ReadSlice('\n')
			cc.line = append(cc.line, line...)
		}
		line = cc.line
	}
	if err != nil {
		return line, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// readHeader reads a header block into res.Header, with one string for
// all the values and one slice for their lists.
func (cc *clientConn) readHeader(res *http.Response) error {
	cc.fields, cc.vals = cc.fields[:0], cc.vals[:0]
	total := 0
	for {
		line, err := cc.readLine(maxResponseHeaderBytes)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if total += len(line) + 2; total > maxResponseHeaderBytes {
			return &errMalformed{"response head too long"}
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			// obs-fold (RFC 9112 section 5.2): a continuation of the last
			// value, replaced by a space.
			if len(cc.fields) == 0 {
				return &errMalformed{"a header block beginning with a continuation line"}
			}
			v := trimOWS(line)
			if !validValueBytes(v) {
				return &errMalformed{"header field value"}
			}
			cc.vals = append(cc.vals, ' ')
			cc.vals = append(cc.vals, v...)
			cc.fields[len(cc.fields)-1].end = len(cc.vals)
			continue
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 {
			return &errMalformed{fmt.Sprintf("header line %q", truncate(line))}
		}
		key, ok := canonicalKey(line[:i])
		if !ok {
			return &errMalformed{fmt.Sprintf("header field name %q", truncate(line[:i]))}
		}
		v := trimOWS(line[i+1:])
		if !validValueBytes(v) {
			return &errMalformed{fmt.Sprintf("header field value for %q", key)}
		}
		start := len(cc.vals)
		cc.vals = append(cc.vals, v...)
		cc.fields = append(cc.fields, fieldSpan{key: key, start: start, end: len(cc.vals)})
	}
	vals := string(cc.vals)
	lists := make([]string, len(cc.fields))
	h := make(http.Header, len(cc.fields))
	for i, f := range cc.fields {
		lists[i] = vals[f.start:f.end]
		if have, ok := h[f.key]; ok {
			h[f.key] = append(have, lists[i])
		} else {
			h[f.key] = lists[i : i+1 : i+1]
		}
	}
	res.Header = h
	return nil
}

// parseStatusLine parses "HTTP/1.x 200 Reason".
func parseStatusLine(line []byte) (code, major, minor int, reason string, ok bool) {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return 0, 0, 0, "", false
	}
	switch line[7] {
	case '0':
		minor = 0
	case '1':
		minor = 1
	default:
		return 0, 0, 0, "", false
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, 0, 0, "", false
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return 0, 0, 0, "", false
	}
	if len(line) > 12 {
		if line[12] != ' ' {
			return 0, 0, 0, "", false
		}
		if r := line[13:]; string(r) == "OK" {
			reason = "OK"
		} else {
			reason = string(r)
		}
	}
	return code, 1, minor, reason, true
}

// commonKeys interns the header names servers send most, so that reading
// them allocates nothing.
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept-Ranges", "Access-Control-Allow-Origin", "Age", "Alt-Svc", "Cache-Control",
		"Connection", "Content-Disposition", "Content-Encoding", "Content-Language",
		"Content-Length", "Content-Range", "Content-Security-Policy", "Content-Type", "Date", "Etag",
		"Expires", "Keep-Alive", "Last-Modified", "Link", "Location", "Pragma", "Retry-After",
		"Server", "Set-Cookie", "Strict-Transport-Security", "Trailer", "Transfer-Encoding",
		"Vary", "Via", "Www-Authenticate", "X-Content-Type-Options", "X-Frame-Options",
		"X-Request-Id", "X-Backend", FullHeader,
	} {
		m[k] = k
	}
	return m
}()

// canonicalKey returns name in canonical form (as textproto's), interned
// when common, and false when it is not a token. name is changed in place.
func canonicalKey(name []byte) (string, bool) {
	upper := true
	for i, c := range name {
		if !isTokenByte(c) {
			return "", false
		}
		switch {
		case upper && 'a' <= c && c <= 'z':
			name[i] = c - ('a' - 'A')
		case !upper && 'A' <= c && c <= 'Z':
			name[i] = c + ('a' - 'A')
		}
		upper = c == '-'
	}
	if k, ok := commonKeys[string(name)]; ok {
		return k, true
	}
	return string(name), true
}

func isTokenByte(c byte) bool {
	if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return false
		}
	}
	return true
}

// validValue reports whether s may be sent as a field value: no control
// bytes but HTAB (so no CR or LF that would split the message).
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func validValueBytes(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

// responseBody is a response's body, framed on its connection, and the
// response itself, so that both come in one allocation. The connection goes
// back to the pool when the body has been read to its end.
type responseBody struct {
	res       http.Response
	cc        *clientConn
	stop      func() bool // stops the context's abort; nil if none
	wrote     chan error  // the request body's writer's result; nil if none
	remaining int64       // bytes left with a Content-Length; -1 otherwise
	chunked   bool
	cr        io.Reader // the chunked decoder, made on first read
	done      bool      // the connection is released
	err       error     // what Read returns once done
	bounded   bool      // the connection has a read deadline (readWhole)
}

// readWhole reads the body into p, all of it, bounded as the wait for its
// head was (the response header timeout, replica_timeout_s): to the
// client, which gets the answer once it is whole, it has not begun. A
// replica that stopped partway through a small answer held its request,
// and its slot, for as long as the client waited (a tester).
func (b *responseBody) readWhole(p []byte) error {
	// (Not for a body that came with its head, the common case: nothing
	// to wait for, and two deadline changes saved.)
	if d := b.cc.pool.c.headerTimeout; d > 0 && !b.done && b.cc.br.Buffered() < len(p) {
		b.bounded = true
		_ = b.cc.conn.SetReadDeadline(time.Now().Add(d))
	}
	_, err := io.ReadFull(b, p)
	return err
}

// errBodyClosed is a read of a response body after its Close.
var errBodyClosed = errors.New("upstream client: read on a closed response body")

// Read implements io.Reader.
func (b *responseBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, b.err
	}
	br := b.cc.br
	switch {
	case b.chunked:
		if b.cr == nil {
			b.cr = httputil.NewChunkedReader(br)
		}
		n, err := b.cr.Read(p)
		if err == io.EOF {
			if terr := b.readTrailer(); terr != nil {
				b.fail(terr)
				return n, terr
			}
			b.finish(!b.res.Close)
			return n, io.EOF
		}
		if err != nil {
			b.fail(err)
		}
		return n, err
	case b.remaining >= 0:
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err := br.Read(p)
		b.remaining -= int64(n)
		if b.remaining == 0 {
			b.finish(!b.res.Close)
			return n, io.EOF
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			b.fail(err)
		}
		return n, err
	default: // until the connection closes
		n, err := br.Read(p)
		if err == io.EOF {
			b.finish(false)
		} else if err != nil {
			b.fail(err)
		}
		return n, err
	}
}

// readTrailer reads the trailer section after the last chunk into
// res.Trailer, announced or not (as net/http does).
func (b *responseBody) readTrailer() error {
	var tr http.Response
	if err := b.cc.readHeader(&tr); err != nil {
		return err
	}
	if len(tr.Header) == 0 {
		return nil
	}
	if b.res.Trailer == nil {
		b.res.Trailer = make(http.Header, len(tr.Header))
	}
	for k, vv := range tr.Header {
		b.res.Trailer[k] = append(b.res.Trailer[k], vv...)
	}
	return nil
}

// Close implements io.Closer. A body not read to its end costs its
// connection.
func (b *responseBody) Close() error {
	if !b.done {
		b.fail(errBodyClosed)
	}
	b.err = errBodyClosed
	return nil
}

// finish releases the connection at the body's end: back to the pool when
// reuse says so, the request's body is written, and the context's abort
// did not fire.
func (b *responseBody) finish(reuse bool) {
	b.done, b.err = true, io.EOF
	if b.res.Request.Close {
		reuse = false // the request said it was the connection's last
	}
	if b.stop != nil && !b.stop() {
		reuse = false // the abort closed it, or is closing it
	}
	if b.wrote != nil {
		var werr error
		select {
		case werr = <-b.wrote:
		default:
			t := time.NewTimer(maxWriteWait)
			select {
			case werr = <-b.wrote:
			case <-t.C:
				werr = errors.New("the request body is still being sent")
			}
			t.Stop()
		}
		if werr != nil {
			reuse = false
		}
	}
	if b.cc.br.Buffered() > 0 {
		// The server sent more than its answer (a body on a 204, say):
		// the next request's answer would begin with it.
		reuse = false
	}
	if reuse && b.bounded && b.cc.conn.SetReadDeadline(time.Time{}) != nil {
		reuse = false
	}
	if reuse {
		b.cc.pool.put(b.cc)
	} else {
		b.cc.close()
	}
}

// fail releases the connection after err, closing it.
func (b *responseBody) fail(err error) {
	b.done, b.err = true, err
	if b.stop != nil {
		b.stop()
	}
	b.cc.close()
}
