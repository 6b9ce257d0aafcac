package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/serveproxy/serveproxy/loadtest"
)

// loadOptions is the single-load command line: the load and how to show it.
type loadOptions struct {
	cfg  loadtest.Config
	json bool // print JSON instead of ab's text
}

// headerFlag collects repeated -H "Key: Value" flags.
type headerFlag struct{ h http.Header }

// String implements flag.Value.
func (f *headerFlag) String() string { return "" }

// Set implements flag.Value.
func (f *headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, ":")
	k = strings.TrimSpace(k)
	if !ok || k == "" || strings.ContainsAny(k, " \t") {
		return fmt.Errorf(`want "Key: Value", got %q`, s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(k, strings.TrimSpace(v))
	return nil
}

// parseLoad turns the command line into a loadtest.Config; errors name the
// flag. Progress is left nil: the caller decides.
func parseLoad(args []string, stderr io.Writer) (loadOptions, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest [flags] URL\n       loadtest compare [flags] name=URL...\n       loadtest gc-compare [flags]\n       loadtest soak [flags]\n       loadtest broadcast [flags]\n       loadtest reverseproxy -target URL [flags]\n\nflags:\n")
		fs.PrintDefaults()
	}
	n := fs.Int64("n", 0, "number of `requests` (0: until -t ends)")
	c := fs.Int("c", 50, "concurrent `workers` (closed loop)")
	k := fs.Bool("k", true, "keep connections alive; -k=false opens a connection per request, like ab without -k")
	m := fs.String("m", http.MethodGet, "HTTP `method`")
	var h headerFlag
	fs.Var(&h, "H", "request header `\"Key: Value\"` (repeatable)")
	d := fs.String("d", "", "request `body`")
	bodyFile := fs.String("D", "", "read the request body from `file`")
	t := duration(fs, "t", 0, "run for this long (0: until -n requests are done)")
	rate := fs.Float64("rate", 0, "open loop at this many `requests/s` (latency from each request's intended send time)")
	maxInFlight := fs.Int("max-inflight", loadtest.DefaultMaxInFlight, "open loop: most requests in flight; past it, due requests are dropped and counted as failed")
	timeout := duration(fs, "timeout", loadtest.DefaultTimeout, "per-request timeout")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	quiet := fs.Bool("q", false, "no progress bar (there is none when stderr is not a terminal)")
	allowRemote := fs.Bool("allow-remote", false, "allow a URL whose host is not loopback")
	if err := parse(fs, args); err != nil {
		return loadOptions{}, err
	}
	set := explicit(fs)

	switch {
	case fs.NArg() == 0:
		return loadOptions{}, usagef("URL: missing (usage: loadtest [flags] URL)")
	case fs.NArg() > 1:
		return loadOptions{}, usagef("unexpected arguments after the URL: %q (flags go before the URL)", fs.Args()[1:])
	case *n < 0:
		return loadOptions{}, usagef("-n: must be >= 0, got %d", *n)
	case *t < 0:
		return loadOptions{}, usagef("-t: must be >= 0, got %v", *t)
	case *n == 0 && *t == 0:
		return loadOptions{}, usagef("-n, -t: set at least one (a request count, a duration, or both)")
	case *c < 1:
		return loadOptions{}, usagef("-c: must be >= 1, got %d", *c)
	case !(*rate >= 0): // NaN too: it ran the closed loop in silence
		return loadOptions{}, usagef("-rate: must be >= 0, got %g", *rate)
	case *rate > 1e7:
		return loadOptions{}, usagef("-rate: must be <= 1e7 requests/s, got %g", *rate)
	case *rate > 0 && set["c"]:
		return loadOptions{}, usagef("-c: does not apply to the open loop (-rate); bound it with -max-inflight")
	case *rate == 0 && set["max-inflight"]:
		return loadOptions{}, usagef("-max-inflight: applies to the open loop only (-rate); the closed loop is bounded by -c")
	case *rate == 0 && set["c"] && *n > 0 && int64(*c) > *n:
		// As ab and hey refuse it: the report would say a concurrency
		// the server never saw.
		return loadOptions{}, usagef("-c: %d workers for %d requests (-n): -n must be at least -c", *c, *n)
	case *maxInFlight < 1:
		return loadOptions{}, usagef("-max-inflight: must be >= 1, got %d", *maxInFlight)
	case *timeout <= 0:
		return loadOptions{}, usagef("-timeout: must be > 0, got %v", *timeout)
	case set["d"] && set["D"]:
		return loadOptions{}, usagef("-d, -D: give the body one way, not both")
	}
	rawURL := fs.Arg(0)
	if err := checkURL(rawURL, *allowRemote); err != nil {
		return loadOptions{}, err
	}

	if *rate == 0 && !set["c"] && *n > 0 && int64(*c) > *n {
		*c = int(*n) // the default's workers, no more than the requests
	}
	cfg := loadtest.Config{
		URL: rawURL, Method: *m, Header: h.h,
		Requests: *n, Duration: *t, Concurrency: *c,
		Rate: *rate, MaxInFlight: *maxInFlight, Timeout: *timeout,
		DisableKeepAlives: !*k, AllowRemote: *allowRemote,
	}
	switch {
	case set["d"]:
		cfg.Body = []byte(*d)
	case set["D"]:
		b, err := os.ReadFile(*bodyFile)
		if err != nil {
			return loadOptions{}, usagef("-D: %v", err)
		}
		cfg.Body = b
	}
	if err := cfg.Validate(); err != nil {
		// The fields not checked above, under their flags' names.
		if strings.HasPrefix(err.Error(), "Method:") {
			return loadOptions{}, usagef("-m: %s", strings.TrimSpace(strings.TrimPrefix(err.Error(), "Method:")))
		}
		if strings.HasPrefix(err.Error(), "Header:") {
			return loadOptions{}, usagef("-H: %s", strings.TrimSpace(strings.TrimPrefix(err.Error(), "Header:")))
		}
		return loadOptions{}, usagef("%v", err)
	}
	if !*quiet {
		cfg.Progress = loadtest.TerminalProgress()
	}
	return loadOptions{cfg: cfg, json: *asJSON}, nil
}

// checkURL checks a target URL's syntax and, unless allowRemote, that its
// host is loopback.
func checkURL(rawURL string, allowRemote bool) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return usagef("URL: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("URL: want http://HOST[:PORT]/PATH, got %q", rawURL)
	}
	if !allowRemote {
		if err := loadtest.CheckLoopback(rawURL); err != nil {
			return usagef("URL: %v; pass -allow-remote to load another host", err)
		}
	}
	return nil
}

// runLoad is the single-load command.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseLoad(args, stderr)
	if err != nil {
		return report(stderr, "loadtest", err)
	}
	res, err := loadtest.Run(ctx, opts.cfg)
	if res != nil {
		write := res.WriteText
		if opts.json {
			write = res.WriteJSON
		}
		if werr := write(stdout); werr != nil {
			return report(stderr, "loadtest", werr)
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			err = fmt.Errorf("interrupted after %v: the report above is partial", res.Elapsed.Round(time.Millisecond))
		}
		return report(stderr, "loadtest", err)
	}
	if res.Completed == 0 && res.Total+res.Cancelled > 0 {
		// A target that refuses every connection is fast to fail: its
		// rate above is no throughput. One that answers nothing leaves
		// every request cancelled at the end (found by review).
		return report(stderr, "loadtest", fmt.Errorf("no request got a response (%d failed, %d cancelled at the end): the rate above is not throughput", res.Failed, res.Cancelled))
	}
	return exitOK
}
