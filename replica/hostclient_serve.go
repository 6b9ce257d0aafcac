package replica

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hostReplica is one actor of a replica host, as the proxy routes to it:
// the proxy holds its slots (exactly like an Upstream, against the limit
// the host announced) and sends its requests over its HostConn.
type hostReplica struct {
	hc     *HostConn
	k      int    // its index in hc.replicas
	hostID string // the actor's id at the host
	id     string // "<host address>/<hostID>"

	slots
	stopped atomic.Bool
}

var (
	_ Replica   = (*hostReplica)(nil)
	_ HostActor = (*hostReplica)(nil)
	_ Stopper   = (*hostReplica)(nil)
)

// ID implements Handle: the host's address and the actor's id there.
func (r *hostReplica) ID() string { return r.id }

// Host implements Actor: the host's address.
func (r *hostReplica) Host() string { return r.hc.addr }

// Batcher implements HostActor.
func (r *hostReplica) Batcher() HostBatcher { return r.hc }

// TryAcquire implements Handle: the actor's slots, and none while its
// host is unreachable, so that the router sends nothing to a host that is
// down (a whole host's actors at once) instead of one retry per actor.
func (r *hostReplica) TryAcquire() (func(), bool) {
	if !r.hc.Connected() {
		return nil, false
	}
	return r.slots.TryAcquire()
}

// Call implements Actor: a control call for this actor alone (a Broadcast
// batches the host's actors instead).
func (r *hostReplica) Call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	res := r.hc.call(ctx, method, payload, Ref{}, []*hostReplica{r})[0]
	return res.Value, res.Err
}

// Stop implements Stopper: the HostConn is closed when the last of its
// replicas is stopped.
func (r *hostReplica) Stop(context.Context) error {
	if r.stopped.CompareAndSwap(false, true) && int(r.hc.stopped.Add(1)) == len(r.hc.replicas) {
		r.hc.Close()
	}
	return nil
}

// patchStats makes a host's stats answer this replica's: its id and its
// state are the proxy's; the counts are the actor's own, across proxies.
func (r *hostReplica) patchStats(v []byte) ([]byte, error) {
	var s Stats
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, fmt.Errorf("replica %s: stats: %w", r.id, err)
	}
	s.ID, s.State = r.id, r.State()
	return json.Marshal(s)
}

// maxWholeBody is the longest request body sent whole, in its request
// frame: a quarter of the host's frame limit leaves the rest for the
// header block.
func maxWholeBody(cc *hostLink) int { return cc.w.peerMax / 4 }

