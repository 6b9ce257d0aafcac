package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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

// compareOptions is the compare command line: the comparison and, with
// -stacks, how to start its targets.
type compareOptions struct {
	cfg loadtest.CompareConfig
	// stacks says to start the stacks (see loadtest.StartStacks) instead
	// of taking targets; cfg.Targets is then empty.
	stacks bool
	// proxyPath is -proxy: the proxy binary, "" to build it.
	proxyPath string
	// keep keeps the stacks' temp dir (configs and logs).
	keep bool
}

// parseCompare turns the compare command line into a CompareConfig.
func parseCompare(args []string, stderr io.Writer) (loadtest.CompareConfig, error) {
	opts, err := parseCompareOptions(args, stderr)
	return opts.cfg, err
}

// parseCompareOptions turns the compare command line into its options.
func parseCompareOptions(args []string, stderr io.Writer) (compareOptions, error) {
	fs := flag.NewFlagSet("loadtest compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest compare [flags] name=URL name=URL...\n"+
			"       loadtest compare -stacks [flags]\n\n"+
			"The same load against every target, rounds in rotating order, then the medians.\n"+
			"The first target is the baseline of the ratios. Servers are not started here,\n"+
			"except with -stacks: bare (cmd/hiserver), proxy (cmd/proxy, its default app), and in\n"+
			"front of bare: proxy-up (cmd/proxy, handler upstream), revproxy (httputil.ReverseProxy),\n"+
			"proxy-host (cmd/proxy in front of a cmd/replica host serving hi),\n"+
			"nginx and haproxy when installed, on free loopback ports.\n\nflags:\n")
		fs.PrintDefaults()
	}
	defaultTool := loadtest.ToolBuiltin
	if _, err := exec.LookPath("wrk"); err == nil {
		defaultTool = loadtest.ToolWrk
	}
	rounds := fs.Int("rounds", 5, "rounds (every target once per round)")
	d := duration(fs, "t", 10*time.Second, "length of each run")
	c := fs.Int("c", 100, "connections")
	warmup := duration(fs, "warmup", 2*time.Second, "a run per target before the rounds, not counted (0: none)")
	tool := fs.String("tool", string(defaultTool), "load generator: wrk (wrk -t1 -cC -dD --latency) or builtin (the default is wrk if it is on PATH)")
	pids := pidFlag{}
	fs.Var(pids, "pid", "`name=PID` of a target's server process, to report its CPU time per request (repeatable)")
	backendPIDs := pidFlag{}
	fs.Var(backendPIDs, "backend-pid", "`name=PID` of the process a target forwards to, to report its CPU time per request too (repeatable)")
	allowRemote := fs.Bool("allow-remote", false, "allow targets whose host is not loopback")
	stacks := fs.Bool("stacks", false, "start bare, proxy, nginx and haproxy (when installed) on loopback and compare them, instead of name=URL targets")
	proxyPath := fs.String("proxy", "", "with -stacks, the proxy `binary` (default: go build "+proxyPackage+" into a temp dir)")
	keep := fs.Bool("keep", false, "with -stacks, keep the temp dir of the stacks' configs and logs (and print where)")
	if err := parse(fs, args); err != nil {
		return compareOptions{}, err
	}
	set := explicit(fs)
	if *stacks {
		switch {
		case fs.NArg() > 0:
			return compareOptions{}, usagef("-stacks: takes no name=URL targets, got %d", fs.NArg())
		case set["pid"] || set["backend-pid"]:
			return compareOptions{}, usagef("-stacks: -pid and -backend-pid are not for started stacks (their PIDs are known)")
		case set["allow-remote"]:
			return compareOptions{}, usagef("-stacks: -allow-remote is not for started stacks (they are on loopback)")
		}
	} else {
		for _, f := range []string{"proxy", "keep"} {
			if set[f] {
				return compareOptions{}, usagef("-%s: only with -stacks", f)
			}
		}
	}
	switch {
	case *rounds < 1:
		return compareOptions{}, usagef("-rounds: must be >= 1, got %d", *rounds)
	case *d <= 0:
		return compareOptions{}, usagef("-t: must be > 0, got %v", *d)
	case *c < 1:
		return compareOptions{}, usagef("-c: must be >= 1, got %d", *c)
	case *warmup < 0:
		return compareOptions{}, usagef("-warmup: must be >= 0, got %v", *warmup)
	case *tool != string(loadtest.ToolWrk) && *tool != string(loadtest.ToolBuiltin):
		return compareOptions{}, usagef("-tool: want wrk or builtin, got %q", *tool)
	case *tool == string(loadtest.ToolWrk) && *d%time.Second != 0:
		return compareOptions{}, usagef("-t: wrk runs whole seconds, got %v (or use -tool builtin)", *d)
	case !*stacks && fs.NArg() < 2:
		return compareOptions{}, usagef("targets: want at least two name=URL arguments, got %d", fs.NArg())
	}
	cfg := loadtest.CompareConfig{
		Rounds: *rounds, Duration: *d, Concurrency: *c, Warmup: *warmup,
		Tool: loadtest.Tool(*tool), AllowRemote: *allowRemote,
	}
	if err := checkProxyFlag(*proxyPath); err != nil {
		return compareOptions{}, err
	}
	opts := compareOptions{cfg: cfg, stacks: *stacks, proxyPath: *proxyPath, keep: *keep}
	if *stacks {
		return opts, nil
	}
	seen := make(map[string]bool)
	for _, a := range fs.Args() {
		name, u, ok := strings.Cut(a, "=")
		if !ok || name == "" || u == "" {
			return compareOptions{}, usagef("targets: want name=URL, got %q", a)
		}
		if seen[name] {
			return compareOptions{}, usagef("targets: %q given twice", name)
		}
		seen[name] = true
		if err := checkURL(u, *allowRemote); err != nil {
			return compareOptions{}, usagef("target %s: %v", name, err)
		}
		cfg.Targets = append(cfg.Targets, loadtest.Target{Name: name, URL: u, PID: pids[name], BackendPID: backendPIDs[name]})
	}
	for flagName, m := range map[string]pidFlag{"pid": pids, "backend-pid": backendPIDs} {
		for name, pid := range m {
			if !seen[name] {
				return compareOptions{}, usagef("-%s: %q names no target", flagName, name)
			}
			if _, err := loadtest.ProcCPU(pid); err != nil {
				// Before the run, not after it (found by a tester).
				return compareOptions{}, usagef("-%s: %s=%d: no process to read the CPU time of: %v", flagName, name, pid, err)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return compareOptions{}, usagef("%v", err)
	}
	opts.cfg = cfg
	return opts, nil
}

// runCompare is the compare subcommand.
func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseCompareOptions(args, stderr)
	if err != nil {
		return report(stderr, "loadtest compare", err)
	}
	cfg := opts.cfg
	if opts.stacks {
		stacks, cleanup, err := startStacks(ctx, opts, stdout, stderr)
		defer cleanup()
		if err != nil {
			return report(stderr, "loadtest compare", err)
		}
		cfg.Targets = stacks.Targets()
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
	return reportRun(stderr, "loadtest compare", "table", err)
}

// hiserverPackage is the bare baseline that -stacks builds, and
// replicaPackage the replica host of its proxy-host stack.
const (
	hiserverPackage = "github.com/serveproxy/serveproxy/cmd/hiserver"
	replicaPackage  = "github.com/serveproxy/serveproxy/cmd/replica"
)

// startStacks builds what -stacks needs into a temp dir, starts the stacks
// and prints them and the skipped ones. cleanup, never nil, stops them and
// removes the temp dir (unless -keep); call it also on error.
func startStacks(ctx context.Context, opts compareOptions, stdout, stderr io.Writer) (_ *loadtest.Stacks, cleanup func(), err error) {
	tmp, err := os.MkdirTemp("", "compare-stacks-")
	if err != nil {
		return nil, func() {}, err
	}
	var stacks *loadtest.Stacks
	cleanup = func() {
		if stacks != nil {
			stacks.Stop()
		}
		if opts.keep {
			fmt.Fprintf(stderr, "compare: stacks' configs and logs kept in %s\n", tmp)
		} else {
			_ = os.RemoveAll(tmp)
		}
	}
	proxyPath := opts.proxyPath
	if proxyPath == "" {
		fmt.Fprintf(stderr, "compare: building %s\n", proxyPackage)
		if proxyPath, err = buildProxy(ctx, tmp, stderr); err != nil {
			return nil, cleanup, err
		}
	}
	fmt.Fprintf(stderr, "compare: building %s\n", hiserverPackage)
	hiserver := filepath.Join(tmp, "hiserver")
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	if err := loadtest.GoBuild(bctx, hiserverPackage, hiserver, stderr); err != nil {
		return nil, cleanup, fmt.Errorf("%w (run inside the module)", err)
	}
	fmt.Fprintf(stderr, "compare: building %s\n", replicaPackage)
	replicaHost := filepath.Join(tmp, "replica")
	if err := loadtest.GoBuild(bctx, replicaPackage, replicaHost, stderr); err != nil {
		return nil, cleanup, fmt.Errorf("%w (run inside the module)", err)
	}
	self, err := os.Executable() // its reverseproxy command is the revproxy stack
	if err != nil {
		return nil, cleanup, err
	}
	stacks, err = loadtest.StartStacks(ctx, loadtest.StacksConfig{Dir: tmp, HiserverPath: hiserver, ProxyPath: proxyPath, LoadtestPath: self, ReplicaPath: replicaHost})
	if err != nil {
		return nil, cleanup, err
	}
	for _, s := range stacks.Started {
		fmt.Fprintf(stdout, "stack %-10s %s  pid %d", s.Name, s.URL, s.PID)
		if opts.keep && s.Config != "" {
			fmt.Fprintf(stdout, "  config %s", s.Config)
		}
		fmt.Fprintln(stdout)
	}
	for _, s := range stacks.Skipped {
		fmt.Fprintf(stdout, "stack %-10s skipped: %s\n", s.Name, s.Reason)
	}
	fmt.Fprintln(stdout, "stacks proxy and proxy-up: access log off (PROXY_ACCESS_LOG=false), like nginx (access_log off) and haproxy (no log)")
	return stacks, cleanup, nil
}

// reportRun turns a harness's error into the exit code; a run cut short by
// an interrupt says that what it printed (its table or summary) is partial.
func reportRun(stderr io.Writer, name, printed string, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, context.Canceled) {
		err = fmt.Errorf("interrupted (%w): the %s above is partial", err, printed)
	}
	return report(stderr, name, err)
}
