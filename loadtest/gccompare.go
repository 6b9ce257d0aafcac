package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// GCSetting is one GC configuration of the proxy: a name and the
// environment that selects it.
type GCSetting struct {
	// Name labels the setting in the table.
	Name string
	// Env is set in the proxy's environment (every other PROXY_* variable,
	// GOGC and GOMEMLIMIT are removed from it).
	Env map[string]string
}

// DefaultGCSettings returns the settings gc-compare runs by default, a new
// slice each call: off, limit-only, gogc200, gogc400, gogc800, gogc-off,
// and default (no PROXY_GC_* at all: the proxy's own choice).
func DefaultGCSettings() []GCSetting {
	tuned := func(percent string) map[string]string {
		return map[string]string{"PROXY_GC_PERCENT": percent, "PROXY_GC_MEMORY_LIMIT": "64MiB"}
	}
	return []GCSetting{
		{Name: "off", Env: map[string]string{"PROXY_GC_TUNING": "false"}},
		{Name: "limit-only", Env: map[string]string{"PROXY_GC_TUNING": "true", "PROXY_GC_PERCENT": "100", "PROXY_GC_MEMORY_LIMIT": "64MiB"}},
		{Name: "gogc200", Env: tuned("200")},
		{Name: "gogc400", Env: tuned("400")},
		{Name: "gogc800", Env: tuned("800")},
		{Name: "gogc-off", Env: tuned("off")},
		{Name: "default", Env: map[string]string{}},
	}
}

// The scenarios GCCompare knows.
const (
	// ScenarioSeed is the proxy with no config (its built-in app answering
	// "hi"): a closed loop at Concurrency (Requests of them with
	// ToolBuiltin, ClosedDuration long with ToolWrk), then the builtin
	// open loop at Rate for Duration.
	ScenarioSeed = "seed"
	// ScenarioEcho16k is one app at / whose deployment is 16 replicas of
	// the echo handler (max_ongoing_requests 100), loaded with 16 KiB POST
	// bodies in a closed loop (of Tool) at Concurrency for Duration.
	ScenarioEcho16k = "echo16k"
)

// echo16kConfig is the proxy config of ScenarioEcho16k.
const echo16kConfig = `# Written by loadtest gc-compare (scenario echo16k).
applications:
  - name: echo16k
    route_prefix: /
    deployments:
      - name: echo
        handler: echo
        num_replicas: 16
        max_ongoing_requests: 100
`

// DefaultGCWarmupRequests is GCCompareConfig.WarmupRequests when 0.
const DefaultGCWarmupRequests = 2000

// DefaultGCClosedDuration is GCCompareConfig.ClosedDuration when 0.
const DefaultGCClosedDuration = 10 * time.Second

