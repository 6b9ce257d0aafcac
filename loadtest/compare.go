package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
	// BackendPID, if not 0, is the process the server forwards to, whose
	// CPU time per request is reported beside it: on a shared machine a
	// proxy's cost includes what it makes its backend spend.
	BackendPID int
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
	// BackendCPUPerRequest is the same for the target's backend; 0 if it
	// has no BackendPID.
	BackendCPUPerRequest time.Duration
	// ClientCPUPerRequest is the load generator's: wrk's own CPU time, or
	// with ToolBuiltin this process's.
	ClientCPUPerRequest time.Duration
	// Ratio is RequestsPerSec over the baseline's in the same round.
	Ratio float64
}

// Median is one target's medians over the rounds.
type Median struct {
	// Target is the target's name.
	Target string
	// RequestsPerSec, Ratio, P99 and the CPU times are the medians of the
	// samples' fields (a CPU time 0 when unknown).
	RequestsPerSec       float64
	Ratio                float64
	P99                  time.Duration
	CPUPerRequest        time.Duration
	BackendCPUPerRequest time.Duration
	ClientCPUPerRequest  time.Duration
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
		case t.BackendPID < 0:
			return fmt.Errorf("Targets[%d].BackendPID: must be >= 0, got %d", i, t.BackendPID)
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
	pids := []int{t.PID, t.BackendPID, 0}
	if cfg.Tool == ToolBuiltin {
		pids[2] = os.Getpid() // the load runs in this process
	}
	var before [3]time.Duration
	for i, pid := range pids {
		if pid > 0 {
			var err error
			if before[i], err = ProcCPU(pid); err != nil {
				return s, fmt.Errorf("CPU of pid %d: %w", pid, err)
			}
		}
	}
	var client time.Duration
	switch cfg.Tool {
	case ToolWrk:
		w, err := RunWrk(ctx, WrkConfig{Path: cfg.WrkPath, URL: t.URL, Concurrency: cfg.Concurrency, Duration: d, AllowRemote: cfg.AllowRemote})
		if err != nil {
			return s, err
		}
		s.RequestsPerSec, s.P99, s.Requests, s.Errors = w.RequestsPerSec, w.Latency[99], w.Requests, w.Errors()
		client = w.CPU
	case ToolBuiltin:
		r, err := Run(ctx, Config{URL: t.URL, Duration: d, Concurrency: cfg.Concurrency, AllowRemote: cfg.AllowRemote})
		if err != nil {
			return s, err
		}
		s.RequestsPerSec, s.P99, s.Requests, s.Errors = r.RequestsPerSec, r.Latency(99), r.Total, r.Failed+r.Non2xx
	}
	if s.Requests == 0 {
		return s, errors.New("no request finished")
	}
	var spent [3]time.Duration
	for i, pid := range pids {
		if pid > 0 {
			after, err := ProcCPU(pid)
			if err != nil {
				return s, fmt.Errorf("CPU of pid %d: %w", pid, err)
			}
			spent[i] = after - before[i]
		}
	}
	if cfg.Tool == ToolWrk {
		spent[2] = client
	}
	n := time.Duration(s.Requests)
	s.CPUPerRequest, s.BackendCPUPerRequest, s.ClientCPUPerRequest = spent[0]/n, spent[1]/n, spent[2]/n
	return s, nil
}

// Medians returns each target's medians over rounds, in targets' order.
func Medians(targets []Target, rounds [][]Sample) []Median {
	out := make([]Median, 0, len(targets))
	for _, t := range targets {
		var rps, ratio, p99, cpu, backend, client []float64
		for _, round := range rounds {
			for _, s := range round {
				if s.Target != t.Name {
					continue
				}
				rps = append(rps, s.RequestsPerSec)
				ratio = append(ratio, s.Ratio)
				p99 = append(p99, float64(s.P99))
				cpu = appendKnown(cpu, s.CPUPerRequest)
				backend = appendKnown(backend, s.BackendCPUPerRequest)
				client = appendKnown(client, s.ClientCPUPerRequest)
			}
		}
		out = append(out, Median{
			Target:               t.Name,
			RequestsPerSec:       Median64(rps),
			Ratio:                Median64(ratio),
			P99:                  time.Duration(Median64(p99)),
			CPUPerRequest:        time.Duration(Median64(cpu)),
			BackendCPUPerRequest: time.Duration(Median64(backend)),
			ClientCPUPerRequest:  time.Duration(Median64(client)),
		})
	}
	return out
}

// appendKnown appends d to xs unless it is 0 (unknown).
func appendKnown(xs []float64, d time.Duration) []float64 {
	if d > 0 {
		xs = append(xs, float64(d))
	}
	return xs
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
//	round 1  bare    73493 req/s  p99   5.24ms  cpu  12.3µs/req  ratio 1.00  backend -  client 9.8µs/req
func WriteRound(w io.Writer, round []Sample) error {
	width := 0
	for _, s := range round {
		width = max(width, len(s.Target))
	}
	ew := &errWriter{w: w}
	for _, s := range round {
		fmt.Fprintf(ew, "round %d  %-*s  %9.0f req/s  p99 %8s  cpu %13s  ratio %.2f  backend %s  client %s",
			s.Round, width, s.Target, s.RequestsPerSec, fmtMs(s.P99), fmtCPU(s.CPUPerRequest), s.Ratio,
			fmtCPU(s.BackendCPUPerRequest), fmtCPU(s.ClientCPUPerRequest))
		if s.Errors > 0 {
			fmt.Fprintf(ew, "  ERRORS %d", s.Errors)
		}
		fmt.Fprintln(ew)
	}
	return ew.err
}

// WriteText writes the table of medians, the first target the baseline.
// The CPU columns are the target's server ("cpu"), its backend and the
// load generator, each per request; "-" where unknown.
func (r *CompareResult) WriteText(w io.Writer) error {
	var rows [][]string
	for _, m := range r.Medians {
		rows = append(rows, []string{m.Target, fmt.Sprintf("%.0f", m.RequestsPerSec), fmt.Sprintf("%.2f", m.Ratio), fmtMs(m.P99),
			fmtCPU(m.CPUPerRequest), fmtCPU(m.BackendCPUPerRequest), fmtCPU(m.ClientCPUPerRequest)})
	}
	if err := writeTable(w, 1, []string{"target", "median req/s", "median ratio", "median p99", "median cpu", "backend cpu", "client cpu"}, rows); err != nil {
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
