package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// GCPercent is a GOGC value: a percentage of the live heap that the heap
// may grow by before a collection, at least 1, or GCOff.
type GCPercent int

// GCOff is the GCPercent that turns proportional collection off, leaving
// only the memory limit to trigger collections; written "off".
const GCOff GCPercent = -1

// UnmarshalText implements encoding.TextUnmarshaler: "off", or an integer
// of at least 1.
func (p *GCPercent) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	if strings.EqualFold(s, "off") {
		*p = GCOff
		return nil
	}
	// Go keeps the percentage in 32 bits: a larger one would wrap.
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 {
		return fmt.Errorf("invalid GC percent %q (want an integer from 1 to %d, such as 400, or off)", s, math.MaxInt32)
	}
	*p = GCPercent(n)
	return nil
}

// String returns the percentage, or "off".
func (p GCPercent) String() string {
	if p < 0 {
		return "off"
	}
	return strconv.Itoa(int(p))
}

// MinMemoryLimit is the smallest fixed memory limit accepted: below it the
// Go runtime would collect nearly all the time.
const MinMemoryLimit = 16 << 20

// MemoryLimit is a soft memory limit for the Go runtime: a size in bytes,
// or a ratio of the memory the process may use (its cgroup's limit), or
// none when both are zero.
type MemoryLimit struct {
	Bytes ByteSize // a fixed limit; 0 if Ratio is used or there is none
	Ratio float64  // in (0, 1]; 0 if Bytes is used or there is none
}

// UnmarshalText implements encoding.TextUnmarshaler: "none", a ratio with
// a decimal point in (0, 1] such as "0.9", or a size such as "512MiB".
func (m *MemoryLimit) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	if strings.EqualFold(s, "none") {
		*m = MemoryLimit{}
		return nil
	}
	if strings.Contains(s, ".") && strings.Trim(s, "0123456789.") == "" {
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r <= 0 || r > 1 || math.IsNaN(r) {
			return fmt.Errorf("invalid memory limit ratio %q (want a ratio above 0 and at most 1.0, such as 0.9)", s)
		}
		*m = MemoryLimit{Ratio: r}
		return nil
	}
	var b ByteSize
	err := b.UnmarshalText([]byte(s))
	bad, _ := errors.AsType[*ByteSizeError](err)
	if bad != nil && bad.TooLarge {
		return fmt.Errorf("memory limit %q is too large: at most %d bytes", s, int64(math.MaxInt64))
	}
	if err == nil && b == 0 {
		return fmt.Errorf("invalid memory limit %q: write none for no limit", s)
	}
	if s != "" && strings.Trim(s, "0123456789") == "" {
		// A bare number is refused: "1" is more likely a ratio than a byte.
		return fmt.Errorf("invalid memory limit %q: a number with no unit could be bytes or a ratio (want a size with a unit, such as %sB or 512MiB, or a ratio with a decimal point, such as 0.9, where 1.0 is all the memory)", s, s)
	}
	if err != nil {
		// The size's own reason (a unit unknown, or read as bits), then
		// what else the limit takes.
		if bad != nil && bad.Reason != "" {
			return fmt.Errorf("invalid memory limit %q: %s (or a ratio such as 0.9, or none)", s, bad.Reason)
		}
		return fmt.Errorf("invalid memory limit %q (want a size with a unit such as 512MiB, a ratio such as 0.9, or none)", s)
	}
	if b < MinMemoryLimit {
		return fmt.Errorf("memory limit %q is below the 16MiB floor (the collector would run without pause)", s)
	}
	*m = MemoryLimit{Bytes: b}
	return nil
}

// None reports whether there is no limit.
func (m MemoryLimit) None() bool { return m.Bytes == 0 && m.Ratio == 0 }

// String returns the limit as UnmarshalText reads it.
func (m MemoryLimit) String() string {
	switch {
	case m.Ratio > 0:
		return strconv.FormatFloat(m.Ratio, 'f', -1, 64)
	case m.Bytes > 0:
		return m.Bytes.String()
	}
	return "none"
}
