// Package proxy is the HTTP side of serveproxy: the public server that
// routes requests to applications' replicas, the admin server (metrics,
// profiling), the mapping of errors to Serve's status codes, the access log
// and the metrics.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/replica"
	"github.com/serveproxy/serveproxy/router"
)

// Deployment is a deployment's controller together with the scheduler that
// routes requests to its replicas.
type Deployment struct {
	*replica.Deployment
	Scheduler *router.Scheduler // routes the deployment's requests among its replicas
	route     string            // the route prefix it is the ingress of; "" if none
	// replicaMetrics are its route's per-replica metrics, pruned at scrape
	// time; nil if it is no route's ingress.
	replicaMetrics *routeMetrics
	maxQueued      int // max_queued_requests; < 0 means no limit
	// discoveryErr is its DNS discovery's last failure, nil once it
	// answers again (see SetDiscoveryError).
	discoveryErr atomic.Pointer[string]
}

// SetDiscoveryError records that the deployment's DNS discovery failed
// with err (its last known replicas stay), or, with nil, that it answers
// again: GET /-/applications says so, where "no replica is running (0
// wanted)" alone read as nothing wanted. It suits
// replica.DiscoveryOptions.OnError.
func (d *Deployment) SetDiscoveryError(err error) {
	if err == nil {
		d.discoveryErr.Store(nil)
		return
	}
	msg := err.Error()
	d.discoveryErr.Store(&msg)
}

// DiscoveryError is the DNS discovery's last failure, "" if none or it
// answers again.
func (d *Deployment) DiscoveryError() string {
	if m := d.discoveryErr.Load(); m != nil {
		return *m
	}
	return ""
}

// NewDeployment builds a deployment's replicas and its scheduler, wired so
// that every freed slot reaches the scheduler's waiters. maxQueued is
// max_queued_requests: < 0 means no limit (Serve's default, -1), and 0
// that no request waits: one that finds every replica full is shed with
// 503 at once. ctx bounds the first starts (see replica.NewDeployment).
func NewDeployment(ctx context.Context, spec replica.DeploymentSpec, maxQueued int, log zerolog.Logger) (*Deployment, error) {
	s := router.NewScheduler(nil, maxQueued)
	d, err := replica.NewDeployment(ctx, spec, replica.Hooks{
		OnChange:  s.SetReplicas,
		OnRelease: s.Notify,
		Log:       log,
	})
	if err != nil {
		return nil, err
	}
	return &Deployment{Deployment: d, Scheduler: s, maxQueued: maxQueued}, nil
}

// Application is a set of deployments served under one route prefix; the
// first deployment is the ingress, which receives the HTTP requests.
type Application struct {
	// Name is the application's, in logs, metrics and /-/routes.
	Name string
	// RoutePrefix is where it is served: "/" or a path that starts with
	// "/" and does not end with one (the config's default is "/"; here
	// there is none).
	RoutePrefix string
	// Deployments are the application's, the ingress first; none is nil.
	Deployments []*Deployment
}

// Options configure a Proxy.
type Options struct {
	// Applications to serve; their route prefixes must be unique.
	Applications []*Application
	// RequestTimeout bounds each request end to end (408 past it). Zero
	// means no timeout, as in Serve.
	RequestTimeout time.Duration
	// MaxBodyBytes bounds request bodies (413 past it). Zero means no limit.
	MaxBodyBytes int64
	// ClientBodyTimeout, if above 0, bounds the wait for each part of a
	// request's body: past it, the request is answered 408 and its
	// connection closed.
	ClientBodyTimeout time.Duration
	// ClientSendTimeout, if above 0, bounds each write of a response to
	// its client once the response is larger than net/http buffers, or
	// flushed: a client that takes no part of it for that long is taken
	// for gone (499), its connection closed, and its replica's slot freed.
	ClientSendTimeout time.Duration
	// Log receives the proxy's own events. The zero Logger logs nothing.
	Log zerolog.Logger
	// AccessLog, if not nil, receives one line per request, through a
	// non-blocking buffer (see NewAccessLogger). Close flushes it.
	AccessLog io.Writer
	// LogOutput, if not nil, is the writer under Log: its lost lines are
	// counted in serve_proxy_log_dropped_total.
	LogOutput *LogWriter
	// LogFormat is the access log's format: "json" (if empty) or "console".
	LogFormat string
	// GC, if not nil, is served by GET and PUT /-/gc on the admin handler
	// and exported in the metrics.
	GC *gctune.Tuner
	// AdminToken, if not empty, must be presented by mutating admin calls
	// as "Authorization: Bearer <token>" (401 otherwise).
	AdminToken string
	// Registerer takes the proxy's metrics. If nil, they are registered on
	// a new registry of the proxy's own, returned by Registry.
	Registerer prometheus.Registerer
	// Reload, if not nil, is POST /-/reload on the admin handler (a
	// mutating call): it applies the config file again and says what it
	// did.
	Reload func(context.Context) ReloadResult
}

