package replica

// The replica-host protocol: how a proxy (HostConn) talks to a replica
// host (Host, cmd/replica) over TCP. It exists so that a request to an
// actor in another process costs less than one HTTP exchange: many requests
// share a connection, are answered out of order, and the frames that wait
// while a write is in progress all go out in the next one, so that under
// load N requests cost about one write system call on each side, not N.
//
// # Frames
//
// A connection carries frames both ways. A frame is a 10-byte header and a
// body; integers are big-endian:
//
//	length  uint32  the body's length, at most the receiver's max frame size
//	type    uint8   one of the types below
//	flags   uint8   end (1), stream (2), payload (4); see the types
//	stream  uint32  the request or control call the frame belongs to; 0 for the connection
//
// In the bodies, str8 and str16 are a uint8 or uint16 length and that many
// bytes, bytes32 a uint32 length and that many bytes, and headers a uint16
// count and that many (name str16, value str16) pairs, one pair per value,
// the values of one name next to each other.
//
//	type         from   stream  body
//	1  hello     proxy  0       magic "serveproxy-host", version uint16, max_frame uint32,
//	                            capabilities uint8 (1: it takes goaway; absent from proxies
//	                            before goaway, which hosts then close as before)
//	1  hello     host   0       magic, version uint16, max_frame uint32, count uint16,
//	                            count x (actor id str8, max_ongoing_requests uint32)
//	2  request   proxy  req     actor uint16 (its index in the host's hello), method str8,
//	                            target str16 (path?query), host str16, content_length
//	                            uint64 (^0: unknown), headers; with end: the whole body
//	                            is the rest, else it follows in data frames
//	3  response  host   req     status uint16, headers; with end: the whole body is the
//	                            rest, else it follows in data frames; stream: the handler
//	                            flushed, so the proxy flushes each chunk to its client
//	4  data      both   req     a chunk of body; end on the last one (which may be empty)
//	5  credit    both   req     n uint32: the sender of data may send n more bytes
//	6  cancel    proxy  req     the proxy gave up on the request or call (the client left,
//	                            a deadline passed): the host cancels its context
//	7  full      host   req     refused: the actor is at its max_ongoing_requests, or not
//	                            running; nothing of the request ran or was read
//	8  error     host   req     code uint8, message str16: the request failed at the host;
//	                            before a response, the replica's error (500); after one,
//	                            the response breaks off
//	9  control   proxy  call    timeout_ms uint32 (0: none), method str8, ref uint64 (0: the
//	                            payload is by value), count uint16, count x actor uint16,
//	                            then the payload, the rest: by value, or the ref's bytes
//	                            with flag payload; nothing when a ref is named without it
//	10 result    host   call    count uint16, count x (code uint8, bytes32): one per actor
//	                            of the call, in its order; the answer if code is 0, else
//	                            the error's message
//	11 free      proxy  0       ref uint64: drop the payload kept under ref
//	12 goaway    host   0       empty: the host is shutting down; the proxy sends no new
//	                            request or call on the connection, and closes it once
//	                            every one in flight is answered (those that reach the
//	                            host meanwhile are answered full)
//
// The proxy dials, sends its hello and waits for the host's; then both
// sides send frames whenever they like. The proxy numbers requests and
// calls (one space, never 0, not reused while in flight). A host answers
// every request with full, error or a response (and its data), and every
// call with result or error, unless the proxy cancels it first.
//
// # Bodies and flow control
//
// A body that fits in one frame is sent whole in its request or response
// frame: the common case, one frame each way per request. Longer or
// streamed bodies go in data frames of at most dataChunk bytes, and only
// they are flow controlled: each direction of each request has a window
// of streamWindow bytes that the sender may have sent and the receiver not
// yet credited back. A response's window is open from the start. A
// streamed request body's is shut until the host takes the request (it
// then sends credit streamWindow), so that a request refused as full has
// none of its body read, and can go to another replica whole.
//
// # Control calls and payload refs
//
// One control frame carries one encoded call and the actors it is for; the
// host fans it out to them (Pool.Broadcast over its own actors) and sends
// one result frame. set_gc is applied once per frame: it tunes the process,
// not an actor. A call passed by Ref carries its bytes (flag payload) only
// the first time it goes on a connection; the host keeps them under the
// ref id, for that connection, until free.
//
// # Errors
//
// A frame over the receiver's max frame size, of an unknown type or
// direction, or whose body does not parse, breaks the protocol: the side
// that read it closes the connection (ErrFrameTooLarge, ErrBadFrame), and
// everything in flight on it fails.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
)

