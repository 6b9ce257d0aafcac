package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"

	"github.com/serveproxy/serveproxy/loadtest"
)

// runReverseProxy is the reverseproxy subcommand: Go's
// httputil.ReverseProxy, tuned, in front of -target, for compare -stacks
// (the revproxy stack) and for comparisons by hand.
func runReverseProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest reverseproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest reverseproxy -target URL [flags]\n\n"+
			"Serves Go's httputil.ReverseProxy, its transport tuned as compare -stacks runs it, in front of\n"+
			"-target, until interrupted: the baseline the proxy's forwarding is measured against.\n\nflags:\n")
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	target := fs.String("target", "", "the `URL` of the server to forward to (loopback)")
	if err := fs.Parse(args); err != nil {
		return report(stderr, "loadtest reverseproxy", err)
	}
	if fs.NArg() > 0 {
		return report(stderr, "loadtest reverseproxy", usagef("unexpected arguments %q: it takes flags only", fs.Args()))
	}
	if *target == "" {
		return report(stderr, "loadtest reverseproxy", usagef("-target: required"))
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return report(stderr, "loadtest reverseproxy", usagef("-target: want http://HOST:PORT, got %q", *target))
	}
	if err := loadtest.CheckLoopback(*target); err != nil {
		return report(stderr, "loadtest reverseproxy", usagef("-target: %v", err))
	}
	if host, _, err := net.SplitHostPort(*listen); err != nil || !loopbackHost(host) {
		return report(stderr, "loadtest reverseproxy", usagef("-listen: want a loopback HOST:PORT, got %q", *listen))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return report(stderr, "loadtest reverseproxy", fmt.Errorf("-listen: %w", err))
	}
	return reportRun(stderr, "loadtest reverseproxy", "output", loadtest.ServeReverseProxy(ctx, ln, u, stdout))
}

// loopbackHost reports whether host, of a listen address, is loopback.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