// ReloadResult is what applying the config file again did.
type ReloadResult struct {
	// Config is the file read.
	Config string `json:"config"`
	// Status is the admin call's HTTP status: 200 when every change was
	// made (or there was none), 207 when some replicas did not take a
	// user_config that the others did (see Partial), 400 when the file
	// has problems, 409 when it changes what takes a restart (nothing
	// changed for either), 500 when a change was tried and failed.
	Status int `json:"-"`
	// Applied lists the changes made, one line each.
	Applied []string `json:"applied"`
	// Partial lists the changes made but not on every replica, with how
	// many missed them (they are in Applied too).
	Partial []string `json:"partial,omitempty"`
	// Problems lists the file's problems, or the changes that take a
	// restart, one line each naming the field.
	Problems []string `json:"problems,omitempty"`
	// Failed lists the changes that were tried and failed, with why.
	Failed []string `json:"failed,omitempty"`
	// Warnings lists what the file sets that is not taken as it reads
	// (an http_options value the environment overrides, say), as -check
	// prints them: none of it stops the reload.
	Warnings []string `json:"warnings,omitempty"`
}

// Proxy routes HTTP requests to applications' replicas.
type Proxy struct {
	opts        Options
	table       *router.Table
	deployments []*Deployment
	metrics     *metrics
	registry    *prometheus.Registry // nil when Options.Registerer was given
	notFound    *routeState          // for requests no route matched
	routeMeta   map[*router.Route]*routeState
	access      *AccessLogger // nil without an access log
	draining    atomic.Bool
	started     atomic.Bool
	// cut is set when the graceful shutdown timeout has passed and the
	// connections still serving are being closed: a request that ends
	// for it failed at the proxy (503), its client did not leave (499).
	cut atomic.Bool
	// hijacks are the connections handlers took over (WebSockets).
	hijacks hijackedConns
	// scrapeMu keeps the deletion of gone replicas' series out of the
	// scrapes in progress (held for reading while one collects).
	scrapeMu sync.RWMutex
	// refusals are the admin calls refused for the token that no log
	// line has told yet (see logRefusal).
	refusals refusalLog
}

// routeState is what the request path needs about a route beyond the
// router's view of it.
type routeState struct {
	deployment *Deployment // the route's ingress; nil for no route
	metrics    *routeMetrics
	// log is the route's access log; nil without one.
	log *accessRoute
}

func (p *Proxy) newRouteState(route, app, deployment string) *routeState {
	rs := &routeState{metrics: p.metrics.forRoute(route, app, deployment)}
	if p.access != nil {
		rs.log = p.access.forRoute(app, route, deployment)
	}
	return rs
}

