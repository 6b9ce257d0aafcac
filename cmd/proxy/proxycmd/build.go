package proxycmd

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

// firstResolveTimeout bounds the DNS lookup that gives a discovered
// deployment its first replicas at startup; a failure is logged and the
// deployment starts empty, filled by the next resolution.
const firstResolveTimeout = 5 * time.Second

// build turns the config into running parts: one proxy.Deployment per
// deployment, grouped by application, and the discovery loops that feed
// the deployments found in DNS (to run until the proxy stops). The
// deployments start at once, each on its own (one whose processes take
// their health_check_timeout_s does not hold up the others); ctx ends
// the starts early (a shutdown asked for meanwhile). On any error the
// deployments started are stopped, and the error names every one that
// failed. outputLog receives the output of the replica processes.
func build(ctx context.Context, cfg *config.Config, e config.Env, reg *replica.Registry, log, outputLog zerolog.Logger) ([]*proxy.Application, []func(context.Context), error) {
	type built struct {
		dep  *proxy.Deployment
		disc *replica.Discovery
		err  error
	}
	results := make([][]built, len(cfg.Applications))
	var wg sync.WaitGroup
	for i, a := range cfg.Applications {
		results[i] = make([]built, len(a.Deployments))
		for j, d := range a.Deployments {
			wg.Go(func() {
				r := &results[i][j]
				r.dep, r.disc, r.err = buildDeployment(ctx, a, d, e, reg, log, outputLog)
			})
		}
	}
	wg.Wait()
	var apps []*proxy.Application
	var discoveries []func(context.Context)
	var errs []error
	for i, a := range cfg.Applications {
		app := &proxy.Application{Name: a.Name, RoutePrefix: a.RoutePrefix}
		apps = append(apps, app)
		for _, r := range results[i] {
			switch {
			case r.err != nil:
				errs = append(errs, r.err)
			default:
				app.Deployments = append(app.Deployments, r.dep)
				if r.disc != nil {
					discoveries = append(discoveries, r.disc.Run)
				}
			}
		}
	}
	if err := cmp.Or(ctx.Err(), errors.Join(errs...)); err != nil {
		stopDeployments(apps, log)
		return nil, nil, err
	}
	return apps, discoveries, nil
}

// buildDeployment starts deployment d of application a.
func buildDeployment(ctx context.Context, a config.Application, d config.Deployment, e config.Env, reg *replica.Registry, log, outputLog zerolog.Logger) (_ *proxy.Deployment, _ *replica.Discovery, err error) {
	spec := replica.DeploymentSpec{
		App:                      a.Name,
		Name:                     d.Name,
		UserConfig:               d.UserConfig,
		NumReplicas:              d.NumReplicas,
		MaxOngoingRequests:       d.MaxOngoingRequests,
		HealthCheckPeriod:        d.HealthCheckPeriod(),
		HealthCheckTimeout:       d.HealthCheckTimeout(),
		GracefulShutdownTimeout:  d.GracefulShutdownTimeout(),
		MaxConstructorRetryCount: d.MaxConstructorRetryCount,
	}
	var (
		dep  *proxy.Deployment // set below, before discovery runs
		disc *replica.Discovery
		// hostDep is dep for the replica hosts' connections, which may
		// lose their host before dep is set; hostsBuilt is to be called
		// once it is.
		hostDep    atomic.Pointer[proxy.Deployment]
		hostsBuilt func()
	)
	// The kinds' own lines (a replica's output, a host's connection) name
	// the application too: two applications may have deployments of one
	// name.
	alog := log.With().Str("application", a.Name).Logger()
	setTargets := discoveredTargets(func() *proxy.Deployment { return dep }, alog.With().Str("deployment", d.Name).Logger())
	switch d.Handler {
	case config.HandlerUpstream:
		disc, err = upstreamSpec(&spec, d, e, alog, setTargets)
	case config.HandlerCommand:
		commandSpec(&spec, d, e, alog, outputLog.With().Str("application", a.Name).Logger())
	case config.HandlerHost:
		hostsBuilt, disc, err = hostSpec(&spec, d, e, alog, &hostDep, setTargets)
	default:
		spec.Factory, err = reg.Lookup(d.Handler)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("application %q deployment %q: %w", a.Name, d.Name, err)
	}
	if dep, err = proxy.NewDeployment(ctx, spec, d.MaxQueuedRequests, log); err != nil {
		return nil, nil, err
	}
	hostDep.Store(dep)
	if hostsBuilt != nil {
		hostsBuilt()
	}
	if disc != nil {
		disc.SetOnError(dep.SetDiscoveryError) // before it runs
	}
	return dep, disc, nil
}

// stopDeployments stops the deployments of apps that never served (after
// a startup error), so that no replica process or host connection is left
// behind.
func stopDeployments(apps []*proxy.Application, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, a := range apps {
		for _, d := range a.Deployments {
			wg.Go(func() { // at once: each replica process may have a SIGTERM grace
				if err := d.Stop(ctx); err != nil {
					log.Warn().Str("application", a.Name).Str("deployment", d.Name()).Err(err).Msg("stopping after a startup error")
				}
			})
		}
	}
	wg.Wait()
}

