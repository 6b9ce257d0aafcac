package config

import (
	"strconv"
	"strings"
)

// FieldError is one problem in a config: where it is and what is wrong.
type FieldError struct {
	// File is the name given to Parse; empty for Validate.
	File string
	// Line is the 1-based line of the offending key in File, or 0 when
	// there is none (the key is absent, or the config was built in Go).
	Line int
	// Field is the YAML path of the offending value, such as
	// applications[0].deployments[1].max_ongoing_requests; empty when the
	// problem is with the file as a whole.
	Field string
	// Msg says what is wrong and, for numbers, the allowed range and the
	// value seen.
	Msg string
}

// Error formats the problem as "file:line: field: msg", leaving out
// ":line" when Line is 0 and any part that is empty.
func (e FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		if e.File != "" {
			b.WriteByte(':')
		} else {
			b.WriteString("line ")
		}
		b.WriteString(strconv.Itoa(e.Line))
	}
	for _, s := range [...]string{e.Field, e.Msg} {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// Errors is every problem found in one config, in file order. Parse and
// Validate return it as their error, so a user fixes them all in one go.
type Errors []FieldError

// Error returns the problems one a line.
func (e Errors) Error() string {
	var b strings.Builder
	for i, fe := range e {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(fe.Error())
	}
	return b.String()
}

// Unwrap returns the problems as errors, so errors.As can pick out the
// first FieldError.
func (e Errors) Unwrap() []error {
	errs := make([]error, len(e))
	for i, fe := range e {
		errs[i] = fe
	}
	return errs
}

// fieldPath is the path from a config's root to one value; it prints as
// applications[0].deployments[1].name.
type fieldPath []pathStep

// pathStep is a mapping key or, when isIndex is set, a list index.
type pathStep struct {
	key     string
	index   int
	isIndex bool
}

// child returns the path to the value under key. It never shares p's
// backing array, so sibling paths built from one parent stay distinct.
func (p fieldPath) child(key string) fieldPath {
	return append(p[:len(p):len(p)], pathStep{key: key})
}

// at returns the path to the list element at index i.
func (p fieldPath) at(i int) fieldPath {
	return append(p[:len(p):len(p)], pathStep{index: i, isIndex: true})
}

// within reports whether p is q or lies under it.
func (p fieldPath) within(q fieldPath) bool {
	if len(q) > len(p) {
		return false
	}
	for i := range q {
		if p[i] != q[i] {
			return false
		}
	}
	return true
}

func (p fieldPath) String() string {
	var b strings.Builder
	for _, s := range p {
		if s.isIndex {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.index))
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(keyText(s.key))
	}
	return b.String()
}

// keyText is a key as a path shows it: quoted when it is not a plain
// name, so that a key holding a newline, a dot or a space cannot break a
// problem's line or pass for a path of its own.
func keyText(k string) string {
	for _, r := range k {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}
