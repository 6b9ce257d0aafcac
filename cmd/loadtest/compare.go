package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/serveproxy/serveproxy/loadtest"
)

// pidFlag collects repeated -pid name=PID flags.
type pidFlag map[string]int

// String implements flag.Value.
func (f pidFlag) String() string { return "" }

// Set implements flag.Value.
func (f pidFlag) Set(s string) error {
	name, v, ok := strings.Cut(s, "=")
	pid, err := strconv.Atoi(v)
	if !ok || name == "" || err != nil || pid <= 0 {
		return fmt.Errorf("want name=PID, got %q", s)
	}
	f[name] = pid
	return nil
}

// parseCompare turns the compare command line into a CompareConfig.
func parseCompare(args []string, stderr io.Writer) (loadtest.CompareConfig, error) {
	fs := flag.NewFlagSet("loadtest compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest compare [flags] name=URL name=URL...\n\n"+
			"The same load against every target, rounds in rotating order, then the medians.\n"+
			"The first target is the baseline of the ratios. Servers are not started here.\n\nflags:\n")
		fs.PrintDefaults()
	}
	defaultTool := loadtest.ToolBuiltin
	if _, err := exec.LookPath("wrk"); err == nil {
		defaultTool = loadtest.ToolWrk
	}
	rounds := fs.Int("rounds", 5, "rounds (every target once per round)")
	d := fs.Duration("t", 10*time.Second, "length of each run")
	c := fs.Int("c", 100, "connections")
	warmup := fs.Duration("warmup", 2*time.Second, "a run per target before the rounds, not counted (0: none)")
	tool := fs.String("tool", string(defaultTool), "load generator: wrk (wrk -t1 -cC -dD --latency) or builtin (the default is wrk if it is on PATH)")
	pids := pidFlag{}
	fs.Var(pids, "pid", "`name=PID` of a target's server process, to report its CPU time per request (repeatable)")
	allowRemote := fs.Bool("allow-remote", false, "allow targets whose host is not loopback")
	if err := parse(fs, args); err != nil {
		return loadtest.CompareConfig{}, err
	}
	switch {
	case *rounds < 1:
		return loadtest.CompareConfig{}, usagef("-rounds: must be >= 1, got %d", *rounds)
	case *d <= 0:
		return loadtest.CompareConfig{}, usagef("-t: must be > 0, got %v", *d)
	case *c < 1:
		return loadtest.CompareConfig{}, usagef("-c: must be >= 1, got %d", *c)
	case *warmup < 0:
		return loadtest.CompareConfig{}, usagef("-warmup: must be >= 0, got %v", *warmup)
	case *tool != string(loadtest.ToolWrk) && *tool != string(loadtest.ToolBuiltin):
		return loadtest.CompareConfig{}, usagef("-tool: want wrk or builtin, got %q", *tool)
	case fs.NArg() < 2:
		return loadtest.CompareConfig{}, usagef("targets: want at least two name=URL arguments, got %d", fs.NArg())
	}
	cfg := loadtest.CompareConfig{
		Rounds: *rounds, Duration: *d, Concurrency: *c, Warmup: *warmup,
		Tool: loadtest.Tool(*tool), AllowRemote: *allowRemote,
	}
	seen := make(map[string]bool)
	for _, a := range fs.Args() {
		name, u, ok := strings.Cut(a, "=")
		if !ok || name == "" || u == "" {
			return loadtest.CompareConfig{}, usagef("targets: want name=URL, got %q", a)
		}
		if seen[name] {
			return loadtest.CompareConfig{}, usagef("targets: %q given twice", name)
		}
		seen[name] = true
		if err := checkURL(u, *allowRemote); err != nil {
			return loadtest.CompareConfig{}, usagef("target %s: %v", name, err)
		}
		cfg.Targets = append(cfg.Targets, loadtest.Target{Name: name, URL: u, PID: pids[name]})
	}
	for name := range pids {
		if !seen[name] {
			return loadtest.CompareConfig{}, usagef("-pid: %q names no target", name)
		}
	}
	if err := cfg.Validate(); err != nil {
		return loadtest.CompareConfig{}, usagef("%v", err)
	}
	return cfg, nil
}

// runCompare is the compare subcommand.
func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseCompare(args, stderr)
	if err != nil {
		return report(stderr, "loadtest compare", err)
	}
	cfg.Log = stdout
	fmt.Fprintf(stdout, "compare: %d rounds of %v at -c %d with %s; baseline %s\n",
		cfg.Rounds, cfg.Duration, cfg.Concurrency, cfg.Tool, cfg.Targets[0].Name)
	res, err := loadtest.Compare(ctx, cfg)
	if res != nil && len(res.Rounds) > 0 {
		fmt.Fprintln(stdout)
		if werr := res.WriteText(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			err = fmt.Errorf("interrupted (%w): the table above is partial", err)
		}
		return report(stderr, "loadtest compare", err)
	}
	return exitOK
}
