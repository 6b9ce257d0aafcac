package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/serveproxy/serveproxy/loadtest"
)

// proxyPackage is the package gc-compare builds when -proxy is not given.
const proxyPackage = "github.com/serveproxy/serveproxy/cmd/proxy"

// buildTimeout bounds `go build` of the proxy.
const buildTimeout = 5 * time.Minute

// gcOptions is the gc-compare command line.
type gcOptions struct {
	cfg      loadtest.GCCompareConfig
	keepLogs bool
}

// parseGCCompare turns the gc-compare command line into a GCCompareConfig
// (ProxyPath empty when the proxy is to be built).
func parseGCCompare(args []string, stderr io.Writer) (gcOptions, error) {
	fs := flag.NewFlagSet("loadtest gc-compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var names []string
	for _, s := range loadtest.DefaultGCSettings() {
		names = append(names, s.Name)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest gc-compare [flags]\n\n"+
			"Starts the proxy afresh for every GC setting in every round, on ephemeral loopback ports,\n"+
			"runs the scenario, and prints the medians: req/s, latency, GC cycles, peak RSS.\n\nflags:\n")
		fs.PrintDefaults()
	}
	defaultTool := loadtest.ToolBuiltin
	if _, err := exec.LookPath("wrk"); err == nil {
		defaultTool = loadtest.ToolWrk
	}
	proxyPath := fs.String("proxy", "", "proxy `binary` (default: go build "+proxyPackage+" into a temp dir)")
	scenario := fs.String("scenario", loadtest.ScenarioSeed, "seed (no config: closed loop at -c, for -closed-t with wrk or -n requests with builtin; then the builtin open loop at -rate for -t) or echo16k (16 echo replicas, 16 KiB POSTs, closed loop at -c for -t)")
	tool := fs.String("tool", string(defaultTool), "closed-loop load generator: wrk (wrk -t1 -cC -dD --latency, with a Lua script for the request and the p99.9) or builtin; the open loop is always builtin (the default is wrk if it is on PATH)")
	rounds := fs.Int("rounds", 3, "rounds (every setting once per round, the order rotated)")
	d := duration(fs, "t", 20*time.Second, "length of the open loop (seed) or the closed loop (echo16k)")
	rate := fs.Float64("rate", 5000, "seed: open-loop requests/s")
	n := fs.Int64("n", 10000, "seed, -tool builtin: closed-loop requests (wrk has no -n: with -tool wrk the closed loop runs for -closed-t)")
	closedT := duration(fs, "closed-t", loadtest.DefaultGCClosedDuration, "seed, -tool wrk: length of the closed loop, in whole seconds (wrk has no request count, so it replaces -n)")
	c := fs.Int("c", 100, "closed-loop workers (wrk: connections)")
	accessLog := fs.Bool("access-log", true, "PROXY_ACCESS_LOG for the proxy")
	settings := fs.String("settings", "", "comma-separated subset of the settings, in this order (default all: "+strings.Join(names, ",")+")")
	keepLogs := fs.Bool("keep-logs", false, "keep every run's proxy log (and print where)")
	if err := parse(fs, args); err != nil {
		return gcOptions{}, err
	}
	set := explicit(fs)
	switch {
	case fs.NArg() > 0:
		return gcOptions{}, usagef("unexpected arguments: %q", fs.Args())
	case *scenario != loadtest.ScenarioSeed && *scenario != loadtest.ScenarioEcho16k:
		return gcOptions{}, usagef("-scenario: want seed or echo16k, got %q", *scenario)
	case *rounds < 1:
		return gcOptions{}, usagef("-rounds: must be >= 1, got %d", *rounds)
	case *d <= 0:
		return gcOptions{}, usagef("-t: must be > 0, got %v", *d)
	case !(*rate > 0 && *rate <= 1e7): // NaN too
		return gcOptions{}, usagef("-rate: want 0 < requests/s <= 1e7, got %g", *rate)
	case *tool != string(loadtest.ToolWrk) && *tool != string(loadtest.ToolBuiltin):
		return gcOptions{}, usagef("-tool: want wrk or builtin, got %q", *tool)
	case *n < 1:
		return gcOptions{}, usagef("-n: must be >= 1, got %d", *n)
	case set["n"] && *tool == string(loadtest.ToolWrk):
		return gcOptions{}, usagef("-n: wrk has no request count; with -tool wrk give -closed-t, or use -tool builtin")
	case *closedT <= 0:
		return gcOptions{}, usagef("-closed-t: must be > 0, got %v", *closedT)
	case *closedT%time.Second != 0:
		return gcOptions{}, usagef("-closed-t: must be whole seconds (wrk's -d), got %v", *closedT)
	case set["closed-t"] && *tool == string(loadtest.ToolBuiltin):
		return gcOptions{}, usagef("-closed-t: applies to -tool wrk; the builtin closed loop sends -n requests")
	case *c < 1:
		return gcOptions{}, usagef("-c: must be >= 1, got %d", *c)
	}
	if err := checkProxyFlag(*proxyPath); err != nil {
		return gcOptions{}, err
	}
	cfg := loadtest.GCCompareConfig{
		ProxyPath: *proxyPath, Scenario: *scenario, Tool: loadtest.Tool(*tool), Rounds: *rounds, Duration: *d,
		Rate: *rate, Requests: *n, ClosedDuration: *closedT, Concurrency: *c, AccessLog: *accessLog, KeepLogs: *keepLogs,
	}
	if *settings != "" {
		all := loadtest.DefaultGCSettings()
		for _, name := range strings.Split(*settings, ",") {
			i := slices.IndexFunc(all, func(s loadtest.GCSetting) bool { return s.Name == strings.TrimSpace(name) })
			if i < 0 {
				return gcOptions{}, usagef("-settings: unknown setting %q (known: %s)", name, strings.Join(names, ", "))
			}
			if slices.ContainsFunc(cfg.Settings, func(s loadtest.GCSetting) bool { return s.Name == all[i].Name }) {
				return gcOptions{}, usagef("-settings: %q given twice", all[i].Name)
			}
			cfg.Settings = append(cfg.Settings, all[i])
		}
	}
	return gcOptions{cfg: cfg, keepLogs: *keepLogs}, nil
}

