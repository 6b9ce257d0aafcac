package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // the load or the harness failed, or was interrupted
	exitInvalid = 2 // bad flags or arguments: nothing was sent
)

// run is main without the process: it dispatches on the subcommand, and
// tests call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "compare":
			return runCompare(ctx, args[1:], stdout, stderr)
		case "gc-compare":
			return runGCCompare(ctx, args[1:], stdout, stderr)
		case "soak":
			return runSoak(ctx, args[1:], stdout, stderr)
		case "broadcast":
			return runBroadcast(ctx, args[1:], stdout, stderr)
		case "reverseproxy":
			return runReverseProxy(ctx, args[1:], stdout, stderr)
		}
		if a := args[0]; !strings.HasPrefix(a, "-") && !strings.ContainsAny(a, ":/=.") {
			// Neither a flag nor a URL: a subcommand mistyped, which read
			// as a URL gave "set at least one of -n, -t" or worse.
			fmt.Fprintf(stderr, "loadtest: unknown subcommand %q (compare, gc-compare, soak, broadcast, reverseproxy), and no URL (http://host:port/)\n", a)
			return exitInvalid
		}
	}
	return runLoad(ctx, args, stdout, stderr)
}

// checkProxyFlag refuses a -proxy that is no executable file, before any
// run begins.
func checkProxyFlag(path string) error {
	if path == "" {
		return nil // built
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return usagef("-proxy: %v", err)
	case fi.IsDir():
		return usagef("-proxy: %s is a directory, not the proxy binary", path)
	case fi.Mode()&0o111 == 0:
		return usagef("-proxy: %s is not executable", path)
	}
	return nil
}

// usageError is a problem with the command line; it exits 2.
type usageError struct{ msg string }

// Error implements error.
func (e *usageError) Error() string { return e.msg }

// usagef returns a usageError; by convention its text starts with the flag.
func usagef(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// report prints err for command name and returns its exit code: 2 for a
// usage error or a flag the flag package rejected (it has printed it), 1
// otherwise.
func report(stderr io.Writer, name string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK // asked for: as the proxy's and the replica's -h
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return exitInvalid
	}
	if errors.Is(err, errFlagParse) {
		return exitInvalid
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return exitFailed
}

// errFlagParse wraps the flag package's errors, which it has already
// printed with the usage.
var errFlagParse = errors.New("bad flags")

// parse runs fs.Parse, marking its errors as already printed.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errFlagParse, err)
	}
	return nil
}

// explicit returns the names of the flags set on the command line.
func explicit(fs *flag.FlagSet) map[string]bool {
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// durationValue is a flag.Value for a time.Duration whose error says what
// a duration looks like: the flag package's own reads "parse error" for a
// bare "5" (found by a tester).
type durationValue time.Duration

// String implements flag.Value.
func (d *durationValue) String() string { return time.Duration(*d).String() }

// Set implements flag.Value.
func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration with its unit, such as 10s, 1m30s or 500ms")
	}
	*d = durationValue(v)
	return nil
}

// duration defines a duration flag as fs.Duration does, with durationValue's
// error.
func duration(fs *flag.FlagSet, name string, value time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	*p = value
	fs.Var((*durationValue)(p), name, usage)
	return p
}
