// Package gctune applies the proxy's tuned garbage-collector settings: a
// GOGC above Go's default, always with a soft memory limit, behind a
// feature flag, retunable while running.
//
// Go's default (GOGC=100, no limit) collects every time the heap doubles.
// A proxy's live heap is a few MiB while it allocates per request, so it
// collects tens of times a second; a higher GOGC trades a little memory for
// fewer collections, and the memory limit keeps that trade bounded. The
// defaults were chosen from measurements: see the README.
package gctune

import (
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"sync"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/serveproxy/serveproxy/config"
)

// Where a setting in force came from.
const (
	SourceGoDefault = "go default"          // tuning off, or nothing set it
	SourceDefault   = "default"             // the tuned default
	SourceEnv       = "env"                 // PROXY_GC_PERCENT or PROXY_GC_MEMORY_LIMIT
	SourceGOGC      = "GOGC"                // the user's GOGC wins over tuning
	SourceGOMEMLIM  = "GOMEMLIMIT"          // the user's GOMEMLIMIT wins over tuning
	SourceRuntime   = "runtime (PUT /-/gc)" // retuned while running
)

// noLimit is how the runtime spells "no memory limit".
const noLimit = math.MaxInt64

// minMemoryLimit is the smallest memory limit accepted: below it the
// runtime would collect nearly all the time.
const minMemoryLimit = config.MinMemoryLimit

// State is the GC settings in force and where each came from. It is what
// GET /-/gc answers.
type State struct {
	// Tuning is the feature flag: false when Go's defaults are in force
	// because PROXY_GC_TUNING=false.
	Tuning bool `json:"tuning"`
	// Percent is GOGC; -1 means off.
	Percent       int    `json:"percent"`
	PercentSource string `json:"percent_source"` // what set Percent: one of the Source constants
	// MemoryLimitBytes is the soft memory limit; 0 means none.
	MemoryLimitBytes  int64  `json:"memory_limit_bytes"`
	MemoryLimit       string `json:"memory_limit"`        // MemoryLimitBytes as a size (512MiB), or "none"
	MemoryLimitSource string `json:"memory_limit_source"` // what set it: one of the Source constants
	// MemoryLimitRatio is the share of the memory available (the cgroup's
	// limit, else the system's) that the limit was resolved from; 0 for a
	// fixed limit or none. A replica host that set_gc reaches on another
	// machine resolves the ratio against its own memory, not the proxy's
	// bytes.
	MemoryLimitRatio float64 `json:"memory_limit_ratio,omitempty"`
	// Note says how a ratio was resolved (cgroup or system memory), or
	// why a setting was not applied.
	Note string `json:"note,omitempty"`
}

// Tuner holds the settings in force. Its methods are safe for concurrent
// use.
type Tuner struct {
	// memory returns the memory the process may use, for a ratio limit:
	// the cgroup's limit, else the system's memory.
	memory func() (bytes uint64, from string, err error)

	// mu guards state and serializes changes to the runtime's settings.
	mu    sync.Mutex
	state State
}

// Apply applies the settings of e (PROXY_GC_*) to the runtime, unless the
// user's GOGC or GOMEMLIMIT (read from environ) say otherwise, and returns
// the Tuner holding what is in force. Call it first thing in main. An
// error means nothing was changed.
func Apply(e config.Env, environ map[string]string) (*Tuner, error) {
	t := &Tuner{memory: containerMemory}
	return t, t.apply(e, environ)
}

