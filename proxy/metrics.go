package proxy

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/serveproxy/serveproxy/replica"
)

// latencyBucketsMS are Ray Serve's default latency buckets, in milliseconds.
var latencyBucketsMS = []float64{1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000, 60000, 120000, 300000, 600000}

// metrics holds the proxy's Prometheus metrics, named as Ray Serve names
// them without the "ray_" prefix. Observers for a label set are resolved
// once and cached, so recording a request takes no lock and no allocation.
type metrics struct {
	errors        *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	ongoing       atomic.Int64 // read at scrape time by a GaugeFunc
	depErrors     *prometheus.CounterVec
	depLatency    *prometheus.HistogramVec
	accessDropped prometheus.Counter
	adminRefused  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, deployments []*Deployment) (*metrics, error) {
	m := &metrics{
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "serve_num_http_error_requests_total",
			Help: "The number of HTTP requests whose status is 4xx or 5xx, recorded ones included: 499 (the client left before its answer's end) and 503 (cut at the shutdown).",
		}, []string{"route", "error_code", "method", "application"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "serve_http_request_latency_ms",
			Help:    "The end-to-end latency of HTTP requests, in milliseconds, measured from the proxy.",
			Buckets: latencyBucketsMS,
		}, []string{"route", "method", "application", "status_code"}),
		depErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "serve_deployment_error_counter_total",
			Help: "The number of requests the replica answered with an error (status 500 or above, or a panic).",
		}, []string{"application", "deployment", "replica", "route"}),
		depLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "serve_deployment_processing_latency_ms",
			Help:    "The time the replica took to process a request, in milliseconds.",
			Buckets: latencyBucketsMS,
		}, []string{"application", "deployment", "replica", "route"}),
		accessDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "serve_proxy_access_log_dropped_total",
			Help: "Access-log lines dropped because the log writer fell behind or its output did not take them (the request path never waits for it).",
		}),
		adminRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "serve_proxy_admin_calls_refused_total",
			Help: "Admin calls refused for a missing or wrong PROXY_ADMIN_TOKEN (401).",
		}),
	}
	ongoing := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "serve_num_ongoing_http_requests",
		Help: "The number of HTTP requests the proxy is answering now.",
	}, func() float64 { return float64(m.ongoing.Load()) })
	for _, c := range []prometheus.Collector{
		&histogramCount{h: m.latency, desc: requestsDesc, labels: []string{"route", "method", "application", "status_code"}},
		&histogramCount{h: m.depLatency, desc: replicaRequestsDesc, labels: []string{"application", "deployment", "replica", "route"}},
		m.errors, m.latency, ongoing, m.depErrors, m.depLatency, m.accessDropped, m.adminRefused,
		&stateCollector{deployments: deployments},
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// httpKey is the part of an HTTP metric's label set that varies per request
// within one route.
type httpKey struct {
	method string
	status int
}

// httpObservers are the resolved HTTP metrics of one label set.
type httpObservers struct {
	latency prometheus.Observer
	errors  prometheus.Counter // nil below 400
}

// replicaObservers are the resolved deployment metrics of one replica and
// route. Its request count is its latency histogram's (replicaRequestsDesc).
type replicaObservers struct {
	errors  prometheus.Counter
	latency prometheus.Observer
}

// routeMetrics caches the resolved observers of one route (the empty route
// for requests no route matched).
type routeMetrics struct {
	http     observerCache[httpKey, *httpObservers]
	replicas observerCache[string, *replicaObservers]
	// forget deletes a replica's series from the deployment metrics.
	forget func(replicaID string)

	// pruneMu guards missing, pruneGrace and doomed.
	pruneMu sync.Mutex
	// missing holds when a scrape first found each replica with series
	// gone from the deployment.
	missing map[string]time.Time
	// pruneGrace is how long a gone replica's series stay.
	pruneGrace time.Duration
	// doomed are the replicas whose series the next scrape deletes
	// before it collects (deletePruned).
	doomed []string
}

// replicaSeriesGrace is how long the series of a replica that left stay
// in /metrics: longer than scrape intervals are, so that every scraper (a
// pair of Prometheus servers too) sees the final counts.
const replicaSeriesGrace = 2 * time.Minute

// pruneReplicas dooms the series of replicas that have left the
// deployment (replaced, scaled down, gone from DNS), so that churn does not
// grow the metrics without bound, as a Serve replica's metrics leave with
// its actor. live reports whether a replica is still a member. A replica's
// series are doomed by the first scrape at least pruneGrace after one
// found it gone, and deleted at the start of the next (deletePruned): a
// scrape's collectors run side by side, so a deletion during one would
// show some of a replica's series and not others. A request still
// finishing on it after that makes them anew, and they go again.
func (rm *routeMetrics) pruneReplicas(live func(replicaID string) bool, now time.Time) {
	rm.pruneMu.Lock()
	defer rm.pruneMu.Unlock()
	rm.doomed = slices.DeleteFunc(rm.doomed, live) // back before they went
	var gone []string
	next := make(map[string]time.Time)
	for _, id := range rm.replicas.keys() {
		if live(id) {
			continue
		}
		since, ok := rm.missing[id]
		switch {
		case !ok:
			next[id] = now
		case now.Sub(since) >= rm.pruneGrace:
			gone = append(gone, id)
		default:
			next[id] = since
		}
	}
	rm.missing = next
	for _, id := range gone {
		if !slices.Contains(rm.doomed, id) {
			rm.doomed = append(rm.doomed, id)
		}
	}
}

// deletePruned deletes the series pruneReplicas doomed; call it before a
// scrape collects.
func (rm *routeMetrics) deletePruned() {
	rm.pruneMu.Lock()
	defer rm.pruneMu.Unlock()
	if len(rm.doomed) == 0 {
		return
	}
	// The series first, then the cache: a request in between records to
	// an observer just deleted (one observation lost), rather than making
	// a series that the delete would leave cached but unexported.
	for _, id := range rm.doomed {
		rm.forget(id)
	}
	rm.replicas.delete(rm.doomed)
	rm.doomed = nil
}

func (m *metrics) forRoute(route, app, deployment string) *routeMetrics {
	rm := &routeMetrics{pruneGrace: replicaSeriesGrace}
	rm.http.build = func(k httpKey) *httpObservers {
		code := strconv.Itoa(k.status)
		o := &httpObservers{
			latency: m.latency.WithLabelValues(route, k.method, app, code),
		}
		if k.status >= 400 {
			o.errors = m.errors.WithLabelValues(route, code, k.method, app)
		}
		return o
	}
	rm.replicas.build = func(replicaID string) *replicaObservers {
		return &replicaObservers{
			errors:  m.depErrors.WithLabelValues(app, deployment, replicaID, route),
			latency: m.depLatency.WithLabelValues(app, deployment, replicaID, route),
		}
	}
	rm.forget = func(replicaID string) {
		m.depErrors.DeleteLabelValues(app, deployment, replicaID, route)
		m.depLatency.DeleteLabelValues(app, deployment, replicaID, route)
	}
	return rm
}

// observerCache is a copy-on-write map from label values to resolved
// observers: reads are one atomic load and a map lookup; a miss, rare after
// warm-up, copies the map under a lock.
type observerCache[K comparable, V any] struct {
	m     atomic.Pointer[map[K]V]
	mu    sync.Mutex // serializes misses
	build func(K) V
}

func (c *observerCache[K, V]) get(k K) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	next := make(map[K]V, 1)
	if old != nil {
		for kk, vv := range *old {
			next[kk] = vv
		}
	}
	v := c.build(k)
	next[k] = v
	c.m.Store(&next)
	return v
}

