package front

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// readBufferSize is a connection's read buffer: a request head that does
// not fit is net/http's to read (it answers 431 past MaxHeaderBytes).
const readBufferSize = 4 << 10

// watchAfter is how long a handler runs before its client is watched for
// leaving. net/http starts that watch (a read in the background) for
// every request; most handlers are done well before this, and for them
// the read, its goroutine and its wake-up are saved. A client that leaves
// a slower handler is noticed this much later, at most.
const watchAfter = 10 * time.Millisecond

// buffers are a connection's: what it reads, and its answers' body and
// output before they go (see response). They are pooled: a connection
// without keep-alive (ab) would allocate them for each request.
type buffers struct {
	read [readBufferSize]byte
	body [bufferBeforeHeader]byte
	out  [outBufferSize]byte
}

var buffersPool = sync.Pool{New: func() any { return new(buffers) }}

// Connection states, for Shutdown's closing of idle connections.
const (
	stateNew int32 = iota
	stateActive
	stateIdle
	stateGone // hijacked, handed over or closed: not the server's any more
)

// conn is one client connection the lean path serves.
type conn struct {
	s          *Server
	rwc        net.Conn
	remoteAddr string
	baseCtx    context.Context
	bufs       *buffers
	buf        []byte // bufs.read
	n          int    // bytes read into buf
	end        int    // the end of the current request's head in buf
	state      atomic.Int32
	since      atomic.Int64 // unix seconds it was accepted
	fresh      bool         // no request served yet

	w response

	// The read deadline, set only when it must change: deadlineSet says
	// one may be in force, idleSince when the idle one in force was set
	// (zero if it is another). See awaitIdle.
	deadlineSet bool
	idleSince   time.Time

	// The watch for a client leaving a slow handler (see watchAfter).
	// Each request arms timer; its callback (watch) tells stopWatch on
	// fired that it has decided whether to watch, so that a callback late
	// for one request cannot watch the next.
	timer     *time.Timer
	armed     bool // timer is armed for the current request
	fired     chan struct{}
	mu        sync.Mutex         // guards the fields below
	cancel    context.CancelFunc // the current request's
	served    bool               // the handler is done: no watch may begin
	watching  bool               // a read is under way
	watchDone chan struct{}      // closed when that read returned
	peeked    bool               // it read a byte (the next request's)
	peek      [1]byte
}

// serve answers the connection's requests until it closes, is hijacked
// or is handed to net/http.
func (c *conn) serve() {
	c.bufs = buffersPool.Get().(*buffers)
	c.buf = c.bufs.read[:]
	c.w = response{c: c, body: c.bufs.body[:0], out: c.bufs.out[:0]}
	keep := false // the connection is someone else's now
	defer func() {
		if c.timer != nil {
			c.timer.Stop()
		}
		if !keep {
			_ = c.rwc.Close()
			c.s.untrack(c)
		}
		if !c.w.hijacked {
			// A handler that hijacked may still hold w (wrongly, but
			// net/http's buffers would not be another's either): its
			// buffers go to the garbage collector.
			buffersPool.Put(c.bufs)
		}
	}()
	// As net/http: the first request's head has ReadHeaderTimeout from
	// the accept; a later one waits for its first byte under
	// IdleTimeout, then has ReadHeaderTimeout for the rest.
	if d := c.s.ReadHeaderTimeout; d > 0 {
		c.setReadDeadline(time.Now().Add(d))
	}
	for first := true; ; first = false {
		if !first {
			// Idle until a whole head is read, as net/http, though part
			// of it came with the last request: Shutdown closes it.
			c.state.Store(stateIdle)
		}
		if c.n == 0 {
			if !first {
				if c.s.shuttingDown() {
					return
				}
				c.awaitIdle()
			}
			m, err := c.rwc.Read(c.buf)
			if m == 0 {
				if err == nil {
					continue
				}
				return
			}
			c.n = m
		}
		head, ok := c.readHead(first)
		if !ok {
			return
		}
		// Active once its head is read, as net/http: Shutdown closes a
		// connection still reading one.
		c.state.Store(stateActive)
		if head == nil {
			keep = c.handOff()
			return
		}
		req, ok := parseHead(head)
		if !ok {
			keep = c.handOff()
			return
		}
		// The read deadline in force stays so while the handler runs:
		// nothing reads then but the watch, which clears it.
		c.fresh = false
		switch c.serveRequest(req) {
		case served:
		case hijacked:
			keep = true
			return
		case closed:
			return
		}
		if c.w.readDeadline.Load() {
			c.deadlineSet, c.idleSince = true, time.Time{} // the handler's: replaced before the next read
		}
		if c.s.shuttingDown() {
			return // not even a request already sent: as net/http
		}
		copy(c.buf, c.buf[c.end:c.n])
		c.n -= c.end
		if c.peeked {
			c.buf[c.n] = c.peek[0]
			c.n++
			c.peeked = false
		}
	}
}