// buildProxy runs `go build` of the proxy into dir and returns the binary.
func buildProxy(ctx context.Context, dir string, stderr io.Writer) (string, error) {
	out := filepath.Join(dir, "proxy")
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	if err := loadtest.GoBuild(ctx, proxyPackage, out, stderr); err != nil {
		return "", fmt.Errorf("%w (run inside the module, or give -proxy PATH)", err)
	}
	return out, nil
}

// runGCCompare is the gc-compare subcommand.
func runGCCompare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseGCCompare(args, stderr)
	if err != nil {
		return report(stderr, "loadtest gc-compare", err)
	}
	cfg := opts.cfg
	tmp, err := os.MkdirTemp("", "gc-compare-")
	if err != nil {
		return report(stderr, "loadtest gc-compare", err)
	}
	if opts.keepLogs {
		cfg.Dir = tmp
		defer fmt.Fprintf(stderr, "gc-compare: proxy logs kept in %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if cfg.ProxyPath == "" {
		fmt.Fprintf(stderr, "gc-compare: building %s\n", proxyPackage)
		if cfg.ProxyPath, err = buildProxy(ctx, tmp, stderr); err != nil {
			return report(stderr, "loadtest gc-compare", err)
		}
	}
	cfg.Log = stdout
	fmt.Fprintf(stdout, "gc-compare: scenario %s, closed loop by %s, %d rounds, proxy %s, access log %t\n",
		cfg.Scenario, cfg.Tool, cfg.Rounds, cfg.ProxyPath, cfg.AccessLog)
	res, err := loadtest.GCCompare(ctx, cfg)
	if res != nil && len(res.Medians) > 0 {
		fmt.Fprintln(stdout, "\nmedians:")
		if werr := res.WriteText(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	return reportRun(stderr, "loadtest gc-compare", "table", err)
}
