package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// ServeReverseProxy serves Go's httputil.ReverseProxy in front of target
// on ln until ctx ends: the baseline of issue 5's forwarding target, tuned
// as a careful operator would (keep-alive connections enough for the
// load, no compression, pooled copy buffers, HTTP/1.1 only). It writes
// "listening on ADDR" to out once serving.
func ServeReverseProxy(ctx context.Context, ln net.Listener, target *url.URL, out io.Writer) error {
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	rp.BufferPool = bufferPool{}
	rp.ErrorLog = nil
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// bufferPool is httputil.BufferPool over a sync.Pool of 32 KiB buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Get implements httputil.BufferPool.
func (bufferPool) Get() []byte { return *copyBuffers.Get().(*[]byte) }

// Put implements httputil.BufferPool.
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }
