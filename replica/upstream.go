package replica

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultHealthPath is the path that Upstream.CheckHealth GETs when
// UpstreamOptions.HealthPath is empty: Serve's own health path, which the
// replica hosts of this project answer. Any other server needs its own path
// configured, or it fails its checks with a 404.
const DefaultHealthPath = "/-/healthz"

// UpstreamOptions configure an Upstream.
type UpstreamOptions struct {
	// MaxOngoing is the replica's max_ongoing_requests, enforced by the
	// proxy since the server knows nothing of it. It must be at least 1.
	MaxOngoing int
	// OnRelease is called each time a slot is freed (the router uses it to
	// wake a waiting request). If nil, nothing is notified.
	OnRelease func()
	// Transport carries the requests; share one among a deployment's
	// replicas (see NewUpstreamClient, or NewTransport for net/http's). If
	// nil, the Upstream builds its own with
	// NewUpstreamClient(TransportOptions{MaxConnsPerReplica: MaxOngoing})
	// and closes it in Close.
	Transport http.RoundTripper
	// HealthPath is what CheckHealth GETs. If empty, DefaultHealthPath.
	HealthPath string
	// HealthTransport carries the health checks. It must not be Transport
	// when that bounds connections per replica: a replica busy with all its
	// slots would then fail its checks while they wait for a connection.
	// If nil, the Upstream uses a transport of its own without keep-alive
	// (one connection per check, which also proves the server accepts).
	HealthTransport http.RoundTripper
	// TrustedProxies are the peers (load balancers in front of the proxy)
	// whose X-Forwarded-For is appended to and whose X-Forwarded-Proto and
	// -Host are kept. If empty, no peer is trusted: the headers are always
	// set from what the proxy saw.
	TrustedProxies []netip.Prefix
	// Host, if not empty, is the Host header of every request and health
	// check (a virtual-hosting server's name for the service); if empty,
	// requests carry the client's Host and health checks the URL's.
	// X-Forwarded-Host keeps the client's either way.
	Host string
	// Via, if not empty, is the pseudonym this proxy adds to the Via header
	// of requests and responses ("1.1 <Via>"). If empty, Via is passed on
	// untouched.
	Via string
	// RetryBodyLimit is how much of a request's body Serve keeps while
	// sending it, so that a request the replica refuses as full (a
	// FullHeader 503, which may come after the transport has sent the
	// body) can go to another replica with its body. If 0,
	// DefaultRetryBodyLimit; if negative, nothing is kept, and only a
	// request whose body was not read yet is retried.
	RetryBodyLimit int
}

// DefaultRetryBodyLimit is UpstreamOptions.RetryBodyLimit's default: most
// API requests fit, uploads do not, and it costs nothing to a request that
// has no body.
const DefaultRetryBodyLimit = 64 << 10

// Upstream is a replica that is an HTTP server in another process, on this
// machine or another: one server is one replica. The proxy enforces its
// max_ongoing_requests (the limit is never exceeded: a slot is taken with a
// compare-and-swap below the limit, and released exactly once) and
// forwards each request over a pooled keep-alive connection, streaming
// both bodies.
//
// Serve passes the client's Host header on (the replica sees the name the
// client used; X-Forwarded-Host says it too), and the full path, with the
// base URL's path, if any, in front.
type Upstream struct {
	id        string
	base      *url.URL
	basePath  string // base.Path without its trailing slash; "" for none
	baseRaw   string // base.EscapedPath() likewise
	healthURL string
	trusted   []netip.Prefix
	via       viaEntries // PROXY_VIA's entries; the zero value for none
	host      string     // UpstreamOptions.Host
	keepBody  int        // RetryBodyLimit, resolved; 0 keeps nothing

	rt          http.RoundTripper
	health      http.RoundTripper
	ownedRT     interface{ CloseIdleConnections() } // closed by Close; nil when given
	forgotten   atomic.Bool                         // Close told a given UpstreamClient
	ownedHealth *http.Transport                     // likewise
	sessions    sessions                            // its WebSockets, closed by Close

	slots
}

var _ Handle = (*Upstream)(nil)

// _ checks that the deployment controller can health-check an Upstream.
var _ HealthChecker = (*Upstream)(nil)

