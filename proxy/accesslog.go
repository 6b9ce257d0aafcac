package proxy

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// LogTimeFormat is the layout of the "time" field of every log line: RFC
// 3339 with milliseconds.
const LogTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Access-log buffering: lines are collected in accessLogBuffers buffers of
// accessLogBufferSize bytes, and a full buffer, or every
// accessLogFlushInterval whatever is buffered, is written out by a
// goroutine of the log's own.
const (
	accessLogBuffers       = 4
	accessLogBufferSize    = 64 << 10
	accessLogFlushInterval = 100 * time.Millisecond
)

// AccessLogger is the non-blocking access log: one zerolog JSON line per
// request, appended to an in-memory buffer under a short lock. Requests
// never make a system call for it and never wait for the output: when
// every buffer is waiting to be written, lines are dropped and counted.
type AccessLogger struct {
	zerolog.Logger
	out   *asyncWriter
	clock stampCache
}

// NewAccessLogger returns an access log writing to w. format is "json" or
// "console". dropped, if not nil, is called with the number of lines lost
// each time lines had to be dropped, at once.
func NewAccessLogger(w io.Writer, format string, dropped func(n int)) *AccessLogger {
	out := newAsyncWriter(w, dropped)
	var lw io.Writer = out
	if format == "console" {
		lw = zerolog.ConsoleWriter{Out: out, TimeFormat: time.TimeOnly}
	}
	return &AccessLogger{Logger: zerolog.New(lw).With().Str("component", "access").Logger(), out: out}
}

// Close writes out the lines still buffered and stops the log's goroutine.
func (a *AccessLogger) Close() error { return a.out.Close() }

// stampCache formats log times once per millisecond: at tens of thousands
// of requests a second, formatting the time was a tenth of the access
// log's cost.
type stampCache struct {
	cur atomic.Pointer[stamp]
}

type stamp struct {
	ms   int64
	text string
}

func (c *stampCache) format(t time.Time) string {
	ms := t.UnixMilli()
	if s := c.cur.Load(); s != nil && s.ms == ms {
		return s.text
	}
	s := &stamp{ms: ms, text: t.Format(LogTimeFormat)}
	c.cur.Store(s)
	return s.text
}

// asyncWriter batches writes into a few fixed buffers; a goroutine writes
// out each full buffer, and on a timer the one being filled. Write never
// blocks on the output and allocates nothing.
type asyncWriter struct {
	out     io.Writer
	dropped func(n int)
	free    chan []byte // empty buffers
	full    chan []byte // buffers to write out, in order
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	// mu guards cur and closed.
	mu     sync.Mutex
	cur    []byte // the buffer being filled; nil while none is free
	closed bool   // Close has begun: lines are dropped
}

func newAsyncWriter(out io.Writer, dropped func(n int)) *asyncWriter {
	w := &asyncWriter{
		out:     out,
		dropped: dropped,
		free:    make(chan []byte, accessLogBuffers),
		full:    make(chan []byte, accessLogBuffers),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		cur:     make([]byte, 0, accessLogBufferSize),
	}
	for range accessLogBuffers - 1 {
		w.free <- make([]byte, 0, accessLogBufferSize)
	}
	go w.loop()
	return w
}

// Write implements io.Writer. zerolog writes one whole line per call.
func (w *asyncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.cur != nil && len(w.cur)+len(p) > cap(w.cur) {
		w.handOffLocked()
	}
	if w.cur == nil && !w.closed {
		select {
		case b := <-w.free: // a buffer came back since
			w.cur = b[:0]
		default:
		}
	}
	if w.cur == nil || len(p) > accessLogBufferSize {
		w.mu.Unlock()
		// Counted at once: the log's goroutine may be stuck writing to
		// an output that does not read (a full pipe).
		if w.dropped != nil {
			w.dropped(1)
		}
		return len(p), nil
	}
	w.cur = append(w.cur, p...)
	w.mu.Unlock()
	return len(p), nil
}

// handOffLocked queues the current buffer, which is not empty, for writing
// and takes a free one, or none if every buffer is queued (then lines are
// dropped until one comes back). w.mu must be held.
func (w *asyncWriter) handOffLocked() {
	w.full <- w.cur // never blocks: it has room for every buffer there is
	select {
	case b := <-w.free:
		w.cur = b[:0]
	default:
		w.cur = nil
	}
}

func (w *asyncWriter) loop() {
	defer close(w.done)
	t := time.NewTicker(accessLogFlushInterval)
	defer t.Stop()
	for {
		select {
		case b := <-w.full:
			w.writeOut(b)
		case <-t.C:
			w.mu.Lock()
			if w.cur == nil {
				// Lines are being dropped: take the next free buffer now.
				select {
				case b := <-w.free:
					w.cur = b[:0]
				default:
				}
			} else if len(w.cur) > 0 {
				w.handOffLocked()
			}
			w.mu.Unlock()
		case <-w.stop:
			w.mu.Lock()
			w.closed = true
			if len(w.cur) > 0 {
				w.full <- w.cur
			}
			w.cur = nil
			w.mu.Unlock()
			for len(w.full) > 0 { // this goroutine is the only reader
				w.writeOut(<-w.full)
			}
			return
		}
	}
}

func (w *asyncWriter) writeOut(b []byte) {
	_, _ = w.out.Write(b) // nowhere to report a failing log
	w.free <- b[:0]
}

// Close writes out everything buffered and stops the goroutine. Lines
// written after Close are dropped.
func (w *asyncWriter) Close() error {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	return nil
}
