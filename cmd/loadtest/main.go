// Command loadtest is serveproxy's load generator and benchmark harness.
//
//	loadtest [flags] URL                 one load, ab's report (or -json)
//	loadtest compare [flags] name=URL... the same load against several targets, side by side
//	loadtest gc-compare [flags]          the proxy under each GC setting, one table
//	loadtest soak [flags]                the proxy under a long steady load: do memory and goroutines stay flat?
//
// Load goes to loopback hosts only, unless -allow-remote is given. Run
// "loadtest -h", "loadtest compare -h", "loadtest gc-compare -h" or
// "loadtest soak -h" for the flags.
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
