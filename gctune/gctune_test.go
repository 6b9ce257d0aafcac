package gctune

import (
	"errors"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/serveproxy/serveproxy/config"
)

// keepRuntime restores the runtime's GC settings after a test: they are
// process-wide.
func keepRuntime(t *testing.T) {
	t.Helper()
	p, l := currentPercent(), debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(p)
		debug.SetMemoryLimit(l)
	})
}

func env(t *testing.T, environ map[string]string) config.Env {
	t.Helper()
	e, err := config.ReadEnv(environ)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

const gib = 1 << 30

// ninety is the default limit (0.9) of 4 GiB, as the code computes it.
var ninety = func() int64 { total := uint64(4 * gib); return int64(float64(total) * 0.9) }()

// apply is Apply with a fixed amount of container memory.
func apply(t *testing.T, environ map[string]string, memory uint64, memErr error) (*Tuner, error) {
	t.Helper()
	tu := &Tuner{memory: func() (uint64, string, error) { return memory, "the cgroup's memory limit", memErr }}
	return tu, tu.apply(env(t, environ), environ)
}

func TestApply(t *testing.T) {
	tests := []struct {
		name          string
		environ       map[string]string
		wantPercent   int
		wantLimit     int64
		percentSource string
		limitSource   string
	}{
		{"defaults", map[string]string{}, 400, ninety, SourceDefault, SourceDefault},
		{"env flag off", map[string]string{"PROXY_GC_TUNING": "false"}, -2, -2, SourceGoDefault, SourceGoDefault},
		{"env percent", map[string]string{"PROXY_GC_PERCENT": "800"}, 800, ninety, SourceEnv, SourceDefault},
		{"env off and bytes", map[string]string{"PROXY_GC_PERCENT": "off", "PROXY_GC_MEMORY_LIMIT": "256MiB"}, -1, 256 << 20, SourceEnv, SourceEnv},
		{"env ratio", map[string]string{"PROXY_GC_MEMORY_LIMIT": "0.5"}, 400, 2 * gib, SourceDefault, SourceEnv},
		{"user GOGC wins", map[string]string{"GOGC": "150", "PROXY_GC_PERCENT": "800"}, -2, ninety, SourceGOGC, SourceDefault},
		{"user GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "1GiB"}, 400, -2, SourceDefault, SourceGOMEMLIM},
		// One above the memory there is bounds nothing, as none does: a
		// tester's 100GiB took the default GOGC of 400.
		{"user GOMEMLIMIT beyond memory keeps go's GOGC", map[string]string{"GOMEMLIMIT": "100GiB"}, 100, -2, SourceGoDefault, SourceGOMEMLIM},
		// No limit and no explicit GOGC: a high GOGC is not left unbounded.
		{"no limit keeps go's GOGC", map[string]string{"PROXY_GC_MEMORY_LIMIT": "none"}, 100, 0, SourceGoDefault, SourceEnv},
		{"no limit with an explicit GOGC", map[string]string{"PROXY_GC_MEMORY_LIMIT": "none", "PROXY_GC_PERCENT": "400"}, 400, 0, SourceEnv, SourceEnv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keepRuntime(t)
			if v := tt.environ["GOMEMLIMIT"]; v != "" {
				limit := int64(gib)
				if v == "100GiB" {
					limit = 100 * gib
				}
				debug.SetMemoryLimit(limit) // as the runtime does at start
			}
			before, beforeLimit := currentPercent(), debug.SetMemoryLimit(-1)
			tu, err := apply(t, tt.environ, 4*gib, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := tu.State()
			wantPercent, wantLimit := tt.wantPercent, tt.wantLimit
			if wantPercent == -2 { // untouched
				wantPercent = before
			}
			if wantLimit == -2 {
				wantLimit = beforeLimit
				if wantLimit == noLimit {
					wantLimit = 0
				}
			}
			if s.Percent != wantPercent || currentPercent() != wantPercent {
				t.Errorf("percent = %d (runtime %d), want %d", s.Percent, currentPercent(), wantPercent)
			}
			if s.MemoryLimitBytes != wantLimit {
				t.Errorf("memory limit = %d, want %d", s.MemoryLimitBytes, wantLimit)
			}
			if got := debug.SetMemoryLimit(-1); wantLimit > 0 && got != wantLimit {
				t.Errorf("runtime memory limit = %d, want %d", got, wantLimit)
			}
			if s.PercentSource != tt.percentSource || s.MemoryLimitSource != tt.limitSource {
				t.Errorf("sources = %q, %q; want %q, %q", s.PercentSource, s.MemoryLimitSource, tt.percentSource, tt.limitSource)
			}
		})
	}
}

func TestApplyRatioBelowFloor(t *testing.T) {
	keepRuntime(t)
	_, err := apply(t, map[string]string{"PROXY_GC_MEMORY_LIMIT": "0.001"}, 4*gib, nil)
	if err == nil || !strings.Contains(err.Error(), "floor") {
		t.Fatalf("err = %v, want the floor named", err)
	}
}

// A limit above the memory there is bounds nothing: with a high GOGC it
// is refused at start as PUT /-/gc refuses it (a tester); with GOGC 100
// or below it does no harm.
func TestApplyLimitBeyondMemory(t *testing.T) {
	keepRuntime(t)
	before, beforeLimit := currentPercent(), debug.SetMemoryLimit(-1)
	// The message names the percent by where it came from.
	for _, tc := range []struct {
		environ map[string]string
		percent string
	}{
		{map[string]string{"PROXY_GC_MEMORY_LIMIT": "64GiB"}, "the default GC percent 400 (PROXY_GC_PERCENT)"},
		{map[string]string{"PROXY_GC_MEMORY_LIMIT": "64GiB", "PROXY_GC_PERCENT": "300"}, "PROXY_GC_PERCENT=300"},
	} {
		_, err := apply(t, tc.environ, 4*gib, nil)
		want := "PROXY_GC_MEMORY_LIMIT=64GiB: " + tc.percent + " with a memory limit of 64GiB, more than the 4GiB there is (the cgroup's memory limit), would let the heap grow without bound; set one within it (a ratio such as 0.9), or none"
		if err == nil || err.Error() != want {
			t.Errorf("%v: err = %v, want %q", tc.environ, err, want)
		}
		if currentPercent() != before || debug.SetMemoryLimit(-1) != beforeLimit {
			t.Fatal("a refused setting changed the runtime's")
		}
	}
	debug.SetGCPercent(300) // as the runtime read GOGC=300 at start
	if _, err := apply(t, map[string]string{"PROXY_GC_MEMORY_LIMIT": "64GiB", "GOGC": "300"}, 4*gib, nil); err == nil || !strings.Contains(err.Error(), ": GOGC=300 with a memory limit") {
		t.Errorf("GOGC=300: err = %v, want GOGC=300 named", err)
	}
	debug.SetGCPercent(before)
	for _, environ := range []map[string]string{
		{"PROXY_GC_MEMORY_LIMIT": "64GiB", "PROXY_GC_PERCENT": "100"},
		{"PROXY_GC_MEMORY_LIMIT": "4GiB"},
	} {
		if _, err := apply(t, environ, 4*gib, nil); err != nil {
			t.Errorf("%v: %v", environ, err)
		}
	}
}

// A GOGC the runtime cannot read is an error: Go takes it for 100 in
// silence, which the proxy would report as the user's setting.
func TestApplyBadGOGC(t *testing.T) {
	keepRuntime(t)
	for _, v := range []string{"abc", "50%", "1e3", "2147483648"} {
		if _, err := apply(t, map[string]string{"GOGC": v}, 4*gib, nil); err == nil || !strings.Contains(err.Error(), "GOGC="+v+": must be an integer percentage of at most 2147483647, or off") {
			t.Errorf("GOGC=%s: err = %v, want one naming it", v, err)
		}
	}
	// 0 is read by the runtime, as a collector that never pauses: refused
	// as PROXY_GC_PERCENT=0 is (a tester found it taken in silence).
	for v, want := range map[string]string{"0": "the collector would run without pause", "-1": "Go reads a negative GOGC as off: write off"} {
		if _, err := apply(t, map[string]string{"GOGC": v}, 4*gib, nil); err == nil || !strings.Contains(err.Error(), "GOGC="+v+": "+want) {
			t.Errorf("GOGC=%s: err = %v, want it refused saying %q", v, err, want)
		}
	}
	for _, v := range []string{"off", "200", "2147483647"} {
		if _, err := apply(t, map[string]string{"GOGC": v}, 4*gib, nil); err != nil {
			t.Errorf("GOGC=%s: %v", v, err)
		}
	}
}

// A GOMEMLIMIT under the floor is refused, as PROXY_GC_MEMORY_LIMIT's is:
// the runtime read it (0: a collector that never pauses) before main (a
// tester found it taken in silence).
func TestApplyGOMEMLIMITBelowTheFloor(t *testing.T) {
	keepRuntime(t)
	for _, v := range []string{"0", "1MiB"} {
		limit, _ := strconv.ParseInt(strings.TrimSuffix(v, "MiB"), 10, 64)
		if strings.HasSuffix(v, "MiB") {
			limit <<= 20
		}
		debug.SetMemoryLimit(limit) // as the runtime read it
		if _, err := apply(t, map[string]string{"GOMEMLIMIT": v}, 4*gib, nil); err == nil || !strings.Contains(err.Error(), "GOMEMLIMIT="+v+": below the 16MiB floor") {
			t.Errorf("GOMEMLIMIT=%s: err = %v, want it refused", v, err)
		}
	}
}

func TestApplyNoMemoryKnownKeepsGoDefault(t *testing.T) {
	keepRuntime(t)
	_, err := apply(t, map[string]string{}, 0, errors.New("no /proc"))
	if err == nil || !strings.Contains(err.Error(), "PROXY_GC_MEMORY_LIMIT") {
		t.Fatalf("err = %v, want one naming PROXY_GC_MEMORY_LIMIT", err)
	}
}

func TestSet(t *testing.T) {
	keepRuntime(t)
	tu, err := apply(t, map[string]string{}, 4*gib, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := config.GCPercent(300)
	l := config.MemoryLimit{Bytes: 256 << 20}
	s, err := tu.Set(Update{Percent: &p, MemoryLimit: &l})
	if err != nil {
		t.Fatal(err)
	}
	if s.Percent != 300 || currentPercent() != 300 || s.MemoryLimitBytes != 256<<20 || debug.SetMemoryLimit(-1) != 256<<20 {
		t.Fatalf("after Set: %+v (runtime %d, %d)", s, currentPercent(), debug.SetMemoryLimit(-1))
	}
	if s.PercentSource != SourceRuntime || s.MemoryLimitSource != SourceRuntime {
		t.Fatalf("sources = %q %q", s.PercentSource, s.MemoryLimitSource)
	}
	if s.MemoryLimitRatio != 0 {
		t.Fatalf("a fixed limit has ratio %v, want 0", s.MemoryLimitRatio)
	}
	// A ratio is kept beside its bytes, for set_gc to pass on.
	half := config.MemoryLimit{Ratio: 0.5}
	if s, err = tu.Set(Update{MemoryLimit: &half}); err != nil || s.MemoryLimitRatio != 0.5 || s.MemoryLimitBytes != 2*gib {
		t.Fatalf("Set ratio 0.5 of 4GiB: %+v, %v", s, err)
	}
	if s, err = tu.Set(Update{MemoryLimit: &l}); err != nil || s.MemoryLimitRatio != 0 {
		t.Fatalf("a fixed limit after a ratio: %+v, %v", s, err)
	}
	// A high GOGC with no limit is refused, and nothing changes.
	off, none := config.GCOff, config.MemoryLimit{}
	if _, err := tu.Set(Update{Percent: &off, MemoryLimit: &none}); err == nil {
		t.Fatal("Set accepted GOGC off with no memory limit")
	}
	if got := tu.State(); got != s || currentPercent() != 300 {
		t.Fatalf("a refused Set changed the state: %+v", got)
	}
	// Nor with a limit beyond the memory there is; up to all of it is
	// taken (found by a tester and a review).
	over := config.MemoryLimit{Bytes: 4*gib + 1}
	if _, err := tu.Set(Update{Percent: &off, MemoryLimit: &over}); err == nil || !strings.Contains(err.Error(), "4294967297 bytes, more than the 4294967296 bytes there is") {
		t.Fatalf("Set GOGC off with a limit a byte over the memory: %v", err)
	}
	all, ratio := config.MemoryLimit{Bytes: 4 * gib}, config.MemoryLimit{Ratio: 0.9}
	for _, m := range []config.MemoryLimit{all, ratio} {
		if _, err := tu.Set(Update{Percent: &off, MemoryLimit: &m}); err != nil {
			t.Fatalf("Set GOGC off with %+v of 4GiB: %v", m, err)
		}
	}
}

func TestCollector(t *testing.T) {
	keepRuntime(t)
	tu, err := apply(t, map[string]string{"PROXY_GC_MEMORY_LIMIT": "512MiB", "PROXY_GC_PERCENT": "200"}, 4*gib, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(tu.Collector())
	want := `
# HELP serve_proxy_gc_memory_limit_bytes The soft memory limit in force, in bytes; 0 when there is none.
# TYPE serve_proxy_gc_memory_limit_bytes gauge
serve_proxy_gc_memory_limit_bytes 5.36870912e+08
# HELP serve_proxy_gc_percent The GOGC in force; -1 when proportional collection is off.
# TYPE serve_proxy_gc_percent gauge
serve_proxy_gc_percent 200
# HELP serve_proxy_gc_tuning_enabled Whether the proxy's GC tuning is on (1) or Go's defaults are in force (0).
# TYPE serve_proxy_gc_tuning_enabled gauge
serve_proxy_gc_tuning_enabled 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{256 << 20: "256MiB", 3 << 30: "3GiB", 22748851814: "21.2GiB", 1500000: "1.4MiB", 12341792 << 10: "11.8GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// A GOMEMLIMIT of the user's above the memory there is, beside a high GOGC
// of theirs (GOGC or PROXY_GC_PERCENT), is taken as set, but said: PUT
// /-/gc would refuse the pair, and it went in silence (a tester).
func TestApplyUserLimitBeyondMemoryNoted(t *testing.T) {
	keepRuntime(t)
	debug.SetMemoryLimit(64 * gib) // as the runtime read GOMEMLIMIT=64GiB at start
	tu, err := apply(t, map[string]string{"GOMEMLIMIT": "64GiB", "PROXY_GC_PERCENT": "300"}, 4*gib, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := tu.state.Note; !strings.Contains(n, "bounds nothing") || !strings.Contains(n, "PROXY_GC_PERCENT=300") {
		t.Errorf("note %q, want the limit said to bound nothing beside PROXY_GC_PERCENT=300", n)
	}
	if tu.state.Percent != 300 {
		t.Errorf("percent %d, want 300: the user's, taken as set", tu.state.Percent)
	}
}
