package loadtest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSoakMetrics(t *testing.T) {
	// Captured from the proxy's admin /metrics, idle after its start.
	f, err := os.Open("testdata/proxy-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var s SoakSample
	if err := ParseSoakMetrics(f, &s); err != nil {
		t.Fatal(err)
	}
	if s.Goroutines != 12 || s.HeapInuse != 1843200 || s.GCCycles != 0 {
		t.Errorf("sample %+v, want 12 goroutines, 1843200 bytes of heap in use, 0 GC cycles", s)
	}
	if err := ParseSoakMetrics(strings.NewReader("go_goroutines 3\ngo_gc_duration_seconds_count 1\n"), &s); err == nil ||
		!strings.Contains(err.Error(), "go_memstats_heap_inuse_bytes") {
		t.Errorf("without the heap metric: %v", err)
	}
}

func FuzzParseSoakMetrics(f *testing.F) {
	b, err := os.ReadFile("testdata/proxy-metrics.txt")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Fuzz(func(t *testing.T, in string) {
		var s SoakSample
		_ = ParseSoakMetrics(strings.NewReader(in), &s)
	})
}

// soakSamples returns a start sample, load samples every 10s with the
// given RSS (MiB) and goroutines, and an end sample with endGoroutines.
func soakSamples(startGoroutines int, rssMiB []int64, goroutines []int, endGoroutines int) []SoakSample {
	s := []SoakSample{{Phase: SoakStart, RSS: 10 << 20, Goroutines: startGoroutines}}
	for i := range rssMiB {
		s = append(s, SoakSample{Phase: SoakLoad, At: time.Duration(i+1) * 10 * time.Second,
			RSS: rssMiB[i] << 20, HeapInuse: rssMiB[i] << 19, Goroutines: goroutines[i], GCCycles: float64(10 * (i + 1))})
	}
	last := s[len(s)-1]
	return append(s, SoakSample{Phase: SoakEnd, At: last.At + time.Second, RSS: last.RSS, Goroutines: endGoroutines, GCCycles: last.GCCycles})
}

func TestSummarizeSoak(t *testing.T) {
	const warmup = 30 * time.Second
	for _, tc := range []struct {
		name    string
		samples []SoakSample
		flat    bool
		verdict []string // in the verdict line
	}{
		// The climb before the warm-up does not count: drift 100 -> 105.
		{"flat", soakSamples(12, []int64{40, 80, 100, 103, 105}, []int{30, 31, 30, 29, 31}, 13), true,
			[]string{"verdict: flat (RSS drift +5.0MiB (+5.0% of 100.0MiB", "goroutines 12 at start, 13 at end (+1, limit ±5)"}},
		{"rss grows 10%", soakSamples(12, []int64{40, 80, 100, 105, 110}, []int{30, 30, 30, 30, 30}, 12), false,
			[]string{"verdict: NOT flat: RSS drift +10.0MiB (+10.0% of 100.0MiB, limit +10%)"}},
		{"rss shrinks", soakSamples(12, []int64{40, 80, 100, 90, 60}, []int{30, 30, 30, 30, 30}, 12), true, []string{"-40.0MiB"}},
		{"goroutines +6", soakSamples(12, []int64{40, 80, 100, 100, 100}, []int{30, 30, 30, 30, 30}, 18), false,
			[]string{"verdict: NOT flat: goroutines 12 at start, 18 at end (+6, limit ±5)"}},
		{"goroutines -5", soakSamples(12, []int64{40, 80, 100, 100, 100}, []int{30, 30, 30, 30, 30}, 7), true, []string{"(-5, limit ±5)"}},
		{"both", soakSamples(12, []int64{100, 100, 100, 200, 300}, []int{30, 30, 30, 30, 300}, 300), false,
			[]string{"RSS drift +200.0MiB", "; goroutines 12 at start, 300 at end"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := SummarizeSoak(tc.samples, warmup)
			if err != nil {
				t.Fatal(err)
			}
			if s.Flat != tc.flat {
				t.Errorf("Flat = %v, want %v: %s", s.Flat, tc.flat, s.Verdict())
			}
			for _, want := range tc.verdict {
				if !strings.Contains(s.Verdict(), want) {
					t.Errorf("verdict %q, want it to contain %q", s.Verdict(), want)
				}
			}
		})
	}

	s, err := SummarizeSoak(soakSamples(12, []int64{40, 80, 100, 103, 105}, []int{30, 45, 30, 29, 31}, 13), warmup)
	if err != nil {
		t.Fatal(err)
	}
	if s.Base.At != 30*time.Second || s.Last.At != 50*time.Second || s.RSSDrift != 5<<20 || s.HeapDrift != 5<<19 ||
		s.GoroutineDrift != 1 || s.GoroutineDelta != 1 || s.MaxRSS != 105<<20 || s.MaxGoroutines != 45 || s.GCCycles != 50 {
		t.Errorf("summary %+v", s)
	}

	// Failed samples are skipped; too few good ones after the warm-up is
	// an error, as is a missing idle sample.
	bad := soakSamples(12, []int64{40, 80, 100, 103, 105}, []int{30, 30, 30, 30, 30}, 12)
	for i := 3; i < 5; i++ {
		bad[i].Err = errors.New("scrape failed")
	}
	if _, err := SummarizeSoak(bad, warmup); err == nil || !strings.Contains(err.Error(), "1 samples under load after the 30s warm-up") {
		t.Errorf("one good sample after the warm-up: %v", err)
	}
	good := soakSamples(12, []int64{40, 80, 100, 103, 105}, []int{30, 30, 30, 30, 30}, 12)
	if _, err := SummarizeSoak(good[1:], warmup); err == nil || !strings.Contains(err.Error(), "before the load") {
		t.Errorf("no start sample: %v", err)
	}
	if _, err := SummarizeSoak(good[:len(good)-1], warmup); err == nil || !strings.Contains(err.Error(), "after the load") {
		t.Errorf("no end sample: %v", err)
	}
}

func TestSoakFakeProxy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeProxyEnv, "1")
	t.Setenv("GOGC", "5") // must not reach the child
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	dir := t.TempDir()
	var log bytes.Buffer
	res, err := Soak(context.Background(), SoakConfig{
		ProxyPath: self, Env: map[string]string{"PROXY_GC_PERCENT": "77"},
		Rate: 200, Duration: time.Second, Every: 200 * time.Millisecond, Warmup: 300 * time.Millisecond,
		Dir: dir, Log: &log,
	})
	if err != nil {
		t.Fatalf("Soak: %v\n%s", err, log.String())
	}
	n := len(res.Samples)
	if n < 5 || res.Samples[0].Phase != SoakStart || res.Samples[1].Phase != SoakLoad || res.Samples[n-1].Phase != SoakEnd {
		t.Fatalf("samples %+v", res.Samples)
	}
	for _, s := range res.Samples {
		if s.Err != nil || s.RSS <= 0 || s.HeapInuse <= 0 || s.Goroutines <= 0 {
			t.Errorf("sample %+v", s)
		}
	}
	if l := res.Load; l == nil || l.Completed < 150 || l.Failed != 0 {
		t.Errorf("load %+v", l)
	}
	var out bytes.Buffer
	sum, err := res.WriteText(&out)
	if err != nil {
		t.Fatalf("WriteText: %v\n%s", err, out.String())
	}
	for _, want := range []string{"load: ", "rss:        first", "goroutines: first", "drift under load, t=", "verdict: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary has no %q:\n%s", want, out.String())
		}
	}
	if abs(sum.GoroutineDelta) > SoakMaxGoroutineDelta {
		t.Errorf("goroutines %d -> %d", sum.Start.Goroutines, sum.End.Goroutines)
	}
	for _, want := range []string{"builtin open loop at 200 req/s for 1s", "PROXY_GC_PERCENT=77", "heap_inuse", "  0.0s  start", "  load  "} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log has no %q:\n%s", want, log.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "proxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, `"gc_percent":"77"`) || !strings.Contains(s, `"gogc":""`) {
		t.Errorf("child environment, as logged: %s", s)
	}
}

