package loadtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGCCompareFakeProxy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeProxyEnv, "1")
	t.Setenv("GOGC", "5") // must not reach the child
	// A race-enabled child otherwise sleeps a second at exit.
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	dir := t.TempDir()
	var log bytes.Buffer
	settings := []GCSetting{
		{Name: "low", Env: map[string]string{"PROXY_GC_PERCENT": "50"}},
		{Name: "high", Env: map[string]string{"PROXY_GC_PERCENT": "800"}},
	}
	res, err := GCCompare(context.Background(), GCCompareConfig{
		ProxyPath: self, Settings: settings, Rounds: 2,
		Duration: 300 * time.Millisecond, Rate: 200, Requests: 100, Concurrency: 4, WarmupRequests: 20,
		AccessLog: false, Dir: dir, KeepLogs: true, Log: &log,
	})
	if err != nil {
		t.Fatalf("GCCompare: %v\n%s", err, log.String())
	}
	if len(res.Runs) != 8 {
		t.Fatalf("%d runs, want 2 rounds x 2 settings x 2 phases:\n%s", len(res.Runs), log.String())
	}
	// Round 2 starts with the second setting.
	if res.Runs[0].Setting != "low" || res.Runs[4].Setting != "high" || res.Runs[4].Round != 2 {
		t.Errorf("order: %+v", res.Runs)
	}
	if len(res.Medians) != 4 || res.Medians[0].Setting != "low" || res.Medians[0].Phase != "closed" || res.Medians[1].Phase != "open" {
		t.Fatalf("medians %+v", res.Medians)
	}
	for _, r := range res.Runs {
		if r.RequestsPerSec <= 0 || r.P99 <= 0 || r.Max < r.P99 || r.PeakRSS <= 0 || r.Errors != 0 || r.GCCycles < 1 {
			t.Errorf("run %+v: want throughput, latency, RSS and GC cycles, no errors", r)
		}
	}
	// Each child got its setting, PROXY_ACCESS_LOG, and not our GOGC.
	b, err := os.ReadFile(filepath.Join(dir, "proxy-r2-high.log"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, `"gc_percent":"800"`) || !strings.Contains(s, `"gogc":""`) || !strings.Contains(s, `"access_log":"false"`) {
		t.Errorf("child environment, as logged: %s", s)
	}

	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"setting  phase", "low      closed", "high     open", "GC cycles", "peak RSS", "PROXY_GC_PERCENT=800",
		"warmup: builtin closed loop, 20 requests", "closed: builtin closed loop, 100 requests at -c 4", "open: builtin open loop at 200 req/s for 300ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table has no %q:\n%s", want, out.String())
		}
	}
}

func TestGCCompareWrk(t *testing.T) {
	if _, err := exec.LookPath("wrk"); err != nil {
		t.Skip("wrk is not on PATH")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeProxyEnv, "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	settings := []GCSetting{{Name: "low", Env: map[string]string{"PROXY_GC_PERCENT": "50"}}}
	for _, tc := range []struct {
		scenario string
		phases   int
	}{
		// The fake proxy answers 400 to anything but the echo16k request
		// when it has a config: no errors means wrk sent exactly that.
		{ScenarioSeed, 2},
		{ScenarioEcho16k, 1},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			dir := t.TempDir()
			res, err := GCCompare(context.Background(), GCCompareConfig{
				ProxyPath: self, Settings: settings, Scenario: tc.scenario, Tool: ToolWrk, Rounds: 1,
				ClosedDuration: time.Second, Duration: time.Second, Rate: 200, Concurrency: 4, WarmupRequests: 20,
				Dir: dir,
			})
			if err != nil {
				t.Fatalf("GCCompare: %v", err)
			}
			if len(res.Runs) != tc.phases {
				t.Fatalf("runs %+v, want %d", res.Runs, tc.phases)
			}
			c := res.Runs[0]
			if c.Phase != "closed" || c.RequestsPerSec <= 0 || c.P50 <= 0 || c.P99 < c.P50 || c.P999 < c.P99 || c.Max < c.P999 ||
				c.Errors != 0 || c.GCCycles < 1 || c.PeakRSS <= 0 {
				t.Errorf("closed run %+v: want wrk's throughput, p50..max, no errors, GC cycles and RSS", c)
			}
			if !strings.HasPrefix(res.Load[1], "closed: wrk -t1 -c4 -d1s --latency -s SCRIPT") {
				t.Errorf("load %q", res.Load)
			}
			if _, err := os.Stat(filepath.Join(dir, "wrk-"+tc.scenario+"-closed.lua")); err != nil {
				t.Errorf("script: %v", err)
			}
		})
	}
}

