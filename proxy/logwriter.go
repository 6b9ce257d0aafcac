package proxy

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// BuildVersion returns override if it is set (a version given at build
// time), else the build's module version and VCS revision, else
// "unknown": what the binaries' -version prints.
func BuildVersion(override string) string {
	if override != "" {
		return override
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}

// NewLogger returns the process's own logger, as the proxy and the
// replica host log: JSON lines (or zerolog's console format, for format
// "console") on w, with millisecond times, at level (info when it does not
// parse: PROXY_LOG_LEVEL has been validated before).
func NewLogger(w io.Writer, level, format string) zerolog.Logger {
	zerolog.TimeFieldFormat = LogTimeFormat
	lv, err := zerolog.ParseLevel(level)
	if err != nil {
		lv = zerolog.InfoLevel
	}
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(lv).With().Timestamp().Logger()
}

// isTerminal reports whether w writes to a terminal, directly or through
// a LogWriter: the console format's colours are escape codes anywhere
// else (a file, a pipe to a log collector). NO_COLOR turns them off on a
// terminal too (zerolog reads it).
func isTerminal(w io.Writer) bool {
	if l, ok := w.(*LogWriter); ok {
		w = l.out
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// logCloseTimeout bounds how long closing a log waits for its output: a
// log collector that stopped reading must not hold up the proxy's exit.
const logCloseTimeout = 2 * time.Second

// LogWriter is the output of the proxy's own log (not the access log):
// Write hands each line to a goroutine that writes it out at once, and
// never waits for the output itself. A log collector that stops reading
// (a full pipe) costs log lines, counted in Dropped, never a request, a
// lock held while logging, or the shutdown. Lines that the output refuses
// (a closed pipe) are counted too.
type LogWriter struct {
	w       *asyncWriter
	out     io.Writer // what w writes to
	dropped atomic.Uint64
}

// NewLogWriter returns a LogWriter writing to out (os.Stderr, say).
func NewLogWriter(out io.Writer) *LogWriter {
	l := &LogWriter{out: out}
	l.w = newAsyncWriter(out, func(n int) { l.dropped.Add(uint64(n)) })
	l.w.eager = true
	return l
}

// Write implements io.Writer; zerolog writes one whole line per call.
func (l *LogWriter) Write(p []byte) (int, error) { return l.w.Write(p) }

// Dropped returns the number of lines lost so far.
func (l *LogWriter) Dropped() uint64 { return l.dropped.Load() }

// Close writes out what is buffered and stops the writer's goroutine,
// waiting for the output at most a few seconds. Lines written after Close
// are dropped.
func (l *LogWriter) Close() error { return l.w.Close() }

// asyncWriter batches writes into a few fixed buffers; a goroutine writes
// out each full buffer, and on a timer the one being filled (or, if eager,
// whatever has been written as soon as it can). Write never blocks on the
// output and allocates nothing.
type asyncWriter struct {
	out     io.Writer
	dropped func(n int)
	// eager writes each line out as soon as the goroutine can, rather than
	// on the timer: for a log read by people, not one of a line a request.
	eager bool
	kick  chan struct{} // a line is waiting (eager)
	free  chan []byte   // empty buffers
	full  chan []byte   // buffers to write out, in order
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	// mu guards cur and closed.
	mu     sync.Mutex
	cur    []byte // the buffer being filled; nil while none is free
	closed bool   // Close has begun: lines are dropped
}

func newAsyncWriter(out io.Writer, dropped func(n int)) *asyncWriter {
	w := &asyncWriter{
		out:     out,
		dropped: dropped,
		kick:    make(chan struct{}, 1),
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
	if w.eager {
		select {
		case w.kick <- struct{}{}:
		default: // the goroutine has been told already
		}
	}
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

// flush queues what the buffer being filled holds, or, while lines are
// being dropped, takes the next free buffer.
func (w *asyncWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		select {
		case b := <-w.free:
			w.cur = b[:0]
		default:
		}
	} else if len(w.cur) > 0 {
		w.handOffLocked()
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
		case <-w.kick:
			w.flush()
		case <-t.C:
			w.flush()
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

// newline counts the lines of a buffer the output refused.
var newline = []byte{'\n'}

func (w *asyncWriter) writeOut(b []byte) {
	// A failing output has nowhere to report to but the count: the lines
	// it did not take are lost.
	if n, err := w.out.Write(b); err != nil && w.dropped != nil {
		if lost := bytes.Count(b[min(n, len(b)):], newline); lost > 0 {
			w.dropped(lost)
		}
	}
	w.free <- b[:0]
}

// errLogBlocked is Close's error when the output did not take the lines
// still buffered in time.
var errLogBlocked = fmt.Errorf("log output blocked for %v: the lines still buffered were not written", logCloseTimeout)

// Close writes out everything buffered and stops the goroutine, waiting at
// most logCloseTimeout for an output that does not read. Lines written
// after Close are dropped.
func (w *asyncWriter) Close() error {
	w.once.Do(func() { close(w.stop) })
	t := time.NewTimer(logCloseTimeout)
	defer t.Stop()
	select {
	case <-w.done:
		return nil
	case <-t.C:
		return errLogBlocked
	}
}