// ParseUpstreamURL checks an upstream's base URL, as the config gives it:
// http or https, a host, and nothing the proxy could not honour (user
// info, a query, a fragment).
func ParseUpstreamURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("upstream %q: the scheme must be http or https", s)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("upstream %q: no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("upstream %q: user info is not supported", s)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("upstream %q: a query is not supported", s)
	case u.Fragment != "":
		return nil, fmt.Errorf("upstream %q: a fragment is not supported", s)
	}
	if p := u.Port(); p != "" {
		if _, err := netip.ParseAddrPort("0.0.0.0:" + p); err != nil || p == "0" {
			return nil, fmt.Errorf("upstream %q: bad port %q", s, p)
		}
	}
	return u, nil
}

// NewUpstream returns a replica in StateStarting that forwards to the HTTP
// server at baseURL (see ParseUpstreamURL).
func NewUpstream(id, baseURL string, o UpstreamOptions) (*Upstream, error) {
	base, err := ParseUpstreamURL(baseURL)
	if err != nil {
		return nil, err
	}
	if o.MaxOngoing < 1 {
		return nil, fmt.Errorf("upstream %q: max_ongoing_requests must be at least 1, not %d", baseURL, o.MaxOngoing)
	}
	hp := o.HealthPath
	if hp == "" {
		hp = DefaultHealthPath
	}
	if !strings.HasPrefix(hp, "/") {
		return nil, fmt.Errorf("upstream %q: the health path %q must begin with /", baseURL, hp)
	}
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("upstream %q: an invalid trusted proxy prefix", baseURL)
		}
	}
	u := &Upstream{
		id:       id,
		base:     base,
		basePath: strings.TrimSuffix(base.Path, "/"),
		baseRaw:  strings.TrimSuffix(base.EscapedPath(), "/"),
		trusted:  o.TrustedProxies,
		rt:       o.Transport,
		health:   o.HealthTransport,
		host:     o.Host,
	}
	u.init(o.MaxOngoing, o.OnRelease)
	u.healthURL = (&url.URL{Scheme: base.Scheme, Host: base.Host}).String() + u.baseRaw + hp
	if o.Via != "" {
		u.via = newViaEntries(o.Via)
	}
	switch {
	case o.RetryBodyLimit == 0:
		u.keepBody = DefaultRetryBodyLimit
	case o.RetryBodyLimit > 0:
		u.keepBody = o.RetryBodyLimit
	}
	if u.rt == nil {
		c := NewUpstreamClient(TransportOptions{MaxConnsPerReplica: o.MaxOngoing})
		u.ownedRT, u.rt = c, c
	} else if c, ok := u.rt.(*UpstreamClient); ok {
		c.retainReplica(u.base)
	}
	if u.health == nil {
		u.ownedHealth = NewTransport(TransportOptions{})
		u.ownedHealth.DisableKeepAlives = true
		u.health = u.ownedHealth
	}
	return u, nil
}

// ID implements Handle.
func (u *Upstream) ID() string { return u.id }

// SetMaxOngoing changes the replica's max_ongoing_requests (see
// Deployment.SetMaxOngoing). An UpstreamClient's bound on connections
// (shared by the deployment's replicas) rises with it, so that no request
// holding a slot waits for a connection.
func (u *Upstream) SetMaxOngoing(n int) {
	if c, ok := u.rt.(*UpstreamClient); ok {
		c.fitLimit(n)
	}
	u.setMax(n)
}

// URL returns the replica's base URL.
func (u *Upstream) URL() string { return u.base.String() }

// Close closes the idle connections of the transports the Upstream built
// for itself, and its connections in an UpstreamClient given in
// UpstreamOptions (other given transports are left alone). In-flight
// requests are not cut, but its WebSocket sessions are closed: they would
// go on for as long as their clients like, to a replica that has left.
func (u *Upstream) Close() {
	if u.ownedRT != nil {
		u.ownedRT.CloseIdleConnections()
	} else if c, ok := u.rt.(*UpstreamClient); ok && u.forgotten.CompareAndSwap(false, true) {
		c.forgetReplica(u.base)
	}
	if u.ownedHealth != nil {
		u.ownedHealth.CloseIdleConnections()
	}
	u.sessions.closeAll() // its WebSockets: the replica has left
}

