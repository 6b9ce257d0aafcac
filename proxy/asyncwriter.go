package proxy

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// outputWaitLimit is how long one write of up to eagerChunk bytes to the
// output may take before a waiting write (LogWriter.Waiting) takes the
// output for stuck: then waiting writes drop their lines at once, until
// that write is done. A log collector that stopped reading must not stall
// a replica process for long; one that is slow but reading (faster than
// 16 KB/s) must not cost its lines.
const outputWaitLimit = time.Second

// eagerChunk is the most an eager writer (the proxy's own log) writes to
// its output at once, so that a slow reader is seen to read (see
// outputWaitLimit). The access log writes whole buffers.
const eagerChunk = 16 << 10

// monoStart is the origin of monoNow.
var monoStart = time.Now()

// monoNow is the monotonic clock in nanoseconds, never 0: a step of the
// wall clock must not make a stuck output look alive, or a live one
// stuck.
func monoNow() int64 { return int64(time.Since(monoStart)) + 1 }

// maxLogLineBytes bounds one line of a log. A line longer than a buffer
// (a reload's line with a large user_config, a replica's long line once
// escaped) goes out in a buffer of its own; one longer than this is
// dropped and counted.
const maxLogLineBytes = 1 << 20

// dropReportInterval is how often, at most, lost lines are reported in a
// log line (see asyncWriter.reportDrops).
const dropReportInterval = time.Second

// asyncWriter batches writes into a few fixed buffers; a goroutine writes
// out each full buffer, and on a timer the one being filled (or, if eager,
// whatever has been written as soon as it can). Write never blocks on the
// output, and allocates only for a line longer than a buffer.
type asyncWriter struct {
	// First, what every Write touches, to share one cache line.

	// mu guards cur, closed and wrote.
	mu     sync.Mutex
	cur    []byte       // the buffer being filled; nil while none is free
	queued atomic.Int32 // buffers handed off and not yet written out
	closed bool         // Close has begun: lines are dropped
	// eager writes each line out as soon as the goroutine can, rather than
	// on the timer: for a log read by people, not one of a line a request.
	eager bool
	kick  chan struct{} // a line is waiting (eager)
	free  chan []byte   // empty buffers

	full    chan []byte // buffers to write out, in order
	out     io.Writer
	dropped func(n int)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	// wrote, if not nil, is closed (and cleared) when the output next
	// takes a buffer: waiting writes wait on it. waiters is set before a
	// waiting write looks for room, so that the output, having freed some,
	// closes wrote only when someone may wait on it: the access log, which
	// has no waiting writes, never takes the lock for it.
	wrote   chan struct{}
	waiters atomic.Bool
	// writingSince is when the write to the output in progress began
	// (monoNow), 0 between writes: see stuck.
	writingSince atomic.Int64
	// unreported counts the lines lost since the last report.
	unreported atomic.Int64
	// report, if set, is told every dropReportInterval at most how many
	// lines were lost since it was last told (see reportDrops).
	report atomic.Pointer[func(n int)]
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
	if ok, _, _ := w.tryAppend(p, false); !ok {
		// Counted at once: the log's goroutine may be stuck writing to
		// an output that does not read (a full pipe).
		w.lost(1)
	}
	return len(p), nil
}

// tryAppend appends p to the buffer being filled, if there is room. A
// waiting write leaves the last buffer not queued to the others: a burst
// of a replica's output must not crowd out the proxy's own lines. If p
// was not taken, wrote is closed when the output next takes a buffer.
func (w *asyncWriter) tryAppend(p []byte, waiting bool) (ok bool, wrote <-chan struct{}, closed bool) {
	w.mu.Lock()
	if waiting {
		w.waiters.Store(true) // before looking: see wrote
	}
	if len(w.cur) > 0 && len(w.cur)+len(p) > cap(w.cur) {
		w.handOffLocked()
	}
	if w.cur == nil && !w.closed {
		select {
		case b := <-w.free: // a buffer came back since
			w.cur = b[:0]
		default:
		}
	}
	if w.cur == nil || len(p) > maxLogLineBytes || waiting && w.queued.Load() >= accessLogBuffers-1 {
		if waiting && w.wrote == nil {
			w.wrote = make(chan struct{})
		}
		wrote, closed = w.wrote, w.closed
		w.mu.Unlock()
		return false, wrote, closed
	}
	if len(p) > cap(w.cur) {
		// Longer than a buffer (this one is empty): out in one of its
		// own size, replaced by one of the usual size once written.
		w.cur = append(w.cur, p...)
		w.handOffLocked()
	} else {
		w.cur = append(w.cur, p...)
	}
	w.mu.Unlock()
	if w.eager {
		select {
		case w.kick <- struct{}{}:
		default: // the goroutine has been told already
		}
	}
	return true, nil, false
}