// Serve implements Handle: it sends r to the actor and copies the answer
// to w, streaming both bodies and flushing a response the handler flushed.
//
// Its errors are as Upstream.Serve's: a context error when the client left
// or r's deadline passed; *FullError when the actor refused the request at
// its limit (nothing ran; r may go to another replica, body and all);
// *UnreachableError when there is no connection (retryable), or it broke
// before the answer began (Sent says whether the request may have
// reached the host); *TimeoutError past ResponseHeaderTimeout;
// *RequestBodyError when the client's body could not be read; and
// *ReplicaError when the handler failed (a panic: 500) or the answer broke
// off after it began. Nothing is written to w before the answer begins.
func (r *hostReplica) Serve(w http.ResponseWriter, req *http.Request) error {
	r.served.Add(1)
	c := r.hc
	cc, idx, err := c.pick(r.k)
	if cc == nil {
		return &UnreachableError{Replica: r.id, Down: true, Err: err}
	}
	ctx := req.Context()

	// A short body of known length is read first and sent whole; any
	// other streams once the actor has taken the request.
	var whole *[]byte
	streamed := false
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength != 0 {
		if req.ContentLength > 0 && req.ContentLength <= int64(maxWholeBody(cc)) {
			whole = getBuf(int(req.ContentLength))
			if _, err := io.ReadFull(req.Body, *whole); err != nil {
				putBuf(whole)
				if cerr := ctx.Err(); cerr != nil {
					return cerr
				}
				return &RequestBodyError{Err: err}
			}
		} else {
			streamed = true
		}
	}
	// giveBack lets a retry on another replica read the body again.
	giveBack := func() {
		if whole != nil {
			req.Body = newReplayBody(*whole, req.Body)
			whole = nil
		}
	}
	defer func() {
		if whole != nil {
			putBuf(whole)
		}
	}()

	s := &linkStream{wake: make(chan struct{}, 1)}
	if streamed {
		s.win = newWindow(0) // shut until the host takes the request
	}
	if !cc.register(s) {
		giveBack()
		return &UnreachableError{Replica: r.id, Err: cc.cause()}
	}
	defer cc.unregister(s)
	var body []byte
	if whole != nil {
		body = *whole
	}
	if err := cc.sendRequest(s, idx, req, body, streamed); err != nil {
		if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, errTooLong) {
			return &HeaderTooLargeError{Replica: r.id, Err: err}
		}
		giveBack()
		return &UnreachableError{Replica: r.id, Err: err}
	}
	// replica_timeout_s bounds the waits on the host, as net/http's
	// ResponseHeaderTimeout does: for its answer once the request is
	// sent, body included, and, for a streamed body, for each credit to
	// send more. The waits for the client's body do not count: a slow
	// upload is no slow replica.
	var timeout <-chan time.Time
	var wait *hostWait
	if d := c.o.ResponseHeaderTimeout; d > 0 {
		if streamed {
			wait = newHostWait(d)
			defer wait.end()
			timeout = wait.fire
		} else {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
	}
	var guard *bodyGuard
	if streamed {
		guard = &bodyGuard{rc: req.Body}
		defer guard.detach()
		// Without it, net/http's server drops the rest of the client's
		// body when the response begins.
		_ = http.NewResponseController(w).EnableFullDuplex()
		go pumpBody(ctx, cc, s, guard, wait)
	}

	typ, err := s.waitHead(ctx, timeout)
	if err != nil {
		var be *RequestBodyError
		switch {
		case ctx.Err() != nil:
			cc.cancel(s)
			return ctx.Err()
		case errors.As(err, &be):
			cc.cancel(s)
			return be
		case err == errHeadTimeout:
			cc.cancel(s)
			return &TimeoutError{Replica: r.id, Err: err}
		}
		sent := cc.w.sent(s.gen)
		if !sent {
			giveBack()
		}
		return &UnreachableError{Replica: r.id, Sent: sent, Err: err}
	}
	s.mu.Lock()
	head, flags, in := *s.head, s.headFlags, s.in
	s.mu.Unlock()
	switch typ {
	case frameFull:
		giveBack()
		return &FullError{Replica: r.id}
	case frameError:
		err := decodeErrorFrame(head)
		switch {
		case errors.Is(err, http.ErrAbortHandler):
			return fmt.Errorf("replica %s: handler aborted the response: %w", r.id, http.ErrAbortHandler)
		case errors.Is(err, ErrUnknownActor):
			giveBack() // it ran nowhere
			return &UnreachableError{Replica: r.id, Down: true, Err: err}
		}
		return &ReplicaError{Replica: r.id, Err: err}
	case frameResponse:
	default:
		return &ReplicaError{Replica: r.id, Err: fmt.Errorf("%w: a frame of type %d answering a request", ErrBadFrame, typ)}
	}

	status, end, err := c.readResponseHead(w.Header(), head)
	if err != nil {
		return &ReplicaError{Replica: r.id, Err: err}
	}
	w.WriteHeader(status)
	if flags&flagEnd != 0 {
		if len(head) > end {
			if _, err := w.Write(head[end:]); err != nil {
				return fmt.Errorf("replica %s: writing the response: %w: %w", r.id, context.Canceled, err)
			}
		}
		return nil
	}
	stream := flags&flagStream != 0
	if stream {
		flush(w) // the headers at once: the first event may be long in coming
	}
	for {
		data, end, err := in.take(ctx)
		if len(data) > 0 {
			if _, werr := w.Write(data); werr != nil {
				cc.cancel(s)
				return fmt.Errorf("replica %s: writing the response: %w: %w", r.id, context.Canceled, werr)
			}
			if stream {
				flush(w)
			}
		}
		if end {
			return nil
		}
		if err != nil {
			cc.cancel(s)
			var be *RequestBodyError
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.As(err, &be):
				return be
			case errors.Is(err, http.ErrAbortHandler):
				return fmt.Errorf("replica %s: handler aborted the response: %w", r.id, http.ErrAbortHandler)
			}
			return &ReplicaError{Replica: r.id, Err: fmt.Errorf("the response broke off: %w", err)}
		}
	}
}