// outgoing is one forwarded request: everything Serve builds for it, in one
// allocation. It is never reused, since the transport may still hold the
// request (writing its body) after the response is done.
type outgoing struct {
	req  http.Request
	url  url.URL
	body bodyGuard
	xff  [1]string // X-Forwarded-For's value
	xfh  [1]string // X-Forwarded-Host's value
	// upgrade is set when the client asked to switch protocols (a
	// WebSocket): Connection and Upgrade are passed on.
	upgrade bool
}

// BatchAnswers implements AnswerBatcher: an HTTP replica's answers go out
// in bursts under load, as its requests do.
func (u *Upstream) BatchAnswers() bool { return true }

// Serve implements Handle: it forwards r to the replica and copies the
// answer to w, streaming both bodies and flushing streamed responses as
// they come.
//
// It returns a context error when the client left or r's deadline passed
// (nothing more is written), and otherwise one of *UnreachableError (502),
// *TimeoutError (504), *ReplicaError (500), *FullError (503, try another)
// or *RequestBodyError (the client's body could not be read). Until the
// replica's response has begun, nothing is written to w, not even a
// header; when Retryable(err) is true r may be passed, as it is, to
// another replica's Serve. Retries are safe because Serve calls them
// retryable only when no byte of r.Body was read, or when every byte read
// was kept (see RetryBodyLimit): then Serve has set r.Body to a reader that
// gives those bytes again before the rest.
//
// A request with a body is served full duplex (the client's body is still
// read while the response streams, as a replica echoing an upload needs);
// this needs w to reach net/http's writer through Unwrap.
func (u *Upstream) Serve(w http.ResponseWriter, r *http.Request) error {
	u.served.Add(1)
	o := new(outgoing)
	out := &o.req
	*out = *r // a shallow copy keeps r's context without WithContext's allocation
	o.url = url.URL{Scheme: u.base.Scheme, Host: u.base.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if u.basePath != "" {
		o.url.Path = u.basePath + r.URL.Path
		if r.URL.RawPath != "" {
			o.url.RawPath = u.baseRaw + r.URL.RawPath
		}
	}
	out.URL = &o.url
	out.Proto, out.ProtoMajor, out.ProtoMinor = "HTTP/1.1", 1, 1
	out.RequestURI = ""
	out.Close = false
	out.TransferEncoding = nil
	out.Trailer = nil
	out.GetBody = nil
	out.Response = nil
	o.upgrade = upgradeRequested(r)
	out.Header = u.requestHeader(o, r)
	if u.host != "" {
		out.Host = u.host
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		// A nil body lets the transport retry by itself on a keep-alive
		// connection that the server closed just as it was reused.
		out.Body, out.ContentLength = nil, 0
	} else {
		o.body.rc = r.Body
		o.body.limit = u.keepBody
		if u.keepBody > 0 && r.ContentLength > 0 && r.ContentLength <= int64(u.keepBody) {
			o.body.kept = make([]byte, 0, r.ContentLength)
		}
		out.Body = &o.body
		// GetBody lets the transport retry on a fresh connection when a
		// reused one broke before a byte was written; it succeeds only
		// while nothing of the body has been read.
		out.GetBody = o.body.rewind
		if r.ContentLength < 0 && r.Trailer != nil {
			// The fields announced (their values nil until the client's
			// body ends), and, as it ends, their values and any that
			// came unannounced (see bodyGuard.Read): those that pass.
			out.Trailer = make(http.Header, len(r.Trailer))
			passTrailers(out.Trailer, r.Trailer)
			o.body.trailerIn, o.body.trailerOut = r.Trailer, out.Trailer
		}
		// Without it, net/http's server drops the rest of the client's
		// body when the response begins.
		_ = http.NewResponseController(w).EnableFullDuplex()
	}

	res, err := u.rt.RoundTrip(out)
	if err != nil {
		// Only a request none of whose body was read is retried after a
		// broken connection: the replica may have begun on a partial one.
		untouched, _ := o.body.detach()
		return u.roundTripError(r, err, untouched)
	}
	if res.StatusCode > 599 {
		// Three digits, but no status (RFC 9110, 15): net/http would
		// write it on to the client as it came.
		res.Body.Close()
		o.body.detach()
		return &InvalidResponseError{Replica: u.id, Err: fmt.Errorf("status %d: a status is 100 to 599", res.StatusCode)}
	}
	if res.StatusCode == http.StatusServiceUnavailable && isFull(res.Header) {
		// Detach first: what the transport has not yet sent of the body
		// stays with the client's, for the next replica.
		untouched, replayable := o.body.detach()
		discard(res.Body)
		if replayable && !untouched {
			o.body.rewindInto(r)
		}
		return &FullError{Replica: u.id, BodyLost: !replayable}
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		if !o.upgrade {
			// Another RoundTripper than UpstreamClient (net/http's) lets
			// a replica switch unasked, with a request body maybe still
			// being sent: that is no answer to relay.
			res.Body.Close()
			o.body.detach()
			return &InvalidResponseError{Replica: u.id, Err: errors.New("101 Switching Protocols to a request the proxy did not ask to upgrade")}
		}
		return u.switchProtocols(w, r, res)
	}

	stream := streams(res)
	var whole []byte // a small body read whole before anything is written
	if n := res.ContentLength; n > 0 && n <= smallBodyBytes && !stream && res.Body != http.NoBody {
		// (An answer to HEAD, or a 204 or 304, announces a length and
		// has no body.)
		// A replica that breaks off one is answered for (500) rather
		// than cutting a client that has been sent nothing yet.
		bp := copyBufPool.Get().(*[]byte)
		defer copyBufPool.Put(bp)
		whole = (*bp)[:n]
		if err := readWhole(res.Body, whole); err != nil {
			res.Body.Close()
			o.body.detach()
			return u.copyError(r, err)
		}
	}

	hdr := w.Header()
	u.copyResponseHeader(hdr, res.Header, res.ProtoMinor)
	if v := res.Header["Upgrade"]; res.StatusCode == http.StatusUpgradeRequired && v != nil {
		// A 426 must say what to upgrade to (RFC 9110 section 15.5.22),
		// and an Upgrade goes with "Connection: upgrade" (7.8).
		hdr["Upgrade"], hdr["Connection"] = v, connUpgrade
	}
	// An HTTP/1.0 client's body is delimited by the connection's close:
	// no trailer can follow it, and none is announced.
	trailers := r.ProtoAtLeast(1, 1)
	announced := len(res.Trailer)
	if announced > 0 && trailers {
		keys := make([]string, 0, announced)
		for k := range res.Trailer {
			if trailerPasses(k) {
				keys = append(keys, k)
			}
		}
		if len(keys) > 0 {
			hdr["Trailer"] = append(hdr["Trailer"], strings.Join(keys, ", "))
		}
	}
	w.WriteHeader(res.StatusCode)
	switch {
	case whole != nil:
		if _, werr := w.Write(whole); werr != nil {
			err = &clientWriteError{werr}
		}
	case stream:
		flush(w) // the headers at once: the first event may be long in coming
		fallthrough
	default:
		err = copyBody(w, res.Body, stream)
	}
	res.Body.Close() // before reading res.Trailer: closing fills it in
	o.body.detach()  // a body read the transport still has in mind now fails
	if err != nil {
		return u.copyError(r, err)
	}
	if len(res.Trailer) > 0 && trailers {
		flush(w) // makes the response chunked, so that trailers can follow
		prefix := ""
		if len(res.Trailer) != announced {
			prefix = http.TrailerPrefix // some were not announced
		}
		for k, vv := range res.Trailer {
			if trailerPasses(k) {
				hdr[prefix+k] = vv
			}
		}
	}
	return nil
}

// isFull reports whether a 503's header marks it as "over the limit, try
// another replica".
func isFull(h http.Header) bool {
	v := h[FullHeader]
	return len(v) > 0 && strings.TrimSpace(v[0]) == "1"
}

// discardLimit is how much of a refusal's body is read so that its
// connection can be reused; a longer body costs the connection instead.
const discardLimit = 4 << 10

func discard(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, discardLimit))
	body.Close()
}