// discoveryReminder is how often a connect failure that persists is
// logged again.
const discoveryReminder = 5 * time.Minute

// discoveredTargets returns the function that gives a deployment the
// targets its discovery found. A target it cannot connect to (a replica
// host not answering) is tried again with each answer; the failure is
// logged when its reason is new, and again every discoveryReminder while
// it lasts, not at every resolution.
func discoveredTargets(dep func() *proxy.Deployment, log zerolog.Logger) func([]string) error {
	// Called by build, then by Discovery.Run alone.
	var (
		last   string
		logged time.Time
	)
	return func(targets []string) error {
		// A target whose replicas refused the user_config is connected,
		// and said so in the log: no failure of discovery's.
		_, err := replica.SplitConfigRefused(dep().SetTargets(targets))
		msg := ""
		if err != nil && !errors.Is(err, context.Canceled) { // Canceled: stopping
			msg = err.Error()
		}
		if msg != "" && (msg != last || time.Since(logged) >= discoveryReminder) {
			log.Error().Err(err).Msg("discovery: connecting to replicas failed; tried again at each resolution")
			logged = time.Now()
		}
		last = msg
		return err
	}
}

// newDiscovery returns d's discovery, feeding setTargets, and the targets
// of its first resolution: none, logged, if that fails (the deployment
// starts empty, filled by the next).
func newDiscovery(d config.Deployment, hostPort bool, log zerolog.Logger, setTargets func([]string) error) (*replica.Discovery, []string, error) {
	disc, err := replica.NewDiscovery(d.Discovery, replica.DiscoveryOptions{
		Interval: d.DiscoveryInterval(),
		Server:   d.DiscoveryServer,
		HostPort: hostPort,
		OnChange: setTargets,
		Log:      log.With().Str("deployment", d.Name).Logger(),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), firstResolveTimeout)
	defer cancel()
	targets, err := disc.Resolve(ctx)
	if err != nil {
		log.Error().Str("deployment", d.Name).Str("discovery", d.Discovery).Err(err).
			Msg("discovery: the first resolution failed; starting with no replicas")
	}
	return disc, targets, nil
}

// upstreamOptions are the forwarding settings of a deployment's replicas,
// with one client shared by all of them (and one for health checks,
// without keep-alive, so that a replica busy on every connection still
// answers them).
func upstreamOptions(d config.Deployment, e config.Env) replica.UpstreamOptions {
	health := replica.NewTransport(replica.TransportOptions{})
	health.DisableKeepAlives = true
	return replica.UpstreamOptions{
		MaxOngoing: d.MaxOngoingRequests,
		Transport: replica.NewUpstreamClient(replica.TransportOptions{
			MaxConnsPerReplica:    d.MaxOngoingRequests,
			ResponseHeaderTimeout: d.ReplicaTimeout(),
		}),
		HealthPath:      d.HealthCheckPath,
		HealthTransport: health,
		TrustedProxies:  e.TrustedProxies,
		Via:             e.Via,
		Host:            d.UpstreamHost,
	}
}

// upstreamSpec makes spec follow the upstreams of d, or its DNS
// discovery, which it returns to be run: each new answer goes to
// setTargets.
func upstreamSpec(spec *replica.DeploymentSpec, d config.Deployment, e config.Env, log zerolog.Logger, setTargets func([]string) error) (*replica.Discovery, error) {
	uo := upstreamOptions(d, e)
	spec.Connect = func(_ context.Context, id, target string, onRelease func()) ([]replica.Replica, error) {
		o := uo
		o.OnRelease = onRelease
		r, err := replica.NewUpstreamReplica(id, target, o)
		if err != nil {
			return nil, err
		}
		return []replica.Replica{r}, nil
	}
	if d.Discovery == "" {
		spec.Targets = upstreamTargets(d.Upstreams)
		return nil, nil
	}
	disc, targets, err := newDiscovery(d, false, log, setTargets)
	spec.Targets = targets
	spec.Discovered = true
	return disc, err
}

// upstreamTargets are the deployment's targets for upstreams: the URLs
// without a trailing slash, so that a list that gains or loses one keeps
// the same replica for the same server.
func upstreamTargets(upstreams []string) []string {
	out := make([]string, len(upstreams))
	for i, u := range upstreams {
		out[i] = strings.TrimRight(u, "/")
	}
	return out
}

// commandSpec makes spec start d's command for each replica.
func commandSpec(spec *replica.DeploymentSpec, d config.Deployment, e config.Env, log, outputLog zerolog.Logger) {
	uo := upstreamOptions(d, e)
	output := outputLog.With().Str("deployment", d.Name).Logger()
	po := replica.ProcessOptions{
		Command: d.Command,
		Dir:     d.WorkingDir,
		Env:     d.Env,
		Log:     log.With().Str("deployment", d.Name).Logger(),
		Output:  &output,
	}
	grace := d.GracefulShutdownTimeout()
	spec.Start = func(ctx context.Context, id string, onRelease func()) (replica.Replica, error) {
		o := uo
		o.OnRelease = onRelease
		return replica.StartCommandReplica(ctx, id, po, o, grace)
	}
}

