package replica

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// UpstreamClient is the HTTP/1.1 client that forwards requests to Upstream
// replicas: an http.RoundTripper that does a request's work on the calling
// goroutine. It writes the request head, reads the response and hands its
// body out over a pool of keep-alive connections per replica, with no
// goroutine of its own per connection or per request (only a request with
// a body gets one, which writes the body while the response is read, so
// that a replica can answer while it still reads).
//
// net/http's Transport, which it replaces on this path, runs a read loop
// and a write loop per connection and hands every request and response
// between them over channels: three goroutine switches and ~35 allocations
// a request, most of the proxy's cost when the replica is fast (issue 5).
//
// Responses are framed by Content-Length, chunked encoding or the close of
// the connection; 1xx responses are skipped; HEAD, 204 and 304 have no
// body; trailers are read into Response.Trailer when the body ends. A
// connection goes back to the pool once its response body is read to the
// end (not on an early Close, which closes it), unless either side said
// "Connection: close". A connection that idled a while is checked before
// reuse (linux: a peek for an EOF the server sent), and an idempotent
// request without a body that finds a reused connection closed under it,
// before any byte of the answer, is sent again on a new one, as net/http
// does. Errors are those of net (dial, read and write *net.OpError,
// timeouts), crypto/tls and io.EOF, as Upstream.Serve classifies them.
//
// It sends no User-Agent of its own, asks for no compression, and honours
// no proxy from the environment. Its zero value is not usable: see
// NewUpstreamClient.
type UpstreamClient struct {
	dialer        net.Dialer
	maxConns      atomic.Int64  // per replica; 0 for no bound (raised by fitLimit)
	maxIdle       atomic.Int64  // idle connections kept per replica
	idleTimeout   time.Duration // an idle connection is closed after it
	headerTimeout time.Duration // 0 for none

	// mu guards pools and users.
	mu    sync.RWMutex
	pools map[poolKey]*connPool
	users map[poolKey]int // the Upstreams given this client, by replica
}

var _ http.RoundTripper = (*UpstreamClient)(nil)

// NewUpstreamClient returns a client for the Upstream replicas of one
// deployment, tuned by o as NewTransport tunes its transport: at most
// MaxConnsPerReplica connections to each replica (a request waits for one
// to be free, or for its context), the dial and response-header timeouts,
// and idle connections closed after IdleConnTimeout. Close its idle
// connections (CloseIdleConnections) when the deployment stops.
func NewUpstreamClient(o TransportOptions) *UpstreamClient {
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = DefaultIdleConnTimeout
	}
	idle := o.MaxConnsPerReplica
	if idle <= 0 {
		idle = 64
	}
	c := &UpstreamClient{
		dialer:        net.Dialer{Timeout: o.DialTimeout, KeepAlive: tcpKeepAlive},
		idleTimeout:   o.IdleConnTimeout,
		headerTimeout: o.ResponseHeaderTimeout,
		pools:         make(map[poolKey]*connPool),
		users:         make(map[poolKey]int),
	}
	c.maxConns.Store(int64(o.MaxConnsPerReplica))
	c.maxIdle.Store(int64(idle))
	return c
}

// fitLimit raises the bound on the connections to each replica, and on
// those kept idle, to at least n, as its deployment's
// max_ongoing_requests rises live: requests waiting for a connection get
// the room at once. It never lowers them: a request holding one of its
// replica's slots must never wait for a connection, and a lowered limit
// leaves the requests over it running; the connections over a lower limit
// close when idle for the idle timeout. A client with no bound keeps none.
func (c *UpstreamClient) fitLimit(n int) {
	if c.maxConns.Load() <= 0 {
		return
	}
	grewIdle := raiseTo(&c.maxIdle, int64(n))
	if !raiseTo(&c.maxConns, int64(n)) && !grewIdle {
		return
	}
	for _, p := range c.allPools() {
		p.mu.Lock()
		p.wakeLocked()
		p.mu.Unlock()
	}
}