// roundTripError classifies a failure before the response began. untouched
// says that no byte of the request's body was read (or it had none).
func (u *Upstream) roundTripError(r *http.Request, err error, untouched bool) error {
	if cerr := r.Context().Err(); cerr != nil {
		return cerr // the client left, or the proxy's deadline passed
	}
	if d, ok := r.Context().Deadline(); ok && !time.Now().Before(d) {
		// The proxy's deadline passed, its context not told yet: a dial
		// it cut ("i/o timeout") is no fault of the replica's, which
		// left routing for it (a tester: 503 for every request until a
		// health check passed).
		return context.DeadlineExceeded
	}
	var be *clientBodyError
	if errors.As(err, &be) {
		return &RequestBodyError{Err: be.err}
	}
	if st, ok := errors.AsType[*staleThenRefusedError](err); ok {
		// Down, and sent unless the stale connection failed its write.
		var op *net.OpError
		unsent := errors.As(st.stale, &op) && op.Op == "write" && untouched
		return &UnreachableError{Replica: u.id, Sent: !unsent, Down: true, Err: err}
	}
	var op *net.OpError
	isOp := errors.As(err, &op)
	if isOp && op.Op == "dial" || isTLSFailure(err) {
		// No connection, so nothing was sent.
		return &UnreachableError{Replica: u.id, Sent: !untouched, Down: true, Err: err}
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return &TimeoutError{Replica: u.id, Err: err}
	}
	if _, ok := errors.AsType[*errMalformed](err); ok {
		return &InvalidResponseError{Replica: u.id, Err: err}
	}
	if isOp && op.Op == "write" && untouched {
		// A failed write of the request's header block: the replica
		// cannot have run a request it did not receive whole.
		return &UnreachableError{Replica: u.id, Err: err}
	}
	if isOp || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errBodyRewind) {
		// The connection broke once the request was (maybe) sent: a
		// replica killed or restarted under us.
		return &UnreachableError{Replica: u.id, Sent: true, Err: err}
	}
	return &ReplicaError{Replica: u.id, Err: err}
}

