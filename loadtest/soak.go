package loadtest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Soak defaults and the verdict's limits.
const (
	// DefaultSoakRate is SoakConfig.Rate when 0, in requests/s.
	DefaultSoakRate = 2000
	// DefaultSoakDuration is SoakConfig.Duration when 0.
	DefaultSoakDuration = 5 * time.Minute
	// DefaultSoakEvery is SoakConfig.Every when 0.
	DefaultSoakEvery = 10 * time.Second
	// DefaultSoakWarmup is SoakConfig.Warmup when 0 (or half the
	// Duration, if that is shorter).
	DefaultSoakWarmup = 30 * time.Second

	// SoakMaxRSSDrift is the largest RSS growth under load, after the
	// warm-up, that is still flat: a fraction of the RSS at the first
	// sample after the warm-up.
	SoakMaxRSSDrift = 0.10
	// SoakMaxGoroutineDelta is the largest change of the goroutine count
	// between the idle proxy before the load and after it that is still
	// flat.
	SoakMaxGoroutineDelta = 5
)

// soakSettle bounds the wait, after the load, for the goroutine count to
// come back: the proxy needs a moment to see the client's connections
// close and end their goroutines.
const soakSettle = 5 * time.Second

// SoakConfig is a soak: the proxy binary, on ephemeral loopback ports,
// under the builtin open loop at a steady Rate for a long Duration, its
// memory and goroutines sampled every Every, to see whether they stay
// flat.
type SoakConfig struct {
	// ProxyPath is the proxy binary. Required.
	ProxyPath string
	// Env is set in the proxy's environment (every other PROXY_*
	// variable, GOGC and GOMEMLIMIT are removed from it). It must not set
	// PROXY_HTTP_ADDR or PROXY_ADMIN_ADDR, which the soak chooses.
	Env map[string]string
	// Rate is the open loop's requests/s. If 0, DefaultSoakRate.
	Rate float64
	// Duration is the load's length. If 0, DefaultSoakDuration.
	Duration time.Duration
	// Every is the time between samples under load. If 0,
	// DefaultSoakEvery.
	Every time.Duration
	// Warmup is how long the proxy's memory may grow freely: the drift is
	// measured from the first sample at or after it. If 0,
	// DefaultSoakWarmup or Duration/2, whichever is shorter.
	Warmup time.Duration
	// Dir holds the proxy's log. If empty, a temporary directory is made
	// and removed at the end.
	Dir string
	// Log receives a header and a line per sample as the soak goes. If
	// nil, nothing is written.
	Log io.Writer
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c SoakConfig) withDefaults() SoakConfig {
	if c.Rate == 0 {
		c.Rate = DefaultSoakRate
	}
	if c.Duration == 0 {
		c.Duration = DefaultSoakDuration
	}
	if c.Every == 0 {
		c.Every = DefaultSoakEvery
	}
	if c.Warmup == 0 {
		c.Warmup = min(DefaultSoakWarmup, c.Duration/2)
	}
	return c
}

// Validate reports the first problem with c, naming the field.
func (c SoakConfig) Validate() error {
	if err := checkProxyPath(c.ProxyPath); err != nil {
		return err
	}
	for _, k := range sortedKeys(c.Env) {
		switch {
		case k == "" || strings.ContainsAny(k, "= \t\n"):
			return fmt.Errorf("Env: bad variable name %q", k)
		case k == "PROXY_HTTP_ADDR" || k == "PROXY_ADMIN_ADDR":
			return fmt.Errorf("Env: %s is the soak's (ephemeral loopback ports)", k)
		}
	}
	d := c.withDefaults()
	switch {
	case !(c.Rate >= 0 && c.Rate <= 1e7): // NaN too
		return fmt.Errorf("Rate: want 0 < requests/s <= 1e7, got %g", c.Rate)
	case c.Duration < 0:
		return fmt.Errorf("Duration: must be > 0, got %v", c.Duration)
	case c.Every < 0:
		return fmt.Errorf("Every: must be > 0, got %v", c.Every)
	case c.Warmup < 0:
		return fmt.Errorf("Warmup: must be >= 0, got %v", c.Warmup)
	case d.Warmup+d.Every >= d.Duration:
		// Two samples under load after the warm-up, or there is no drift.
		return fmt.Errorf("Warmup, Every: Warmup + Every (%v + %v) must be shorter than Duration (%v)", d.Warmup, d.Every, d.Duration)
	}
	return nil
}

