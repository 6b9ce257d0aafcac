package proxy

import (
	"io"
	"time"

	"github.com/rs/zerolog"
	"github.com/rs/zerolog/diode"
)

// AccessLogger is a non-blocking access log: lines go into a ring buffer
// that a goroutine of its own drains to the writer. When the writer falls
// behind, lines are dropped and counted; requests never wait for the log.
type AccessLogger struct {
	zerolog.Logger
	diode diode.Writer
}

// NewAccessLogger returns an access log writing to w. format is "json" or
// "console". dropped is called with the number of lines lost when the
// buffer overflowed; it may be nil.
func NewAccessLogger(w io.Writer, format string, dropped func(n int)) *AccessLogger {
	d := diode.NewWriter(w, 16384, 10*time.Millisecond, func(missed int) {
		if dropped != nil {
			dropped(missed)
		}
	})
	var out io.Writer = d
	if format == "console" {
		out = zerolog.ConsoleWriter{Out: d}
	}
	return &AccessLogger{
		Logger: zerolog.New(out).With().Timestamp().Str("component", "access").Logger(),
		diode:  d,
	}
}

// Close flushes the lines still buffered and stops the writer goroutine.
func (a *AccessLogger) Close() error { return a.diode.Close() }