// GCCompareConfig is a GC comparison: the proxy binary started afresh for
// every setting in every round, on ephemeral loopback ports, and loaded
// with the scenario.
type GCCompareConfig struct {
	// ProxyPath is the proxy binary. Required.
	ProxyPath string
	// Settings are compared. If nil, DefaultGCSettings is used.
	Settings []GCSetting
	// Scenario is ScenarioSeed or ScenarioEcho16k. If empty, ScenarioSeed.
	Scenario string
	// Rounds is how many times every setting runs, in an order rotated each
	// round. If 0, 3 is used.
	Rounds int
	// Duration is the open loop's length (seed) or the closed loop's
	// (echo16k). If 0, 20s is used.
	Duration time.Duration
	// Rate is the seed open loop's requests/s. If 0, 5000 is used.
	Rate float64
	// Tool drives the closed loops (the open loop is always the builtin
	// one: wrk has none). With ToolWrk, `wrk -t1 -cC -dD --latency -s
	// SCRIPT` where the script sends the scenario's request and prints
	// wrk's p99.9 and exact max (WrkScript). If empty, ToolBuiltin is
	// used, unlike Compare: the zero config needs no program besides the
	// proxy. Prefer ToolWrk where it is installed: on a small machine the
	// builtin generator saturates (near 40k req/s on two cores) before the
	// proxy does, and then every setting measures the generator.
	Tool Tool
	// WrkPath is the wrk binary for ToolWrk. If empty, PATH is searched.
	WrkPath string
	// Requests is the seed closed loop's request count with ToolBuiltin.
	// If 0, 10000.
	Requests int64
	// ClosedDuration is the seed closed loop's length with ToolWrk, which
	// has no request count (wrk rounds it up to whole seconds). If 0,
	// DefaultGCClosedDuration.
	ClosedDuration time.Duration
	// Concurrency is the closed loops' workers (wrk's connections). If 0,
	// 100 is used.
	Concurrency int
	// WarmupRequests are sent by the builtin closed loop (the first
	// phase's request, at Concurrency) before each run's phases, whose
	// numbers should not include the first connections and the heap's
	// first growth. If 0, DefaultGCWarmupRequests; if < 0, none.
	WarmupRequests int64
	// AccessLog sets PROXY_ACCESS_LOG.
	AccessLog bool
	// Dir holds each run's proxy log (and echo16k's config). If empty, a
	// temporary directory is made and removed at the end.
	Dir string
	// KeepLogs keeps every run's log; by default a run's log is removed
	// once the run succeeded (with the access log on, they are large).
	KeepLogs bool
	// Log receives a line per run as the comparison goes. If nil, nothing
	// is written.
	Log io.Writer
}

// GCRow is one setting's numbers for one phase of the scenario: from one
// run, or medians over the rounds.
type GCRow struct {
	// Setting and Phase ("closed", "open") say what ran; Round counts from
	// 1, and is 0 for a row of medians.
	Setting string
	Phase   string
	Round   int
	// RequestsPerSec, P50, P99, P999 and Max are the load's numbers; a
	// latency of 0 is unknown (wrk without WrkDoneHook prints no p99.9),
	// shown as "-".
	RequestsPerSec      float64
	P50, P99, P999, Max time.Duration
	// Errors counts failed and non-2xx requests (wrk: socket errors and
	// non-2xx/3xx responses); in a row of medians, those of every round.
	Errors int64
	// GCCycles is the delta of the proxy's go_gc_duration_seconds_count.
	GCCycles float64
	// PeakRSS is the proxy's peak resident memory during the phase, bytes.
	PeakRSS int64
}

// GCCompareResult is a whole GC comparison.
type GCCompareResult struct {
	// Runs holds every run's rows, in the order they ran.
	Runs []GCRow
	// Medians holds one row per setting and phase, in the Settings' order.
	Medians []GCRow
	// Settings are the settings compared.
	Settings []GCSetting
	// Load says what generated each phase's load, a line per phase
	// ("closed: wrk -t1 -c100 -d10s ..."), so the table says what it
	// measured.
	Load []string
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c GCCompareConfig) withDefaults() GCCompareConfig {
	if c.Settings == nil {
		c.Settings = DefaultGCSettings()
	}
	if c.Scenario == "" {
		c.Scenario = ScenarioSeed
	}
	if c.Rounds == 0 {
		c.Rounds = 3
	}
	if c.Duration == 0 {
		c.Duration = 20 * time.Second
	}
	if c.Rate == 0 {
		c.Rate = 5000
	}
	if c.Tool == "" {
		c.Tool = ToolBuiltin
	}
	if c.Requests == 0 {
		c.Requests = 10000
	}
	if c.ClosedDuration == 0 {
		c.ClosedDuration = DefaultGCClosedDuration
	}
	if c.Concurrency == 0 {
		c.Concurrency = 100
	}
	if c.WarmupRequests == 0 {
		c.WarmupRequests = DefaultGCWarmupRequests
	}
	return c
}

