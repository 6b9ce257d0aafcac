package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Tool names the load generator Compare drives.
type Tool string

// The tools Compare can drive.
const (
	// ToolWrk runs `wrk -t1 -cC -dD --latency` per run.
	ToolWrk Tool = "wrk"
	// ToolBuiltin runs this package's closed loop (keep-alive) per run.
	ToolBuiltin Tool = "builtin"
)

// Target is one server in a comparison.
type Target struct {
	// Name labels the target in the output.
	Name string
	// URL is where the load goes.
	URL string
	// PID is the server's process, whose CPU time per request is reported.
	// If 0, CPU is not reported for this target.
	PID int
}

// CompareConfig is a side-by-side comparison: the same load against every
// target, Rounds times, the order rotated each round so that no target
// always runs first (or right after the same neighbour).
type CompareConfig struct {
	// Targets are compared; the first is the baseline of the ratios. At
	// least two, with distinct names.
	Targets []Target
	// Rounds is how many times every target is run. If 0, 5 is used.
	Rounds int
	// Duration is each run's length. If 0, 10s is used.
	Duration time.Duration
	// Concurrency is each run's connections. If 0, 100 is used.
	Concurrency int
	// Warmup, if > 0, is a run of this length against each target before
	// the first round, whose numbers are thrown away.
	Warmup time.Duration
	// Tool is the load generator. If empty, ToolWrk is used.
	Tool Tool
	// WrkPath is the wrk binary for ToolWrk. If empty, PATH is searched.
	WrkPath string
	// AllowRemote permits target hosts that are not loopback.
	AllowRemote bool
	// Log receives a line per round as the comparison goes (see
	// WriteRound). If nil, nothing is written until the end.
	Log io.Writer
}

// Sample is one run against one target.
type Sample struct {
	// Target is the target's name; Round counts from 1.
	Target string
	Round  int
	// RequestsPerSec and P99 are the run's throughput and 99th percentile.
	RequestsPerSec float64
	P99            time.Duration
	// Requests is the number of requests the run finished.
	Requests int64
	// Errors counts failed and non-2xx requests (wrk: socket errors and
	// non-2xx/3xx responses).
	Errors int64
	// CPUPerRequest is the target process's CPU time during the run over
	// Requests; 0 if the target has no PID.
	CPUPerRequest time.Duration
	// Ratio is RequestsPerSec over the baseline's in the same round.
	Ratio float64
}

// Median is one target's medians over the rounds.
type Median struct {
	// Target is the target's name.
	Target string
	// RequestsPerSec, Ratio, P99 and CPUPerRequest are the medians of the
	// samples' fields (CPUPerRequest 0 when unknown).
	RequestsPerSec float64
	Ratio          float64
	P99            time.Duration
	CPUPerRequest  time.Duration
}

// CompareResult is a whole comparison.
type CompareResult struct {
	// Rounds holds each round's samples, in the order they ran.
	Rounds [][]Sample
	// Medians holds one entry per target, in the Targets' order.
	Medians []Median
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c CompareConfig) withDefaults() CompareConfig {
	if c.Rounds == 0 {
		c.Rounds = 5
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = 100
	}
	if c.Tool == "" {
		c.Tool = ToolWrk
	}
	return c
}