func (t *Tuner) apply(e config.Env, environ map[string]string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := State{Tuning: e.GCTuning}
	userGOGC, userLimit := environ["GOGC"] != "", environ["GOMEMLIMIT"] != ""
	if v := environ["GOGC"]; userGOGC && v != "off" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			// The runtime takes it for 100 without a word, one past
			// 32 bits too.
			return fmt.Errorf("GOGC=%s: must be an integer percentage of at most %d, or off (Go ignores any other value and uses 100)", v, math.MaxInt32)
		}
		switch {
		case n == 0:
			// The runtime takes it for a collection at every bit of
			// growth: never what was meant, and PROXY_GC_PERCENT
			// refuses it.
			return fmt.Errorf("GOGC=%s: the collector would run without pause; set a percentage from 1 to %d, or off", v, math.MaxInt32)
		case n < 0:
			// The runtime reads it as off, which only off should say.
			return fmt.Errorf("GOGC=%s: Go reads a negative GOGC as off: write off, or a percentage from 1 to %d", v, math.MaxInt32)
		}
	}

	percent, limit := currentPercent(), debug.SetMemoryLimit(-1)
	if v := environ["GOMEMLIMIT"]; v != "" && limit < config.MinMemoryLimit {
		// The runtime read it before main: refused as
		// PROXY_GC_MEMORY_LIMIT is under the floor (a tester: 0 made
		// 763 collections of a 3000-request run).
		return fmt.Errorf("GOMEMLIMIT=%s: below the 16MiB floor, the collector would run without pause; set 16MiB or more, or leave it out", v)
	}
	s.PercentSource, s.MemoryLimitSource = SourceGoDefault, SourceGoDefault
	if userGOGC {
		s.PercentSource = SourceGOGC
	}
	if userLimit {
		s.MemoryLimitSource = SourceGOMEMLIM
	}
	if e.GCTuning {
		if !userGOGC {
			percent = int(e.GCPercent)
			s.PercentSource = sourceOf(environ, "PROXY_GC_PERCENT")
		}
		if !userLimit {
			bytes, note, err := t.resolve(e.GCMemoryLimit)
			if err != nil {
				return fmt.Errorf("PROXY_GC_MEMORY_LIMIT=%s: %w", e.GCMemoryLimit, err)
			}
			limit, s.Note = bytes, note
			s.MemoryLimitRatio = e.GCMemoryLimit.Ratio
			s.MemoryLimitSource = sourceOf(environ, "PROXY_GC_MEMORY_LIMIT")
		}
		if err := t.limitBeyondMemory(percent, percentName(s.PercentSource, percent), limit); err != nil && !userLimit && e.GCMemoryLimit.Bytes > 0 {
			// As Set refuses it: a limit over the memory there is
			// bounds nothing, where a high GOGC needs one.
			return fmt.Errorf("PROXY_GC_MEMORY_LIMIT=%s: %w; set one within it (a ratio such as 0.9), or none", e.GCMemoryLimit, err)
		}
		if (percent < 0 || percent > 100) && limit == noLimit && s.PercentSource == SourceDefault {
			// A high GOGC with no limit lets the heap grow with the live
			// heap times the percentage: never pick that by default; only
			// a GOGC or PROXY_GC_PERCENT the user set may do it.
			percent, s.PercentSource = 100, SourceGoDefault
			s.Note = "no memory limit, so GOGC stays at Go's default unless set explicitly"
		}
		if userLimit && s.PercentSource == SourceDefault && t.limitBeyondMemory(percent, "", limit) != nil {
			// The user's GOMEMLIMIT wins, but one above the memory there
			// is bounds nothing, as none would not: the default GOGC is
			// not picked above it either (a tester; PUT /-/gc then
			// refused a high GOGC that the start had taken).
			percent, s.PercentSource = 100, SourceGoDefault
			s.Note = "GOMEMLIMIT is above the memory there is, so it bounds nothing: GOGC stays at Go's default unless set explicitly"
		}
		if userLimit && s.PercentSource != SourceDefault && s.PercentSource != SourceGoDefault {
			if err := t.limitBeyondMemory(percent, percentName(s.PercentSource, percent), limit); err != nil {
				// Both the user's own: taken as asked, but said, as PUT
				// /-/gc would refuse it (a tester found it in silence).
				s.Note = fmt.Sprintf("GOMEMLIMIT is above the memory there is, so it bounds nothing: %v (taken as set; PUT /-/gc would refuse it)", err)
			}
		}
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
	s.Percent = percent
	s.setLimit(limit)
	t.state = s
	return nil
}

// percentName names a GC percent at start by where it came from, for an
// error about it: the variable that set it, or the tuned default.
func percentName(source string, percent int) string {
	p := config.GCPercent(percent)
	switch source {
	case SourceGOGC:
		return fmt.Sprintf("GOGC=%s", p)
	case SourceEnv:
		return fmt.Sprintf("PROXY_GC_PERCENT=%s", p)
	default:
		return fmt.Sprintf("the default GC percent %s (PROXY_GC_PERCENT)", p)
	}
}

// limitBeyondMemory refuses a high GOGC (or off) with a memory limit
// above the memory there is, which bounds nothing either. A limit of none
// is the caller's to judge. name is how the error names the percent.
func (t *Tuner) limitBeyondMemory(percent int, name string, limit int64) error {
	if percent >= 0 && percent <= 100 || limit == noLimit {
		return nil
	}
	total, from, err := t.memory()
	if err != nil || uint64(limit) <= total {
		return nil
	}
	have, want := humanBytes(int64(total)), humanBytes(limit)
	if limit-int64(total) < int64(total)/100 { // a little over: say how much
		have, want = fmt.Sprintf("%d bytes", total), fmt.Sprintf("%d bytes", limit)
	}
	return fmt.Errorf("%s with a memory limit of %s, more than the %s there is (%s), would let the heap grow without bound", name, want, have, from)
}

