package proxy

import (
	"io"
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
	lines io.Writer // what the lines are written to: out, or a console writer in front of it
	clock stampCache
}

// NewAccessLogger returns an access log writing to w. format is "json" or
// "console". dropped, if not nil, is called with the number of lines lost
// each time lines had to be dropped, at once.
func NewAccessLogger(w io.Writer, format string, dropped func(n int)) *AccessLogger {
	out := newAsyncWriter(w, dropped)
	var lw io.Writer = out
	if format == "console" {
		lw = zerolog.ConsoleWriter{Out: out, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)}
	}
	return &AccessLogger{Logger: zerolog.New(lw).With().Str("component", "access").Logger(), out: out, lines: lw}
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
