// Command hiserver is the bare net/http baseline used in every speed
// comparison with the proxy: it answers "hi" on every path with nothing else
// on the request path (no router, no logging, no metrics), so the difference
// between it and the proxy is the proxy's own cost.
//
// Usage:
//
//	hiserver -listen 127.0.0.1:9000
//
// It prints "listening on ADDR" to stdout once the socket is bound, so scripts
// can wait for that line, and shuts down gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to listen on")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if err := run(ctx, *listen); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// Print the bound address, not the flag, so ":0" reports the real port.
	fmt.Printf("listening on %s\n", ln.Addr())

	srv := &http.Server{
		// The minimal handler on purpose: headers are whatever net/http adds
		// for a bare Write (sniffed Content-Type, Date, Content-Length).
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("hi"))
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
