package front

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// parseHead parses a request head: the request line and header lines up
// to and including the empty line, each ending in CRLF. It takes only the
// plain requests the lean path serves: HTTP/1.1, a method other than
// CONNECT, an origin-form target, one valid Host, and no body (no
// Content-Length, Transfer-Encoding or Expect), no Upgrade, and no
// Connection option but close and keep-alive. Anything else, malformed
// or merely unusual, is not ok: net/http takes the connection over and
// answers it as it answers any request, a 400 included.
//
// The request it returns is as net/http's server builds it: Host moved
// out of the header, Pragma: no-cache mirrored in Cache-Control, Close
// from the Connection header, and an empty Body.
func parseHead(head []byte) (req *http.Request, ok bool) {
	line, rest, ok := cutLine(head)
	if !ok {
		return nil, false
	}
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return nil, false
	}
	method, rest1 := line[:sp], line[sp+1:]
	target, found := bytes.CutSuffix(rest1, []byte(" HTTP/1.1"))
	if !found || len(target) == 0 || target[0] != '/' || !plainTarget(target) || !validToken(method) || string(method) == http.MethodConnect {
		return nil, false
	}
	requestURI := string(target)
	u, err := url.ParseRequestURI(requestURI)
	if err != nil {
		return nil, false
	}

	// The values share one backing array, as textproto's reader does.
	lines := max(bytes.Count(rest, []byte("\n"))-1, 0)
	values := make([]string, lines)
	header := make(http.Header, lines)
	var host string
	var hosts int
	closeConn := false
	for {
		line, rest, ok = cutLine(rest)
		if !ok {
			return nil, false
		}
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validToken(line[:colon]) {
			return nil, false // an obs-fold, a name with a space, no colon
		}
		rawValue := trimOWS(line[colon+1:])
		if !validValue(rawValue) {
			return nil, false
		}
		key := canonicalKey(line[:colon])
		value := string(rawValue)
		switch key {
		case "Host":
			hosts++
			host = value
			continue // net/http moves it to Request.Host
		case "Content-Length", "Transfer-Encoding", "Expect", "Upgrade":
			return nil, false
		case "Connection":
			c, ok := connectionOptions(value)
			if !ok {
				return nil, false
			}
			closeConn = closeConn || c
		}
		if vv := header[key]; vv == nil && len(values) > 0 {
			values[0] = value
			header[key], values = values[:1:1], values[1:]
		} else {
			header[key] = append(vv, value)
		}
	}
	if hosts != 1 || host == "" || !validHost(host) {
		return nil, false
	}
	if p := header["Pragma"]; len(p) > 0 && p[0] == "no-cache" {
		if _, ok := header["Cache-Control"]; !ok {
			header["Cache-Control"] = []string{"no-cache"}
		}
	}
	return &http.Request{
		Method:     internedMethod(method),
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
		Body:       http.NoBody,
		Host:       host,
		RequestURI: requestURI,
		Close:      closeConn,
	}, true
}

// cutLine cuts the first CRLF-ended line from b. A bare LF is not ok:
// net/http takes it, but the lean path leaves such clients to it.
func cutLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return nil, nil, false
	}
	return b[:i-1], b[i+1:], true
}

// plainTarget reports whether an origin-form target is printable ASCII
// without spaces (anything else is net/http's to judge).
func plainTarget(t []byte) bool {
	for _, c := range t {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// validToken reports whether b is an RFC 9110 token (a method, a field
// name).
func validToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c >= 0x80 || !isTokenByte[c] {
			return false
		}
	}
	return true
}

// isTokenByte marks RFC 9110's tchar.
var isTokenByte = byteSet("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

// isHostByte marks the bytes net/http allows in a Host header (those of a
// reg-name, an IP literal and a port).
var isHostByte = byteSet("!$%&'()*+,-.:;=[]_~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

func byteSet(chars string) (set [128]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
}

// validHost reports whether a Host header is one net/http accepts.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 || !isHostByte[h[i]] {
			return false
		}
	}
	return true
}

// validValue reports whether a field value has no control character but
// HTAB (obs-text allowed), as net/http checks.
func validValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// trimOWS trims the optional whitespace (spaces and tabs) around a field
// value.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// connectionOptions reads a Connection header: whether it asks to close,
// and whether it holds only the options the lean path knows (close and
// keep-alive; others, Upgrade or TE, are net/http's to handle).
func connectionOptions(v string) (closeConn, ok bool) {
	for len(v) > 0 {
		var opt string
		opt, v, _ = strings.Cut(v, ",")
		opt = textproto.TrimString(opt)
		switch {
		case opt == "":
		case asciiEqualFold(opt, "close"):
			closeConn = true
		case asciiEqualFold(opt, "keep-alive"):
		default:
			return false, false
		}
	}
	return closeConn, true
}

func asciiEqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lower(s[i]) != lower(t[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// commonKeys are header names clients send on most requests, in their
// canonical form: looked up without allocating, as textproto interns
// them.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language", "Authorization",
		"Cache-Control", "Connection", "Content-Type", "Cookie", "Host", "If-Modified-Since",
		"If-None-Match", "Origin", "Pragma", "Referer", "User-Agent", "X-Forwarded-For",
		"X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id", "Traceparent",
	} {
		m[k] = k
	}
	return m
}()

// canonicalKey is textproto.CanonicalMIMEHeaderKey of a valid field name,
// without allocating for the common ones.
func canonicalKey(name []byte) string {
	if k, ok := commonKeys[string(name)]; ok {
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(string(name))
}

// internedMethod returns the method's string without allocating for the
// standard methods.
func internedMethod(m []byte) string {
	switch string(m) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodOptions:
		return http.MethodOptions
	case http.MethodPatch:
		return http.MethodPatch
	}
	return string(m)
}