// keys returns the keys cached now.
func (c *observerCache[K, V]) keys() []K {
	m := c.m.Load()
	if m == nil {
		return nil
	}
	return slices.Collect(maps.Keys(*m))
}

// delete drops ks from the cache.
func (c *observerCache[K, V]) delete(ks []K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old == nil {
		return
	}
	next := maps.Clone(*old)
	for _, k := range ks {
		delete(next, k)
	}
	c.m.Store(&next)
}

// methodLabel bounds the method label's values: any other method is
// "OTHER", so a client cannot grow the metric's cardinality at will.
func methodLabel(m string) string {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE":
		return m
	}
	return "OTHER"
}

// requestsDesc is serve_num_http_requests_total: the count of the latency
// histogram, which has the same labels, exported as a counter at scrape
// time so that each request updates one metric, not two.
var requestsDesc = prometheus.NewDesc("serve_num_http_requests_total",
	"The number of HTTP requests processed.",
	[]string{"route", "method", "application", "status_code"}, nil)

// replicaRequestsDesc is serve_deployment_request_counter_total: the count
// of serve_deployment_processing_latency_ms, so that it counts what this
// proxy sent the replica and leaves with the histogram (pruneReplicas),
// its final count included.
var replicaRequestsDesc = prometheus.NewDesc("serve_deployment_request_counter_total",
	"The number of requests this proxy sent the replica (the latency histogram's count).",
	[]string{"application", "deployment", "replica", "route"}, nil)

