package replica

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Static header values, shared by every request: the transport only reads
// them, and their capacity is their length so that an append copies.
var (
	protoHTTP        = []string{"http"}
	protoHTTPS       = []string{"https"}
	teTrailers       = []string{"trailers"}
	connUpgrade      = []string{"Upgrade"}
	upgradeWebSocket = []string{"websocket"}
)

const (
	eventStream  = "text/event-stream"
	trailersWord = "trailers"
)

// isHopHeader reports whether the header named k (canonical, as net/http's
// server and transport give them) belongs to one connection and must not be
// forwarded (RFC 9110 section 7.6.1). "Proxy" and "Proxy-*" go too: they
// are meant for this proxy, and "Proxy" is the httpoxy attack's header.
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Proxy":
		return true
	}
	return len(k) > len("Proxy-") && k[:len("Proxy-")] == "Proxy-"
}

// trailerPasses reports whether the trailer field k (canonical) goes on,
// to the replica or to the client: not a hop-by-hop one, nor one of the
// fields RFC 9110 (section 6.5.1) keeps out of trailers because it frames,
// routes or authenticates the message, or says how to read its content,
// nor one the proxy decides on in the header (X-Forwarded-*, Forwarded,
// X-Real-Ip, Via, X-Request-Id): a trailer must not get around the
// header's rules (found by a tester: a client's X-Forwarded-For trailer
// reached the replica unchecked). Nor does a name that is no token: net/http
// leaves one with a space before its colon as it came, not canonical
// ("x-forwarded-for "), which would get past these rules, and which
// RFC 9112 (5.1) has a server refuse.
func trailerPasses(k string) bool {
	if !validToken(k) || isHopHeader(k) || strings.HasPrefix(k, "If-") || strings.HasPrefix(k, "X-Forwarded-") {
		return false
	}
	switch k {
	case "Content-Length", "Content-Type", "Content-Encoding", "Content-Range",
		"Host", "Authorization", "Cookie", "Set-Cookie", "Expect", "Max-Forwards", "Range",
		"Cache-Control", "Pragma", "Age", "Expires", "Date", "Location", "Retry-After", "Vary",
		"Forwarded", "X-Real-Ip", "Via", "X-Request-Id", FullHeader:
		return false
	}
	return true
}

// passTrailers copies the fields of src that trailerPasses to dst.
func passTrailers(dst, src http.Header) {
	for k, vv := range src {
		if trailerPasses(k) {
			dst[k] = vv
		}
	}
}

// passHeader reports whether the client's header k goes on to the replica:
// X-Request-Id always, else not a hop-by-hop one nor one the Connection
// values conn name, not one the proxy sets itself (X-Forwarded-For, -Proto
// and -Host; Via when it adds its own, via), and Forwarded, X-Real-IP, the
// other X-Forwarded-* and X-Original-URL (and X-Rewrite-URL) only from a
// trusted peer, as they are the client's own word for its address, scheme
// or path otherwise.
func passHeader(k string, conn []string, trust, via bool) bool {
	if k == "X-Request-Id" {
		// The proxy's own (read or made, echoed and logged): a client's
		// "Connection: X-Request-Id" must not keep it from the replica.
		return true
	}
	if isHopHeader(k) || (len(conn) > 0 && hasToken(conn, k)) {
		return false
	}
	switch k {
	case "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host":
		return false
	case "Forwarded", "X-Real-Ip", "X-Original-Url", "X-Rewrite-Url":
		return trust
	case "Via":
		return !via
	}
	// The rest of X-Forwarded-* (-Port, -Prefix, -Ssl, -Scheme...), as
	// frameworks honour them (Spring, Werkzeug's ProxyFix, Rack), are a
	// proxy's word too, not a client's (found by a tester).
	return trust || !strings.HasPrefix(k, "X-Forwarded-")
}

// hasToken reports whether one of the comma-separated lists in values holds
// token, compared without case, as Connection and TE values are.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.Trim(t, " \t"), token) {
				return true
			}
		}
	}
	return false
}

// forwardedFor returns the client address the proxy saw, from a
// RemoteAddr of the form host:port, and whether that peer is trusted to
// have set X-Forwarded-* itself.
func forwardedFor(remoteAddr string, trusted []netip.Prefix) (ip string, ok, trust bool) {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil || host == "" {
		return "", false, false
	}
	if len(trusted) == 0 {
		return host, true, false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host, true, false
	}
	addr = addr.Unmap().WithZone("")
	for _, p := range trusted {
		if p.Contains(addr) {
			return host, true, true
		}
	}
	return host, true, false
}