// Validate reports the first problem with c, naming the field.
func (c GCCompareConfig) Validate() error {
	if err := checkProxyPath(c.ProxyPath); err != nil {
		return err
	}
	if c.Settings != nil && len(c.Settings) == 0 {
		return errors.New("Settings: empty")
	}
	seen := make(map[string]bool)
	for i, s := range c.Settings {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("Settings[%d].Name: want a unique, non-empty name, got %q", i, s.Name)
		}
		seen[s.Name] = true
	}
	switch {
	case c.Scenario != "" && c.Scenario != ScenarioSeed && c.Scenario != ScenarioEcho16k:
		return fmt.Errorf("Scenario: want %q or %q, got %q", ScenarioSeed, ScenarioEcho16k, c.Scenario)
	case c.Rounds < 0:
		return fmt.Errorf("Rounds: must be >= 1, got %d", c.Rounds)
	case c.Duration < 0:
		return fmt.Errorf("Duration: must be > 0, got %v", c.Duration)
	case !(c.Rate >= 0 && c.Rate <= 1e7): // NaN too
		return fmt.Errorf("Rate: want 0 (the default, 5000) to 1e7 requests/s, got %g", c.Rate)
	case c.Requests < 0:
		return fmt.Errorf("Requests: must be >= 1, got %d", c.Requests)
	case c.ClosedDuration < 0:
		return fmt.Errorf("ClosedDuration: must be > 0, got %v", c.ClosedDuration)
	case c.Tool != "" && c.Tool != ToolWrk && c.Tool != ToolBuiltin:
		return fmt.Errorf("Tool: want %q or %q, got %q", ToolWrk, ToolBuiltin, c.Tool)
	case c.Concurrency < 0:
		return fmt.Errorf("Concurrency: must be >= 1, got %d", c.Concurrency)
	}
	if c.Tool == ToolWrk {
		path := c.WrkPath
		if path == "" {
			path = "wrk"
		}
		if _, err := exec.LookPath(path); err != nil {
			return fmt.Errorf("WrkPath: %w (or use ToolBuiltin)", err)
		}
	}
	return nil
}

// gcPhase is one load of a scenario, its URL filled in per run.
type gcPhase struct {
	name string
	// load is the phase's request and shape for the builtin generator;
	// with wrk set, its request, Duration and Concurrency are wrk's. It is
	// also the warmup's template.
	load Config
	wrk  bool
	// script is wrk's -s file (the request and WrkDoneHook), written by
	// GCCompare before the first run.
	script string
}

// phases returns the scenario's loads (c with its defaults).
func (c GCCompareConfig) phases() []gcPhase {
	wrk := c.Tool == ToolWrk
	switch c.Scenario {
	case ScenarioEcho16k:
		h := http.Header{}
		h.Set("Content-Type", "application/octet-stream")
		return []gcPhase{{name: "closed", wrk: wrk, load: Config{
			Method: http.MethodPost, Header: h, Body: echoBody(16 << 10),
			Duration: c.Duration, Concurrency: c.Concurrency,
		}}}
	default:
		closed := Config{Requests: c.Requests, Concurrency: c.Concurrency}
		if wrk {
			closed = Config{Duration: c.ClosedDuration, Concurrency: c.Concurrency}
		}
		return []gcPhase{
			{name: "closed", wrk: wrk, load: closed},
			{name: "open", load: Config{Rate: c.Rate, Duration: c.Duration}},
		}
	}
}

// describe says what generates ph's load, for GCCompareResult.Load.
func (ph gcPhase) describe() string {
	l := ph.load
	var req string
	if l.Body != nil {
		req = fmt.Sprintf(", %s of %d-byte bodies", l.Method, len(l.Body))
	}
	switch {
	case ph.wrk:
		sec := max(1, int64((l.Duration+time.Second-1)/time.Second))
		return fmt.Sprintf("%s: wrk -t1 -c%d -d%ds --latency -s SCRIPT%s (p50, p99 from wrk's distribution; p99.9, max from its histogram via a Lua done hook)",
			ph.name, l.Concurrency, sec, req)
	case l.Rate > 0:
		return fmt.Sprintf("%s: builtin open loop at %g req/s for %v%s (latency from each request's intended send time)", ph.name, l.Rate, l.Duration, req)
	case l.Requests > 0:
		return fmt.Sprintf("%s: builtin closed loop, %d requests at -c %d%s", ph.name, l.Requests, l.Concurrency, req)
	default:
		return fmt.Sprintf("%s: builtin closed loop for %v at -c %d%s", ph.name, l.Duration, l.Concurrency, req)
	}
}