func TestGCCompareProxyFails(t *testing.T) {
	// /bin/false exits at once: the error says so, and nothing is left.
	_, err := GCCompare(context.Background(), GCCompareConfig{ProxyPath: "/bin/false", Settings: DefaultGCSettings()[:1], Rounds: 1})
	if err == nil || !strings.Contains(err.Error(), "exited while starting") {
		t.Errorf("GCCompare with /bin/false: %v", err)
	}
}

func TestGCCompareValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  GCCompareConfig
		want string
	}{
		{"no proxy", GCCompareConfig{}, "ProxyPath: required"},
		{"missing proxy", GCCompareConfig{ProxyPath: "/nonexistent/proxy"}, "ProxyPath"},
		{"dir as proxy", GCCompareConfig{ProxyPath: "/"}, "not an executable"},
		{"scenario", GCCompareConfig{ProxyPath: "/bin/true", Scenario: "big"}, "Scenario"},
		{"dup setting", GCCompareConfig{ProxyPath: "/bin/true", Settings: []GCSetting{{Name: "a"}, {Name: "a"}}}, "Settings[1]"},
		{"empty settings", GCCompareConfig{ProxyPath: "/bin/true", Settings: []GCSetting{}}, "Settings: empty"},
		{"tool", GCCompareConfig{ProxyPath: "/bin/true", Tool: "ab"}, "Tool"},
		{"closed duration", GCCompareConfig{ProxyPath: "/bin/true", ClosedDuration: -time.Second}, "ClosedDuration"},
		{"no wrk", GCCompareConfig{ProxyPath: "/bin/true", Tool: ToolWrk, WrkPath: "/nonexistent/wrk"}, "WrkPath"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDefaultGCSettings(t *testing.T) {
	s := DefaultGCSettings()
	var names []string
	for _, g := range s {
		names = append(names, g.Name)
	}
	if got := strings.Join(names, ","); got != "off,limit-only,gogc200,gogc400,gogc800,gogc-off,default" {
		t.Errorf("settings %s", got)
	}
	if s[0].Env["PROXY_GC_TUNING"] != "false" || s[5].Env["PROXY_GC_PERCENT"] != "off" || len(s[6].Env) != 0 {
		t.Errorf("settings %+v", s)
	}
	s[0].Env["X"] = "y"
	if _, ok := DefaultGCSettings()[0].Env["X"]; ok {
		t.Error("DefaultGCSettings shares its maps between calls")
	}
}

func TestWriteGCTable(t *testing.T) {
	rows := []GCRow{
		{Setting: "off", Phase: "closed", RequestsPerSec: 20000.4, P50: 4 * time.Millisecond, P99: 12500 * time.Microsecond,
			P999: 20 * time.Millisecond, Max: 31 * time.Millisecond, GCCycles: 120, PeakRSS: 30 << 20},
		{Setting: "gogc400", Phase: "open", RequestsPerSec: 5000, P50: time.Millisecond, P99: 3 * time.Millisecond,
			P999: 5 * time.Millisecond, Max: 9 * time.Millisecond, Errors: 2, GCCycles: 7.5, PeakRSS: 45 << 20},
		// What a tool did not report is shown as unknown, not as 0.
		{Setting: "wrk", Phase: "closed", RequestsPerSec: 70000, P50: time.Millisecond, P99: 3 * time.Millisecond, GCCycles: 9, PeakRSS: 20 << 20},
	}
	var buf bytes.Buffer
	if err := WriteGCTable(&buf, rows); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"setting  phase   req/s     p50      p99    p99.9      max  errors  GC cycles  peak RSS\n" +
		"off      closed  20000  4.00ms  12.50ms  20.00ms  31.00ms       0        120   30.0MiB\n" +
		"gogc400  open     5000  1.00ms   3.00ms   5.00ms   9.00ms       2          8   45.0MiB\n" +
		"wrk      closed  70000  1.00ms   3.00ms        -        -       0          9   20.0MiB\n"
	if buf.String() != want {
		t.Errorf("WriteGCTable:\n%s\nwant:\n%s", buf.String(), want)
	}
	// The unknown p99.9 and max of the second run do not pull the medians
	// down.
	// Errors are those of every round: a median hid one round's.
	med := GCMedians([]GCSetting{{Name: "off"}}, append(rows,
		GCRow{Setting: "off", Phase: "closed", RequestsPerSec: 10000, PeakRSS: 10 << 20, Errors: 5000},
		GCRow{Setting: "off", Phase: "closed", RequestsPerSec: 15000.2, PeakRSS: 20 << 20}))
	if len(med) != 1 || med[0].RequestsPerSec != 15000.2 || med[0].PeakRSS != 20<<20 || med[0].P999 != 20*time.Millisecond || med[0].Max != 31*time.Millisecond || med[0].Errors != 5000 {
		t.Errorf("GCMedians = %+v", med)
	}
}