// raiseTo sets v to n if it is below, and reports whether it was.
func raiseTo(v *atomic.Int64, n int64) bool {
	for cur := v.Load(); cur < n; cur = v.Load() {
		if v.CompareAndSwap(cur, n) {
			return true
		}
	}
	return false
}

// CloseIdleConnections closes the connections that no request is using.
func (c *UpstreamClient) CloseIdleConnections() {
	for _, p := range c.allPools() {
		p.closeIdle(func(*clientConn) bool { return true })
	}
}

// allPools returns the client's connection pools, one per replica.
func (c *UpstreamClient) allPools() []*connPool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	pools := make([]*connPool, 0, len(c.pools))
	for _, p := range c.pools {
		pools = append(pools, p)
	}
	return pools
}

// keyOf names the connections to the replica at base.
func keyOf(base *url.URL) poolKey { return poolKey{host: base.Host, tls: base.Scheme == "https"} }

// retainReplica counts an Upstream that forwards to base through c, for
// forgetReplica.
func (c *UpstreamClient) retainReplica(base *url.URL) {
	c.mu.Lock()
	c.users[keyOf(base)]++
	c.mu.Unlock()
}

// forgetReplica undoes a retainReplica. When no Upstream forwards to base
// any more, it closes the idle connections to it and drops its pool, so
// that a deployment whose replicas come and go (DNS discovery, restarted
// processes) does not keep a pool per address it ever had. Connections
// still in use are closed when their request ends; a later request to the
// address makes a new pool.
func (c *UpstreamClient) forgetReplica(base *url.URL) {
	k := keyOf(base)
	c.mu.Lock()
	if c.users[k]--; c.users[k] > 0 {
		c.mu.Unlock()
		return // an Upstream for the same address (re-added) still uses it
	}
	delete(c.users, k)
	p := c.pools[k]
	delete(c.pools, k)
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	p.retired = true
	p.mu.Unlock()
	p.closeIdle(func(*clientConn) bool { return true })
}

// stalePeekAfter is how long a connection idles before it is checked for
// a close from the server on reuse. Under load connections idle for
// microseconds and are not checked; a close that races a reuse is covered
// by the retry of idempotent requests, and the others are checked always.
// A variable for tests.
var stalePeekAfter = time.Millisecond

// Limits of the response head, as net/http's transport has them.
const (
	maxResponseHeaderBytes = 10 << 20
	max1xxResponses        = 5
	// maxWriteWait is how long a response that ended waits for its
	// request's body to be written before the connection is given up
	// instead of reused, as in net/http.
	maxWriteWait = 50 * time.Millisecond
)

// RoundTrip implements http.RoundTripper.
func (c *UpstreamClient) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL
	if u == nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		closeReqBody(req)
		return nil, fmt.Errorf("upstream client: unsupported URL %v", u)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeReqBody(req)
		return nil, err
	}
	p := c.pool(poolKey{host: u.Host, tls: u.Scheme == "https"})
	fresh := false
	// A request that could not be sent again after meeting a stale
	// connection (a POST, say) has any idle connection checked first.
	check := !replayable(req)
	var sentErr error // the stale-looking connection's, once req went out on it
	for {
		cc, reused, err := p.get(ctx, fresh, check)
		if err != nil {
			closeReqBody(req)
			if sentErr != nil {
				// Refused now, the server may have died of req rather
				// than closed an idle connection.
				return nil, &staleThenRefusedError{stale: sentErr, refused: err}
			}
			return nil, err
		}
		res, answered, err := cc.roundTrip(req)
		if err == nil {
			return res, nil
		}
		if reused && !answered && !fresh && retryableOnNewConn(req, err) && ctx.Err() == nil {
			fresh = true // once, on a connection of its own: it cannot be stale
			sentErr = err
			continue
		}
		return nil, err
	}
}