// writeWaiting is Write, but when every buffer is waiting for the output
// it waits for the output to take one (see outputWaitLimit) rather than
// drop p.
func (w *asyncWriter) writeWaiting(p []byte) (int, error) {
	var timer *time.Timer
	for {
		ok, wrote, closed := w.tryAppend(p, true)
		if ok {
			return len(p), nil
		}
		left := w.stuck()
		if closed || len(p) > maxLogLineBytes || left <= 0 {
			w.lost(1)
			return len(p), nil
		}
		// Until the write in progress has taken outputWaitLimit: each
		// write done frees a buffer, and a slow output that keeps
		// writing never costs a line.
		if timer == nil {
			timer = time.NewTimer(left)
			defer timer.Stop()
		} else {
			timer.Reset(left)
		}
		select {
		case <-wrote: // a buffer is free again: try again
		case <-timer.C: // look at the output again
		case <-w.stop:
			w.lost(1)
			return len(p), nil
		}
	}
}

// stuck returns how long the write to the output in progress has left
// before it is taken for stuck (see outputWaitLimit): 0 or less once it
// is, outputWaitLimit between writes.
func (w *asyncWriter) stuck() time.Duration {
	since := w.writingSince.Load()
	if since == 0 {
		return outputWaitLimit
	}
	return min(outputWaitLimit, outputWaitLimit-time.Duration(monoNow()-since))
}

// lost counts n lines lost.
func (w *asyncWriter) lost(n int) {
	w.unreported.Add(int64(n))
	if w.dropped != nil {
		w.dropped(n)
	}
}

// reportDrops has report told, from the writer's goroutine and at most
// every dropReportInterval, how many lines were lost since it was last
// told: a log line saying so, where the count alone would be seen only
// by whoever looks at the metrics.
func (w *asyncWriter) reportDrops(report func(n int)) { w.report.Store(&report) }

// handOffLocked queues the current buffer, which is not empty, for writing
// and takes a free one, or none if every buffer is queued (then lines are
// dropped until one comes back). w.mu must be held.
func (w *asyncWriter) handOffLocked() {
	w.full <- w.cur // never blocks: it has room for every buffer there is
	w.queued.Add(1)
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
	lastReport := time.Now()
	for {
		select {
		case b := <-w.full:
			w.writeOut(b)
			if w.eager && len(w.full) == 0 {
				// What came while that was written goes out as one write.
				w.flush()
			}
		case <-w.kick:
			if len(w.full) == 0 {
				w.flush()
			} // else the flush after the queued write takes the line along
		case now := <-t.C:
			w.flush()
			if now.Sub(lastReport) >= dropReportInterval {
				lastReport = now
				if r := w.report.Load(); r != nil {
					if n := w.unreported.Swap(0); n > 0 {
						(*r)(int(n))
					}
				}
			}
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
	chunk := len(b)
	if w.eager {
		chunk = eagerChunk
	}
	var (
		n   int
		err error
	)
	for n < len(b) && err == nil {
		w.writingSince.Store(monoNow())
		var m int
		m, err = w.out.Write(b[n:min(n+chunk, len(b))])
		n += m
	}
	w.writingSince.Store(0)
	if err != nil {
		// A failing output has nowhere to report to but the count: the
		// lines it did not take are lost.
		if lost := bytes.Count(b[min(n, len(b)):], newline); lost > 0 {
			w.lost(lost)
		}
	}
	if cap(b) > accessLogBufferSize {
		b = make([]byte, 0, accessLogBufferSize) // it held one long line
	}
	w.free <- b[:0]
	w.queued.Add(-1)
	if w.waiters.Load() {
		w.mu.Lock()
		if w.wrote != nil {
			close(w.wrote)
			w.wrote = nil
		}
		w.waiters.Store(false)
		w.mu.Unlock()
	}
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
