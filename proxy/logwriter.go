package proxy

import (
	"io"
	"os"
	"runtime/debug"
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
// a LogWriter (or its Waiting writer): the console format's colours are escape codes anywhere
// else (a file, a pipe to a log collector). NO_COLOR turns them off on a
// terminal too (zerolog reads it).
func isTerminal(w io.Writer) bool {
	switch l := w.(type) {
	case *LogWriter:
		w = l.out
	case waitingWriter:
		w = l.w.out
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

// Waiting returns a writer into the same log whose lines, when every
// buffer is waiting for the output, wait for one to come free rather than
// being dropped: for a replica process's output, which a burst of would
// otherwise lose even to a file that keeps up, and where the wait holds
// up the process's next write to its pipe (as a terminal would), never a
// request. Lines wait while the output keeps reading, at 16 KB/s or
// more; once one write of 16 KiB to it has taken outputWaitLimit (1 s),
// it is taken for stuck, and waiting lines are dropped at once, as
// Write's are, until that write is done.
func (l *LogWriter) Waiting() io.Writer { return waitingWriter{l.w} }

type waitingWriter struct{ w *asyncWriter }

func (ww waitingWriter) Write(p []byte) (int, error) { return ww.w.writeWaiting(p) }

// ReportDrops has report called, from the writer's goroutine and at most
// once a second, with the number of lines lost since it was last called:
// lines lost to an output that stopped taking them are reported once it
// takes them again. report may log through l; a report that is lost
// itself is counted in the next.
func (l *LogWriter) ReportDrops(report func(n int)) { l.w.reportDrops(report) }

// Dropped returns the number of lines lost so far.
func (l *LogWriter) Dropped() uint64 { return l.dropped.Load() }

// Close writes out what is buffered and stops the writer's goroutine,
// waiting for the output at most a few seconds. Lines written after Close
// are dropped.
func (l *LogWriter) Close() error { return l.w.Close() }