const (
	hostMagic           = "serveproxy-host"
	hostProtocolVersion = 1
	// capGoAway, in a proxy's hello, says that it takes goaway frames.
	capGoAway = 1

	frameHeaderLen = 10

	// DefaultMaxFrameSize is the largest frame body a host or a proxy takes
	// unless told otherwise (HostConfig.MaxFrameSize,
	// HostOptions.MaxFrameSize).
	DefaultMaxFrameSize = 1 << 20
	// MinMaxFrameSize is the smallest max frame size allowed: a data chunk
	// and an ordinary header block must fit.
	MinMaxFrameSize = 64 << 10

	// dataChunk is the most body one data frame carries.
	dataChunk = 32 << 10
	// streamWindow is each stream's flow-control window, each way.
	streamWindow = 256 << 10
	// readBufferSize is the bufio.Reader's size: frames up to it are read
	// in place, without a copy.
	readBufferSize = 64 << 10
	// unknownLength is content_length's "unknown" (a chunked body).
	unknownLength = ^uint64(0)
)

type frameType uint8

const (
	frameHello frameType = 1 + iota
	frameRequest
	frameResponse
	frameData
	frameCredit
	frameCancel
	frameFull
	frameError
	frameControl
	frameResult
	frameFree
	frameGoAway
)

const (
	flagEnd     = 1 << 0
	flagStream  = 1 << 1
	flagPayload = 1 << 2
)

var (
	// ErrFrameTooLarge is a frame over the receiver's max frame size, or
	// one that would be over the peer's: the connection is closed (read) or
	// the frame is not sent (write).
	ErrFrameTooLarge = errors.New("replica host protocol: frame over the size limit")
	// ErrBadFrame is a frame that breaks the replica-host protocol: an
	// unknown type, a type the sender may not send, or a body that does
	// not parse. The connection is closed.
	ErrBadFrame = errors.New("replica host protocol: malformed frame")
	// errConnClosed is the error of a connection closed on purpose.
	errConnClosed = errors.New("replica host connection closed")
	// errHostGoingAway is why a proxy closed a connection whose host sent
	// goaway.
	errHostGoingAway = errors.New("the replica host is shutting down (goaway)")
)

// Error codes of error and result frames. A code names the error the
// proxy rebuilds (errors.Is holds for the sentinels); the message is the
// host's text.
const (
	codeOK byte = iota
	codeOther
	codePanic
	codeAborted // http.ErrAbortHandler
	codeUnknownActor
	codeUnknownMethod
	codeNotReconfigurable
	codeCheckInFlight
	codeUnknownRef
	codeDeadline
	codeCanceled
)

// errorCode returns err's code, for the wire.
func errorCode(err error) byte {
	var pe *PanicError
	switch {
	case err == nil:
		return codeOK
	case errors.Is(err, http.ErrAbortHandler):
		return codeAborted
	case errors.As(err, &pe):
		return codePanic
	case errors.Is(err, ErrUnknownActor):
		return codeUnknownActor
	case errors.Is(err, ErrUnknownMethod):
		return codeUnknownMethod
	case errors.Is(err, ErrNotReconfigurable):
		return codeNotReconfigurable
	case errors.Is(err, ErrCheckInFlight):
		return codeCheckInFlight
	case errors.Is(err, ErrUnknownRef):
		return codeUnknownRef
	case errors.Is(err, context.DeadlineExceeded):
		return codeDeadline
	case errors.Is(err, context.Canceled):
		return codeCanceled
	}
	return codeOther
}

