package proxy

import (
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"time"

	"github.com/serveproxy/serveproxy/proxy/front"
)

// drainAfterCut bounds the replicas' drain at shutdown once the graceful
// shutdown timeout is spent: the requests left were cut, and a replica
// that does not finish its handlers by then is stuck.
const drainAfterCut = 5 * time.Second

// ServerOptions are the HTTP servers' settings.
type ServerOptions struct {
	// ReadHeaderTimeout bounds reading a request's headers (slowloris).
	ReadHeaderTimeout time.Duration
	// KeepAliveTimeout is how long an idle keep-alive connection is kept.
	KeepAliveTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (431 past it).
	MaxHeaderBytes int
	// DrainDelay is how long /-/healthz answers 503 before the listeners
	// close, for load balancers to notice; 0 closes them at once.
	DrainDelay time.Duration
	// NetHTTPFront serves the public listener with net/http's server
	// alone; otherwise with the lean front (package front), which hands
	// net/http every connection whose requests are not plain.
	NetHTTPFront bool
	// OnShutdown, if not nil, is called when the graceful shutdown begins
	// (the binary uses it to let a second signal kill the process).
	OnShutdown func()
	// OnDrained, if not nil, is called once the requests in flight are
	// done, before the replicas stop (the binary ends DNS discovery there,
	// which kept the replica set current while requests were still
	// served).
	OnDrained func()
}

// Serve starts the proxy's deployments, serves the public handler on public
// and the admin handler on admin (which may be nil), and runs until ctx is
// done. Then it shuts down gracefully: /-/healthz answers 503 (for
// DrainDelay while still accepting), the listeners stop accepting, requests in flight finish (for up to the
// deployments' graceful_shutdown_timeout_s), replicas stop, the access log
// is flushed. It returns nil after a clean shutdown.
func (p *Proxy) Serve(ctx context.Context, public, admin net.Listener, so ServerOptions) error {
	errLog := stdlog.New(p.opts.Log.With().Str("component", "http").Logger(), "", 0)
	var pub publicServer = &front.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: so.ReadHeaderTimeout,
		IdleTimeout:       so.KeepAliveTimeout,
		MaxHeaderBytes:    so.MaxHeaderBytes,
		ErrorLog:          errLog,
	}
	if so.NetHTTPFront {
		pub = &http.Server{
			Handler:           p.Handler(),
			ReadHeaderTimeout: so.ReadHeaderTimeout,
			IdleTimeout:       so.KeepAliveTimeout,
			MaxHeaderBytes:    so.MaxHeaderBytes,
			ErrorLog:          errLog,
		}
	}
	p.Start()
	errc := make(chan error, 2)
	go func() { errc <- pub.Serve(public) }()
	var adm *http.Server
	if admin != nil {
		adm = &http.Server{
			Handler:           p.AdminHandler(nil),
			ReadHeaderTimeout: so.ReadHeaderTimeout,
			IdleTimeout:       so.KeepAliveTimeout,
			MaxHeaderBytes:    so.MaxHeaderBytes,
			ErrorLog:          errLog,
		}
		go func() { errc <- adm.Serve(admin) }()
	}
	p.opts.Log.Info().Str("http_addr", public.Addr().String()).Str("admin_addr", addrOf(admin)).
		Int("applications", len(p.opts.Applications)).Msg("serving")

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		p.opts.Log.Error().Err(serveErr).Msg("a listener failed; shutting down")
	}
	if so.OnShutdown != nil {
		so.OnShutdown()
	}

	p.SetDraining()
	if so.DrainDelay > 0 && serveErr == nil {
		p.opts.Log.Info().Stringer("drain_delay", so.DrainDelay).Msg("draining: /-/healthz answers 503; still accepting until the delay ends")
		t := time.NewTimer(so.DrainDelay)
		select {
		case <-t.C:
		case serveErr = <-errc:
			t.Stop()
		}
	}
	grace := p.GracefulShutdownTimeout()
	p.opts.Log.Info().Stringer("graceful_shutdown_timeout", grace).Msg("draining: no new connections, finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var errs []error
	if err := pub.Shutdown(sctx); err != nil {
		p.opts.Log.Warn().Err(err).Int64("requests", p.metrics.ongoing.Load()).
			Msg("requests still running at the graceful shutdown timeout; closing their connections (recorded as 503)")
		p.cut.Store(true)
		errs = append(errs, fmt.Errorf("graceful shutdown: %w", err), pub.Close())
	}
	// Connections taken over by their handlers (WebSockets) are not
	// net/http's to wait for: they get what is left of the period, then
	// are closed, which ends their handlers.
	if n := p.hijacks.wait(sctx); n > 0 {
		p.opts.Log.Warn().Int("connections", n).
			Msg("upgraded connections (WebSockets) still open at the graceful shutdown timeout; closing them")
	}
	p.hijacks.closeAll()
	if so.OnDrained != nil {
		so.OnDrained()
	}
	// Requests that used all of the grace period do not cost replica
	// processes their SIGTERM: Stop gives those their own grace. Nor do
	// they cost every replica its drain: once the period is spent (the
	// stuck requests' connections cut above), the drains get a bound of
	// their own, so that only a replica still stuck fails Stop.
	stopCtx := sctx
	if sctx.Err() != nil {
		var cancelStop context.CancelFunc
		stopCtx, cancelStop = context.WithTimeout(context.Background(), drainAfterCut)
		defer cancelStop()
	}
	if err := p.Stop(stopCtx); err != nil {
		errs = append(errs, err)
	}
	if sctx.Err() != nil {
		// The replicas' slots are free before the cut requests are
		// recorded: give those their metrics and access-log lines before
		// the log closes.
		p.awaitRequests(stopCtx)
	}
	if adm != nil {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		defer acancel()
		if err := adm.Shutdown(actx); err != nil {
			errs = append(errs, fmt.Errorf("admin shutdown: %w", err), adm.Close())
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		errs = append(errs, serveErr)
	}
	p.opts.Log.Info().Msg("stopped")
	if err := p.Close(); err != nil {
		// The requests were answered; only their log lines are lost
		// (and counted): no reason for a failed exit.
		p.opts.Log.Warn().Err(err).Msg("access log not all written out")
	}
	return errors.Join(errs...)
}

// publicServer is what serves the public listener: front.Server, or
// net/http's.
type publicServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// awaitRequests waits until no request is in the handler, or ctx is done.
func (p *Proxy) awaitRequests(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for p.metrics.ongoing.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}