// histogramCount exports a histogram vector's sample counts as a counter
// with the same labels, given in desc's order.
type histogramCount struct {
	h      *prometheus.HistogramVec
	desc   *prometheus.Desc
	labels []string
}

// Describe implements prometheus.Collector.
func (c *histogramCount) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *histogramCount) Collect(ch chan<- prometheus.Metric) {
	hs := make(chan prometheus.Metric, 64)
	go func() {
		c.h.Collect(hs)
		close(hs)
	}()
	for m := range hs {
		var d dto.Metric
		if m.Write(&d) != nil || d.Histogram == nil {
			continue
		}
		byName := make(map[string]string, len(d.Label))
		for _, l := range d.Label {
			byName[l.GetName()] = l.GetValue()
		}
		values := make([]string, len(c.labels))
		for i, name := range c.labels {
			values[i] = byName[name]
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(d.Histogram.GetSampleCount()), values...)
	}
}

// statsTimeout bounds the stats broadcasts of one scrape, or of one GET
// /-/applications: one deadline for all deployments' broadcasts, made at
// once (statsOf). It is half Prometheus's default scrape_timeout (10 s),
// so that a stalled replica host costs a scrape its own replicas' counts
// and leaves time for the rest of the scrape and the network, instead of
// the whole scrape failing and every metric going missing. A replica that
// answers does so in milliseconds.
const statsTimeout = 5 * time.Second

// statsOf asks every deployment of ds for its replicas' stats at once,
// all under ctx, and returns them in ds's order. One after another, each
// with a deadline of its own, a host stalled under n deployments cost n
// deadlines; under one shared deadline, the first stalled deployment used
// it up and left the later ones errors.
func statsOf(ctx context.Context, ds []*Deployment) [][]replica.ReplicaStatus {
	out := make([][]replica.ReplicaStatus, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() { out[i] = d.Stats(ctx) }) // ends by ctx's deadline
	}
	wg.Wait()
	return out
}

// stateCollector reads queue lengths, replica load, request counts and
// health at scrape time, so that the request path pays nothing for them.
type stateCollector struct {
	deployments []*Deployment
}