func TestSoakProxyDies(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeProxyEnv, "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	// The load stops soon after the proxy does, not at its 30s.
	start := time.Now()
	res, err := Soak(context.Background(), SoakConfig{
		ProxyPath: self, Env: map[string]string{fakeDieAfterEnv: "50"},
		Rate: 500, Duration: 30 * time.Second, Every: 100 * time.Millisecond,
	})
	if !errors.Is(err, errProxyDied) || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Soak: %v, want the proxy's death", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Soak took %v after the proxy died", d)
	}
	if res == nil || len(res.Samples) == 0 || res.Samples[0].Phase != SoakStart {
		t.Errorf("result %+v", res)
	}
}

func TestSoakValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  SoakConfig
		want string
	}{
		{"no proxy", SoakConfig{}, "ProxyPath: required"},
		{"dir as proxy", SoakConfig{ProxyPath: "/"}, "not an executable"},
		{"addr", SoakConfig{ProxyPath: "/bin/true", Env: map[string]string{"PROXY_HTTP_ADDR": ":80"}}, "Env: PROXY_HTTP_ADDR"},
		{"env name", SoakConfig{ProxyPath: "/bin/true", Env: map[string]string{"A=B": "c"}}, "Env: bad variable name"},
		{"rate", SoakConfig{ProxyPath: "/bin/true", Rate: -1}, "Rate"},
		{"every", SoakConfig{ProxyPath: "/bin/true", Every: -time.Second}, "Every"},
		{"too short", SoakConfig{ProxyPath: "/bin/true", Duration: 20 * time.Second, Warmup: 15 * time.Second, Every: 5 * time.Second}, "Warmup, Every"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
	// Defaults: 5m at 2000 req/s, a sample every 10s, the drift from 30s,
	// or from half the run when that is shorter.
	if c := (SoakConfig{}).withDefaults(); c.Duration != 5*time.Minute || c.Rate != 2000 || c.Every != 10*time.Second || c.Warmup != 30*time.Second {
		t.Errorf("defaults %+v", c)
	}
	if c := (SoakConfig{Duration: 20 * time.Second}).withDefaults(); c.Warmup != 10*time.Second {
		t.Errorf("warmup of a 20s soak: %v", c.Warmup)
	}
}