// isTLSFailure reports whether err is an https replica's handshake
// failing: a bad certificate, an alert, or a server that does not speak TLS.
func isTLSFailure(err error) bool {
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var alert tls.AlertError
	return errors.As(err, &cv) || errors.As(err, &rh) || errors.As(err, &alert)
}

// copyError classifies a failure once the response had begun: the status
// is sent, so the caller can only abort the client's connection.
func (u *Upstream) copyError(r *http.Request, err error) error {
	if cerr := r.Context().Err(); cerr != nil {
		return cerr
	}
	var we *clientWriteError
	if errors.As(err, &we) {
		// A client that cannot be written to is gone (499), whether or not
		// the server has noticed yet.
		return fmt.Errorf("replica %s: writing the response: %w: %w", u.id, context.Canceled, we.err)
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return &TimeoutError{Replica: u.id, Err: err}
	}
	if _, ok := errors.AsType[*errMalformed](err); ok {
		return &InvalidResponseError{Replica: u.id, Err: err}
	}
	return &ReplicaError{Replica: u.id, Err: fmt.Errorf("the response broke off: %w", err)}
}

// readWhole reads all of len(p) bytes of body into p, bounded by the
// replica timeout where the client is this package's (see
// responseBody.readWhole).
func readWhole(body io.Reader, p []byte) error {
	if b, ok := body.(*responseBody); ok {
		return b.readWhole(p)
	}
	_, err := io.ReadFull(body, p)
	return err
}

// smallBodyBytes is the largest response body with a Content-Length that
// is read whole before its head is written on (a copy buffer's).
const smallBodyBytes = 32 << 10

// copyBufPool holds the buffers that response bodies are copied through.
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// clientWriteError is a failed write to the client.
type clientWriteError struct{ err error }

func (e *clientWriteError) Error() string { return e.err.Error() }