// hostConnectTimeout bounds connecting to a replica host at startup.
const hostConnectTimeout = 10 * time.Second

// hostSpec makes spec's replicas the actors of d's replica hosts: one
// connection each, reconnected in the background after a loss. While a
// host is unreachable its actors are out of routing (dep's), so that
// requests go elsewhere or get 503 instead of waiting for its health
// checks to fail; once it is back they are checked at once. With
// host_tls, every connection is TLS.
//
// Call the function it returns once dep is set. With hosts, it takes out
// the actors of hosts lost before then (a host that cannot be reached at
// the start is an error). With discovery, it connects to the hosts of the
// first answer, and one that does not answer is tried again at the next:
// the discovery returned gives the rest to setTargets.
func hostSpec(spec *replica.DeploymentSpec, d config.Deployment, e config.Env, log zerolog.Logger, dep *atomic.Pointer[proxy.Deployment], setTargets func([]string) error) (built func(), disc *replica.Discovery, err error) {
	var (
		mu    sync.Mutex
		conns []*replica.HostConn
		dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	)
	if d.HostTLS != nil {
		// The files are read again at every dial (the start, and each
		// reconnection): a renewed certificate or CA is taken without a
		// restart, and one caught half-written leaves the last good one.
		current, err := config.ReloadingTLS(d.HostTLS.ClientConfig, func(err error) {
			log.Warn().Str("deployment", d.Name).Err(err).Msg("host_tls: reloading the files failed; dialing with the last ones that loaded")
		})
		if err != nil {
			return nil, nil, fmt.Errorf("host_tls.%w", err)
		}
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&tls.Dialer{Config: current()}).DialContext(ctx, network, addr)
		}
	}
	outOfRouting := func(dd *proxy.Deployment, hc *replica.HostConn) {
		for _, r := range hc.Replicas() {
			dd.ReportUnreachable(r, hc.LastError())
		}
	}
	spec.Connect = func(ctx context.Context, _, addr string, onRelease func()) ([]replica.Replica, error) {
		ctx, cancel := context.WithTimeout(ctx, hostConnectTimeout)
		defer cancel()
		hc, err := replica.ConnectHost(ctx, addr, replica.HostOptions{
			OnRelease:             onRelease,
			Dial:                  dial,
			ResponseHeaderTimeout: d.ReplicaTimeout(),
			TrustedProxies:        e.TrustedProxies,
			Via:                   e.Via,
			Log:                   log.With().Str("deployment", d.Name).Logger(),
			OnReachability: func(hc *replica.HostConn, up bool) {
				dd := dep.Load()
				switch {
				case dd == nil:
				case up && hc.ActorsChanged(): // restarted with other actors
					dd.ReplaceTarget(hc.Addr())
				case up: // given the user_config if it changed, then checked
					dd.Reconnected(hc.Replicas())
				default:
					outOfRouting(dd, hc)
				}
			},
		})
		if err != nil {
			return nil, err
		}
		if n := len(hc.Replicas()); d.HostHandler != "" && n != d.NumReplicas {
			// The file says what hosts started from it run: one that
			// runs otherwise was started with flags, or from another file.
			log.Warn().Str("deployment", d.Name).Str("host", addr).Int("actors", n).Int("num_replicas", d.NumReplicas).
				Msg("replica host runs another number of actors than the file's num_replicas (per host): serving the ones it has")
		}
		if d.HostHandler != "" {
			for _, r := range hc.Replicas() {
				if n := r.MaxOngoing(); n != d.MaxOngoingRequests {
					// As for the count: the host's own limit is the one
					// it enforces, and routing follows it.
					log.Warn().Str("deployment", d.Name).Str("host", addr).Int("actor_max_ongoing_requests", n).Int("max_ongoing_requests", d.MaxOngoingRequests).
						Msg("replica host's actors have another max_ongoing_requests than the file's: routing follows the host's")
					break
				}
			}
		}
		if dep.Load() == nil { // connected for NewDeployment
			mu.Lock()
			conns = append(conns, hc)
			mu.Unlock()
		}
		return hc.Replicas(), nil
	}
	if d.Discovery != "" {
		spec.Discovered = true
		disc, targets, err := newDiscovery(d, true, log, setTargets)
		return func() { _ = setTargets(targets) }, disc, err
	}
	spec.Targets = d.Hosts
	return func() {
		dd := dep.Load()
		mu.Lock()
		cs := slices.Clone(conns)
		mu.Unlock()
		for _, hc := range cs {
			if !hc.Connected() {
				outOfRouting(dd, hc)
			}
		}
	}, nil, nil
}