// New builds a proxy. Its deployments take requests once Start is called.
func New(opts Options) (*Proxy, error) {
	p := &Proxy{opts: opts, routeMeta: make(map[*router.Route]*routeState)}
	reg := opts.Registerer
	if reg == nil {
		p.registry = prometheus.NewRegistry()
		p.registry.MustRegister(
			collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC, collectors.MetricsMemory, collectors.MetricsScheduler)),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		reg = p.registry
	}
	var routes []router.Route
	for _, app := range opts.Applications {
		if app == nil {
			return nil, errors.New("an application is nil")
		}
		if len(app.Deployments) == 0 {
			return nil, fmt.Errorf("application %q has no deployments", app.Name)
		}
		if i := slices.Index(app.Deployments, nil); i >= 0 {
			return nil, fmt.Errorf("application %q: deployment %d is nil", app.Name, i)
		}
		p.deployments = append(p.deployments, app.Deployments...)
		ingress := app.Deployments[0]
		ingress.route = app.RoutePrefix
		routes = append(routes, router.Route{
			Prefix:      app.RoutePrefix,
			Application: app.Name,
			Deployment:  ingress.Name(),
			Scheduler:   ingress.Scheduler,
		})
	}
	table, err := router.NewTable(routes)
	if err != nil {
		return nil, err
	}
	p.table = table
	if p.metrics, err = newMetrics(reg, p.deployments); err != nil {
		return nil, err
	}
	if opts.GC != nil {
		if err := reg.Register(opts.GC.Collector()); err != nil {
			return nil, err
		}
	}
	if lw := opts.LogOutput; lw != nil {
		dropped := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "serve_proxy_log_dropped_total",
			Help: "Lines of the proxy's own log (not the access log) lost because its output did not take them: it stopped reading, or went away.",
		}, func() float64 { return float64(lw.Dropped()) })
		if err := reg.Register(dropped); err != nil {
			return nil, err
		}
	}
	if opts.AccessLog != nil {
		p.access = NewAccessLogger(opts.AccessLog, opts.LogFormat, func(n int) { p.metrics.accessDropped.Add(float64(n)) })
		p.access.out.reportDrops(func(n int) {
			opts.Log.Warn().Int("lines", n).Msg("access-log lines were lost: the access log's output did not take them in time (a reader that stopped, or a disk too slow); serve_proxy_access_log_dropped_total counts them")
		})
	}
	p.notFound = p.newRouteState("", "", "")
	for _, r := range table.Routes() {
		rs := p.newRouteState(r.Prefix, r.Application, r.Deployment)
		for _, d := range p.deployments {
			if d.Scheduler == r.Scheduler {
				rs.deployment = d
				d.replicaMetrics = rs.metrics
			}
		}
		p.routeMeta[r] = rs
	}
	return p, nil
}

// Registry returns the proxy's own metrics registry, or nil when
// Options.Registerer was given.
func (p *Proxy) Registry() *prometheus.Registry { return p.registry }

// Deployments returns every deployment of every application.
func (p *Proxy) Deployments() []*Deployment { return p.deployments }

// Start makes every deployment's replicas take requests.
func (p *Proxy) Start() {
	for _, d := range p.deployments {
		d.Start()
	}
	p.started.Store(true)
}

// SetDraining makes /-/healthz answer 503, so that load balancers stop
// sending new traffic; requests are still served.
func (p *Proxy) SetDraining() { p.draining.Store(true) }

// Draining reports whether SetDraining was called: the proxy is shutting
// down.
func (p *Proxy) Draining() bool { return p.draining.Load() }

// Ready reports whether the proxy should receive traffic: started, not
// draining, and every deployment past its start (replica.Deployment
// Settled: it has had a running replica, gave up starting them, or
// follows targets).
func (p *Proxy) Ready() bool {
	if !p.started.Load() || p.draining.Load() {
		return false
	}
	for _, d := range p.deployments {
		if !d.Settled() {
			return false
		}
	}
	return true
}

// GracefulShutdownTimeout is the longest graceful_shutdown_timeout of the
// proxy's deployments: how long shutdown waits for requests in flight.
func (p *Proxy) GracefulShutdownTimeout() time.Duration {
	var t time.Duration
	for _, d := range p.deployments {
		t = max(t, d.Spec().GracefulShutdownTimeout)
	}
	return t
}

// Stop stops every deployment, waiting up to ctx's deadline for their
// requests to finish.
func (p *Proxy) Stop(ctx context.Context) error {
	errs := make([]error, len(p.deployments))
	var wg sync.WaitGroup
	for i, d := range p.deployments {
		wg.Go(func() { // at once, so that one's grace period is not another's
			if err := d.Stop(ctx); err != nil {
				errs[i] = fmt.Errorf("application %q deployment %q: %w", d.App(), d.Name(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close flushes the access log, and logs the refused admin calls not told
// yet. Call it after the servers have stopped.
func (p *Proxy) Close() error {
	p.flushRefusals(true)
	if p.access == nil {
		return nil
	}
	return p.access.Close()
}