// pumpBody sends a streamed request body in data frames, as the host's
// credit allows. The first credit comes when the host takes the request,
// so a refused request has nothing of its body read. It ends at the body's
// end, when the stream is over (its window closed), or at the first read
// error, which fails the stream. wait, if not nil, runs while it waits on
// the host: for credit, and after the body's end.
func pumpBody(ctx context.Context, cc *hostLink, s *linkStream, guard *bodyGuard, wait *hostWait) {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := (*bp)[:min(len(*bp), dataChunk)]
	for {
		wait.on(true)
		n, err := s.win.acquire(ctx, len(buf))
		wait.on(false)
		if err != nil {
			return
		}
		m, rerr := guard.Read(buf[:n])
		s.win.giveBack(n - m)
		end := rerr == io.EOF
		if m > 0 || end {
			var flags byte
			if end {
				flags = flagEnd
			}
			if cc.w.send(frameData, flags, s.id, buf[:m]) != nil {
				return
			}
			if end {
				wait.on(true) // for the answer
				return
			}
		}
		if rerr != nil {
			if errors.Is(rerr, errBodyDetached) {
				return // the request is over
			}
			var be *clientBodyError
			if errors.As(rerr, &be) {
				rerr = be.err
			}
			berr := &RequestBodyError{Err: rerr}
			s.mu.Lock()
			s.bodyErr = berr
			in := s.in
			s.mu.Unlock()
			s.signal()
			if in != nil {
				in.fail(berr)
			}
			cc.cancel(s)
			return
		}
	}
}

// hostWait is replica_timeout_s for a request whose body streams: a timer
// that runs only while the request waits on the host, and closes fire
// when one wait lasts d.
type hostWait struct {
	d    time.Duration
	fire chan time.Time
	mu   sync.Mutex
	t    *time.Timer
	done bool // fired, or the request is over
}

func newHostWait(d time.Duration) *hostWait {
	return &hostWait{d: d, fire: make(chan time.Time)}
}

// on starts (true) or stops a wait on the host. A nil hostWait does
// nothing.
func (w *hostWait) on(waiting bool) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.done:
	case waiting && w.t == nil:
		w.t = time.AfterFunc(w.d, w.expire)
	case waiting:
		w.t.Reset(w.d)
	case w.t != nil:
		w.t.Stop()
	}
}

func (w *hostWait) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.done = true
		close(w.fire)
	}
}

// end stops the timer for good: the request is over.
func (w *hostWait) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if w.t != nil {
		w.t.Stop()
	}
}

// sendRequest queues s's request frame: body is the whole body, or nil
// when it streams (or there is none).
func (cc *hostLink) sendRequest(s *linkStream, idx uint16, req *http.Request, body []byte, streamed bool) error {
	if len(req.Method) > 0xff || len(req.Host) > 0xffff {
		return errTooLong
	}
	b, err := cc.w.lock()
	if err != nil {
		return err
	}
	var flags byte
	if !streamed {
		flags = flagEnd
	}
	b, at := startFrame(b, frameRequest, flags, s.id)
	b = binary.BigEndian.AppendUint16(b, idx)
	b = appendStr8(b, req.Method)
	b, err = appendTarget(b, req.URL)
	if err == nil {
		b = appendStr16(b, req.Host)
		cl := uint64(len(body))
		if streamed {
			cl = unknownLength
			if req.ContentLength > 0 {
				cl = uint64(req.ContentLength)
			}
		}
		b = binary.BigEndian.AppendUint64(b, cl)
		b, err = cc.hc.appendRequestHeaders(b, req)
	}
	if err == nil {
		b = append(b, body...)
		b, err = cc.w.finishFrame(b, at)
	} else {
		b = b[:at]
	}
	s.gen = cc.w.unlock(b)
	return err
}