// requestHeader builds the header sent to the replica: the client's, less
// the hop-by-hop ones and those the Connection header names, with
// X-Forwarded-For, -Proto and -Host set from what the proxy saw. An
// incoming X-Forwarded-For is appended to, and an incoming -Proto or -Host
// kept, only when the peer is in the trusted set (a load balancer in front
// of the proxy); from anyone else they are replaced, and Forwarded and
// X-Real-IP dropped, so that a client cannot forge its address. Value slices are shared with r.Header, never
// written through.
func (u *Upstream) requestHeader(o *outgoing, r *http.Request) http.Header {
	in := r.Header
	conn := in["Connection"]
	h := make(http.Header, len(in)+4)
	ip, ok, trust := forwardedFor(r.RemoteAddr, u.trusted)
	for k, vv := range in {
		if passHeader(k, conn, trust, u.via.on()) {
			h[k] = vv
		}
	}
	// Tell the replica that trailers can be passed on, when the client
	// said it takes them (gRPC-style servers check).
	if hasToken(in["Te"], trailersWord) {
		h["Te"] = teTrailers
	}
	if _, ok := in["User-Agent"]; !ok {
		h["User-Agent"] = nil // present but empty: the transport sends no Go user agent
	}

	if ok {
		prior := in["X-Forwarded-For"]
		switch {
		case trust && len(prior) == 1:
			o.xff[0] = prior[0] + ", " + ip
		case trust && len(prior) > 1:
			o.xff[0] = strings.Join(prior, ", ") + ", " + ip
		default:
			o.xff[0] = ip
		}
		h["X-Forwarded-For"] = o.xff[:]
	}
	if v := in["X-Forwarded-Proto"]; trust && len(v) > 0 {
		h["X-Forwarded-Proto"] = v
	} else if r.TLS != nil {
		h["X-Forwarded-Proto"] = protoHTTPS
	} else {
		h["X-Forwarded-Proto"] = protoHTTP
	}
	if v := in["X-Forwarded-Host"]; trust && len(v) > 0 {
		h["X-Forwarded-Host"] = v
	} else if r.Host != "" {
		o.xfh[0] = r.Host
		h["X-Forwarded-Host"] = o.xfh[:]
	}
	if u.via.on() {
		h["Via"] = []string{joinVia(in["Via"], u.via.of(r.ProtoMinor))}
	}
	if o.upgrade {
		// The one hop-by-hop request a proxy passes on, as RFC 9110
		// (section 7.8) has it do for a protocol it can relay.
		h["Connection"] = connUpgrade
		h["Upgrade"] = upgradeWebSocket // of the protocols offered, the one relayed
	}
	return h
}

// viaEntries are this proxy's Via entries under its pseudonym, one for
// each protocol it may receive a message as: RFC 9110 (7.6.3) has the
// entry name the protocol received, and an HTTP/1.0 client's request said
// 1.1 (found by a tester). Built once, not per request; the zero value is
// no Via.
type viaEntries struct{ http10, http11 string }

func newViaEntries(name string) viaEntries {
	if name == "" {
		return viaEntries{}
	}
	return viaEntries{http10: "1.0 " + name, http11: "1.1 " + name}
}

// on reports whether the proxy adds Via entries.
func (v viaEntries) on() bool { return v.http11 != "" }

// of is the entry for a message received as HTTP/1.minor.
func (v viaEntries) of(minor int) string {
	if minor == 0 {
		return v.http10
	}
	return v.http11
}

// joinVia is the Via list prior with this proxy's entry added, as one
// value: a server that reads only one Via line (Python's http.server,
// say) still sees the whole path.
func joinVia(prior []string, via string) string {
	if len(prior) == 0 {
		return via
	}
	return strings.Join(prior, ", ") + ", " + via
}

// copyResponseHeader adds the replica's response header to dst (the
// client's response), less the hop-by-hop headers and FullHeader. A header
// the proxy has set already (X-Request-Id) keeps its value when the
// replica echoes the same one, and gets the replica's appended otherwise.
func (u *Upstream) copyResponseHeader(dst, src http.Header, minor int) {
	conn := src["Connection"]
	for k, vv := range src {
		if isHopHeader(k) || k == FullHeader || (len(conn) > 0 && hasToken(conn, k)) {
			continue
		}
		have, ok := dst[k]
		switch {
		case !ok:
			dst[k] = vv
		case !equalValues(have, vv):
			dst[k] = append(have[:len(have):len(have)], vv...)
		}
	}
	if u.via.on() {
		dst["Via"] = []string{joinVia(dst["Via"], u.via.of(minor))}
	}
	if _, ok := dst["Content-Type"]; !ok {
		// The replica sent none: a nil entry keeps net/http from
		// sniffing one that the replica never said.
		dst["Content-Type"] = nil
	}
}

func equalValues(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// streams reports whether a response must be flushed after every read, as
// httputil.ReverseProxy does with a FlushInterval of -1: server-sent
// events, and any body of unknown length (chunked, or until close), which
// is how a server says it streams.
func streams(res *http.Response) bool {
	if res.ContentLength == -1 {
		return true
	}
	ct := res.Header["Content-Type"]
	return len(ct) > 0 && len(ct[0]) >= len(eventStream) && strings.EqualFold(ct[0][:len(eventStream)], eventStream)
}