// copyBody copies the replica's body to the client, flushing after each
// read when stream is set.
func copyBody(w http.ResponseWriter, body io.Reader, stream bool) error {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := *bp
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return &clientWriteError{werr}
			}
			if stream {
				flush(w)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

func flush(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(w).Flush()
}

// bodyGuard stands between the client's request body and the transport.
// It records whether any of the body was read (a request whose body was
// read cannot be sent again, unless every byte read was kept), keeps up to
// limit bytes of what was read, lets the transport rewind it while nothing
// was read, and stops further reads once Serve is done (detach): the
// transport may still be sending a body the replica did not wait for, and
// net/http forbids reading a request body after its handler returned.
// Close does nothing: the server closes the client's body itself, and a
// retry on another replica still needs it open.
type bodyGuard struct {
	rc    io.ReadCloser
	limit int // how much of the body to keep; 0 keeps nothing

	// mu guards the fields below. It is not held while reading rc, which
	// may block on the client.
	mu       sync.Mutex
	read     bool   // a read began
	reading  bool   // a read is in progress
	detached bool   // Serve is done: reads fail
	kept     []byte // the bytes read so far, while they fit in limit
	overflow bool   // more was read than kept

	// trailerIn, filled in by net/http as the client's body ends, has
	// what passes copied to trailerOut, the request's to the replica, at
	// that end; nil for a body with no trailers.
	trailerIn, trailerOut http.Header
}

var (
	errBodyDetached = errors.New("replica: the request is over; its body can no longer be read")
	errBodyRewind   = errors.New("replica: the request body was read already and cannot be sent again")
)

// clientBodyError is a failed read of the client's body, kept apart from
// the replica's failures.
type clientBodyError struct{ err error }

func (e *clientBodyError) Error() string { return e.err.Error() }

// Read implements io.Reader.
func (b *bodyGuard) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.detached {
		b.mu.Unlock()
		return 0, errBodyDetached
	}
	b.read, b.reading = true, true
	b.mu.Unlock()

	n, err := b.rc.Read(p)

	b.mu.Lock()
	b.reading = false
	if !b.overflow && n > 0 {
		if len(b.kept)+n <= b.limit {
			b.kept = append(b.kept, p[:n]...)
		} else {
			b.overflow, b.kept = true, nil
		}
	}
	b.mu.Unlock()
	if err == io.EOF && b.trailerOut != nil {
		passTrailers(b.trailerOut, b.trailerIn)
	}
	if err != nil && err != io.EOF {
		err = &clientBodyError{err}
	}
	return n, err
}

// Close implements io.Closer; see bodyGuard.
func (b *bodyGuard) Close() error { return nil }

// rewind is the request's GetBody, for the transport's own retry.
func (b *bodyGuard) rewind() (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.read {
		return nil, errBodyRewind
	}
	return b, nil
}

// detach stops reads. It reports whether none had begun, and whether what
// was read is all kept, with no read in progress, so that the body can be
// given again.
func (b *bodyGuard) detach() (untouched, replayable bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.detached = true
	return !b.read, !b.read || (!b.reading && !b.overflow)
}

// rewindInto sets r.Body to give the kept bytes again before the rest; the
// guard must be detached and replayable.
func (b *bodyGuard) rewindInto(r *http.Request) {
	r.Body = newReplayBody(b.kept, b.rc)
}

// replayBody is a request body given again: the bytes already read, then
// the rest of the client's body.
type replayBody struct {
	kept []byte
	rest io.ReadCloser
}

// newReplayBody gives kept, the bytes read from rest, again before the
// rest. A rest that is itself a replay read past its own kept bytes is
// dropped from the chain (kept has them): a request refused round after
// round (see the proxy's back-off) would otherwise hold one more copy of
// its body per refusal.
func newReplayBody(kept []byte, rest io.ReadCloser) *replayBody {
	if prev, ok := rest.(*replayBody); ok && len(prev.kept) == 0 {
		rest = prev.rest
	}
	return &replayBody{kept: kept, rest: rest}
}

// Read implements io.Reader.
func (b *replayBody) Read(p []byte) (int, error) {
	if len(b.kept) > 0 {
		n := copy(p, b.kept)
		b.kept = b.kept[n:]
		return n, nil
	}
	return b.rest.Read(p)
}

// Close implements io.Closer.
func (b *replayBody) Close() error { return b.rest.Close() }

// CheckHealth implements HealthChecker, so that a deployment controller
// checks an Upstream as it checks a Local's handler: it GETs the health
// path over the health transport and succeeds on a 2xx answer. Bound it
// with ctx (health_check_timeout_s).
func (u *Upstream) CheckHealth(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.healthURL, nil)
	if err != nil {
		return fmt.Errorf("replica %s: health check: %w", u.id, err)
	}
	req.Header["User-Agent"] = []string{"serveproxy-health-check"}
	if u.host != "" {
		req.Host = u.host
	}
	res, err := u.health.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("replica %s: health check GET %s: %w", u.id, u.healthURL, err)
	}
	discard(res.Body)
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return fmt.Errorf("replica %s: health check GET %s: %s", u.id, u.healthURL, res.Status)
	}
	return nil
}
