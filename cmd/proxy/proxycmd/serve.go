package proxycmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

func httpAddr(cfg *config.Config) string {
	return net.JoinHostPort(cfg.HTTPOptions.Host, strconv.Itoa(cfg.HTTPOptions.Port))
}

// serve runs the proxy until ctx is done; hup delivers SIGHUP, a reload.
// path is the config file, "" for the built-in app.
func serve(ctx context.Context, stopSignals func(), hup <-chan os.Signal, path string, cfg *config.Config, e config.Env, reg *replica.Registry, gc *gctune.Tuner, log zerolog.Logger, logOut *proxy.LogWriter, stderr io.Writer) error {
	// Once the first SIGTERM or SIGINT is in, a second kills at once,
	// whether it comes during the start or during the graceful shutdown.
	context.AfterFunc(ctx, stopSignals)
	// The ports first: one in use fails the proxy before any replica
	// process starts, and during the start they answer 503.
	public, err := net.Listen("tcp", httpAddr(cfg))
	if err != nil {
		from := "PROXY_HTTP_ADDR"
		switch {
		case e.HTTPAddr != "":
		case path != "":
			from = "http_options.host and port in " + path
		default:
			from = "the default; set PROXY_HTTP_ADDR"
		}
		return fmt.Errorf("http listener (%s): %w", from, err)
	}
	admin, err := net.Listen("tcp", e.AdminAddr)
	if err != nil {
		public.Close()
		return fmt.Errorf("admin listener (PROXY_ADMIN_ADDR): %w", err)
	}
	listening := true
	defer func() {
		if listening {
			public.Close()
			admin.Close()
		}
	}()
	starting := serveStarting(log, e.ReadHeaderTimeout, int(e.MaxHeaderBytes), public, admin)
	log.Info().Str("http_addr", public.Addr().String()).Str("admin_addr", admin.Addr().String()).
		Msg("listening; answering 503 until the deployments' first starts are done")
	// Replica processes' output waits for the log's output rather than
	// being lost in a burst (see proxy.LogWriter.Waiting).
	outputLog := log
	if logOut != nil {
		outputLog = proxy.NewLogger(logOut.Waiting(), e.LogLevel, e.LogFormat)
	}
	// A SIGHUP is logged as it comes during the start, and the reload it
	// asks for made once the start is done (several make one: it reads
	// the file as it is then).
	reloads := make(chan struct{}, 1)
	var started atomic.Bool
	hupsDone := make(chan struct{})
	defer close(hupsDone)
	go func() {
		for {
			select {
			case <-hupsDone:
				return
			case <-hup:
				if !started.Load() {
					log.Info().Msg("SIGHUP during the start: the file is reloaded once the start is done")
				}
				select {
				case reloads <- struct{}{}:
				default: // one is pending: it reads the file as it is then
				}
			}
		}
	}()
	apps, discoveries, err := build(ctx, cfg, e, reg, log, outputLog)
	started.Store(true)
	if n := starting.handBack(); n > 0 {
		log.Info().Int64("requests", n).Msg("answered 503 during the start (probes of /-/healthz included), before the access log began")
	}
	if err != nil && ctx.Err() != nil {
		log.Info().Msg("shutdown asked for during the start; what had started is stopped")
		return nil
	}
	if err != nil {
		return err
	}
	// Until Serve owns them, the deployments (processes started, host
	// connections open) are stopped on the way out of an error.
	serving := false
	defer func() {
		if !serving {
			stopDeployments(apps, log)
		}
	}()
	var accessLog io.Writer
	if e.AccessLog {
		accessLog = stderr
	}
	rl := newReloader(path, e, reg, cfg, apps, log)
	p, err := proxy.New(proxy.Options{
		Applications:      apps,
		RequestTimeout:    cfg.HTTPOptions.RequestTimeout(),
		MaxBodyBytes:      int64(e.MaxBodyBytes),
		ClientBodyTimeout: e.ClientBodyTimeout,
		ClientSendTimeout: e.ClientSendTimeout,
		Log:               log,
		AccessLog:         accessLog,
		LogFormat:         e.LogFormat,
		LogOutput:         logOut,
		GC:                gc,
		AdminToken:        e.AdminToken,
		Reload:            rl.Reload,
	})
	if err != nil {
		return err
	}
	// ctx ends with SIGTERM or SIGINT a moment before the proxy drains.
	rl.stopping = func() bool { return ctx.Err() != nil || p.Draining() }
	// Discovery feeds the upstream deployments' replica sets until the
	// requests in flight are done (OnDrained), not just until the signal:
	// the drain delay and the grace period still serve.
	dctx, stopDiscovery := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	for _, run := range discoveries {
		wg.Go(func() { run(dctx) })
	}
	// SIGHUP reloads the file, as POST /-/reload does, until shutdown.
	wg.Go(func() {
		for {
			select {
			case <-dctx.Done():
				return
			case <-reloads:
				if p.Draining() {
					log.Warn().Msg("SIGHUP while shutting down: nothing is reloaded")
					continue
				}
				rl.Reload(dctx)
			}
		}
	})
	defer wg.Wait()
	defer stopDiscovery()
	serving, listening = true, false // Serve closes them
	return p.Serve(ctx, public, admin, proxy.ServerOptions{
		ReadHeaderTimeout: e.ReadHeaderTimeout,
		KeepAliveTimeout:  cfg.HTTPOptions.KeepAliveTimeout(),
		MaxHeaderBytes:    int(e.MaxHeaderBytes),
		DrainDelay:        e.DrainDelay,
		NetHTTPFront:      !e.LeanFront,
		// A second SIGTERM or SIGINT during the grace period kills at once.
		OnShutdown: stopSignals,
		OnDrained:  stopDiscovery,
	})
}
