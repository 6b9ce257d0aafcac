package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/replica"
	"github.com/serveproxy/serveproxy/router"
)

const requestIDHeader = "X-Request-Id" // canonical form of X-Request-ID

// newRequestID returns a random UUID (version 4 layout) from the runtime's
// fast per-thread generator: request ids must be unique, not secret.
func newRequestID() string {
	var b [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		b[i], b[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// result is what one request came to, for logs and metrics.
type result struct {
	route   *router.Route
	replica replica.Handle
	status  int
	// replicaStart is when the replica began the request (zero if it never
	// did), replicaEnd when it was done with it; end is when the request
	// was done (later, for a body read after its answer was ready).
	replicaStart time.Time
	replicaEnd   time.Time
	end          time.Time
	// switchedAt is when a handler took the connection over (a
	// WebSocket's handshake done); zero if none did.
	switchedAt time.Time
	err        error
	// abort is set when the replica failed after its response had begun:
	// the connection must be cut so the client cannot take a truncated
	// answer for a whole one.
	abort bool
	// cut is set when the proxy cut the request at the graceful shutdown
	// timeout: its 503 is no error of the replica's.
	cut bool
	// sendTimedOut is set when the client read none of the response for
	// the send timeout (a 499, its connection closed).
	sendTimedOut bool
	// bytes is how much of the response body was written.
	bytes int
	// abandoned is set when the proxy gave up on a handler still running
	// (a 408 at the request timeout).
	abandoned bool
}

// serveApp is the request path of every application route.
func (p *Proxy) serveApp(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	p.metrics.ongoing.Add(1)
	defer p.metrics.ongoing.Add(-1)

	// The key is canonical already: index the map rather than pay Get's
	// canonicalization.
	ids := r.Header[requestIDHeader]
	if len(ids) == 0 || ids[0] == "" {
		ids = []string{newRequestID()}
		r.Header[requestIDHeader] = ids // the replica sees it too
	} else if len(ids) > 1 {
		ids = ids[:1:1]
		r.Header[requestIDHeader] = ids // the one echoed and logged, alone
	}
	id := ids[0]
	w.Header()[requestIDHeader] = ids[:1:1] // shared with the request, never appended to

	sw := getStatusWriter(w, &p.hijacks)
	defer putStatusWriter(sw)
	sw.sendTimeout = p.opts.ClientSendTimeout
	hr := r // the handler's request
	if body := r.Body; body != nil && body != http.NoBody {
		// Not pooled with sw: a handler past its deadline may read it
		// after the request.
		sw.reqBody = &trackedBody{rc: body, length: r.ContentLength}
		if rd, ok := w.(readDeadliner); ok && p.opts.ClientBodyTimeout > 0 {
			sw.reqBody.timeout, sw.reqBody.setDeadline = p.opts.ClientBodyTimeout, rd.SetReadDeadline
		}
		if t := p.opts.RequestTimeout; t > 0 {
			sw.deadline = start.Add(t)
		}
		sw.expect = r.Header["Expect"] != nil // net/http answered any but 100-continue
		sw.reqBody.expect = sw.expect
		sw.reqClose, sw.http10, sw.head = r.Close, !r.ProtoAtLeast(1, 1), r.Method == http.MethodHead
		// The handler's is a copy: net/http decides what to do with the
		// rest of the body by the type of its request's, whenever the
		// response's header goes out (a body it closed early, one too
		// large to read, an Expect whose body did not come), and must
		// find its own.
		if r.Trailer == nil && r.ContentLength < 0 {
			// net/http fills in its own request's Trailer at the body's
			// end, making one if nil: trailers not declared up front must
			// land in a map the copy shares.
			r.Trailer = make(http.Header)
		}
		hr = new(http.Request)
		*hr = *r
		hr.Body = sw.reqBody
		defer func() {
			if hr.MultipartForm != nil && r.MultipartForm == nil {
				r.MultipartForm = hr.MultipartForm // net/http removes its files
			}
		}()
	}
	res := p.route(sw, hr, start)
	if b := sw.reqBody; b != nil && b.gone.Load() && sw.switchedAt.IsZero() && !sw.headerOut {
		// Its client left (or half-closed) before the end of the body it
		// declared: whatever the handler made of the short read (echo
		// answers 400), it is a 499 and gets nothing, as when the
		// handler left the body unread (settleBody). A tester saw 400s
		// for it on the routes that read bodies, 499s on the others.
		if res.status != StatusClientClosedRequest {
			res.status, res.abort, res.err = StatusClientClosedRequest, true, nil
			sw.sent = 0 // still in net/http's buffer, dropped with the connection
		}
		if res.err == nil {
			res.err = fmt.Errorf("%w (%d bytes of it came)", errClientLeftMidBody, b.got.Load())
		}
	}
	if sw.sendArmed && !res.abort && sw.switchedAt.IsZero() {
		sw.endSend()
	}
	if sw.sendTimedOut() {
		// Its client took no part of the response for the timeout: gone,
		// as far as its replica is concerned, whose slot is free.
		res.status, res.sendTimedOut = StatusClientClosedRequest, true
		res.err = fmt.Errorf("the client took no part of the response for %v (PROXY_CLIENT_SEND_TIMEOUT): %w", sw.sendTimeout, sw.writeErr)
	}
	if res.status == StatusClientClosedRequest && p.cut.Load() {
		res.status, res.cut = http.StatusServiceUnavailable, true // see Proxy.cut
		res.err = errCutAtShutdown
	}
	aborted := func() bool {
		return res.abort || (res.status == StatusClientClosedRequest || res.cut) && !sw.wroteHeader
	}
	res.end = time.Now()
	res.replicaEnd = res.end
	if !aborted() {
		if b := sw.reqBody; !sw.wroteHeader && (sw.fullDuplex || b != nil && (b.length < 0 || sw.http10)) {
			// net/http's implicit 200, made explicit to go through
			// closeIfBodyLeft (full duplex; a chunked or HTTP/1.0
			// request, whose connection closes after it: a review found
			// a handler that wrote nothing kept it).
			sw.WriteHeader(http.StatusOK)
		}
		// The answer is ready, but goes out only once the rest of the
		// body is read: the request is recorded after that, with the
		// wait in its latency (not its replica's, done by then), and as
		// a 499 if its client left meanwhile (a 503 if the proxy cut
		// it, at the shutdown).
		if sw.switchedAt.IsZero() && sw.reqBody != nil {
			if err := sw.settleBody(true); err != nil {
				res.status, res.err, res.abort = StatusClientClosedRequest, err, true
				if p.cut.Load() {
					res.status, res.cut, res.err = http.StatusServiceUnavailable, true, errCutAtShutdown
				}
				sw.sent = 0 // still in net/http's buffer, dropped with the connection
			}
			res.end = time.Now()
		}
	}
	res.switchedAt = sw.switchedAt
	if r.Method != http.MethodHead {
		res.bytes = sw.sent // net/http drops a HEAD's body: nothing was sent
	}
	p.record(r, id, start, &res)
	if aborted() {
		// A 499's client may still read (one that half-closed its
		// connection ends the request's context too): it gets nothing,
		// where net/http would send an empty 200. Nor does a request
		// cut at shutdown, whose connection is being closed.
		// net/http's finishRequest, which removes a multipart form's
		// files, does not run after a panic.
		if f := hr.MultipartForm; f != nil {
			_ = f.RemoveAll()
		}
		panic(http.ErrAbortHandler)
	}
	// net/http writes the answer out when this returns; the slot is free
	// and the status settled by now (see replica.AnswerBatcher).
	if b, ok := res.replica.(replica.AnswerBatcher); ok && b.BatchAnswers() {
		runtime.Gosched()
	}
}

// errCutAtShutdown is why a request cut at the graceful shutdown timeout
// failed, for its log line: its context's "context canceled" read as its
// client's leaving.
var errCutAtShutdown = errors.New("cut at the graceful shutdown timeout: the proxy closed its connection")

// errStoppedUnder notes that a request's replica was stopped by the proxy
// while the request was in flight.
var errStoppedUnder = errors.New("cut: the proxy stopped the replica, its graceful_shutdown_timeout_s over, with the request in flight")

// maxAttempts bounds the replicas one request is offered to when they
// refuse it (see replica.Retryable): an unreachable replica leaves routing
// at once, so the second try almost always lands.
const maxAttempts = 3

// A request that maxAttempts replicas refused as full waits
// fullBackoffInitial before the next round of tries, twice as long after
// each round that fails the same way, up to fullBackoffMax: as Serve's
// router backs off from replicas that reject.
const (
	fullBackoffInitial = 5 * time.Millisecond
	fullBackoffMax     = 200 * time.Millisecond
)

// route finds the request's application and replica and runs it there.
// start is when the request arrived.
func (p *Proxy) route(sw *statusWriter, r *http.Request, start time.Time) result {
	if r.Method == http.MethodConnect {
		// A tunnel is a forward proxy's; a replica's 2xx to it would
		// tell the client one is open. The connection closes after: a
		// client may have sent tunnel bytes already.
		sw.Header().Set("Connection", "close")
		writeError(sw, http.StatusNotImplemented, "CONNECT is not supported: this is a reverse proxy")
		return result{status: http.StatusNotImplemented}
	}
	if strings.IndexByte(r.RequestURI, '#') >= 0 {
		// No request target has a fragment (RFC 9112, 3.2): forwarded,
		// it would become %23 and mean another path.
		writeError(sw, http.StatusBadRequest, "Bad Request: a '#' in the request target")
		return result{status: http.StatusBadRequest}
	}
	if r.RequestURI == "*" {
		// The asterisk form is the server's, not a resource's: nothing
		// any replica should get (h2c's "PRI *" preface among them).
		// net/http answers OPTIONS * itself, before the handler.
		writeError(sw, http.StatusBadRequest, "Bad Request: the request target '*' is only for OPTIONS")
		return result{status: http.StatusBadRequest}
	}
	if config.HasDotSegment(r.URL.Path) {
		// Matched as it is, /app/../other would be routed to /app's
		// replicas and reach their /other: out of the prefix that routing
		// (and any rule by prefix in front of the proxy) gave it.
		// Clients resolve dot segments before sending (RFC 3986, 5.2.4).
		writeError(sw, http.StatusBadRequest, "Bad Request: a '.' or '..' segment in the path")
		return result{status: http.StatusBadRequest}
	}
	rt := p.table.Match(r.URL.Path)
	if rt == nil {
		sw.own = true // see closeIfBodyLeft
		sw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		sw.Header().Set("X-Content-Type-Options", "nosniff")
		sw.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(sw, "Path '%s' not found. Ping http://%s/-/routes for the available routes.\n", r.URL.Path, r.Host)
		return result{status: http.StatusNotFound}
	}
	res := result{route: rt}
	if limit := p.opts.MaxBodyBytes; limit > 0 && r.Body != http.NoBody && r.Body != nil {
		if r.ContentLength > limit {
			res.status = http.StatusRequestEntityTooLarge
			writeError(sw, res.status, fmt.Sprintf("Request body too large: %d bytes, the limit is %d bytes (PROXY_MAX_BODY_BYTES)", r.ContentLength, limit))
			return res
		}
		r.Body = limitedBody{http.MaxBytesReader(sw, r.Body, limit), sw.reqBody}
	}
	ctx := r.Context()
	if t := p.opts.RequestTimeout; t > 0 {
		var cancel context.CancelFunc
		// The very deadline sw.deadline bounds the body's reads by: a
		// read failing at it ends the context too (net/http's doing),
		// and it is a 408 as the deadline's own end is (see
		// deadlineError).
		ctx, cancel = context.WithDeadline(ctx, start.Add(t))
		defer cancel()
		outer := r
		r = r.WithContext(ctx)
		defer func() {
			// A multipart form the handler parsed, once it has returned
			// (see serveWithDeadline), for net/http to remove its files.
			if !res.abandoned && r.MultipartForm != nil {
				outer.MultipartForm = r.MultipartForm
			}
		}()
	}

	var tried [maxAttempts]replica.Handle // the replicas that refused it, this round
	sawFull := false                      // one of them was full
	backoff := fullBackoffInitial
	backedOff := false
	for attempt := 1; ; attempt++ {
		// A request served at once starts on its replica when it arrived,
		// give or take the routing's few hundred nanoseconds: reading the
		// clock again is a measurable cost per request on virtual
		// machines. Only a request that waited (or is retried) gets its
		// own replica start.
		var h replica.Handle
		var release func()
		var ok bool
		if attempt == 1 {
			h, release, ok = rt.Scheduler.TryAcquire()
		} else {
			h, release, ok = rt.Scheduler.TryAcquireExcept(tried[:attempt-1])
		}
		if !ok || attempt > 1 || backedOff {
			if !ok {
				var err error
				if h, release, err = rt.Scheduler.Acquire(ctx); err != nil {
					res.status = statusOf(err)
					// No Retry-After from a deployment that gave up
					// starting its replicas (max_constructor_retry_count):
					// a second later is no better.
					gaveUp := errors.Is(err, router.ErrNoReplicas) && p.routeMeta[rt].deployment.GaveUp()
					writeErrorRetry(sw, res.status, errorMessage(res.status, err), res.status == http.StatusServiceUnavailable && !gaveUp)
					if res.replica != nil {
						// The replica tried refused it before none was
						// left (unreachable, say): it was sent nothing,
						// and its refusal is why, for the log.
						err = fmt.Errorf("%w (after %s refused it: %w)", err, res.replica.ID(), res.err)
						res.replica = nil
					}
					res.err = err
					return res
				}
			}
			res.replicaStart = time.Now()
		} else {
			res.replicaStart = start
		}
		res.replica = h
		if p.opts.RequestTimeout > 0 {
			res.abandoned, res.err = p.serveWithDeadline(ctx, h, release, sw, r)
		} else {
			res.err = p.serveOn(h, release, sw, r, start, &res)
		}
		if res.err == nil {
			break
		}
		if st, ok := h.(interface{ State() replica.State }); ok && st.State() == replica.StateStopped {
			if _, ok := errors.AsType[*replica.UnreachableError](res.err); ok {
				// The proxy stopped the replica under it (retired by a
				// scale-down, a failed health check or reconfigure, a
				// target or host gone, the shutdown), its
				// graceful_shutdown_timeout_s over: "unreachable" alone
				// reads as the replica failing the request.
				res.err = fmt.Errorf("%w (%w)", res.err, errStoppedUnder)
			}
		}
		// A replica that cannot be reached leaves routing, whether or not
		// the request may go elsewhere (one it reached before dying may
		// not).
		var unreachable *replica.UnreachableError
		if errors.As(res.err, &unreachable) && unreachable.Down {
			p.routeMeta[rt].deployment.ReportUnreachable(h, res.err)
		}
		// Another replica may take the request only if none accepted it
		// (issue 5): refused, unreachable before a byte was sent, or full.
		if sw.wroteHeader || !replica.Retryable(res.err) {
			break
		}
		tried[attempt-1] = h
		var full *replica.FullError
		sawFull = sawFull || errors.As(res.err, &full)
		if attempt < maxAttempts {
			continue
		}
		if !sawFull {
			break // unreachable or refused, each of them: 502
		}
		// The replicas tried were full at their own count (as when other
		// proxies share them), or gone (out of routing now): the request
		// waits as a queued one does (Serve's router backs off and tries
		// again), rather than fail while its deployment has room for it
		// to wait. A round that ended on a replica gone had been a 502.
		if err := rt.Scheduler.Backoff(ctx, backoff); err != nil {
			res.replica = nil // no replica's error: it ended waiting
			res.err = err
			res.status = statusOf(err)
			writeError(sw, res.status, errorMessage(res.status, err))
			return res
		}
		backoff = min(2*backoff, fullBackoffMax)
		backedOff = true
		attempt, sawFull = 0, false
		tried = [maxAttempts]replica.Handle{}
	}
	// (A handler that took the connection over has nothing left to abort.)
	res.abort = res.err != nil && sw.switchedAt.IsZero() && (sw.wroteHeader || errors.Is(res.err, http.ErrAbortHandler))
	res.status = p.finish(sw, r, &res)
	return res
}

// serveOn runs r on h and frees h's slot after. A handler that ends its
// goroutine (runtime.Goexit, as t.FailNow does) never returns to route:
// its slot is freed and its request answered and recorded on the way
// out, or the slot would be lost for good, the client find its connection
// closed, and the logs and metrics show nothing. (Not a defer in route,
// whose many returns would cost every request a defer record.)
func (p *Proxy) serveOn(h replica.Handle, release func(), sw *statusWriter, r *http.Request, start time.Time, res *result) error {
	returned := false
	defer func() {
		release()
		if !returned {
			p.endedInHandler(sw, r, start, res)
		}
	}()
	err := h.Serve(sw, r)
	returned = true
	return err
}

// endedInHandler answers and records a request whose handler ended the
// request's goroutine: nothing after route runs for it, and net/http
// closes its connection without writing out what is buffered. An answer
// the handler had begun is cut there.
func (p *Proxy) endedInHandler(sw *statusWriter, r *http.Request, start time.Time, res *result) {
	res.err, res.status = replica.ErrHandlerExited, http.StatusInternalServerError
	res.end = time.Now()
	res.replicaEnd = res.end
	answer := !sw.wroteHeader && sw.switchedAt.IsZero()
	if answer {
		msg := errorMessage(res.status, res.err)
		h := sw.Header()
		h.Set("Connection", "close")
		h.Set("Content-Length", strconv.Itoa(len(msg)+1)) // writeError's line
		writeError(sw, res.status, msg)
		if r.Method != http.MethodHead {
			res.bytes = sw.sent
		}
	} else {
		res.abort = sw.switchedAt.IsZero() // what is buffered is dropped
		res.bytes = sw.sent                // as for a panic after the answer began
	}
	if f := r.MultipartForm; f != nil {
		_ = f.RemoveAll() // net/http's finishRequest, which would, does not run
	}
	var id string
	if ids := r.Header[requestIDHeader]; len(ids) > 0 {
		id = ids[0]
	}
	// Recorded before the answer goes out, as every request is: its
	// client must not find a later request of its own logged first.
	p.record(r, id, start, res)
	if answer {
		_ = sw.FlushError()
	}
}

// serveWithDeadline runs the handler in its own goroutine so that the proxy
// can answer 408 at the deadline even if the handler ignores its context.
// The replica's slot is held until the handler really returns: the limit
// counts work being done, not requests being waited for.
//
// abandoned is set when the handler is still running as this returns:
// then the files of a multipart form it parses are removed once it is
// done.
func (p *Proxy) serveWithDeadline(ctx context.Context, h replica.Handle, release func(), sw *statusWriter, r *http.Request) (abandoned bool, err error) {
	dw := newDeadlineWriter(sw)
	done := make(chan error, 1)
	go func() {
		defer release()
		err := replica.ErrHandlerExited // unless it returns
		defer func() { done <- err }()
		err = h.Serve(dw, r)
	}()
	select {
	case err := <-done:
		dw.finish(err)
		return false, err
	case <-ctx.Done():
	}
	hijacked, cut := dw.close()
	if hijacked {
		// A WebSocket, say: the deadline was its handshake's, and its
		// handler has the connection now. Its slot is held until it ends.
		return false, <-done
	}
	select {
	case err := <-done:
		if cut || dw.refused.Load() {
			// Its answer was being written, and is cut short (a write
			// in progress, or one refused after the deadline: a 200 was
			// recorded for it, one in sixty under load).
			return false, deadlineError(ctx)
		}
		// It finished just as the deadline passed: its answer stands if
		// it began (the proxy answers 408 if not, so its header stays
		// out).
		return false, err
	default:
	}
	go func() {
		<-done
		if r.MultipartForm != nil {
			_ = r.MultipartForm.RemoveAll()
		}
	}()
	// If the response had begun, it is too late for a status: route sees
	// that and aborts the connection.
	return true, deadlineError(ctx)
}

// deadlineError is ctx's error, as the request timeout's end: once its
// deadline has passed, a cancel (a body's read failing at that deadline,
// which ends the connection's context first) is a 408 too, not a 499 (a
// review found six in ten so).
func deadlineError(ctx context.Context) error {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return ctx.Err()
}

// finish decides a served request's status, answering for the replica when
// it failed before writing anything.
func (p *Proxy) finish(sw *statusWriter, r *http.Request, res *result) int {
	err, abort := res.err, res.abort
	if b := sw.reqBody; b != nil && b.stalled() && !sw.wroteHeader && sw.switchedAt.IsZero() {
		// The client stalled its body: whatever its replica made of the
		// failed read (the request's context ends with it), it is a 408,
		// and the connection, its body half read, cannot go on.
		sw.Header().Set("Connection", "close")
		writeError(sw, http.StatusRequestTimeout, fmt.Sprintf("Request Timeout: no part of the request body came for %v (PROXY_CLIENT_BODY_TIMEOUT)", b.timeout))
		return http.StatusRequestTimeout
	}
	if err != nil {
		status := statusOf(err)
		switched := !sw.switchedAt.IsZero()
		var pe *replica.PanicError
		if errors.As(err, &pe) {
			msg := "handler panicked; answered 500"
			switch {
			case switched:
				msg = "handler panicked after taking its connection over"
			case sw.wroteHeader:
				// Its answer had begun: the client gets it cut, no 500
				// (a tester read "answered 500" beside a 200's head).
				msg = "handler panicked after its answer began; connection cut"
			}
			// Named as its access-log line is, to be found beside it.
			ev := p.opts.Log.Error().Str("panic", fmt.Sprint(pe.Value)).Bytes("stack", pe.Stack)
			if ids := r.Header[requestIDHeader]; len(ids) > 0 {
				ev.Str("request_id", clipped(ids[0]))
			}
			if rs := p.routeMeta[res.route]; rs != nil && rs.deployment != nil {
				ev.Str("application", rs.deployment.App()).Str("deployment", rs.deployment.Name())
			}
			if res.replica != nil {
				ev.Str("replica", res.replica.ID())
			}
			ev.Str("path", clipped(r.URL.Path)).Msg(msg)
		}
		if switched {
			// The connection was the handler's (a WebSocket): there is
			// no status to send, and the error goes in its log line.
			return http.StatusSwitchingProtocols
		}
		if !sw.wroteHeader && !abort {
			writeError(sw, status, errorMessage(status, err))
		}
		return status
	}
	if sw.writeErr != nil && r.Context().Err() != nil {
		// The response began, but its connection broke (net/http ends
		// the request's context with it): the client did not get it,
		// whatever status it began with.
		return StatusClientClosedRequest
	}
	// A read of the body that failed at the handler's own read deadline
	// ends the request's context too (net/http's doing): not the client's
	// leaving.
	b := sw.reqBody
	ownCut := b != nil && b.cut.Load()
	// net/http ends the context for the client's leaving once the body
	// is read to its end (its read for that starts there), or as a read of
	// the body finds the connection gone; before the body's end, a read
	// failing at one of the proxy's own deadlines ends it too.
	clientLeft := (b == nil || b.eof.Load() || b.gone.Load()) && errors.Is(r.Context().Err(), context.Canceled)
	// A client that left before the end of its body with nothing of the
	// answer out is serveApp's to tell (errClientLeftMidBody).
	leftMidBody := b != nil && b.gone.Load() && !sw.headerOut
	if clientLeft && sw.wroteHeader && sw.switchedAt.IsZero() && !leftMidBody {
		// Its client left before the handler was done (net/http ended
		// the request's context), however the handler took it: a
		// tester's stream that stopped at its context, and an answer
		// written after its client had gone, were recorded as 200s.
		if !sw.headerOut {
			// None of the answer has gone out (it is in net/http's
			// buffer): as for a handler that gave up, it is a 499 and
			// the client gets nothing (one that only half-closed counts
			// as gone).
			res.err, res.abort = errClientLeftMidAnswer, true
			sw.sent = 0 // dropped with the connection
			return StatusClientClosedRequest
		}
		if !sw.answerWhole(r.Method == http.MethodHead) {
			res.err = errClientLeftMidAnswer
			return StatusClientClosedRequest
		}
	}
	if ctxErr := r.Context().Err(); !sw.wroteHeader && ctxErr != nil && !(ownCut && errors.Is(ctxErr, context.Canceled)) {
		// The handler gave up on a request whose client left (499: nothing
		// is written) or whose deadline passed (408).
		status := statusOf(ctxErr)
		writeError(sw, status, errorMessage(status, ctxErr))
		return status
	}
	if !sw.wroteHeader {
		return http.StatusOK // net/http sends an empty 200
	}
	return sw.status
}

// record writes the request's metrics and access-log line.
func (p *Proxy) record(r *http.Request, id string, start time.Time, res *result) {
	elapsed := res.end.Sub(start)
	rs := p.notFound
	if res.route != nil {
		rs = p.routeMeta[res.route]
	}
	ms := float64(elapsed) / float64(time.Millisecond)
	o := rs.metrics.http.get(httpKey{method: methodLabel(r.Method), status: res.status})
	o.latency.Observe(ms) // its count is serve_num_http_requests_total
	if o.errors != nil {
		o.errors.Inc()
	}
	var replicaID string
	if res.replica != nil {
		replicaID = res.replica.ID()
		ro := rs.metrics.replicas.get(replicaID)
		end := res.replicaEnd
		if !res.switchedAt.IsZero() {
			// A WebSocket's processing is its handshake: its length
			// would swamp the histogram, which has no status label to
			// tell it apart (the access log and the HTTP histogram,
			// under 101, have the length).
			end = res.switchedAt
		}
		ro.latency.Observe(float64(end.Sub(res.replicaStart)) / float64(time.Millisecond))
		if (res.status >= 500 || res.status == http.StatusSwitchingProtocols && res.err != nil) && !res.cut {
			// (A WebSocket's error is its replica's connection breaking.)
			ro.errors.Inc()
		}
	}
	if rs.log == nil {
		return
	}
	e := accessEntry{
		end:        res.end, // already read: time.Now is a measurable cost per request on virtual machines
		requestID:  clipped(id),
		method:     clipped(r.Method), // a token, but of any length up to the header limit
		path:       clipped(r.URL.Path),
		status:     res.status,
		bytes:      res.bytes,
		elapsed:    elapsed,
		replica:    replicaID,
		remoteAddr: r.RemoteAddr,
	}
	if res.err != nil && (res.status >= 500 || res.status == http.StatusSwitchingProtocols || res.sendTimedOut || errors.Is(res.err, errClientLeftDuringBody) || errors.Is(res.err, errClientLeftMidBody) || errors.Is(res.err, errClientLeftMidAnswer)) {
		// Why: a replica's 500, 502 or 504, a WebSocket's replica gone, a
		// client that stopped reading, or one that left before its
		// answer, ready, could go out, or before its end.
		e.err = clipped(res.err.Error())
	}
	p.access.write(rs.log, &e)
}

// maxLoggedValue bounds the values from the client (and the error) in an
// access-log line, which must fit in one of the log's buffers: a client
// must not keep its request out of the log with a long path or id.
const maxLoggedValue = 4 << 10

// clipped returns s, cut to maxLoggedValue bytes with "..." after.
func clipped(s string) string {
	if len(s) <= maxLoggedValue {
		return s
	}
	return s[:maxLoggedValue] + "..."
}

// appendMillis appends d in milliseconds with three decimals (microsecond
// precision), as a JSON number: fixed-point is several times cheaper than
// strconv's shortest float.
func appendMillis(b []byte, d time.Duration) []byte {
	us := d.Microseconds()
	if us < 0 {
		b = append(b, '-')
		us = -us
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}