// Validate reports the first problem with c, naming the field.
func (c CompareConfig) Validate() error {
	if len(c.Targets) < 2 {
		return fmt.Errorf("Targets: want at least 2, got %d", len(c.Targets))
	}
	seen := make(map[string]bool)
	for i, t := range c.Targets {
		switch {
		case t.Name == "":
			return fmt.Errorf("Targets[%d].Name: required", i)
		case seen[t.Name]:
			return fmt.Errorf("Targets[%d].Name: %q given twice", i, t.Name)
		case t.PID < 0:
			return fmt.Errorf("Targets[%d].PID: must be >= 0, got %d", i, t.PID)
		}
		seen[t.Name] = true
		if err := (Config{URL: t.URL, Requests: 1, AllowRemote: c.AllowRemote}).Validate(); err != nil {
			return fmt.Errorf("Targets[%d] (%s): %w", i, t.Name, err)
		}
	}
	switch {
	case c.Rounds < 0:
		return fmt.Errorf("Rounds: must be >= 1, got %d", c.Rounds)
	case c.Duration < 0:
		return fmt.Errorf("Duration: must be > 0, got %v", c.Duration)
	case c.Concurrency < 0:
		return fmt.Errorf("Concurrency: must be >= 1, got %d", c.Concurrency)
	case c.Warmup < 0:
		return fmt.Errorf("Warmup: must be >= 0, got %v", c.Warmup)
	case c.Tool != "" && c.Tool != ToolWrk && c.Tool != ToolBuiltin:
		return fmt.Errorf("Tool: want %q or %q, got %q", ToolWrk, ToolBuiltin, c.Tool)
	}
	return nil
}