// SoakPhase says when a SoakSample was taken.
type SoakPhase string

// The phases of a soak's samples.
const (
	// SoakStart is the idle proxy, started, before the load.
	SoakStart SoakPhase = "start"
	// SoakLoad is under load.
	SoakLoad SoakPhase = "load"
	// SoakEnd is the idle proxy after the load, once the client's
	// connections are closed.
	SoakEnd SoakPhase = "end"
)

// SoakSample is one look at the proxy.
type SoakSample struct {
	// Phase and At say when: At is the time since the load started (0
	// for SoakStart).
	Phase SoakPhase
	At    time.Duration
	// RSS is the resident set (VmRSS), in bytes.
	RSS int64
	// HeapInuse is go_memstats_heap_inuse_bytes, in bytes.
	HeapInuse int64
	// Goroutines is go_goroutines.
	Goroutines int
	// GCCycles is go_gc_duration_seconds_count, cycles since the start.
	GCCycles float64
	// CPU is the process's CPU time so far.
	CPU time.Duration
	// Err is why the sample could not be taken; then the fields above are
	// not to be read.
	Err error
}

// soakMetrics are the admin /metrics samples a SoakSample reads.
var soakMetrics = []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "go_gc_duration_seconds_count"}

// ParseSoakMetrics fills s's HeapInuse, Goroutines and GCCycles from the
// proxy's admin /metrics (Prometheus text). It is an error if any is
// missing.
func ParseSoakMetrics(r io.Reader, s *SoakSample) error {
	m, err := ParseMetrics(r, soakMetrics...)
	if err != nil {
		return err
	}
	s.Goroutines = int(m["go_goroutines"])
	s.HeapInuse = int64(m["go_memstats_heap_inuse_bytes"])
	s.GCCycles = m["go_gc_duration_seconds_count"]
	return nil
}

// SoakResult is a whole soak.
type SoakResult struct {
	// PID is the proxy's process.
	PID int
	// Samples are every sample, in the order taken: SoakStart, the
	// SoakLoad ones, SoakEnd.
	Samples []SoakSample
	// Load is the open loop's result; nil if it did not run.
	Load *Result
	// Warmup is the configured warm-up (see SoakConfig.Warmup).
	Warmup time.Duration
}

// SoakSummary is what a soak's samples say.
type SoakSummary struct {
	// Start and End are the idle samples before and after the load.
	Start, End SoakSample
	// Base is the first load sample at or after the warm-up, Last the
	// last load sample: the drift runs from one to the other.
	Base, Last SoakSample
	// MaxRSS and MaxGoroutines are the largest of every sample.
	MaxRSS        int64
	MaxGoroutines int
	// RSSDrift and HeapDrift are Last minus Base; GoroutineDrift too.
	RSSDrift, HeapDrift int64
	GoroutineDrift      int
	// GoroutineDelta is End minus Start: goroutines left behind by the
	// load.
	GoroutineDelta int
	// GCCycles are the cycles from Start to Last.
	GCCycles float64
	// Flat is the verdict: RSSDrift < SoakMaxRSSDrift of Base's RSS and
	// |GoroutineDelta| <= SoakMaxGoroutineDelta.
	Flat bool
}

