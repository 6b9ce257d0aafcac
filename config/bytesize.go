package config

import (
	"encoding"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// ByteSize is a number of bytes, written as a plain integer ("1048576") or
// a number with a unit: B; KB, MB, GB (powers of 1000); or KiB, MiB, GiB
// (powers of 1024). Units are case-insensitive ("mb" is MB, but "Mb", a
// megabit's spelling, is refused) and may follow a space; a
// decimal fraction is allowed if the result is a whole number of bytes
// ("1.5KiB" is 1536).
type ByteSize int64

var (
	_ encoding.TextUnmarshaler = (*ByteSize)(nil)
	_ encoding.TextMarshaler   = ByteSize(0)
)

// byteUnits lists the units, largest first, so String picks the largest
// that divides a size exactly, preferring binary units.
var byteUnits = []struct {
	name string
	size int64
}{
	{"GiB", 1 << 30},
	{"MiB", 1 << 20},
	{"KiB", 1 << 10},
	{"GB", 1e9},
	{"MB", 1e6},
	{"KB", 1e3},
	{"B", 1},
}

// UnmarshalText parses a size such as "512MiB"; a negative, empty,
// fractional-byte or too large size, or an unknown unit, is an error.
func (s *ByteSize) UnmarshalText(text []byte) error {
	n, err := parseByteSize(strings.TrimSpace(string(text)))
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// ByteSizeError is a size that does not parse, and why.
type ByteSizeError struct {
	Text     string // as given
	Reason   string // why it does not parse; "" if nothing more can be said
	TooLarge bool   // it is a size, larger than an int64 holds
}

// Error implements error.
func (e *ByteSizeError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("invalid byte size %q", e.Text)
	}
	return fmt.Sprintf("invalid byte size %q: %s", e.Text, e.Reason)
}

func parseByteSize(text string) (ByteSize, error) {
	if text == "" {
		return 0, &ByteSizeError{Text: text, Reason: "empty"}
	}
	if text[0] == '-' {
		return 0, &ByteSizeError{Text: text, Reason: "must not be negative"}
	}
	end := strings.IndexFunc(text, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end < 0 {
		end = len(text)
	}
	num, unit := text[:end], strings.TrimSpace(text[end:])
	if num == "" || num == "." || strings.Count(num, ".") > 1 {
		return 0, &ByteSizeError{Text: text, Reason: "want a number and an optional unit, such as 512MiB"}
	}
	mult := int64(1)
	if len(unit) >= 2 && unit[len(unit)-1] == 'b' && unit[0] >= 'A' && unit[0] <= 'Z' {
		// "Mb" is a megabit wherever it is written so: refused rather
		// than read as megabytes (all lower case, "mb", is bytes).
		return 0, &ByteSizeError{Text: text, Reason: fmt.Sprintf("%q reads as bits; write %sB or %siB", unit, unit[:1], unit[:1])}
	}
	if unit != "" {
		i := -1
		for j, u := range byteUnits {
			if strings.EqualFold(u.name, unit) {
				i = j
			}
		}
		if i < 0 {
			return 0, &ByteSizeError{Text: text, Reason: fmt.Sprintf("unknown unit %q (want B, KB, MB, GB, KiB, MiB or GiB)", unit)}
		}
		mult = byteUnits[i].size
	}

	// Exact arithmetic: 1.5GiB is 1610612736 bytes, not a rounding of it.
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, &ByteSizeError{Text: text}
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, &ByteSizeError{Text: text, Reason: "not a whole number of bytes"}
	}
	if !r.Num().IsInt64() {
		return 0, &ByteSizeError{Text: text, Reason: fmt.Sprintf("larger than %d bytes", int64(math.MaxInt64)), TooLarge: true}
	}
	return ByteSize(r.Num().Int64()), nil
}

// String formats s in the largest unit that divides it exactly, such as
// "1MiB", "1500KB" or "7B"; UnmarshalText reads it back.
func (s ByteSize) String() string {
	for _, u := range byteUnits {
		if s != 0 && int64(s)%u.size == 0 {
			return strconv.FormatInt(int64(s)/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// MarshalText returns String's form, so a ByteSize encodes as it is written.
func (s ByteSize) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