func sourceOf(environ map[string]string, name string) string {
	if environ[name] != "" {
		return SourceEnv
	}
	return SourceDefault
}

// resolve turns a configured limit into bytes (noLimit for none), with a
// note on where a ratio's base came from.
func (t *Tuner) resolve(m config.MemoryLimit) (int64, string, error) {
	switch {
	case m.Bytes > 0:
		return int64(m.Bytes), "", nil
	case m.Ratio > 0:
		total, from, err := t.memory()
		if err != nil {
			return 0, "", fmt.Errorf("reading the memory available: %w", err)
		}
		limit := int64(float64(total) * m.Ratio)
		if limit < minMemoryLimit {
			return 0, "", fmt.Errorf("%s of %s is %s, below the %s floor: the collector would run without pause", strconv.FormatFloat(m.Ratio, 'f', -1, 64), humanBytes(int64(total)), humanBytes(limit), humanBytes(minMemoryLimit))
		}
		return limit, fmt.Sprintf("memory limit is %s of %s (%s)", strconv.FormatFloat(m.Ratio, 'f', -1, 64), humanBytes(int64(total)), from), nil
	}
	return noLimit, "", nil
}

// containerMemory is the cgroup's memory limit (v1 or v2) or, without
// one, the system's memory.
func containerMemory() (uint64, string, error) {
	b, err := memlimit.FromCgroup()
	if err == nil {
		return b, "the cgroup's memory limit", nil
	}
	if !errors.Is(err, memlimit.ErrNoLimit) && !errors.Is(err, memlimit.ErrNoCgroup) && !errors.Is(err, memlimit.ErrCgroupsNotSupported) {
		return 0, "", err
	}
	b, err = memlimit.FromSystem()
	if err != nil {
		return 0, "", err
	}
	return b, "no cgroup memory limit: the system's memory", nil
}

// currentPercent reads GOGC without changing it.
func currentPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func (s *State) setLimit(limit int64) {
	if limit == noLimit {
		s.MemoryLimitBytes, s.MemoryLimit = 0, "none"
		return
	}
	s.MemoryLimitBytes, s.MemoryLimit = limit, humanBytes(limit)
}

// humanBytes writes a size exactly when it is a whole number of MiB or GiB
// (as ByteSize does), else to a tenth of a MiB or GiB: a ratio's limit of
// whole KiB read "12341792KiB" where another's read "21.2GiB" (a tester).
// MemoryLimitBytes has it exactly.
func humanBytes(n int64) string {
	if s := config.ByteSize(n).String(); n%(1<<20) == 0 {
		return s
	}
	if n >= 1<<30 {
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + "GiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "MiB"
}

// State returns the settings in force.
func (t *Tuner) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}

// Update is a change of settings; nil fields are left as they are.
type Update struct {
	Percent     *config.GCPercent   `json:"percent"`
	MemoryLimit *config.MemoryLimit `json:"memory_limit"`
}

// Set applies u to the runtime, all or nothing, and returns the settings
// now in force. It refuses a high GOGC (or off) with no memory limit.
func (t *Tuner) Set(u Update) (State, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.state
	percent, limit := s.Percent, int64(noLimit)
	if s.MemoryLimitBytes > 0 {
		limit = s.MemoryLimitBytes
	}
	note := s.Note
	if u.Percent != nil {
		percent = int(*u.Percent)
	}
	if u.MemoryLimit != nil {
		l, n, err := t.resolve(*u.MemoryLimit)
		if err != nil {
			return s, fmt.Errorf("memory_limit: %w", err)
		}
		limit, note = l, n
	}
	if (percent < 0 || percent > 100) && limit == noLimit {
		return s, fmt.Errorf("percent %s with no memory limit would let the heap grow without bound; set memory_limit too", config.GCPercent(percent))
	}
	if err := t.limitBeyondMemory(percent, fmt.Sprintf("percent %s", config.GCPercent(percent)), limit); err != nil {
		return s, fmt.Errorf("%w; set a memory_limit within it (a ratio such as 0.9)", err)
	}
	debug.SetGCPercent(percent)
	debug.SetMemoryLimit(limit)
	if u.Percent != nil {
		s.Percent, s.PercentSource = percent, SourceRuntime
	}
	if u.MemoryLimit != nil {
		s.setLimit(limit)
		s.MemoryLimitRatio = u.MemoryLimit.Ratio
		s.MemoryLimitSource, s.Note = SourceRuntime, note
	}
	s.Tuning = true
	t.state = s
	return s, nil
}