// SummarizeSoak reads the samples (those with Err skipped) of a soak whose
// warm-up was warmup. It needs a SoakStart and a SoakEnd sample and two
// SoakLoad samples at or after warmup.
func SummarizeSoak(samples []SoakSample, warmup time.Duration) (SoakSummary, error) {
	var (
		s                  SoakSummary
		start, end, base   bool
		afterWarmup, valid int
	)
	for _, x := range samples {
		if x.Err != nil {
			continue
		}
		valid++
		s.MaxRSS = max(s.MaxRSS, x.RSS)
		s.MaxGoroutines = max(s.MaxGoroutines, x.Goroutines)
		switch {
		case x.Phase == SoakStart && !start:
			s.Start, start = x, true
		case x.Phase == SoakEnd:
			s.End, end = x, true
		case x.Phase == SoakLoad && x.At >= warmup:
			if !base {
				s.Base, base = x, true
			}
			s.Last = x
			afterWarmup++
		}
	}
	switch {
	case !start:
		return s, fmt.Errorf("no sample of the idle proxy before the load (%d good samples)", valid)
	case !end:
		return s, fmt.Errorf("no sample of the idle proxy after the load (%d good samples)", valid)
	case afterWarmup < 2:
		return s, fmt.Errorf("%d samples under load after the %v warm-up, want at least 2", afterWarmup, warmup)
	}
	s.RSSDrift = s.Last.RSS - s.Base.RSS
	s.HeapDrift = s.Last.HeapInuse - s.Base.HeapInuse
	s.GoroutineDrift = s.Last.Goroutines - s.Base.Goroutines
	s.GoroutineDelta = s.End.Goroutines - s.Start.Goroutines
	s.GCCycles = s.Last.GCCycles - s.Start.GCCycles
	s.Flat = s.rssFlat() && s.goroutinesFlat()
	return s, nil
}

// rssFlat reports whether the RSS grew less than SoakMaxRSSDrift.
func (s SoakSummary) rssFlat() bool {
	return float64(s.RSSDrift) < SoakMaxRSSDrift*float64(s.Base.RSS)
}

// goroutinesFlat reports whether the goroutines came back to within
// SoakMaxGoroutineDelta of the start.
func (s SoakSummary) goroutinesFlat() bool {
	return abs(s.GoroutineDelta) <= SoakMaxGoroutineDelta
}

// Verdict is the verdict line: "verdict: flat (...)" or
// "verdict: NOT flat: ..." with the numbers that decided it.
func (s SoakSummary) Verdict() string {
	pct := 0.0
	if s.Base.RSS > 0 {
		pct = 100 * float64(s.RSSDrift) / float64(s.Base.RSS)
	}
	rss := fmt.Sprintf("RSS drift %s (%+.1f%% of %s, limit +%.0f%%)", fmtMiBSigned(s.RSSDrift), pct, fmtMiB(s.Base.RSS), 100*SoakMaxRSSDrift)
	gor := fmt.Sprintf("goroutines %d at start, %d at end (%+d, limit ±%d)", s.Start.Goroutines, s.End.Goroutines, s.GoroutineDelta, SoakMaxGoroutineDelta)
	if s.Flat {
		return "verdict: flat (" + rss + "; " + gor + ")"
	}
	var why []string
	if !s.rssFlat() {
		why = append(why, rss)
	}
	if !s.goroutinesFlat() {
		why = append(why, gor)
	}
	return "verdict: NOT flat: " + strings.Join(why, "; ")
}

