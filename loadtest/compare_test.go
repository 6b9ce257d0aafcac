package loadtest

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian64(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1}, 2},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{1, 1, 100, 1, 1}, 1},
	} {
		in := slices.Clone(tc.in)
		if got := Median64(tc.in); got != tc.want {
			t.Errorf("Median64(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("Median64 reordered its input: %v", tc.in)
		}
	}
}

func TestRotateLeft(t *testing.T) {
	s := []string{"a", "b", "c"}
	for k, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := RotateLeft(s, k); !slices.Equal(got, want) {
			t.Errorf("RotateLeft(%v, %d) = %v, want %v", s, k, got, want)
		}
	}
	if got := RotateLeft([]int(nil), 3); got != nil {
		t.Errorf("RotateLeft(nil) = %v", got)
	}
	// Two targets alternate.
	two := []string{"bare", "proxy"}
	if RotateLeft(two, 1)[0] != "proxy" || RotateLeft(two, 2)[0] != "bare" {
		t.Error("two targets do not alternate")
	}
}

func TestParseWrk(t *testing.T) {
	t.Run("clean", func(t *testing.T) {
		w := parseWrkFile(t, "testdata/wrk.txt")
		if w.RequestsPerSec != 73492.97 || w.Requests != 147077 || w.Elapsed != 2*time.Second || w.Errors() != 0 {
			t.Errorf("got %+v", w)
		}
		want := map[float64]time.Duration{50: 528 * time.Microsecond, 75: 860 * time.Microsecond, 90: 2120 * time.Microsecond, 99: 5240 * time.Microsecond}
		for q, d := range want {
			if got := w.Latency[q]; got.Round(time.Microsecond) != d {
				t.Errorf("p%v = %v, want %v", q, got, d)
			}
		}
		// No done hook: no p99.9 (unknown, not 0), max from the thread
		// stats row.
		if d, ok := w.Latency[99.9]; ok || len(w.Latency) != 4 {
			t.Errorf("p99.9 = %v, %v; want none", d, ok)
		}
		if w.Mean.Round(time.Microsecond) != 870*time.Microsecond || w.Max.Round(time.Microsecond) != 9820*time.Microsecond {
			t.Errorf("mean %v, max %v; want 0.87ms, 9.82ms", w.Mean, w.Max)
		}
	})
	// Captured from wrk 4.1.0 -s WrkScript(...) against the proxy: the
	// hook's line gives p99.9 and the exact max, over the thread stats'.
	for _, tc := range []struct {
		file           string
		rps            float64
		p50, p99, p999 time.Duration
		max, mean      time.Duration
		requests       int64
	}{
		{"testdata/wrk-gc-seed.txt", 30139.99, 2350 * time.Microsecond, 10860 * time.Microsecond, 16340 * time.Microsecond,
			22999 * time.Microsecond, 2850 * time.Microsecond, 30542},
		{"testdata/wrk-gc-echo16k.txt", 7503.38, 12180 * time.Microsecond, 86190 * time.Microsecond, 121621 * time.Microsecond,
			139690 * time.Microsecond, 16820 * time.Microsecond, 7526},
	} {
		t.Run(tc.file, func(t *testing.T) {
			w := parseWrkFile(t, tc.file)
			r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
			if w.RequestsPerSec != tc.rps || w.Requests != tc.requests || w.Errors() != 0 ||
				r(w.Latency[50]) != tc.p50 || r(w.Latency[99]) != tc.p99 || r(w.Latency[99.9]) != tc.p999 ||
				r(w.Max) != tc.max || r(w.Mean) != tc.mean {
				t.Errorf("got %+v", w)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		// A sample in wrk's format with every error line (made by hand:
		// wrk prints them only when they are non-zero).
		w := parseWrkFile(t, "testdata/wrk-errors.txt")
		if w.SocketErrors != 16 || w.Non2xx != 42 || w.Errors() != 58 || w.Elapsed != time.Minute || w.Latency[99] != 1020*time.Millisecond {
			t.Errorf("got %+v", w)
		}
	})
	for _, in := range []string{"", "unable to connect to 127.0.0.1:1 Connection refused\n", "  10 requests in 1.00s, 1KB read\n"} {
		if _, err := ParseWrk(strings.NewReader(in)); err == nil {
			t.Errorf("ParseWrk(%q): no error", in)
		}
	}
	if _, err := ParseWrk(strings.NewReader("  Latency Distribution\n     50%  12.3xs\n")); err == nil {
		t.Error("a bad latency unit parsed")
	}
	rest := "  10 requests in 1.00s, 1KB read\nRequests/sec: 10.00\n"
	for _, hook := range []string{"p99.9", "p99.9 12x", "p99.9 -1", "p200 5", "px 5", "max 1e20"} {
		if _, err := ParseWrk(strings.NewReader(rest + wrkHookPrefix + " " + hook + "\n")); err == nil {
			t.Errorf("hook line %q parsed", hook)
		}
	}
	w, err := ParseWrk(strings.NewReader(rest + wrkHookPrefix + " p99.9 1500 p99.99 2000.4 max 3000 later 7\n"))
	if err != nil || w.Latency[99.9] != 1500*time.Microsecond || w.Latency[99.99] != 2000400*time.Nanosecond || w.Max != 3*time.Millisecond {
		t.Errorf("hook line: %+v, %v", w, err)
	}
}

func TestWrkScript(t *testing.T) {
	// Nothing to send but wrk's own GET: the hook alone.
	if got, want := WrkScript(Config{Method: "GET"}), "-- Written by loadtest for wrk -s.\n"+WrkDoneHook; got != want {
		t.Errorf("WrkScript(GET) = %q, want %q", got, want)
	}
	h := http.Header{}
	h.Set("content-type", "text/plain")
	h.Add("X-List", "a")
	h.Add("X-List", `"b"`)
	got := WrkScript(Config{Method: "POST", Header: h, Body: []byte("a\"b\\c\n1\xff")})
	want := "-- Written by loadtest for wrk -s.\n" +
		`wrk.method = "POST"` + "\n" +
		`wrk.headers["Content-Type"] = "text/plain"` + "\n" +
		`wrk.headers["X-List"] = "a, \"b\""` + "\n" +
		// \010 then the digit 1: three-digit escapes cannot swallow it.
		`wrk.body = "a\"b\\c\0101\255"` + "\n" + WrkDoneHook
	if got != want {
		t.Errorf("WrkScript:\n%s\nwant:\n%s", got, want)
	}
	// The echo16k body is printable: written as itself.
	if s := WrkScript(Config{Body: echoBody(16 << 10)}); !strings.Contains(s, `wrk.body = "abcdefghijklmnopqrstuvwxyz0123456789abc`) || len(s) < 16<<10 {
		t.Errorf("echo16k script: %.200q", s)
	}
}

// parseWrkFile parses a captured wrk output.
func parseWrkFile(t *testing.T, path string) WrkResult {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ParseWrk(f)
	if err != nil {
		t.Fatalf("ParseWrk: %v", err)
	}
	return w
}

func FuzzParseWrk(f *testing.F) {
	for _, file := range []string{"testdata/wrk.txt", "testdata/wrk-errors.txt", "testdata/wrk-gc-seed.txt", "testdata/wrk-gc-echo16k.txt"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, in string) {
		_, _ = ParseWrk(strings.NewReader(in))
	})
}

func TestParseProc(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	stat := "1206 (a) b (c) R 1160 1160 27422 0 -1 4194304 104 0 0 0 250 50 0 0 20 0 1 0 299472 3133440 380\n"
	got, err := parseStatCPU([]byte(stat))
	if err != nil || got != 3*time.Second {
		t.Errorf("parseStatCPU = %v, %v; want 3s (300 ticks)", got, err)
	}
	for _, bad := range []string{"", "1 (x) R 1 2", "1 (x) R 1 1 1 0 -1 4 1 0 0 0 x 5 0"} {
		if _, err := parseStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
	status := "Name:\tproxy\nVmPeak:\t  9000 kB\nVmHWM:\t    2088 kB\nVmRSS:\t    1024 kB\nThreads:\t7\n"
	m, err := parseStatus([]byte(status))
	if err != nil || m.HWM != 2088<<10 || m.RSS != 1024<<10 {
		t.Errorf("parseStatus = %+v, %v", m, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmHWM:\t1 kB\nVmRSS:\tlots kB\n", "VmHWM:\t1 MB\nVmRSS:\t1 kB\n"} {
		if _, err := parseStatus([]byte(bad)); err == nil {
			t.Errorf("parseStatus(%q): no error", bad)
		}
	}

	// And the real files of this process.
	cpu, err := ProcCPU(os.Getpid())
	if err != nil || cpu < 0 {
		t.Errorf("ProcCPU(self) = %v, %v", cpu, err)
	}
	if m, err := ReadProcMemory(os.Getpid()); err != nil || m.RSS <= 0 || m.HWM < m.RSS {
		t.Errorf("ReadProcMemory(self) = %+v, %v", m, err)
	}
}

func TestParseMetric(t *testing.T) {
	text := "# HELP go_gc_duration_seconds A summary.\n# TYPE go_gc_duration_seconds summary\n" +
		"go_gc_duration_seconds{quantile=\"0\"} 1.2e-05\ngo_gc_duration_seconds_sum 0.01\ngo_gc_duration_seconds_count 42\n"
	if v, err := ParseMetric(strings.NewReader(text), "go_gc_duration_seconds_count"); err != nil || v != 42 {
		t.Errorf("ParseMetric = %v, %v; want 42", v, err)
	}
	if _, err := ParseMetric(strings.NewReader(text), "go_goroutines"); err == nil {
		t.Error("a missing metric parsed")
	}
	m, err := ParseMetrics(strings.NewReader(text+"go_goroutines 7\ngo_goroutines 9\n"), "go_goroutines", "go_gc_duration_seconds_sum")
	if err != nil || len(m) != 2 || m["go_goroutines"] != 7 || m["go_gc_duration_seconds_sum"] != 0.01 {
		t.Errorf("ParseMetrics = %v, %v; want the first of each", m, err)
	}
	if _, err := ParseMetrics(strings.NewReader("go_goroutines lots\n"), "go_goroutines"); err == nil {
		t.Error("a metric that is not a number parsed")
	}
}

func TestParseServing(t *testing.T) {
	log := `{"level":"info","message":"gc tuned"}` + "\n" +
		`{"level":"info","message":"serving","note":"\"serving\""}` + "\n" + // no addresses yet
		`{"level":"info","http_addr":"127.0.0.1:4321","admin_addr":"127.0.0.1:4322","applications":1,"message":"serving"}` + "\n"
	s, ok := parseServing(strings.NewReader(log))
	if !ok || s.HTTPAddr != "127.0.0.1:4321" || s.AdminAddr != "127.0.0.1:4322" {
		t.Errorf("parseServing = %+v, %v", s, ok)
	}
	if _, ok := parseServing(strings.NewReader(`{"message":"starting"}`)); ok {
		t.Error("found a serving line in a log without one")
	}
}

func TestProxyEnv(t *testing.T) {
	parent := []string{"PATH=/bin", "PROXY_GC_PERCENT=50", "GOGC=10", "GOMEMLIMIT=1GiB", "HOME=/root", "PROXY_CONFIG=x.yaml"}
	got := proxyEnv(parent, map[string]string{"PROXY_HTTP_ADDR": "127.0.0.1:0", "PROXY_GC_TUNING": "false"})
	want := []string{"PATH=/bin", "HOME=/root", "PROXY_GC_TUNING=false", "PROXY_HTTP_ADDR=127.0.0.1:0"}
	if !slices.Equal(got, want) {
		t.Errorf("proxyEnv = %v, want %v", got, want)
	}
}

func TestCompareTables(t *testing.T) {
	targets := []Target{{Name: "bare"}, {Name: "proxy"}}
	rounds := [][]Sample{
		{{Target: "bare", Round: 1, RequestsPerSec: 100, P99: 2 * time.Millisecond, CPUPerRequest: 10 * time.Microsecond, ClientCPUPerRequest: 8 * time.Microsecond},
			{Target: "proxy", Round: 1, RequestsPerSec: 50, P99: 4 * time.Millisecond, CPUPerRequest: 20 * time.Microsecond, BackendCPUPerRequest: 15 * time.Microsecond, Errors: 3}},
		{{Target: "proxy", Round: 2, RequestsPerSec: 60, P99: 6 * time.Millisecond},
			{Target: "bare", Round: 2, RequestsPerSec: 120, P99: 4 * time.Millisecond}},
		{{Target: "bare", Round: 3, RequestsPerSec: 80, P99: 3 * time.Millisecond},
			{Target: "proxy", Round: 3, RequestsPerSec: 60, P99: 5 * time.Millisecond}},
	}
	for _, r := range rounds {
		setRatios(r, "bare")
	}
	if rounds[1][0].Ratio != 0.5 || rounds[2][1].Ratio != 0.75 {
		t.Errorf("ratios %v %v, want 0.5 0.75", rounds[1][0].Ratio, rounds[2][1].Ratio)
	}
	med := Medians(targets, rounds)
	want := []Median{
		{Target: "bare", RequestsPerSec: 100, Ratio: 1, P99: 3 * time.Millisecond, CPUPerRequest: 10 * time.Microsecond, ClientCPUPerRequest: 8 * time.Microsecond},
		{Target: "proxy", RequestsPerSec: 60, Ratio: 0.5, P99: 5 * time.Millisecond, CPUPerRequest: 20 * time.Microsecond, BackendCPUPerRequest: 15 * time.Microsecond},
	}
	if !slices.Equal(med, want) {
		t.Errorf("Medians = %+v, want %+v", med, want)
	}

	var buf bytes.Buffer
	if err := WriteRound(&buf, rounds[0]); err != nil {
		t.Fatal(err)
	}
	wantRound := "round 1  bare         100 req/s  p99   2.00ms  cpu    10.0µs/req  ratio 1.00  backend -  client 8.0µs/req\n" +
		"round 1  proxy         50 req/s  p99   4.00ms  cpu    20.0µs/req  ratio 0.50  backend 15.0µs/req  client -  ERRORS 3\n"
	if buf.String() != wantRound {
		t.Errorf("WriteRound:\n%s\nwant:\n%s", buf.String(), wantRound)
	}
	buf.Reset()
	res := &CompareResult{Rounds: rounds, Medians: med}
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	wantTable := "" +
		"target  median req/s  median ratio  median p99  median cpu  backend cpu  client cpu\n" +
		"bare             100          1.00      3.00ms  10.0µs/req            -   8.0µs/req\n" +
		"proxy             60          0.50      5.00ms  20.0µs/req   15.0µs/req           -\n" +
		"WARNING: runs with errors (failed or non-2xx requests): round 1 proxy: 3\n"
	if buf.String() != wantTable {
		t.Errorf("WriteText:\n%s\nwant:\n%s", buf.String(), wantTable)
	}
}

func TestCompareBuiltin(t *testing.T) {
	a, hitsA := hiServer(t)
	b, hitsB := hiServer(t)
	var log bytes.Buffer
	cfg := CompareConfig{
		Targets:  []Target{{Name: "a", URL: a.URL, PID: os.Getpid()}, {Name: "b", URL: b.URL}},
		Rounds:   2,
		Duration: 150 * time.Millisecond, Concurrency: 2, Tool: ToolBuiltin, Log: &log,
	}
	res, err := Compare(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	if len(res.Rounds) != 2 || res.Rounds[0][0].Target != "a" || res.Rounds[1][0].Target != "b" {
		t.Fatalf("rounds %+v: want 2, the order alternating", res.Rounds)
	}
	if hitsA.Load() == 0 || hitsB.Load() == 0 {
		t.Errorf("hits %d %d, want both > 0", hitsA.Load(), hitsB.Load())
	}
	if m := res.Medians[0]; m.Ratio != 1 || m.RequestsPerSec <= 0 || m.CPUPerRequest < 0 {
		t.Errorf("baseline median %+v", m)
	}
	if m := res.Medians[1]; m.Ratio <= 0 || m.CPUPerRequest != 0 {
		t.Errorf("median %+v, want a ratio and no CPU (no PID)", m)
	}
	if n := strings.Count(log.String(), "\n"); n != 4 {
		t.Errorf("log has %d lines, want 4:\n%s", n, log.String())
	}
}

func TestCompareValidate(t *testing.T) {
	ok := []Target{{Name: "a", URL: "http://127.0.0.1:1/"}, {Name: "b", URL: "http://127.0.0.1:2/"}}
	for _, tc := range []struct {
		name string
		cfg  CompareConfig
		want string
	}{
		{"one target", CompareConfig{Targets: ok[:1]}, "at least 2"},
		{"dup", CompareConfig{Targets: []Target{ok[0], ok[0]}}, "twice"},
		{"remote", CompareConfig{Targets: []Target{ok[0], {Name: "r", URL: "http://192.0.2.1/"}}}, "not loopback"},
		{"tool", CompareConfig{Targets: ok, Tool: "ab"}, "Tool"},
		{"rounds", CompareConfig{Targets: ok, Rounds: -1}, "Rounds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
	if err := (CompareConfig{Targets: ok}).Validate(); err != nil {
		t.Errorf("Validate of a good config: %v", err)
	}
}
