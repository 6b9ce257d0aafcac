package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// onRequest takes a request frame: the actor takes the request, or it is
// refused at once with a full frame.
func (c *hostSession) onRequest(id uint32, flags byte, body []byte) error {
	if id == 0 || len(body) < 2 {
		return fmt.Errorf("%w: a request frame without an id or an actor", ErrBadFrame)
	}
	idx := int(binary.BigEndian.Uint16(body))
	if idx >= len(c.h.actors) {
		err := fmt.Errorf("%w: the host has no actor %d", ErrUnknownActor, idx)
		return c.sendError(id, err)
	}
	l := c.h.actors[idx]
	release, ok := l.TryAcquire()
	if !ok {
		if err := c.w.send(frameFull, 0, id); err != nil && !errors.Is(err, errConnClosed) {
			return err
		}
		return nil
	}
	hr := &hostRequest{stream: hostStream{id: id}} // one allocation for the stream and the request
	s := &hr.stream
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if flags&flagEnd == 0 {
		s.body = newInbox(streamWindow, func(n int) { c.w.sendCredit(id, n) })
	}
	if !c.register(s) {
		release()
		s.cancel()
		return fmt.Errorf("%w: request id %d is in use", ErrBadFrame, id)
	}
	if s.body != nil {
		c.w.sendCredit(id, streamWindow) // taken: the body may come
	}
	buf := copyBuf(body)
	c.handlers.Add(1)
	c.h.unanswered.Add(1)
	go c.serve(hr, l, release, buf, flags&flagEnd != 0)
	return nil
}

// sendError answers stream id with an error frame.
func (c *hostSession) sendError(id uint32, err error) error {
	var code [1]byte
	code[0] = errorCode(err)
	msg := appendStr16(nil, errorMessage(err))
	if err := c.w.send(frameError, 0, id, code[:], msg); err != nil && !errors.Is(err, errConnClosed) && !errors.Is(err, ErrFrameTooLarge) {
		return err
	}
	return nil
}

// hostRequest is everything one request on the host needs, in one
// allocation.
type hostRequest struct {
	stream hostStream
	req    http.Request
	w      hostWriter
	whole  wholeBody
	body   hostBody
}

// serve runs one request on its actor. release frees the actor's slot;
// buf is the request frame's body, which serve gives back.
func (c *hostSession) serve(hr *hostRequest, l *Local, release func(), buf *[]byte, whole bool) {
	defer c.handlers.Done()
	defer c.h.unanswered.Add(-1) // its answer is queued, or cannot be
	defer putBuf(buf)
	s := &hr.stream
	defer c.endStream(s)
	req, err := hr.parse(c, s, *buf, whole)
	if err != nil {
		release()
		if errors.Is(err, ErrBadFrame) {
			c.h.log.Warn().Err(err).Str("peer", c.remote).Msg("replica host: protocol error; connection closed")
			c.w.fail(err)
			return
		}
		_ = c.sendError(s.id, err)
		return
	}
	w := &hr.w
	*w = hostWriter{c: c, s: s}
	returned := false
	defer func() {
		if !returned {
			// The handler ended its goroutine (runtime.Goexit): its slot
			// and its answer are still due, or the actor would be a slot
			// short for good and the request never answered.
			release()
			w.finish(ErrHandlerExited)
			w.free()
		}
	}()
	err = l.Serve(w, req)
	returned = true
	// The handler is done: its slot is free before its answer goes out,
	// so that the proxy, which frees its own slot on the answer, never
	// finds the actor fuller than it thinks.
	release()
	var pe *PanicError
	if errors.As(err, &pe) {
		c.h.log.Error().Str("replica", l.ID()).Str("panic", fmt.Sprint(pe.Value)).Bytes("stack", pe.Stack).
			Str("path", req.URL.Path).Msg("replica host: handler panicked")
	}
	w.finish(err)
	w.free()
}

// parse builds the request from a request frame's body.
func (hr *hostRequest) parse(c *hostSession, s *hostStream, p []byte, whole bool) (*http.Request, error) {
	r := newWireReader(p)
	r.u16() // the actor, read already
	const base = 2
	mf := r.off + 1
	r.str8()
	mt := r.off
	tf, tt := r.span16()
	hf, ht := r.span16()
	cl := r.u64()
	hdrAt := r.off
	for range int(r.u16()) {
		r.span16()
		r.span16()
	}
	end := r.off
	if !r.ok || mt == mf {
		return nil, fmt.Errorf("%w: a request frame that does not parse", ErrBadFrame)
	}
	block := string(p[base:end]) // every string of the request, in one allocation
	hr2 := newWireReader(p)
	hr2.off = hdrAt
	header, ok := parseHeaders(&hr2, block, base)
	if !ok {
		return nil, fmt.Errorf("%w: a request frame whose headers do not parse", ErrBadFrame)
	}
	target := block[tf-base : tt-base]
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("replica host: request target %q: %w", target, err)
	}
	req := &hr.req
	*req = http.Request{
		Method:     block[mf-base : mt-base],
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
		Host:       block[hf-base : ht-base],
		RequestURI: target,
		RemoteAddr: c.remote,
	}
	switch {
	case !whole:
		req.ContentLength = -1
		if cl != unknownLength {
			req.ContentLength = int64(cl)
		}
		hr.body = hostBody{in: s.body, ctx: s.ctx}
		req.Body = &hr.body
	case len(p) > end:
		hr.whole = wholeBody{b: p[end:]}
		req.ContentLength = int64(len(p) - end)
		req.Body = &hr.whole
	default:
		req.Body = http.NoBody
	}
	return req.WithContext(s.ctx), nil
}