// staleThenRefusedError is a request that met a kept-alive connection
// broken before any answer (stale), and then a refused new one (refused):
// the server is down, and may have died of the request, which reached it
// unless the stale connection failed its write. It unwraps to stale only:
// the refusal must not make the request read as never sent, or it would
// go to another replica, which it could kill too.
type staleThenRefusedError struct{ stale, refused error }

func (e *staleThenRefusedError) Error() string {
	return fmt.Sprintf("%v; then a new connection: %v", e.stale, e.refused)
}

func (e *staleThenRefusedError) Unwrap() error { return e.stale }

// retryableOnNewConn reports whether req, which failed with err on a
// reused connection before any byte of an answer came, may be sent again:
// the server closed the connection as it was reused (it never ran the
// request, or it is idempotent), as net/http's transport decides.
func retryableOnNewConn(req *http.Request, err error) bool {
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		return false
	}
	return replayable(req)
}

// replayable reports whether req may be sent again on a new connection
// after its first one turned out stale: it has no body (which may be read
// already; Upstream.Serve decides on those), and is idempotent or has an
// idempotency key.
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// poolKey names a replica's connections.
type poolKey struct {
	host string // as in the URL, port optional
	tls  bool
}

// pool returns the connections to k, made on first use.
func (c *UpstreamClient) pool(k poolKey) *connPool {
	c.mu.RLock()
	p := c.pools[k]
	c.mu.RUnlock()
	if p != nil {
		return p
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p = c.pools[k]; p == nil {
		p = newConnPool(c, k)
		c.pools[k] = p
	}
	return p
}

// connPool holds the connections to one replica.
type connPool struct {
	c      *UpstreamClient
	addr   string      // host:port to dial
	tlsCfg *tls.Config // nil for http

	// mu guards the fields below.
	mu    sync.Mutex
	idle  []*clientConn // the most recently used last
	open  int           // connections open or being dialed
	freed chan struct{} // closed when a connection is freed, made when someone waits
	sweep *time.Timer   // closes connections idle too long; nil until needed
	armed bool          // sweep is scheduled
	// retired is set when the client forgot the replica: connections are
	// closed instead of kept idle.
	retired bool
}

func newConnPool(c *UpstreamClient, k poolKey) *connPool {
	host, port, err := net.SplitHostPort(k.host)
	if err != nil {
		host, port = strings.TrimSuffix(strings.TrimPrefix(k.host, "["), "]"), "80"
		if k.tls {
			port = "443"
		}
	}
	p := &connPool{c: c, addr: net.JoinHostPort(host, port)}
	if k.tls {
		p.tlsCfg = &tls.Config{ServerName: host, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	}
	return p
}

// get returns an idle connection (reused true) or a new one; with fresh, a
// new one. An idle one is checked for a close from the server when it
// idled over stalePeekAfter, or always with check. It waits while the
// replica has all the connections it may have, until one is freed or ctx
// ends.
func (p *connPool) get(ctx context.Context, fresh, check bool) (cc *clientConn, reused bool, err error) {
	p.mu.Lock()
	for {
		if n := len(p.idle); n > 0 && !fresh {
			cc = p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			if (check || time.Since(cc.idleAt) >= stalePeekAfter) && !cc.alive() {
				cc.close()
				p.mu.Lock()
				continue
			}
			return cc, true, nil
		}
		if limit := p.c.maxConns.Load(); limit <= 0 || int64(p.open) < limit {
			p.open++
			p.mu.Unlock()
			cc, err = p.dial(ctx)
			if err != nil {
				p.closed()
				return nil, false, err
			}
			return cc, false, nil
		}
		if n := len(p.idle); n > 0 { // fresh, and no room: make some
			old := p.idle[0]
			p.idle = append(p.idle[:0], p.idle[1:]...)
			p.mu.Unlock()
			old.close()
			p.mu.Lock()
			continue
		}
		if p.freed == nil {
			p.freed = make(chan struct{})
		}
		freed := p.freed
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		p.mu.Lock()
	}
}

// put makes cc idle, or closes it when the pool keeps enough.
func (p *connPool) put(cc *clientConn) {
	cc.idleAt = time.Now()
	p.mu.Lock()
	if int64(len(p.idle)) >= p.c.maxIdle.Load() || p.retired {
		p.mu.Unlock()
		cc.close()
		return
	}
	p.idle = append(p.idle, cc)
	p.wakeLocked()
	if !p.armed {
		p.armed = true
		if p.sweep == nil {
			p.sweep = time.AfterFunc(p.c.idleTimeout, p.sweepIdle)
		} else {
			p.sweep.Reset(p.c.idleTimeout)
		}
	}
	p.mu.Unlock()
}

// closed accounts for a connection closed (or a dial that failed).
func (p *connPool) closed() {
	p.mu.Lock()
	p.open--
	p.wakeLocked()
	p.mu.Unlock()
}

// wakeLocked wakes the requests waiting for a connection.
func (p *connPool) wakeLocked() {
	if p.freed != nil {
		close(p.freed)
		p.freed = nil
	}
}

// sweepIdle closes the connections idle longer than the idle timeout, and
// comes back while some are left.
func (p *connPool) sweepIdle() {
	now := time.Now()
	p.closeIdle(func(cc *clientConn) bool { return now.Sub(cc.idleAt) >= p.c.idleTimeout })
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) == 0 {
		p.armed = false
		return
	}
	p.sweep.Reset(p.c.idleTimeout - now.Sub(p.idle[0].idleAt))
}

// closeIdle closes the idle connections for which expired is true.
func (p *connPool) closeIdle(expired func(*clientConn) bool) {
	p.mu.Lock()
	var gone []*clientConn
	kept := p.idle[:0]
	for _, cc := range p.idle {
		if expired(cc) {
			gone = append(gone, cc)
		} else {
			kept = append(kept, cc)
		}
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.mu.Unlock()
	for _, cc := range gone {
		cc.close()
	}
}

// dial opens a connection, with the TLS handshake for https.
func (p *connPool) dial(ctx context.Context) (*clientConn, error) {
	conn, err := p.c.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	cc := &clientConn{pool: p}
	if sc, ok := conn.(syscall.Conn); ok {
		cc.raw, _ = sc.SyscallConn()
	}
	if p.tlsCfg != nil {
		tc := tls.Client(conn, p.tlsCfg)
		hctx, cancel := context.WithTimeout(ctx, p.c.dialer.Timeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		conn = tc
	}
	cc.conn = conn
	cc.br = bufio.NewReaderSize(conn, 4<<10)
	cc.bw = bufio.NewWriterSize(conn, 4<<10)
	cc.abort = func() { _ = conn.Close() }
	cc.peek = cc.peekFD
	return cc, nil
}

// clientConn is one keep-alive connection to a replica. One request uses
// it at a time: the one that took it from the pool, until its response
// body ends.
type clientConn struct {
	pool   *connPool
	conn   net.Conn
	raw    syscall.RawConn // the TCP socket, for alive; nil if none
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt time.Time   // when it was last put in the pool
	closed atomic.Bool // close ran
	abort  func()      // closes conn when a request's context ends
	peek   func(uintptr) bool
	peekOK bool        // peek's answer
	fields []fieldSpan // scratch of readHead
	vals   []byte      // likewise
	line   []byte      // likewise, for lines longer than br's buffer
	wbuf   [32]byte    // scratch for numbers written
	pbuf   [1]byte     // peek's buffer
}

// close closes the connection and frees its place in the pool, once.
func (cc *clientConn) close() {
	if cc.closed.CompareAndSwap(false, true) {
		_ = cc.conn.Close()
		cc.pool.closed()
	}
}

// alive reports whether the server has not closed the connection (nor sent
// anything unasked) while it idled.
func (cc *clientConn) alive() bool {
	if cc.raw == nil {
		return true
	}
	cc.peekOK = false
	if err := cc.raw.Read(cc.peek); err != nil {
		return false
	}
	return cc.peekOK
}

// roundTrip sends req and reads the head of its answer. answered says
// whether any byte of an answer was read (else a reused connection may
// have been closed by the server just then). On error the connection is
// closed.
func (cc *clientConn) roundTrip(req *http.Request) (res *http.Response, answered bool, err error) {
	ctx := req.Context()
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, cc.abort)
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	chunked := hasBody && req.ContentLength <= 0
	fail := func(err error) (*http.Response, bool, error) {
		if stop != nil {
			stop()
		}
		cc.close()
		return nil, answered, err
	}
	if err := cc.writeHead(req, hasBody, chunked); err != nil {
		closeReqBody(req)
		return fail(err)
	}
	headerTimeout := cc.pool.c.headerTimeout
	var deadline *headDeadline
	var wrote chan error
	if hasBody {
		if headerTimeout > 0 {
			// The wait for the answer begins once the body is sent, as
			// net/http's ResponseHeaderTimeout does: a slow upload is no
			// slow replica.
			deadline = &headDeadline{conn: cc.conn, d: headerTimeout}
		}
		wrote = make(chan error, 1)
		go cc.writeBody(req, chunked, wrote, deadline)
	} else {
		// Yield before the write: the goroutines runnable now go first,
		// and under load those are other requests on their way to this
		// point, so that their heads leave in a burst. The replica then
		// wakes once for several requests instead of once for each,
		// which on a busy machine is much of what a small request costs
		// it (see "Speed of forwarding" in the README). With nothing
		// else runnable, this returns at once.
		runtime.Gosched()
		if err := cc.bw.Flush(); err != nil {
			return fail(err)
		}
	}

	if headerTimeout > 0 && deadline == nil {
		_ = cc.conn.SetReadDeadline(time.Now().Add(headerTimeout))
	}
	b := new(responseBody)
	res = &b.res
	answered, err = cc.readHead(req, b)
	switch {
	case deadline != nil:
		if derr := deadline.headRead(); err == nil {
			err = derr
		}
	case err == nil && headerTimeout > 0:
		err = cc.conn.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if wrote != nil {
			// A failed read of the client's body is the client's error,
			// which Upstream.Serve tells apart.
			select {
			case werr := <-wrote:
				if werr != nil {
					err = werr
				}
			default:
			}
		}
		return fail(err)
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		// The connection carries the protocol the request asked for now,
		// and is the caller's until it closes it: the request's context
		// no longer ends it, nor does it go back to the pool.
		if stop != nil && !stop() {
			// The context ended (and its abort closed the connection)
			// just as the 101 came: there is no session to hand over.
			cc.close()
			return nil, true, ctx.Err()
		}
		res.Body = &switchedConn{cc: cc}
		return res, true, nil
	}
	b.cc, b.stop, b.wrote = cc, stop, wrote
	switch {
	case !bodyAllowed(req.Method, res.StatusCode):
		res.Body = http.NoBody
		b.finish(!res.Close)
	case b.remaining == 0 && !b.chunked:
		res.Body = http.NoBody
		b.finish(!res.Close)
	default:
		res.Body = b
	}
	return res, true, nil
}

// switchedConn is a connection to a replica that switched protocols (a
// 101 to an upgrade request): the response's Body, an io.ReadWriteCloser as
// net/http's transport gives one. Reads begin with what the replica sent
// after the 101's head, already buffered.
type switchedConn struct {
	cc *clientConn
}

// Read implements io.Reader.
func (s *switchedConn) Read(p []byte) (int, error) { return s.cc.br.Read(p) }

// Write implements io.Writer.
func (s *switchedConn) Write(p []byte) (int, error) { return s.cc.conn.Write(p) }

// Close closes the connection and frees its place in the pool.
func (s *switchedConn) Close() error {
	s.cc.close()
	return nil
}

// bodyAllowed reports whether a response to method with status code has a
// body (RFC 9112 section 6.3).
func bodyAllowed(method string, code int) bool {
	return method != http.MethodHead && code != http.StatusNoContent && code != http.StatusNotModified && code >= 200
}

// writeHead buffers req's request line and header block.
func (cc *clientConn) writeHead(req *http.Request, hasBody, chunked bool) error {
	bw := cc.bw
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validToken(method) {
		return fmt.Errorf("upstream client: invalid method %q", method)
	}
	u := req.URL
	_, _ = bw.WriteString(method)
	_ = bw.WriteByte(' ')
	switch {
	case u.Opaque != "":
		_, _ = bw.WriteString(u.Opaque)
	case u.EscapedPath() == "":
		_ = bw.WriteByte('/')
	default:
		_, _ = bw.WriteString(u.EscapedPath())
	}
	if u.RawQuery != "" || u.ForceQuery {
		_ = bw.WriteByte('?')
		_, _ = bw.WriteString(u.RawQuery)
	}
	host := req.Host
	if host == "" {
		host = u.Host
	}
	if !validValue(host) {
		return fmt.Errorf("upstream client: invalid Host %q", host)
	}
	_, _ = bw.WriteString(" HTTP/1.1\r\nHost: ")
	_, _ = bw.WriteString(host)
	_, _ = bw.WriteString("\r\n")
	for k, vv := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue // from the request's fields
		}
		if !validToken(k) {
			return fmt.Errorf("upstream client: invalid header field name %q", k)
		}
		for _, v := range vv {
			if !validValue(v) {
				return fmt.Errorf("upstream client: invalid header field value for %q", k)
			}
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			// Spaces and tabs only, as net/http trims: not a value's
			// Unicode spaces (a tester's no-break spaces were cut).
			_, _ = bw.WriteString(strings.Trim(v, " \t"))
			_, _ = bw.WriteString("\r\n")
		}
	}
	if req.Close {
		_, _ = bw.WriteString("Connection: close\r\n")
	}
	switch {
	case chunked:
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(req.Trailer) > 0 {
			_, _ = bw.WriteString("Trailer: ")
			first := true
			for k := range req.Trailer {
				if !validToken(k) {
					return fmt.Errorf("upstream client: invalid trailer name %q", k)
				}
				if !first {
					_, _ = bw.WriteString(", ")
				}
				first = false
				_, _ = bw.WriteString(k)
			}
			_, _ = bw.WriteString("\r\n")
		}
	case hasBody:
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(strconv.AppendInt(cc.wbuf[:0], req.ContentLength, 10))
		_, _ = bw.WriteString("\r\n")
	case method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch:
		_, _ = bw.WriteString("Content-Length: 0\r\n") // as net/http: some servers want one
	}
	_, err := bw.WriteString("\r\n")
	return err
}