// remoteError is an error a host sent: its text, and the sentinel its
// code names, if any.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// decodeError rebuilds the error a host sent as code and msg. A panic is a
// *PanicError whose Value is the host's text (the host logs the stack).
func decodeError(code byte, msg string) error {
	var is error
	switch code {
	case codePanic:
		// The host's text is its PanicError's: "panic: " once, not twice
		// ("handler panic: " from hosts before it was "panic: ").
		v, ok := strings.CutPrefix(msg, "panic: ")
		if !ok {
			v = strings.TrimPrefix(msg, "handler panic: ")
		}
		return &PanicError{Value: v}
	case codeAborted:
		is = http.ErrAbortHandler
	case codeUnknownActor:
		is = ErrUnknownActor
	case codeUnknownMethod:
		is = ErrUnknownMethod
	case codeNotReconfigurable:
		is = ErrNotReconfigurable
	case codeCheckInFlight:
		is = ErrCheckInFlight
	case codeUnknownRef:
		is = ErrUnknownRef
	case codeDeadline:
		is = context.DeadlineExceeded
	case codeCanceled:
		is = context.Canceled
	}
	return &remoteError{msg: msg, is: is}
}

// errorMessage is err's text as an error frame carries it: cut to fit a
// str16.
func errorMessage(err error) string {
	msg := err.Error()
	if len(msg) > 1<<12 {
		msg = msg[:1<<12]
	}
	return msg
}

// The encoders append to a frame being built.

func appendStr8(b []byte, s string) []byte {
	return append(append(b, byte(len(s))), s...)
}

func appendStr16(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint16(b, uint16(len(s))), s...)
}

func appendBytes32(b []byte, p []byte) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(p))), p...)
}

// errTooLong is a string too long for its length prefix.
var errTooLong = errors.New("a method, header or actor id too long for the replica host protocol")

// appendHeaders appends h as a headers field, less the headers skip
// reports.
func appendHeaders(b []byte, h http.Header, skip func(string) bool) ([]byte, error) {
	at := len(b)
	b = append(b, 0, 0)
	n := 0
	for k, vv := range h {
		if skip != nil && skip(k) {
			continue
		}
		if len(k) > 0xffff {
			return b, errTooLong
		}
		for _, v := range vv {
			if len(v) > 0xffff {
				return b, errTooLong
			}
			b = appendStr16(appendStr16(b, k), v)
			n++
		}
	}
	if n > 0xffff {
		return b, errTooLong
	}
	binary.BigEndian.PutUint16(b[at:], uint16(n))
	return b, nil
}

// wireReader reads a frame's body. A read past the end sets ok to false
// and returns zeros, so that a body is parsed in one go and checked once.
type wireReader struct {
	b   []byte
	off int // how much has been read
	ok  bool
}

func newWireReader(b []byte) wireReader { return wireReader{b: b, ok: true} }