// Compare runs cfg's comparison. In round r (from 0) the targets run in
// their order rotated left by r: with two targets, the order alternates.
// It stops at the first failed run, or when ctx ends, returning the rounds
// finished so far with the error.
func Compare(ctx context.Context, cfg CompareConfig) (*CompareResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	res := &CompareResult{}
	defer func() { res.Medians = Medians(cfg.Targets, res.Rounds) }()

	if cfg.Warmup > 0 {
		for _, t := range cfg.Targets {
			if _, err := compareRun(ctx, cfg, t, cfg.Warmup); err != nil {
				return res, fmt.Errorf("warmup %s: %w", t.Name, err)
			}
		}
	}
	for r := range cfg.Rounds {
		var round []Sample
		for _, t := range RotateLeft(cfg.Targets, r) {
			s, err := compareRun(ctx, cfg, t, cfg.Duration)
			if err != nil {
				return res, fmt.Errorf("round %d, %s: %w", r+1, t.Name, err)
			}
			s.Round = r + 1
			round = append(round, s)
		}
		setRatios(round, cfg.Targets[0].Name)
		res.Rounds = append(res.Rounds, round)
		if cfg.Log != nil {
			if err := WriteRound(cfg.Log, round); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// RotateLeft returns a copy of s rotated left by k: k=1 turns a b c into
// b c a.
func RotateLeft[T any](s []T, k int) []T {
	if len(s) == 0 {
		return nil
	}
	k %= len(s)
	return slices.Concat(s[k:], s[:k])
}

// setRatios sets every sample's Ratio to its rate over the baseline's.
func setRatios(round []Sample, baseline string) {
	var base float64
	for _, s := range round {
		if s.Target == baseline {
			base = s.RequestsPerSec
		}
	}
	for i := range round {
		if base > 0 {
			round[i].Ratio = round[i].RequestsPerSec / base
		}
	}
}

// compareRun runs one load of length d against t.
func compareRun(ctx context.Context, cfg CompareConfig, t Target, d time.Duration) (Sample, error) {
	s := Sample{Target: t.Name}
	var cpu0 time.Duration
	if t.PID > 0 {
		var err error
		if cpu0, err = ProcCPU(t.PID); err != nil {
			return s, fmt.Errorf("CPU of pid %d: %w", t.PID, err)
		}
	}
	switch cfg.Tool {
	case ToolWrk:
		w, err := RunWrk(ctx, WrkConfig{Path: cfg.WrkPath, URL: t.URL, Concurrency: cfg.Concurrency, Duration: d, AllowRemote: cfg.AllowRemote})
		if err != nil {
			return s, err
		}
		s.RequestsPerSec, s.P99, s.Requests, s.Errors = w.RequestsPerSec, w.Latency[99], w.Requests, w.Errors()
	case ToolBuiltin:
		r, err := Run(ctx, Config{URL: t.URL, Duration: d, Concurrency: cfg.Concurrency, AllowRemote: cfg.AllowRemote})
		if err != nil {
			return s, err
		}
		s.RequestsPerSec, s.P99, s.Requests, s.Errors = r.RequestsPerSec, r.Latency(99), r.Total, r.Failed+r.Non2xx
	}
	if t.PID > 0 {
		cpu1, err := ProcCPU(t.PID)
		if err != nil {
			return s, fmt.Errorf("CPU of pid %d: %w", t.PID, err)
		}
		if s.Requests > 0 {
			s.CPUPerRequest = (cpu1 - cpu0) / time.Duration(s.Requests)
		}
	}
	if s.Requests == 0 {
		return s, errors.New("no request finished")
	}
	return s, nil
}

// Medians returns each target's medians over rounds, in targets' order.
func Medians(targets []Target, rounds [][]Sample) []Median {
	out := make([]Median, 0, len(targets))
	for _, t := range targets {
		var rps, ratio, p99, cpu []float64
		for _, round := range rounds {
			for _, s := range round {
				if s.Target != t.Name {
					continue
				}
				rps = append(rps, s.RequestsPerSec)
				ratio = append(ratio, s.Ratio)
				p99 = append(p99, float64(s.P99))
				if s.CPUPerRequest > 0 {
					cpu = append(cpu, float64(s.CPUPerRequest))
				}
			}
		}
		out = append(out, Median{
			Target:         t.Name,
			RequestsPerSec: Median64(rps),
			Ratio:          Median64(ratio),
			P99:            time.Duration(Median64(p99)),
			CPUPerRequest:  time.Duration(Median64(cpu)),
		})
	}
	return out
}

// Median64 returns the middle of xs, or the mean of the two middle values
// for an even count; 0 for none. xs is not modified.
func Median64(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// WriteRound writes one line per sample of a round:
//
//	round 1  bare    73493 req/s  p99   5.24ms  cpu  12.3µs/req  ratio 1.00
func WriteRound(w io.Writer, round []Sample) error {
	width := 0
	for _, s := range round {
		width = max(width, len(s.Target))
	}
	ew := &errWriter{w: w}
	for _, s := range round {
		fmt.Fprintf(ew, "round %d  %-*s  %9.0f req/s  p99 %8s  cpu %13s  ratio %.2f",
			s.Round, width, s.Target, s.RequestsPerSec, fmtMs(s.P99), fmtCPU(s.CPUPerRequest), s.Ratio)
		if s.Errors > 0 {
			fmt.Fprintf(ew, "  ERRORS %d", s.Errors)
		}
		fmt.Fprintln(ew)
	}
	return ew.err
}

// WriteText writes the table of medians, the first target the baseline.
func (r *CompareResult) WriteText(w io.Writer) error {
	var rows [][]string
	for _, m := range r.Medians {
		rows = append(rows, []string{m.Target, fmt.Sprintf("%.0f", m.RequestsPerSec), fmt.Sprintf("%.2f", m.Ratio), fmtMs(m.P99), fmtCPU(m.CPUPerRequest)})
	}
	if err := writeTable(w, 1, []string{"target", "median req/s", "median ratio", "median p99", "median cpu"}, rows); err != nil {
		return err
	}
	var errs []string
	for _, round := range r.Rounds {
		for _, s := range round {
			if s.Errors > 0 {
				errs = append(errs, fmt.Sprintf("round %d %s: %d", s.Round, s.Target, s.Errors))
			}
		}
	}
	if len(errs) > 0 {
		_, err := fmt.Fprintf(w, "WARNING: runs with errors (failed or non-2xx requests): %s\n", strings.Join(errs, "; "))
		return err
	}
	return nil
}

// fmtMs formats d in milliseconds with two decimals.
func fmtMs(d time.Duration) string { return fmt.Sprintf("%.2fms", ms(d)) }

// fmtCPU formats a CPU time per request in microseconds, "-" when unknown.
func fmtCPU(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fµs/req", float64(d)/float64(time.Microsecond))
}