// writeBody sends req's body (and its trailers) after the head, flushing
// what each read gave, and reports how it went on wrote. When the body
// fails (the client's read, or a body short of its length) it closes the
// connection, so that the replica does not wait for the rest and the
// response's read fails too. A failed write leaves the connection to the
// response's reader: the replica may have answered before it stopped
// reading (a 413 to an upload), and the read ends either way.
func (cc *clientConn) writeBody(req *http.Request, chunked bool, wrote chan<- error, deadline *headDeadline) {
	bodyFailed, err := cc.copyRequestBody(req, chunked, deadline)
	_ = req.Body.Close()
	if err == nil && deadline != nil {
		deadline.bodySent()
	}
	wrote <- err
	if ne, ok := errors.AsType[net.Error](err); bodyFailed || ok && ne.Timeout() {
		// A replica that stopped taking the body is done with, as is one
		// whose body failed; a write that failed otherwise (a 413 cut
		// the upload short) leaves the answer to be read.
		cc.close()
	}
}

// headDeadline starts the wait for a response's head once the request's
// body is sent, on the writer's goroutine, unless the head came first
// (a replica may answer before it reads the whole body).
type headDeadline struct {
	conn net.Conn
	d    time.Duration
	mu   sync.Mutex
	read bool // the head was read (or failed): no deadline any more
}

