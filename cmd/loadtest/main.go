// Command loadtest is serveproxy's load generator and benchmark harness.
//
//	loadtest [flags] URL                 one load, ab's report (or -json)
//	loadtest compare [flags] name=URL... the same load against several targets, side by side
//	loadtest gc-compare [flags]          the proxy under each GC setting, one table
//	loadtest soak [flags]                the proxy under a long steady load: do memory and goroutines stay flat?
//	loadtest broadcast [flags]           the seed's four tables: foreach vs replica.Pool.Broadcast, in process
//	loadtest reverseproxy -target URL    Go's httputil.ReverseProxy, tuned: a baseline for compare -stacks
//
// Load goes to loopback hosts only, unless -allow-remote is given. Run
// "loadtest -h", "loadtest compare -h", "loadtest gc-compare -h",
// "loadtest soak -h" or "loadtest broadcast -h" for the flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