// idleRefresh is how old an idle deadline may be and still serve for the
// next wait: a connection's idle timeout runs from its last request, or
// up to idleRefresh before it. Setting a deadline costs a timer's change
// in the runtime; on a busy connection, this makes it one a second.
func idleRefresh(idle time.Duration) time.Duration { return min(idle/8, time.Second) }

// awaitIdle readies the connection's wait for its next request: the idle
// timeout, or no deadline without one.
func (c *conn) awaitIdle() {
	d := c.s.IdleTimeout
	if d <= 0 {
		c.clearReadDeadline()
		return
	}
	now := time.Now()
	if c.idleSince.IsZero() || now.Sub(c.idleSince) >= idleRefresh(d) {
		c.setReadDeadline(now.Add(d))
		c.idleSince = now
	}
}

func (c *conn) setReadDeadline(t time.Time) {
	_ = c.rwc.SetReadDeadline(t)
	c.deadlineSet, c.idleSince = true, time.Time{}
}

func (c *conn) clearReadDeadline() {
	if c.deadlineSet {
		_ = c.rwc.SetReadDeadline(time.Time{})
		c.deadlineSet, c.idleSince = false, time.Time{}
	}
}

// readHead reads until buf holds a whole request head, and returns it;
// nil if it does not fit (or is longer than MaxHeaderBytes), or has a
// line ended by a bare LF: net/http's to read. ok is false if the
// connection failed or timed out.
func (c *conn) readHead(first bool) (head []byte, ok bool) {
	limit := len(c.buf)
	if m := c.s.MaxHeaderBytes; m > 0 && m < limit {
		limit = m
	}
	scanned := 0
	timed := first // the first head's deadline runs from the accept
	for {
		for {
			i := bytes.IndexByte(c.buf[scanned:c.n], '\n')
			if i < 0 {
				scanned = c.n
				break
			}
			lf := scanned + i
			if lf < 2 || c.buf[lf-1] != '\r' {
				return nil, true // a bare LF, or an empty line before the request line
			}
			if lf >= 3 && c.buf[lf-2] == '\n' && c.buf[lf-3] == '\r' {
				c.end = lf + 1
				if c.end > limit {
					return nil, true
				}
				return c.buf[:c.end], true
			}
			scanned = lf + 1
		}
		if c.n >= limit {
			return nil, true
		}
		if !timed && c.n >= 4 {
			// The head came in parts: the rest has ReadHeaderTimeout
			// from now, or no deadline without one. (From its fourth
			// byte: net/http waits for four under the idle timeout.)
			timed = true
			if d := c.s.ReadHeaderTimeout; d > 0 {
				c.setReadDeadline(time.Now().Add(d))
			} else {
				c.clearReadDeadline()
			}
		}
		m, err := c.rwc.Read(c.buf[c.n:])
		c.n += m
		if err == io.EOF && m == 0 {
			// The client stopped sending in the middle of a head:
			// net/http answers that (400).
			return nil, true
		}
		if err != nil && m == 0 {
			return nil, false
		}
	}
}

// Outcomes of serveRequest.
const (
	served = iota
	hijacked
	closed
)

// serveRequest runs the handler for req and sends its answer.
func (c *conn) serveRequest(req *http.Request) (outcome int) {
	ctx, cancel := context.WithCancel(c.baseCtx)
	req.RemoteAddr = c.remoteAddr
	req = req.WithContext(ctx)
	w := &c.w
	w.reset(req)
	c.armWatch(cancel)
	defer func() {
		cancel()
		if v := recover(); v != nil {
			c.stopWatch()
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("http: panic serving %v: %v\n%s", c.remoteAddr, v, buf)
			}
			if w.hijacked {
				outcome = hijacked
				return
			}
			// What was sent stays sent, as net/http's final flush
			// does; the answer is cut off by the close.
			if w.headerDone {
				w.flushOut()
			}
			outcome = closed
		}
	}()
	c.s.Handler.ServeHTTP(w, req)
	if w.hijacked {
		return hijacked
	}
	c.stopWatch()
	cancel() // before the answer's end goes out, as net/http
	w.finish()
	if w.writeDeadline.Load() {
		// A deadline the handler set bounded its answer, not the next
		// (net/http clears it after every answer).
		_ = c.rwc.SetWriteDeadline(time.Time{})
	}
	if !w.reusable() {
		return closed
	}
	return served
}