func (h *headDeadline) bodySent() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.read {
		_ = h.conn.SetReadDeadline(time.Now().Add(h.d))
	}
}

// headRead ends the wait: the reads of the body that follow have no
// deadline.
func (h *headDeadline) headRead() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.read = true
	return h.conn.SetReadDeadline(time.Time{})
}

// headFlushDelay is how long a request's head waits for the first part of
// its body, to go out in one write with it (see copyRequestBody).
const headFlushDelay = time.Millisecond

// copyRequestBody writes req's body; bodyFailed says that an error came
// from the body, not from the connection. With deadline, each write may
// wait for the replica to take it for deadline.d: a replica that stops
// reading is a timeout, and the waits for the client's body do not
// count.
func (cc *clientConn) copyRequestBody(req *http.Request, chunked bool, deadline *headDeadline) (bodyFailed bool, err error) {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := *bp
	bw := cc.bw
	waiting := func(on bool) { // on the replica
		if deadline == nil {
			return
		}
		var t time.Time
		if on {
			t = time.Now().Add(deadline.d)
		}
		_ = cc.conn.SetWriteDeadline(t)
	}
	defer waiting(false)
	// The head waits in bw for the body's first part, to go out with it
	// in one write; a body not there at once (a client sending it slowly,
	// or waiting for its 100 Continue) lets the head go on after
	// headFlushDelay, as net/http sends it at once: a replica's header or
	// idle timeout must not run out on a request it was never sent (a
	// tester's 502s, from a Go server with ReadHeaderTimeout).
	var headMu sync.Mutex
	headOut := false
	flushHead := time.AfterFunc(headFlushDelay, func() {
		headMu.Lock()
		defer headMu.Unlock()
		if !headOut {
			headOut = true
			waiting(true)  // a replica that takes none of it is a timeout, as for the body
			_ = bw.Flush() // a failure is the body's write's to meet
			waiting(false)
		}
	})
	left := req.ContentLength
	for first := true; ; first = false {
		p := buf
		if !chunked && int64(len(p)) > left {
			p = p[:left]
		}
		n, rerr := 0, error(nil)
		if len(p) > 0 {
			n, rerr = req.Body.Read(p)
		} else {
			rerr = io.EOF
		}
		if first {
			flushHead.Stop()
			headMu.Lock()
			headOut = true
			headMu.Unlock()
		}
		if n > 0 {
			waiting(true)
			if chunked {
				_, _ = bw.Write(strconv.AppendInt(cc.wbuf[:0], int64(n), 16))
				_, _ = bw.WriteString("\r\n")
			}
			_, _ = bw.Write(p[:n])
			if chunked {
				_, _ = bw.WriteString("\r\n")
			}
			left -= int64(n)
			// Each read goes out at once: the body may be a stream whose
			// next part waits for an answer to this one.
			if err := bw.Flush(); err != nil {
				return false, err
			}
			waiting(false)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return true, rerr
		}
	}
	waiting(true)
	if !chunked {
		if left > 0 {
			return true, fmt.Errorf("upstream client: the request body ended %d bytes short of its Content-Length: %w", left, io.ErrUnexpectedEOF)
		}
		return false, bw.Flush()
	}
	_, _ = bw.WriteString("0\r\n")
	for k, vv := range req.Trailer { // filled in as the body ended
		for _, v := range vv {
			if !validValue(v) {
				return true, fmt.Errorf("upstream client: invalid trailer value for %q", k)
			}
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			_, _ = bw.WriteString(v)
			_, _ = bw.WriteString("\r\n")
		}
	}
	_, _ = bw.WriteString("\r\n")
	return false, bw.Flush()
}