// appendTarget appends u's path and query as a str16.
func appendTarget(b []byte, u *url.URL) ([]byte, error) {
	at := len(b)
	b = append(b, 0, 0)
	p := u.EscapedPath()
	if p == "" {
		p = "/"
	}
	b = append(b, p...)
	if u.ForceQuery || u.RawQuery != "" {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	n := len(b) - at - 2
	if n > 0xffff {
		return b[:at], errTooLong
	}
	binary.BigEndian.PutUint16(b[at:], uint16(n))
	return b, nil
}

// appendRequestHeaders appends the header sent to the host, as Upstream's
// requestHeader builds it: the client's, less the hop-by-hop ones and
// those the Connection header names, with X-Forwarded-For, -Proto and
// -Host set from what the proxy saw (an incoming one kept, or appended
// to, only from a trusted peer; Forwarded and X-Real-IP too are dropped
// from anyone else), and Via if configured.
func (c *HostConn) appendRequestHeaders(b []byte, r *http.Request) ([]byte, error) {
	in := r.Header
	conn := in["Connection"]
	at := len(b)
	b = append(b, 0, 0)
	n := 0
	add := func(k, v string) {
		b = appendStr16(appendStr16(b, k), v)
		n++
	}
	ip, ok, trust := forwardedFor(r.RemoteAddr, c.o.TrustedProxies)
	for k, vv := range in {
		if !passHeader(k, conn, trust, c.via.on()) {
			continue // hop-by-hop, or set below
		}
		if len(k) > 0xffff {
			return b[:at], errTooLong
		}
		for _, v := range vv {
			if len(v) > 0xffff {
				return b[:at], errTooLong
			}
			add(k, v)
		}
	}
	if ok {
		prior := in["X-Forwarded-For"]
		if trust && len(prior) > 0 {
			add("X-Forwarded-For", strings.Join(prior, ", ")+", "+ip)
		} else {
			add("X-Forwarded-For", ip)
		}
	}
	switch v := in["X-Forwarded-Proto"]; {
	case trust && len(v) > 0:
		add("X-Forwarded-Proto", v[0])
	case r.TLS != nil:
		add("X-Forwarded-Proto", "https")
	default:
		add("X-Forwarded-Proto", "http")
	}
	if v := in["X-Forwarded-Host"]; trust && len(v) > 0 {
		add("X-Forwarded-Host", v[0])
	} else if r.Host != "" {
		add("X-Forwarded-Host", r.Host)
	}
	if c.via.on() {
		add("Via", joinVia(in["Via"], c.via.of(r.ProtoMinor)))
	}
	if n > 0xffff {
		return b[:at], errTooLong
	}
	binary.BigEndian.PutUint16(b[at:], uint16(n))
	return b, nil
}

// readResponseHead reads a response frame's status and headers, adding
// the headers to dst (see copyResponseHeader), and returns where the body
// begins. The headers go straight into dst, their strings cut from one
// allocation, unless the host sent a Connection header.
func (c *HostConn) readResponseHead(dst http.Header, head []byte) (status, end int, err error) {
	r := newWireReader(head)
	status = int(r.u16())
	at := r.off
	n := int(r.u16())
	conn := false
	for range n {
		kf, kt := r.span16()
		r.span16()
		conn = conn || r.ok && string(head[kf:kt]) == "Connection"
	}
	end = r.off
	if !r.ok || status < 100 || status > 999 {
		return 0, 0, fmt.Errorf("%w: a response frame that does not parse", ErrBadFrame)
	}
	r.off = at
	block := string(head[at:end])
	if conn {
		src, _ := parseHeaders(&r, block, at)
		c.copyResponseHeader(dst, src)
		return status, end, nil
	}
	r.u16()
	vals := make([]string, n)
	start := 0
	for i := range n {
		kf, kt := r.span16()
		vf, vt := r.span16()
		vals[i] = block[vf-at : vt-at]
		k := block[kf-at : kt-at]
		if i+1 < n {
			// The next key: a name's values are next to each other.
			nr := r
			nf, nt := nr.span16()
			if nr.ok && string(head[nf:nt]) == k {
				continue
			}
		}
		c.mergeHeader(dst, k, vals[start:i+1:i+1])
		start = i + 1
	}
	if c.via.on() {
		dst["Via"] = []string{joinVia(dst["Via"], c.via.of(1))}
	}
	return status, end, nil
}

// mergeHeader adds the host's values vv of header k to dst, as
// copyResponseHeader does.
func (c *HostConn) mergeHeader(dst http.Header, k string, vv []string) {
	if isHopHeader(k) || k == FullHeader {
		return
	}
	have, ok := dst[k]
	switch {
	case !ok:
		dst[k] = vv
	case !equalValues(have, vv):
		dst[k] = append(have[:len(have):len(have)], vv...)
	}
}

// copyResponseHeader adds the host's response header to dst, as
// Upstream's copyResponseHeader does: less the hop-by-hop headers and
// FullHeader; a header the proxy set already keeps its value when the
// host sends the same, and gets the host's appended otherwise.
func (c *HostConn) copyResponseHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if len(conn) == 0 || !hasToken(conn, k) {
			c.mergeHeader(dst, k, vv)
		}
	}
	if c.via.on() {
		dst["Via"] = []string{joinVia(dst["Via"], c.via.of(1))}
	}
}