// armWatch starts the clock on the handler: past watchAfter, the client
// is watched for leaving.
func (c *conn) armWatch(cancel context.CancelFunc) {
	c.mu.Lock()
	c.cancel = cancel
	c.served, c.watching, c.watchDone = false, false, nil
	c.mu.Unlock()
	c.armed = true
	if c.timer == nil {
		c.fired = make(chan struct{}, 1)
		c.timer = time.AfterFunc(watchAfter, c.watch)
		return
	}
	c.timer.Reset(watchAfter)
}

// watch reads from the connection while the handler runs: a byte is the
// client's next request (kept for it), an end or an error is the client
// gone, and the request's context is cancelled, as net/http does. Bytes
// of a next request already read do not stop it: its read comes after
// them, as net/http's does.
func (c *conn) watch() {
	c.mu.Lock()
	start := !c.served
	var done chan struct{}
	var cancel context.CancelFunc
	if start {
		c.watching = true
		done = make(chan struct{})
		c.watchDone, cancel = done, c.cancel
		_ = c.rwc.SetReadDeadline(time.Time{})
	}
	c.mu.Unlock()
	c.fired <- struct{}{} // decided: see stopWatch
	if !start {
		return
	}
	defer close(done)
	n, err := c.rwc.Read(c.peek[:])
	if n == 1 {
		c.peeked = true
		return
	}
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		cancel()
	}
}

// stopWatch ends the watch once the handler is done (or hijacks): a read
// under way is cut short by a deadline in the past. A timer that fired
// has its callback's decision waited for.
func (c *conn) stopWatch() {
	if !c.armed {
		return
	}
	c.armed = false
	if c.timer.Stop() {
		return // its callback will not run: no watch began
	}
	c.mu.Lock()
	c.served = true
	c.mu.Unlock()
	<-c.fired
	c.mu.Lock()
	watching, done := c.watching, c.watchDone
	c.mu.Unlock()
	if watching {
		_ = c.rwc.SetReadDeadline(aLongTimeAgo)
		<-done
		_ = c.rwc.SetReadDeadline(time.Time{})
		c.deadlineSet, c.idleSince = false, time.Time{}
	}
}

var aLongTimeAgo = time.Unix(1, 0)

// hijack gives the connection to the handler, with the bytes the client
// sent after the request.
func (c *conn) hijack() net.Conn {
	c.stopWatch()
	_ = c.rwc.SetDeadline(time.Time{})
	c.s.untrack(c)
	return c.withPending(c.end)
}

// withPending returns the connection, reading first buf[from:n] and any
// byte the watch read.
func (c *conn) withPending(from int) net.Conn {
	pending := c.buf[from:c.n]
	if c.peeked {
		pending = append(pending[:len(pending):len(pending)], c.peek[0])
	}
	if len(pending) == 0 {
		return c.rwc
	}
	return &replayConn{Conn: c.rwc, pending: bytes.Clone(pending)}
}

// handOff gives the connection, with what was read of its next request,
// to net/http's server. It reports whether net/http took it.
func (c *conn) handOff() bool {
	c.s.untrack(c)
	return c.s.handoff.give(c.withPending(0), !c.fresh)
}

// replayConn is a connection whose first reads return bytes read from it
// before.
type replayConn struct {
	net.Conn
	pending []byte
}

// Read implements net.Conn.
func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(p, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	return r.Conn.Read(p)
}

// ReadFrom passes the connection's own (sendfile, splice) on, for
// net/http's answers from files.
func (r *replayConn) ReadFrom(src io.Reader) (int64, error) {
	if rf, ok := r.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{r.Conn}, src)
}

// CloseWrite shuts down the writing side, as *net.TCPConn does (net/http
// uses it before closing a connection whose request body it did not
// read).
func (r *replayConn) CloseWrite() error {
	if cw, ok := r.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