// Soak runs cfg's soak: it starts the proxy, samples it idle, runs the
// open loop sampling every cfg.Every, samples it idle again, and stops it.
// It returns what it has with the error if the proxy dies, a sample of the
// start or end fails, or ctx ends. The proxy has exited when it returns.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "soak-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	}
	env := maps.Clone(cfg.Env)
	if env == nil {
		env = make(map[string]string)
	}
	env["PROXY_HTTP_ADDR"], env["PROXY_ADMIN_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
	logPath := filepath.Join(cfg.Dir, "proxy.log")
	p, err := startProxy(ctx, cfg.ProxyPath, env, logPath)
	if err != nil {
		return nil, fmt.Errorf("%w; proxy log, last lines:\n%s", err, tailFile(logPath, 10))
	}
	defer p.stop()
	res := &SoakResult{PID: p.cmd.Process.Pid, Warmup: cfg.Warmup}
	// failed returns res with err, or with why: ctx's end, the proxy's.
	failed := func(err error) (*SoakResult, error) {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if !p.alive() {
			return res, fmt.Errorf("%w (%v); proxy log, last lines:\n%s", errProxyDied, p.waitErr, tailFile(logPath, 10))
		}
		return res, err
	}

	sl := &soakLog{w: cfg.Log}
	sl.header(cfg, p)
	first := p.sample(ctx, SoakStart, 0)
	sl.line(first, first)
	res.Samples = append(res.Samples, first)
	if first.Err != nil {
		return failed(fmt.Errorf("sampling the idle proxy: %w", first.Err))
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var samples []SoakSample // the sampler's until wg.Wait
	start := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(cfg.Every)
		defer tick.Stop()
		prev := first
		for {
			select {
			case <-done:
				return
			case <-p.exited:
				stopLoad() // nothing left to load
				return
			case <-tick.C:
			}
			at := time.Since(start)
			if at > cfg.Duration {
				continue // the sending is over; the run is draining
			}
			s := p.sample(ctx, SoakLoad, at)
			sl.line(s, prev)
			samples = append(samples, s)
			if s.Err == nil {
				prev = s
			}
		}
	})
	load, err := Run(loadCtx, Config{URL: "http://" + p.HTTPAddr + "/", Rate: cfg.Rate, Duration: cfg.Duration})
	close(done)
	wg.Wait()
	res.Samples = append(res.Samples, samples...)
	res.Load = load
	if err != nil || !p.alive() {
		return failed(fmt.Errorf("load: %w", err))
	}

	last := p.settle(ctx, first.Goroutines)
	last.At = time.Since(start)
	prev := first
	for _, s := range res.Samples {
		if s.Err == nil {
			prev = s
		}
	}
	sl.line(last, prev)
	res.Samples = append(res.Samples, last)
	if last.Err != nil {
		return failed(fmt.Errorf("sampling the idle proxy after the load: %w", last.Err))
	}
	return res, nil
}

// sample takes one SoakSample of p.
func (p *proxyProc) sample(ctx context.Context, phase SoakPhase, at time.Duration) SoakSample {
	s := SoakSample{Phase: phase, At: at}
	pid := p.cmd.Process.Pid
	mem, err := ReadProcMemory(pid)
	if err != nil {
		s.Err = err
		return s
	}
	s.RSS = mem.RSS
	if s.CPU, err = ProcCPU(pid); err != nil {
		s.Err = err
		return s
	}
	body, err := p.metrics(ctx)
	if err == nil {
		err = ParseSoakMetrics(strings.NewReader(body), &s)
	}
	s.Err = err
	return s
}

// settle samples the idle p until its goroutines are back within
// SoakMaxGoroutineDelta of want, or soakSettle has passed, or ctx ends,
// and returns the last sample.
func (p *proxyProc) settle(ctx context.Context, want int) SoakSample {
	deadline := time.Now().Add(soakSettle)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		s := p.sample(ctx, SoakEnd, 0)
		if s.Err == nil && abs(s.Goroutines-want) <= SoakMaxGoroutineDelta || time.Now().After(deadline) {
			return s
		}
		select {
		case <-ctx.Done():
			return s
		case <-tick.C:
		}
	}
}

// abs returns |n|.
func abs(n int) int { return max(n, -n) }

// soakLog writes the soak's progress lines; a nil w writes nothing.
type soakLog struct{ w io.Writer }

// header writes the soak's first lines: what runs, then the column names.
func (l *soakLog) header(cfg SoakConfig, p *proxyProc) {
	if l.w == nil {
		return
	}
	fmt.Fprintf(l.w, "soak: proxy %s (pid %d, %s), builtin open loop at %g req/s for %v, a sample every %v, drift from %v\n",
		cfg.ProxyPath, p.cmd.Process.Pid, p.HTTPAddr, cfg.Rate, cfg.Duration, cfg.Every, cfg.Warmup)
	if len(cfg.Env) > 0 {
		var kv []string
		for _, k := range sortedKeys(cfg.Env) {
			kv = append(kv, k+"="+cfg.Env[k])
		}
		fmt.Fprintf(l.w, "soak: proxy environment (every other PROXY_*, GOGC and GOMEMLIMIT unset): %s\n", strings.Join(kv, " "))
	}
	fmt.Fprintf(l.w, "%7s  %-5s  %9s  %10s  %10s  %9s  %6s  %5s\n", "t", "phase", "rss", "heap_inuse", "goroutines", "gc cycles", "+gc", "cpu")
}

