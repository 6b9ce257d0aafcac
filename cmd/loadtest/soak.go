package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"

	"github.com/serveproxy/serveproxy/loadtest"
)

// envFlag collects repeated -env K=V flags.
type envFlag map[string]string

// String implements flag.Value.
func (f envFlag) String() string { return "" }

// Set implements flag.Value.
func (f envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || strings.ContainsAny(k, " \t") {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	f[k] = v
	return nil
}

// soakOptions is the soak command line.
type soakOptions struct {
	cfg      loadtest.SoakConfig
	keepLogs bool
}

// parseSoak turns the soak command line into a SoakConfig (ProxyPath
// empty when the proxy is to be built).
func parseSoak(args []string, stderr io.Writer) (soakOptions, error) {
	fs := flag.NewFlagSet("loadtest soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest soak [flags]\n\n"+
			"Starts the proxy on ephemeral loopback ports, runs the builtin open loop at -rate for -t,\n"+
			"samples the proxy's RSS, heap, goroutines and GC cycles every -every, and says whether\n"+
			"they stayed flat: RSS growth after -warmup under %.0f%% of its value then, and the idle\n"+
			"goroutines back within ±%d of their start. Exits 1 when they did not.\n\nflags:\n",
			100*loadtest.SoakMaxRSSDrift, loadtest.SoakMaxGoroutineDelta)
		fs.PrintDefaults()
	}
	proxyPath := fs.String("proxy", "", "proxy `binary` (default: go build "+proxyPackage+" into a temp dir)")
	rate := fs.Float64("rate", loadtest.DefaultSoakRate, "open-loop requests/s")
	d := duration(fs, "t", loadtest.DefaultSoakDuration, "length of the load")
	every := duration(fs, "every", loadtest.DefaultSoakEvery, "time between samples")
	warmup := duration(fs, "warmup", loadtest.DefaultSoakWarmup, "the drift is measured from the first sample at or after this (at most -t/2 unless given)")
	env := envFlag{}
	fs.Var(env, "env", "`KEY=VALUE` in the proxy's environment, where every other PROXY_*, GOGC and GOMEMLIMIT is unset (repeatable)")
	keepLogs := fs.Bool("keep-logs", false, "keep the proxy's log (and print where)")
	if err := parse(fs, args); err != nil {
		return soakOptions{}, err
	}
	set := explicit(fs)
	switch {
	case fs.NArg() > 0:
		return soakOptions{}, usagef("unexpected arguments: %q", fs.Args())
	case !(*rate > 0 && *rate <= 1e7): // NaN too
		return soakOptions{}, usagef("-rate: want 0 < requests/s <= 1e7, got %g", *rate)
	case *d <= 0:
		return soakOptions{}, usagef("-t: must be > 0, got %v", *d)
	case *every <= 0:
		return soakOptions{}, usagef("-every: must be > 0, got %v", *every)
	case *warmup <= 0:
		return soakOptions{}, usagef("-warmup: must be > 0, got %v", *warmup)
	}
	if !set["warmup"] {
		*warmup = min(*warmup, *d/2)
	}
	if err := checkProxyFlag(*proxyPath); err != nil {
		return soakOptions{}, err
	}
	cfg := loadtest.SoakConfig{ProxyPath: *proxyPath, Rate: *rate, Duration: *d, Every: *every, Warmup: *warmup}
	if len(env) > 0 {
		cfg.Env = maps.Clone(env)
	}
	for k := range env {
		if k == "PROXY_HTTP_ADDR" || k == "PROXY_ADMIN_ADDR" {
			return soakOptions{}, usagef("-env: %s is the soak's to set (ephemeral loopback ports)", k)
		}
	}
	if *warmup+*every >= *d {
		// Two samples under load after the warm-up, or there is no drift.
		return soakOptions{}, usagef("-warmup, -every: -warmup + -every (%v + %v) must be shorter than -t (%v)", *warmup, *every, *d)
	}
	return soakOptions{cfg: cfg, keepLogs: *keepLogs}, nil
}

// runSoak is the soak subcommand.
func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseSoak(args, stderr)
	if err != nil {
		return report(stderr, "loadtest soak", err)
	}
	cfg := opts.cfg
	tmp, err := os.MkdirTemp("", "soak-")
	if err != nil {
		return report(stderr, "loadtest soak", err)
	}
	cfg.Dir = tmp
	if opts.keepLogs {
		defer fmt.Fprintf(stderr, "soak: proxy log kept in %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if cfg.ProxyPath == "" {
		fmt.Fprintf(stderr, "soak: building %s\n", proxyPackage)
		if cfg.ProxyPath, err = buildProxy(ctx, tmp, stderr); err != nil {
			return report(stderr, "loadtest soak", err)
		}
	}
	cfg.Log = stdout
	res, err := loadtest.Soak(ctx, cfg)
	if res != nil {
		fmt.Fprintln(stdout)
		sum, werr := res.WriteText(stdout)
		if err == nil {
			if werr != nil {
				return report(stderr, "loadtest soak", werr)
			}
			if !sum.Flat {
				return exitFailed
			}
		}
	}
	return reportRun(stderr, "loadtest soak", "summary", err)
}
