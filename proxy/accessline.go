package proxy

import (
	"bytes"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// accessEntry is what one access-log line says.
type accessEntry struct {
	end        time.Time // the line's time
	requestID  string
	method     string
	path       string
	status     int
	bytes      int
	elapsed    time.Duration
	replica    string
	remoteAddr string
	err        string // written only if not empty
}

// accessRoute is the access log of one route: a zerolog logger with the
// route's application, route and deployment, and the opening of its lines
// (level and those fields) as that logger writes them, for the fast path.
type accessRoute struct {
	log        zerolog.Logger
	info, warn []byte // `{"level":"info",...,"deployment":"hello"`
	timeKey    []byte // `,"time":"`
}

// forRoute returns the access log of a route. The openings of its lines
// are zerolog's own output, cut before the closing brace, so that the
// fast path writes what zerolog would, escaping included.
func (a *AccessLogger) forRoute(app, route, deployment string) *accessRoute {
	l := a.With().Str("application", app).Str("route", route).Str("deployment", deployment).Logger()
	opening := func(level zerolog.Level) []byte {
		var buf bytes.Buffer
		out := l.Output(&buf)
		out.WithLevel(level).Msg("")
		return bytes.TrimSuffix(buf.Bytes(), []byte("}\n"))
	}
	return &accessRoute{
		log:     l,
		info:    opening(zerolog.InfoLevel),
		warn:    opening(zerolog.WarnLevel),
		timeKey: []byte(`,"` + zerolog.TimestampFieldName + `":"`),
	}
}

// linePool holds the buffers of the fast path's lines.
var linePool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxPooledLine bounds the buffers kept in linePool: a line with a long
// path must not pin its buffer.
const maxPooledLine = 4 << 10

// write writes e's line: a request of 500 or more is logged at warn level,
// any other at info.
//
// Most lines are built here field by field, with no per-field call into
// zerolog: zerolog's encoding was most of the access log's cost, and the
// access log most of the proxy's own cost per request (pprof, wrk -c100
// against the default app). A line with a value that JSON must escape
// (a quote, a control character, anything not ASCII) goes through zerolog,
// as every line did before; TestAccessLineMatchesZerolog holds the two to
// the same bytes.
func (a *AccessLogger) write(r *accessRoute, e *accessEntry) {
	level := zerolog.InfoLevel
	if e.status >= 500 {
		level = zerolog.WarnLevel
	}
	bp := linePool.Get().(*[]byte)
	b, ok := a.appendLine((*bp)[:0], r, e, level)
	if ok {
		_, _ = a.lines.Write(b)
	} else {
		a.writeZerolog(r, e, level)
	}
	if cap(b) <= maxPooledLine {
		*bp = b
		linePool.Put(bp)
	}
}

// appendLine appends e's line to b, or reports false if a value must be
// escaped, or zerolog would not write the line (the logger's level, or the
// global one), or did not write the line's opening when the route was
// built (a global level above it then).
func (a *AccessLogger) appendLine(b []byte, r *accessRoute, e *accessEntry, level zerolog.Level) ([]byte, bool) {
	opening := r.info
	if level == zerolog.WarnLevel {
		opening = r.warn
	}
	if len(opening) == 0 || zerolog.GlobalLevel() > level || r.log.GetLevel() > level ||
		!plainJSON(e.requestID) || !plainJSON(e.method) || !plainJSON(e.path) ||
		!plainJSON(e.replica) || !plainJSON(e.remoteAddr) || !plainJSON(e.err) {
		return b, false
	}
	b = append(b, opening...)
	b = append(b, r.timeKey...)
	b = append(b, a.clock.format(e.end)...)
	b = append(b, `","request_id":"`...)
	b = append(b, e.requestID...)
	b = append(b, `","method":"`...)
	b = append(b, e.method...)
	b = append(b, `","path":"`...)
	b = append(b, e.path...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(e.status), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, int64(e.bytes), 10)
	b = append(b, `,"latency_ms":`...)
	b = appendMillis(b, e.elapsed)
	b = append(b, `,"replica":"`...)
	b = append(b, e.replica...)
	b = append(b, `","remote_addr":"`...)
	b = append(b, e.remoteAddr...)
	if e.err != "" {
		b = append(b, `","error":"`...)
		b = append(b, e.err...)
	}
	return append(b, "\"}\n"...), true
}

// writeZerolog writes e's line through zerolog.
func (a *AccessLogger) writeZerolog(r *accessRoute, e *accessEntry, level zerolog.Level) {
	var buf [24]byte
	ev := r.log.WithLevel(level).
		Str(zerolog.TimestampFieldName, a.clock.format(e.end)).
		Str("request_id", e.requestID).
		Str("method", e.method).
		Str("path", e.path).
		Int("status", e.status).
		Int("bytes", e.bytes).
		RawJSON("latency_ms", appendMillis(buf[:0], e.elapsed)).
		Str("replica", e.replica).
		Str("remote_addr", e.remoteAddr)
	if e.err != "" {
		ev.Str("error", e.err)
	}
	ev.Msg("")
}

// plainBytes marks the bytes a JSON string holds as they are: printable
// ASCII but the quote and the backslash.
var plainBytes = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainJSON reports whether s goes into a JSON string unescaped.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainBytes[s[i]] {
			return false
		}
	}
	return true
}
