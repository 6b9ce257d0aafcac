package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

// build turns the config into running parts: one proxy.Deployment per
// deployment, grouped by application.
func build(cfg *config.Config, reg *replica.Registry, log zerolog.Logger) ([]*proxy.Application, error) {
	var apps []*proxy.Application
	for _, a := range cfg.Applications {
		app := &proxy.Application{Name: a.Name, RoutePrefix: a.RoutePrefix}
		for _, d := range a.Deployments {
			f, err := reg.Lookup(d.Handler)
			if err != nil {
				return nil, fmt.Errorf("application %q deployment %q: %w", a.Name, d.Name, err)
			}
			dep, err := proxy.NewDeployment(replica.DeploymentSpec{
				App:                     a.Name,
				Name:                    d.Name,
				Factory:                 f,
				UserConfig:              d.UserConfig,
				NumReplicas:             d.NumReplicas,
				MaxOngoingRequests:      d.MaxOngoingRequests,
				HealthCheckPeriod:       d.HealthCheckPeriod(),
				HealthCheckTimeout:      d.HealthCheckTimeout(),
				GracefulShutdownTimeout: d.GracefulShutdownTimeout(),
			}, d.MaxQueuedRequests, log)
			if err != nil {
				return nil, err
			}
			app.Deployments = append(app.Deployments, dep)
		}
		apps = append(apps, app)
	}
	return apps, nil
}

func httpAddr(cfg *config.Config) string {
	return net.JoinHostPort(cfg.HTTPOptions.Host, strconv.Itoa(cfg.HTTPOptions.Port))
}

// serve runs the proxy until ctx is done.
func serve(ctx context.Context, stopSignals func(), cfg *config.Config, e config.Env, reg *replica.Registry, gc *gctune.Tuner, log zerolog.Logger, stderr io.Writer) error {
	apps, err := build(cfg, reg, log)
	if err != nil {
		return err
	}
	var accessLog io.Writer
	if e.AccessLog {
		accessLog = stderr
	}
	p, err := proxy.New(proxy.Options{
		Applications:   apps,
		RequestTimeout: cfg.HTTPOptions.RequestTimeout(),
		MaxBodyBytes:   int64(e.MaxBodyBytes),
		Log:            log,
		AccessLog:      accessLog,
		LogFormat:      e.LogFormat,
		GC:             gc,
		AdminToken:     e.AdminToken,
	})
	if err != nil {
		return err
	}
	public, err := net.Listen("tcp", httpAddr(cfg))
	if err != nil {
		return fmt.Errorf("http listener: %w", err)
	}
	admin, err := net.Listen("tcp", e.AdminAddr)
	if err != nil {
		public.Close()
		return fmt.Errorf("admin listener (PROXY_ADMIN_ADDR): %w", err)
	}
	return p.Serve(ctx, public, admin, proxy.ServerOptions{
		ReadHeaderTimeout: e.ReadHeaderTimeout,
		KeepAliveTimeout:  cfg.HTTPOptions.KeepAliveTimeout(),
		MaxHeaderBytes:    int(e.MaxHeaderBytes),
		DrainDelay:        e.DrainDelay,
		// A second SIGTERM or SIGINT during the grace period kills at once.
		OnShutdown: stopSignals,
	})
}
