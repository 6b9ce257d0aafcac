// Command hiserver is the bare net/http baseline used in every speed
// comparison with the proxy: it answers "hi" on every path with nothing else
// on the request path (no router, no logging, no metrics), so the difference
// between it and the proxy is the proxy's own cost.
//
// Usage:
//
//	hiserver -listen 127.0.0.1:9000
//
// With -headers it also sets the two response headers the proxy's default
// app sends, X-Request-Id (the request's, or a fixed one) and Content-Type,
// so that a comparison can tell what net/http charges for a handler that
// sets any header from what the proxy itself costs.
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
	headers := flag.Bool("headers", false, "set X-Request-Id and Content-Type on every response, as the proxy does")
	requestID := flag.Bool("request-id", false, "set X-Request-Id alone on every response: the one header Serve's semantics ask for")
	flag.Parse() // arguments after the flags are ignored: tests pass some to a command replica

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	handler := http.HandlerFunc(hi)
	switch {
	case *headers:
		handler = hiWithHeaders
	case *requestID:
		handler = hiWithRequestID
	}
	if err := run(ctx, *listen, handler); err != nil {
		log.Fatal(err)
	}
}

// hi is the minimal handler on purpose: headers are whatever net/http adds
// for a bare Write (sniffed Content-Type, Date, Content-Length).
func hi(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hi")) }

// placeholderID stands in for a generated request id: generating one is
// the proxy's cost, not net/http's.
var (
	placeholderID = []string{"00000000-0000-4000-8000-000000000000"}
	textPlain     = []string{"text/plain; charset=utf-8"}
)

// hiWithHeaders answers as the proxy's default app does: the request's
// X-Request-Id echoed (or a placeholder) and an explicit Content-Type.
func hiWithHeaders(w http.ResponseWriter, r *http.Request) {
	id := r.Header["X-Request-Id"]
	if len(id) == 0 {
		id = placeholderID
	}
	h := w.Header()
	h["X-Request-Id"] = id[:1:1]
	h["Content-Type"] = textPlain
	_, _ = w.Write([]byte("hi"))
}

// hiWithRequestID answers as hi does, with the request's X-Request-Id
// (or a placeholder): net/http copies, sorts and writes a header map once
// a handler sets any header, which hi skips.
func hiWithRequestID(w http.ResponseWriter, r *http.Request) {
	id := r.Header["X-Request-Id"]
	if len(id) == 0 {
		id = placeholderID
	}
	w.Header()["X-Request-Id"] = id[:1:1]
	_, _ = w.Write([]byte("hi"))
}

func run(ctx context.Context, addr string, handler http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// Print the bound address, not the flag, so ":0" reports the real port.
	fmt.Printf("listening on %s\n", ln.Addr())

	srv := &http.Server{
		Handler:           handler,
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