func (r *wireReader) take(n int) []byte {
	if !r.ok || n < 0 || len(r.b)-r.off < n {
		r.ok = false
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

func (r *wireReader) u8() byte {
	if v := r.take(1); len(v) == 1 {
		return v[0]
	}
	return 0
}

func (r *wireReader) u16() uint16 {
	if v := r.take(2); len(v) == 2 {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *wireReader) u32() uint32 {
	if v := r.take(4); len(v) == 4 {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *wireReader) u64() uint64 {
	if v := r.take(8); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (r *wireReader) str8() []byte  { return r.take(int(r.u8())) }
func (r *wireReader) str16() []byte { return r.take(int(r.u16())) }

// span16 skips a str16 and returns where its bytes are.
func (r *wireReader) span16() (from, to int) {
	n := int(r.u16())
	from = r.off
	r.take(n)
	return from, r.off
}

func (r *wireReader) bytes32() []byte {
	n := r.u32()
	if uint64(n) > uint64(len(r.b)) {
		r.ok = false
		return nil
	}
	return r.take(int(n))
}

func (r *wireReader) rest() []byte {
	if !r.ok {
		return nil
	}
	v := r.b[r.off:]
	r.off = len(r.b)
	return v
}

// parseHeaders reads a headers field into an http.Header whose keys and
// values are substrings of block, the frame's bytes from offset base on
// made into one string: one allocation for all of them.
func parseHeaders(r *wireReader, block string, base int) (http.Header, bool) {
	n := int(r.u16())
	if !r.ok {
		return nil, false
	}
	h := make(http.Header, n)
	vals := make([]string, n)
	prev, start := "", 0
	for i := range n {
		kf, kt := r.span16()
		vf, vt := r.span16()
		if !r.ok || kt-base > len(block) || vt-base > len(block) {
			return nil, false
		}
		k, v := block[kf-base:kt-base], block[vf-base:vt-base]
		vals[i] = v
		switch {
		case i > 0 && k == prev:
			h[k] = vals[start : i+1 : i+1]
		case h[k] != nil:
			h[k] = append(h[k], v) // not next to its others: a copy
		default:
			start, prev = i, k
			h[k] = vals[i : i+1 : i+1]
		}
	}
	return h, true
}

// frameReader reads frames through a bufio.Reader: a frame that fits in
// its buffer is returned in place, a longer one is read into a buffer of
// its own.
type frameReader struct {
	br   *bufio.Reader
	max  int    // the largest body taken
	long []byte // for bodies longer than br's buffer
	peer string // for errors
}

func newFrameReader(nc net.Conn, max int) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(nc, readBufferSize), max: max, peer: nc.RemoteAddr().String()}
}

// next returns the next frame. Its body is valid until the next call.
func (fr *frameReader) next() (typ frameType, flags byte, id uint32, body []byte, err error) {
	h, err := fr.br.Peek(frameHeaderLen)
	if err != nil {
		if err == io.EOF && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h))
	typ, flags, id = frameType(h[4]), h[5], binary.BigEndian.Uint32(h[6:])
	if n > fr.max {
		return 0, 0, 0, nil, fmt.Errorf("%w: a %d-byte frame from %s; the limit is %d bytes (MaxFrameSize)", ErrFrameTooLarge, n, fr.peer, fr.max)
	}
	if typ < frameHello || typ > frameGoAway {
		return 0, 0, 0, nil, fmt.Errorf("%w: unknown frame type %d from %s", ErrBadFrame, typ, fr.peer)
	}
	if frameHeaderLen+n <= fr.br.Size() {
		b, err := fr.br.Peek(frameHeaderLen + n)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, 0, 0, nil, err
		}
		// The bytes stay in the buffer until the next read.
		_, _ = fr.br.Discard(frameHeaderLen + n)
		return typ, flags, id, b[frameHeaderLen:], nil
	}
	_, _ = fr.br.Discard(frameHeaderLen)
	if cap(fr.long) < n {
		fr.long = make([]byte, n)
	}
	body = fr.long[:n]
	if _, err := io.ReadFull(fr.br, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, 0, nil, err
	}
	return typ, flags, id, body, nil
}

// frameWriter coalesces frames: senders append them to a shared buffer,
// and one goroutine (run) writes everything that has gathered in a single
// Write while the next frames gather in a second buffer. Under load the
// frames of many requests go out in one system call; idle, a frame goes
// out at once.
type frameWriter struct {
	nc      net.Conn
	peerMax int // the largest frame body the peer takes

	// mu guards the fields below.
	mu sync.Mutex
	// buf holds the frames not yet taken by run. Frames appended now go
	// out in write number gen.
	buf []byte
	gen uint64
	// err is why writing stopped; once set, no frame is taken.
	err error
	// closing asks run to write what is left, then close the connection.
	closing bool
	// spare is the buffer run wrote last, for the next swap.
	spare []byte

	wake chan struct{} // buf went from empty to not, or closing was set; capacity 1
	done chan struct{} // closed when run has returned
}

// maxSpare is the largest buffer kept between writes: a burst's bigger
// one is dropped.
const maxSpare = 1 << 20

func newFrameWriter(nc net.Conn, peerMax int) *frameWriter {
	return &frameWriter{nc: nc, peerMax: peerMax, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// run writes what gathers until the connection fails or closes.
func (w *frameWriter) run() {
	defer close(w.done)
	for range w.wake {
		// Let the goroutines that are ready to run (the handlers of the
		// requests that came in the last read, the requests woken by the
		// last answers) queue their frames first: they then go out in this
		// write, not one write each. Idle, nothing else is runnable and
		// this returns at once.
		runtime.Gosched()
		w.mu.Lock()
		out, closing := w.buf, w.closing
		if w.err != nil {
			w.mu.Unlock()
			return
		}
		w.buf = w.spare[:0]
		w.gen++
		w.mu.Unlock()
		if len(out) > 0 {
			if _, err := w.nc.Write(out); err != nil {
				w.fail(err)
				return
			}
		}
		if cap(out) > maxSpare {
			out = nil
		}
		w.mu.Lock()
		w.spare = out
		done := closing && len(w.buf) == 0
		w.mu.Unlock()
		if done {
			w.fail(errConnClosed)
			return
		}
	}
}

// fail stops writing with err and closes the connection (which ends the
// reader too). It reports whether err was the first error.
func (w *frameWriter) fail(err error) bool {
	w.mu.Lock()
	first := w.err == nil
	if first {
		w.err = err
		w.buf = nil
	}
	w.mu.Unlock()
	if first {
		_ = w.nc.Close()
		select {
		case w.wake <- struct{}{}: // run may be waiting: let it see err
		default:
		}
	}
	return first
}

// closeGracefully has run write the frames already queued, then close the
// connection.
func (w *frameWriter) closeGracefully() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// lock begins a frame: it takes mu and returns the buffer to append to,
// or the error writing stopped with (mu then released).
func (w *frameWriter) lock() ([]byte, error) {
	w.mu.Lock()
	if w.err != nil || w.closing {
		err := w.err
		w.mu.Unlock()
		if err == nil {
			err = errConnClosed
		}
		return nil, err
	}
	return w.buf, nil
}

// startFrame appends a frame header whose length finishFrame fills in.
func startFrame(b []byte, typ frameType, flags byte, id uint32) ([]byte, int) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, byte(typ), flags)
	return binary.BigEndian.AppendUint32(b, id), at
}

// finishFrame fills in the length of the frame begun at at.
func (w *frameWriter) finishFrame(b []byte, at int) ([]byte, error) {
	n := len(b) - at - frameHeaderLen
	if n > w.peerMax {
		return b[:at], fmt.Errorf("%w: a %d-byte frame for %s, which takes at most %d", ErrFrameTooLarge, n, w.nc.RemoteAddr(), w.peerMax)
	}
	binary.BigEndian.PutUint32(b[at:], uint32(n))
	return b, nil
}

// unlock ends what lock began: b is the buffer with the new frames. It
// returns the number of the write they go out in.
func (w *frameWriter) unlock(b []byte) uint64 {
	wasEmpty := len(w.buf) == 0
	w.buf = b
	gen := w.gen
	w.mu.Unlock()
	if wasEmpty && len(b) > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return gen
}

// send queues a frame whose body is the concatenation of parts.
func (w *frameWriter) send(typ frameType, flags byte, id uint32, parts ...[]byte) error {
	b, err := w.lock()
	if err != nil {
		return err
	}
	b, at := startFrame(b, typ, flags, id)
	for _, p := range parts {
		b = append(b, p...)
	}
	b, err = w.finishFrame(b, at)
	w.unlock(b)
	return err
}

// sendCredit queues a credit frame.
func (w *frameWriter) sendCredit(id uint32, n int) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(n))
	_ = w.send(frameCredit, 0, id, p[:])
}

// sent reports whether the frames of write number gen were handed to the
// connection (so may have reached the peer).
func (w *frameWriter) sent(gen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return gen < w.gen
}

// The buffers that frame bodies are copied into, by size class.
var bufClasses = [...]int{1 << 9, 1 << 12, 1 << 15, 1 << 18, DefaultMaxFrameSize}

var bufPools [len(bufClasses)]sync.Pool

// getBuf returns a buffer of length n, pooled if n is not above
// DefaultMaxFrameSize.
func getBuf(n int) *[]byte {
	for i, c := range bufClasses {
		if n <= c {
			if p, ok := bufPools[i].Get().(*[]byte); ok {
				*p = (*p)[:n]
				return p
			}
			b := make([]byte, n, c)
			return &b
		}
	}
	b := make([]byte, n)
	return &b
}

// putBuf gives back a buffer from getBuf.
func putBuf(p *[]byte) {
	c := cap(*p)
	for i, size := range bufClasses {
		if c == size {
			bufPools[i].Put(p)
			return
		}
	}
}

// copyBuf returns a pooled copy of b.
func copyBuf(b []byte) *[]byte {
	p := getBuf(len(b))
	copy(*p, b)
	return p
}