// wholeBody is a request body that came whole in its frame.
type wholeBody struct{ b []byte }

func (b *wholeBody) Read(p []byte) (int, error) {
	if len(b.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.b)
	b.b = b.b[n:]
	return n, nil
}

func (b *wholeBody) Close() error { return nil }

// hostBody is a streamed request body, read from its stream's inbox.
type hostBody struct {
	in  *inbox
	ctx context.Context
	cur []byte
	end bool
}

func (b *hostBody) Read(p []byte) (int, error) {
	for len(b.cur) == 0 {
		if b.end {
			return 0, io.EOF
		}
		data, end, err := b.in.take(b.ctx)
		if err != nil {
			return 0, err
		}
		b.cur, b.end = data, end
	}
	n := copy(p, b.cur)
	b.cur = b.cur[n:]
	return n, nil
}

func (b *hostBody) Close() error { return nil }

// hostWriter is a handler's http.ResponseWriter on the host. It keeps the
// body until the handler returns, so that a response whose body fits goes
// in one frame; a handler that flushes, or writes more than a data chunk,
// streams in data frames, paced by the proxy's credit.
type hostWriter struct {
	c *hostSession
	s *hostStream

	header      http.Header
	status      int
	wroteHeader bool
	begun       bool    // the response frame is sent
	flushed     bool    // the handler flushed: the proxy flushes each chunk
	ended       bool    // the last frame is sent
	buf         *[]byte // body not yet sent; pooled
	err         error   // sending failed: the handler's writes fail
}

var _ http.Flusher = (*hostWriter)(nil)

// Header implements http.ResponseWriter.
func (w *hostWriter) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// WriteHeader implements http.ResponseWriter. Informational (1xx)
// statuses are not passed on.
func (w *hostWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if w.wroteHeader || code < 200 {
		return
	}
	w.status, w.wroteHeader = code, true
}

// Write implements http.ResponseWriter.
func (w *hostWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.status == http.StatusNoContent || w.status == http.StatusNotModified {
		return 0, http.ErrBodyNotAllowed
	}
	if w.buf == nil {
		w.buf = getBuf(0)
	}
	*w.buf = append(*w.buf, p...)
	if len(*w.buf) >= dataChunk {
		if err := w.push(false); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush implements http.Flusher: what is written so far goes to the
// proxy, and from now on the proxy flushes every chunk to its client.
func (w *hostWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err == nil {
		w.flushed = true
		_ = w.push(false)
	}
}

// push sends the response frame, if it is not sent, and the body kept so
// far; end sends the last frame too.
func (w *hostWriter) push(end bool) error {
	var body []byte
	if w.buf != nil {
		body = *w.buf
	}
	fw := w.c.w
	if !w.begun {
		b, err := fw.lock()
		if err != nil {
			w.err = err
			return err
		}
		var flags byte
		if w.flushed {
			flags |= flagStream
		}
		b, at := startFrame(b, frameResponse, flags, w.s.id)
		b = binary.BigEndian.AppendUint16(b, uint16(w.status))
		if b, err = appendHeaders(b, w.header, nil); err == nil {
			if end && len(b)-at-frameHeaderLen+len(body) <= fw.peerMax {
				b = append(b, body...)
				b[at+5] |= flagEnd
				body, w.ended = nil, true
			}
			b, err = fw.finishFrame(b, at)
		} else {
			b = b[:at]
		}
		fw.unlock(b)
		if err != nil {
			w.err = err
			return err
		}
		w.begun = true
	}
	if !w.ended && (len(body) > 0 || end) {
		w.c.mu.Lock()
		if w.s.win == nil {
			w.s.win = newWindow(streamWindow)
		}
		win := w.s.win
		w.c.mu.Unlock()
		for len(body) > 0 || end && !w.ended {
			n := min(len(body), dataChunk)
			if n > 0 {
				got, err := win.acquire(w.s.ctx, n)
				if err != nil {
					w.err = err
					return err
				}
				n = got
			}
			var flags byte
			if end && n == len(body) {
				flags = flagEnd
			}
			if err := fw.send(frameData, flags, w.s.id, body[:n]); err != nil {
				w.err = err
				return err
			}
			body = body[n:]
			w.ended = flags == flagEnd
		}
	}
	if w.buf != nil {
		*w.buf = (*w.buf)[:0]
	}
	return nil
}

// finish sends the end of the response once the handler has returned
// with err: the rest of the body, or the error.
func (w *hostWriter) finish(err error) {
	if w.ended {
		return
	}
	if err == nil && w.err == nil {
		if !w.wroteHeader {
			w.WriteHeader(http.StatusOK)
		}
		if w.push(true) == nil {
			return
		}
	}
	if err == nil {
		err = w.err
	}
	if w.s.ctx.Err() != nil {
		return // the proxy gave up on the request, or left
	}
	_ = w.c.sendError(w.s.id, err)
}

// free gives back the body buffer.
func (w *hostWriter) free() {
	if w.buf != nil {
		putBuf(w.buf)
		w.buf = nil
	}
}