// echoBody returns n printable bytes (the echo handler returns the body
// inside JSON, where printable ASCII costs no escaping).
func echoBody(n int) []byte {
	const pattern = "abcdefghijklmnopqrstuvwxyz0123456789"
	return bytes.Repeat([]byte(pattern), n/len(pattern)+1)[:n]
}

// GCCompare runs cfg's comparison: for each round, for each setting (in
// the order rotated left by the round), a fresh proxy, a warmup, and the
// scenario's phases. It stops at the first failed run or when ctx ends,
// returning what it finished with the error. Every proxy it started has
// exited when it returns.
func GCCompare(ctx context.Context, cfg GCCompareConfig) (*GCCompareResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	tempDir := cfg.Dir == ""
	if tempDir {
		dir, err := os.MkdirTemp("", "gc-compare-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	vars := map[string]string{
		"PROXY_HTTP_ADDR":  "127.0.0.1:0",
		"PROXY_ADMIN_ADDR": "127.0.0.1:0",
		"PROXY_ACCESS_LOG": fmt.Sprint(cfg.AccessLog),
	}
	if cfg.Scenario == ScenarioEcho16k {
		path := filepath.Join(cfg.Dir, "echo16k.yaml")
		if err := os.WriteFile(path, []byte(echo16kConfig), 0o600); err != nil {
			return nil, err
		}
		vars["PROXY_CONFIG"] = path
	}

	phases := cfg.phases()
	for i := range phases {
		if !phases[i].wrk {
			continue
		}
		phases[i].script = filepath.Join(cfg.Dir, fmt.Sprintf("wrk-%s-%s.lua", cfg.Scenario, phases[i].name))
		if err := os.WriteFile(phases[i].script, []byte(WrkScript(phases[i].load)), 0o600); err != nil {
			return nil, err
		}
	}

	res := &GCCompareResult{Settings: cfg.Settings}
	if cfg.WarmupRequests > 0 {
		res.Load = append(res.Load, fmt.Sprintf("warmup: builtin closed loop, %d requests at -c %d before each run, not counted", cfg.WarmupRequests, cfg.Concurrency))
	}
	for _, ph := range phases {
		res.Load = append(res.Load, ph.describe())
	}
	defer func() { res.Medians = GCMedians(cfg.Settings, res.Runs) }()
	for r := range cfg.Rounds {
		for _, s := range RotateLeft(cfg.Settings, r) {
			env := maps.Clone(vars)
			maps.Copy(env, s.Env)
			logPath := filepath.Join(cfg.Dir, fmt.Sprintf("proxy-r%d-%s.log", r+1, s.Name))
			rows, err := gcRun(ctx, cfg, phases, env, logPath)
			for i := range rows {
				rows[i].Setting, rows[i].Round = s.Name, r+1
			}
			res.Runs = append(res.Runs, rows...)
			if err != nil {
				if ctx.Err() != nil {
					return res, fmt.Errorf("round %d, %s: %w", r+1, s.Name, ctx.Err())
				}
				if tempDir {
					err = fmt.Errorf("%w; proxy log, last lines:\n%s", err, tailFile(logPath, 10))
				} else {
					err = fmt.Errorf("%w (proxy log: %s)", err, logPath)
				}
				return res, fmt.Errorf("round %d, %s: %w", r+1, s.Name, err)
			}
			if !cfg.KeepLogs {
				_ = os.Remove(logPath)
			}
			if cfg.Log != nil {
				for _, row := range rows {
					fmt.Fprintf(cfg.Log, "round %d/%d  %-10s %-6s %8.0f req/s  p50 %s  p99 %s  p99.9 %s  max %s  gc %.0f  rss %s  errors %d\n",
						row.Round, cfg.Rounds, row.Setting, row.Phase, row.RequestsPerSec,
						fmtMs(row.P50), fmtMs(row.P99), fmtKnownMs(row.P999), fmtKnownMs(row.Max), row.GCCycles, fmtMiB(row.PeakRSS), row.Errors)
				}
			}
		}
	}
	return res, nil
}

// gcRun starts one proxy with env, warms it up, runs every phase and stops
// it, returning a row per phase finished.
func gcRun(ctx context.Context, cfg GCCompareConfig, phases []gcPhase, env map[string]string, logPath string) ([]GCRow, error) {
	p, err := startProxy(ctx, cfg.ProxyPath, env, logPath)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	url := "http://" + p.HTTPAddr + "/"

	if cfg.WarmupRequests > 0 {
		warm := phases[0].load
		warm.URL, warm.Requests, warm.Duration, warm.Rate = url, cfg.WarmupRequests, 0, 0
		warm.Concurrency = cfg.Concurrency
		if _, err := Run(ctx, warm); err != nil {
			return nil, fmt.Errorf("warmup: %w", err)
		}
	}

	var rows []GCRow
	for _, ph := range phases {
		row, err := gcPhaseRun(ctx, cfg, p, ph, url)
		row.Phase = ph.name
		if err != nil {
			return rows, fmt.Errorf("%s: %w", ph.name, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// gcPhaseRun runs ph's load against p at url, measuring its GC cycles
// and peak RSS.
func gcPhaseRun(ctx context.Context, cfg GCCompareConfig, p *proxyProc, ph gcPhase, url string) (GCRow, error) {
	var row GCRow
	pid := p.cmd.Process.Pid
	gc0, err := p.gcCycles(ctx)
	if err != nil {
		return row, err
	}
	hwmReset := ResetPeakRSS(pid) == nil
	stopSampling := sampleRSS(pid, 100*time.Millisecond)
	row, completed, err := gcLoad(ctx, cfg, ph, url)
	peak := stopSampling()
	if err != nil {
		return row, err
	}
	if !p.alive() {
		return row, errProxyDied
	}
	if hwmReset {
		if m, err := ReadProcMemory(pid); err == nil {
			peak = max(peak, m.HWM)
		}
	}
	gc1, err := p.gcCycles(ctx)
	if err != nil {
		return row, err
	}
	row.GCCycles, row.PeakRSS = gc1-gc0, peak
	if completed == 0 {
		return row, errors.New("no responses")
	}
	return row, nil
}

// gcLoad runs ph's load at url with its tool, returning the load's numbers
// and how many requests got a response.
func gcLoad(ctx context.Context, cfg GCCompareConfig, ph gcPhase, url string) (row GCRow, completed int64, err error) {
	if ph.wrk {
		w, err := RunWrk(ctx, WrkConfig{Path: cfg.WrkPath, URL: url, Concurrency: ph.load.Concurrency, Duration: ph.load.Duration, Script: ph.script})
		if err != nil {
			return row, 0, err
		}
		// wrk's request count includes those that got an error status, not
		// the socket errors.
		return GCRow{
			RequestsPerSec: w.RequestsPerSec,
			P50:            w.Latency[50], P99: w.Latency[99], P999: w.Latency[99.9], Max: w.Max,
			Errors: w.Errors(),
		}, w.Requests, nil
	}
	load := ph.load
	load.URL = url
	res, err := Run(ctx, load)
	if err != nil {
		return row, 0, err
	}
	row = GCRow{
		RequestsPerSec: res.RequestsPerSec,
		P50:            res.Latency(50), P99: res.Latency(99), P999: res.Latency(99.9), Max: res.Max,
		Errors: res.Failed + res.Non2xx,
	}
	if res.Completed == 0 {
		return row, 0, fmt.Errorf("no responses (errors: %v)", res.Errors)
	}
	return row, res.Completed, nil
}

// sampleRSS reads pid's VmRSS every period until the returned stop is
// called; stop returns the largest value seen, in bytes.
func sampleRSS(pid int, period time.Duration) (stop func() int64) {
	var (
		wg   sync.WaitGroup
		peak int64
	)
	done := make(chan struct{})
	read := func() {
		if m, err := ReadProcMemory(pid); err == nil {
			peak = max(peak, m.RSS)
		}
	}
	wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			read()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		read()
		return peak
	}
}

// GCMedians returns, for each setting (in order) and phase (in the order
// first seen), the median of every column over the runs; the p99.9 and max
// over the runs that know them (0, unknown, when none does).
func GCMedians(settings []GCSetting, runs []GCRow) []GCRow {
	var phases []string
	for _, r := range runs {
		if !slices.Contains(phases, r.Phase) {
			phases = append(phases, r.Phase)
		}
	}
	var out []GCRow
	for _, s := range settings {
		for _, ph := range phases {
			var rps, p50, p99, p999, mx, gc, rss []float64
			var errs int64
			for _, r := range runs {
				if r.Setting != s.Name || r.Phase != ph {
					continue
				}
				rps = append(rps, r.RequestsPerSec)
				p50 = append(p50, float64(r.P50))
				p99 = append(p99, float64(r.P99))
				if r.P999 > 0 {
					p999 = append(p999, float64(r.P999))
				}
				if r.Max > 0 {
					mx = append(mx, float64(r.Max))
				}
				errs += r.Errors
				gc = append(gc, r.GCCycles)
				rss = append(rss, float64(r.PeakRSS))
			}
			if len(rps) == 0 {
				continue
			}
			out = append(out, GCRow{
				Setting: s.Name, Phase: ph,
				RequestsPerSec: Median64(rps),
				P50:            time.Duration(Median64(p50)),
				P99:            time.Duration(Median64(p99)),
				P999:           time.Duration(Median64(p999)),
				Max:            time.Duration(Median64(mx)),
				Errors:         errs, // all of them: a median would hide a round's
				GCCycles:       Median64(gc),
				PeakRSS:        int64(Median64(rss)),
			})
		}
	}
	return out
}

// WriteText writes the table of medians, then each setting's environment.
func (r *GCCompareResult) WriteText(w io.Writer) error {
	if err := WriteGCTable(w, r.Medians); err != nil {
		return err
	}
	ew := &errWriter{w: w}
	if len(r.Load) > 0 {
		fmt.Fprintln(ew, "\nload:")
		for _, l := range r.Load {
			fmt.Fprintf(ew, "  %s\n", l)
		}
	}
	fmt.Fprintln(ew, "\nsettings (every other PROXY_*, GOGC and GOMEMLIMIT unset):")
	for _, s := range r.Settings {
		var kv []string
		for _, k := range sortedKeys(s.Env) {
			kv = append(kv, k+"="+s.Env[k])
		}
		if len(kv) == 0 {
			kv = []string{"(no PROXY_GC_* set)"}
		}
		fmt.Fprintf(ew, "  %-10s %s\n", s.Name, strings.Join(kv, " "))
	}
	return ew.err
}

// WriteGCTable writes rows as an aligned table: setting, phase, requests/s,
// p50, p99, p99.9, max ("-" when unknown), errors, GC cycles, peak RSS.
func WriteGCTable(w io.Writer, rows []GCRow) error {
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{
			r.Setting, r.Phase, fmt.Sprintf("%.0f", r.RequestsPerSec),
			fmtMs(r.P50), fmtMs(r.P99), fmtKnownMs(r.P999), fmtKnownMs(r.Max),
			fmt.Sprint(r.Errors), fmt.Sprintf("%.0f", r.GCCycles), fmtMiB(r.PeakRSS),
		})
	}
	return writeTable(w, 2, []string{"setting", "phase", "req/s", "p50", "p99", "p99.9", "max", "errors", "GC cycles", "peak RSS"}, cells)
}

// fmtKnownMs is fmtMs, or "-" for 0: a latency the tool did not report.
func fmtKnownMs(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtMs(d)
}

// fmtMiB formats bytes in MiB with one decimal.
func fmtMiB(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