// line writes sample s; prev is the sample before it, for the deltas.
func (l *soakLog) line(s, prev SoakSample) {
	if l.w == nil {
		return
	}
	if s.Err != nil {
		fmt.Fprintf(l.w, "%7s  %-5s  sample failed: %v\n", fmtAt(s.At), s.Phase, s.Err)
		return
	}
	cpu := "-"
	if wall := s.At - prev.At; wall > 0 && s.Phase == SoakLoad {
		cpu = fmt.Sprintf("%.0f%%", 100*float64(s.CPU-prev.CPU)/float64(wall))
	}
	fmt.Fprintf(l.w, "%7s  %-5s  %9s  %10s  %10d  %9.0f  %6s  %5s\n", fmtAt(s.At), s.Phase, fmtMiB(s.RSS), fmtMiB(s.HeapInuse),
		s.Goroutines, s.GCCycles, fmt.Sprintf("+%.0f", s.GCCycles-prev.GCCycles), cpu)
}

// WriteText writes the soak's summary: the load, first/last/max RSS and
// goroutines, the drift, and the verdict line. It returns the summary (and
// SummarizeSoak's error, after writing what it can).
func (r *SoakResult) WriteText(w io.Writer) (SoakSummary, error) {
	ew := &errWriter{w: w}
	if l := r.Load; l != nil {
		fmt.Fprintf(ew, "load: %d requests in %v (%.0f req/s): %d failed (%d dropped), %d non-2xx, %d cancelled; latency p50 %s  p99 %s  p99.9 %s  max %s\n",
			l.Total, l.Elapsed.Round(time.Millisecond), l.RequestsPerSec, l.Failed, l.Dropped, l.Non2xx, l.Cancelled,
			fmtKnownMs(l.Latency(50)), fmtKnownMs(l.Latency(99)), fmtKnownMs(l.Latency(99.9)), fmtKnownMs(l.Max))
		if l.Failed+l.Non2xx > 0 {
			fmt.Fprintf(ew, "WARNING: %d requests failed or were not 2xx: %v\n", l.Failed+l.Non2xx, l.Errors)
		}
	}
	s, err := SummarizeSoak(r.Samples, r.Warmup)
	if err != nil {
		fmt.Fprintf(ew, "verdict: unknown: %v\n", err)
		if ew.err != nil {
			return s, ew.err
		}
		return s, err
	}
	fmt.Fprintf(ew, "rss:        first %s  last %s  max %s\n", fmtMiB(s.Start.RSS), fmtMiB(s.End.RSS), fmtMiB(s.MaxRSS))
	fmt.Fprintf(ew, "goroutines: first %d  last %d  max %d\n", s.Start.Goroutines, s.End.Goroutines, s.MaxGoroutines)
	under := (s.Last.At - s.Start.At).Seconds()
	fmt.Fprintf(ew, "drift under load, t=%s -> t=%s: rss %s, heap_inuse %s, goroutines %+d; GC %.0f cycles (%.1f/s)\n",
		fmtAt(s.Base.At), fmtAt(s.Last.At), fmtMiBSigned(s.RSSDrift), fmtMiBSigned(s.HeapDrift), s.GoroutineDrift, s.GCCycles, s.GCCycles/math.Max(under, 1))
	fmt.Fprintln(ew, s.Verdict())
	return s, ew.err
}

// fmtAt formats a time since the load started: "30.0s".
func fmtAt(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// fmtMiBSigned formats bytes in MiB with one decimal and a sign.
func fmtMiBSigned(n int64) string { return fmt.Sprintf("%+.1fMiB", float64(n)/(1<<20)) }