var (
	queuedDesc = prometheus.NewDesc("serve_deployment_queued_queries",
		"The number of requests waiting for a replica of the deployment.",
		[]string{"application", "deployment"}, nil)
	processingDesc = prometheus.NewDesc("serve_replica_processing_queries",
		"The number of requests the replica is processing now.",
		[]string{"application", "deployment", "replica"}, nil)
	peakDesc = prometheus.NewDesc("serve_replica_peak_processing_queries",
		"The most requests the replica has processed at once since it started: never above the max_ongoing_requests in force then (a lowered limit leaves it above the new one).",
		[]string{"application", "deployment", "replica"}, nil)
	healthyDesc = prometheus.NewDesc("serve_deployment_replica_healthy",
		"Whether the replica is healthy (1) or not (0).",
		[]string{"application", "deployment", "replica"}, nil)
	// healthyReplicasDesc is what an alert on a deployment left without
	// replicas reads: serve_deployment_replica_healthy has no series then
	// (every start crashed, or its upstreams left DNS), and a sum over
	// no series is no value, not 0, so such an alert never fired.
	healthyReplicasDesc = prometheus.NewDesc("serve_deployment_healthy_replicas",
		"The number of the deployment's replicas that are healthy now (running, passed their last health check, in routing): the sum of its serve_deployment_replica_healthy, but 0, not absent, when it has no replica at all.",
		[]string{"application", "deployment"}, nil)
	// startsDesc is Ray Serve's serve_deployment_replica_starts, by
	// deployment: a crash loop's rate (found missing by a tester).
	startsDesc = prometheus.NewDesc("serve_deployment_replica_starts_total",
		"The replicas the deployment has tried to build in process or start as processes, whether or not they came up: the first ones, scale-ups, replacements and retries of failed starts (Ray Serve's serve_deployment_replica_starts; a crash loop shows as its rate). Upstreams and replica hosts' actors are connected to, not started, and do not count.",
		[]string{"application", "deployment"}, nil)
	// unconnectedDesc is what the healthy replicas' count cannot show: a
	// listed host or upstream that never connected has no replica to
	// count, and the deployment looked whole (found by a tester).
	unconnectedDesc = prometheus.NewDesc("serve_deployment_unconnected_targets",
		"The upstreams or replica hosts the deployment's list or DNS discovery names that it could not connect to (tried again at each health check; GET /-/applications lists them as unconnected_targets); 0 for a deployment in process.",
		[]string{"application", "deployment"}, nil)
	// discoveryFailingDesc is what a stale replica set cannot show: the
	// last one found is kept while DNS fails, and looks healthy (a
	// tester could alert on nothing).
	discoveryFailingDesc = prometheus.NewDesc("serve_deployment_discovery_failing",
		"1 while the deployment's DNS discovery fails (the last replicas it found kept; GET /-/applications has discovery_error), else 0.",
		[]string{"application", "deployment"}, nil)
)

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queuedDesc
	ch <- processingDesc
	ch <- peakDesc
	ch <- healthyDesc
	ch <- healthyReplicasDesc
	ch <- unconnectedDesc
	ch <- discoveryFailingDesc
	ch <- startsDesc
}

// Collect implements prometheus.Collector. The replicas' counts come from
// each deployment's stats broadcast, the controllers' one path to them.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	all := statsOf(ctx, c.deployments)
	cancel()
	now := time.Now()
	for i, d := range c.deployments {
		app, name, stats := d.App(), d.Name(), all[i]
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(d.Scheduler.Queued()), app, name)
		if rm := d.replicaMetrics; rm != nil {
			ids := make(map[string]bool, len(stats))
			for _, s := range stats {
				ids[s.ID] = true
			}
			rm.pruneReplicas(func(id string) bool { return ids[id] }, now)
		}
		n := 0
		for _, s := range stats {
			healthy := 0.0
			if s.Healthy {
				healthy = 1
				n++
			}
			ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy, app, name, s.ID)
			if s.Error != "" {
				continue // no counts from a replica that did not answer
			}
			ch <- prometheus.MustNewConstMetric(processingDesc, prometheus.GaugeValue, float64(s.Ongoing), app, name, s.ID)
			ch <- prometheus.MustNewConstMetric(peakDesc, prometheus.GaugeValue, float64(s.Peak), app, name, s.ID)
		}
		ch <- prometheus.MustNewConstMetric(healthyReplicasDesc, prometheus.GaugeValue, float64(n), app, name)
		ch <- prometheus.MustNewConstMetric(unconnectedDesc, prometheus.GaugeValue, float64(len(d.Unconnected())), app, name)
		failing := 0.0
		if d.DiscoveryError() != "" {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(discoveryFailingDesc, prometheus.GaugeValue, failing, app, name)
		ch <- prometheus.MustNewConstMetric(startsDesc, prometheus.CounterValue, float64(d.Starts()), app, name)
	}
}
