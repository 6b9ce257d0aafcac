package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
)

// Handler returns the public handler: the proxy's own /-/healthz and
// /-/routes, and every application route. Nothing on it changes state.
//
// It matches its two fixed paths itself rather than through chi: the route
// table does the rest, and a router in front of it cost 3% of the CPU per
// request under load (pprof, wrk -c100 against the default app).
func (p *Proxy) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path := r.URL.Path; len(path) > 3 && path[:3] == "/-/" {
			switch path {
			case "/-/healthz", "/-/routes":
				p.serveOwn(w, r)
				return
			}
		}
		p.serveApp(w, r)
	})
}

// serveOwn answers the public /-/healthz and /-/routes, with an access-log
// line (route, application and deployment empty, as a 404's) but no
// request metrics: a probe every few seconds is no traffic, and under the
// empty route it would read as 404s.
func (p *Proxy) serveOwn(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ids := r.Header[requestIDHeader]
	if len(ids) == 0 || ids[0] == "" {
		ids = []string{newRequestID()}
	}
	w.Header()[requestIDHeader] = ids[:1:1]
	ow := &ownWriter{ResponseWriter: w}
	switch {
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		// They only read, as on the admin listener.
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(ow, r.Method+" "+r.URL.Path+": not a method of this endpoint; it takes GET, HEAD", http.StatusMethodNotAllowed)
	case r.URL.Path == "/-/healthz":
		p.healthz(ow, r)
	default:
		p.routes(ow, r)
	}
	if p.notFound.log == nil {
		return
	}
	if ow.status == 0 {
		ow.status = http.StatusOK
	}
	if r.Method == http.MethodHead {
		ow.bytes = 0 // net/http drops a HEAD's body: nothing was sent
	}
	end := time.Now()
	p.access.write(p.notFound.log, &accessEntry{
		end: end, requestID: clipped(ids[0]), method: clipped(r.Method), path: clipped(r.URL.Path),
		status: ow.status, bytes: ow.bytes, elapsed: end.Sub(start), remoteAddr: r.RemoteAddr,
	})
}

// ownWriter records the status and body size of the proxy's own answers,
// for their access-log lines.
type ownWriter struct {
	http.ResponseWriter
	status, bytes int
}

// WriteHeader implements http.ResponseWriter.
func (w *ownWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *ownWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += n
	return n, err
}

// AdminHandler returns the admin handler: /metrics from gatherer (the
// proxy's own registry if nil), /-/healthz, /-/routes, /-/applications
// (GET; PUT .../user_config and .../num_replicas), /-/gc and Go's profiler
// under /debug/pprof/. It belongs on a listener of its own, on loopback by
// default.
func (p *Proxy) AdminHandler(gatherer prometheus.Gatherer) http.Handler {
	if gatherer == nil {
		gatherer = p.registry
	}
	inner := gatherer
	gatherer = prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		// Before any collector runs, and while no other scrape does (two
		// Prometheus servers), so that a scrape shows all of a gone
		// replica's series or none (see pruneReplicas). While another
		// scrape collects (up to statsTimeout, a replica host stalled),
		// the deletion is left to a later scrape rather than hold this
		// one: a tester's three scrapes at once took 5, 10 and 15 s.
		if p.scrapeMu.TryLock() {
			for _, d := range p.deployments {
				if rm := d.replicaMetrics; rm != nil {
					rm.deletePruned()
				}
			}
			p.scrapeMu.Unlock()
		}
		p.scrapeMu.RLock()
		defer p.scrapeMu.RUnlock()
		return inner.Gather()
	})
	r := chi.NewRouter()
	r.Use(middleware.GetHead) // HEAD of every GET (a probe's curl -I)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: promLogger{p}}))
	r.Get("/-/healthz", p.healthz)
	r.Get("/-/routes", p.routes)
	r.Get("/-/applications", p.getApplications)
	r.With(p.requireToken, p.refuseWhileDraining).Put("/-/applications/{app}/deployments/{deployment}/user_config", p.putUserConfig)
	r.With(p.requireToken, p.refuseWhileDraining).Put("/-/applications/{app}/deployments/{deployment}/num_replicas", p.putNumReplicas)
	if p.opts.Reload != nil {
		r.With(p.requireToken, p.refuseWhileDraining).Post("/-/reload", p.reload)
	}
	if p.opts.GC != nil {
		r.Get("/-/gc", p.getGC)
		r.With(p.requireToken).Put("/-/gc", p.putGC)
	}
	// The profiler needs the token too: it shows the command line and
	// the heap, and a profile or trace costs CPU for its whole duration.
	r.Route("/debug/pprof", func(r chi.Router) {
		r.Use(p.requireToken)
		r.HandleFunc("/", pprof.Index)
		r.HandleFunc("/cmdline", pprof.Cmdline)
		r.HandleFunc("/profile", pprof.Profile)
		r.HandleFunc("/symbol", pprof.Symbol)
		r.HandleFunc("/trace", pprof.Trace)
		r.Handle("/{profile}", http.HandlerFunc(pprof.Index))
	})
	// Errors as JSON naming the problem, as every other admin error is
	// (a 405 had an empty body, found by a tester).
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allow := allowedMethods(r, req.URL.Path)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeJSONError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s %s: not a method of this endpoint; it takes %s", req.Method, req.URL.Path, strings.Join(allow, ", ")))
	})
	endpoints := []string{"/metrics", "/-/healthz", "/-/routes", "/-/applications"}
	if p.opts.GC != nil {
		endpoints = append(endpoints, "/-/gc")
	}
	if p.opts.Reload != nil {
		endpoints = append(endpoints, "/-/reload")
	}
	endpoints = append(endpoints, "/debug/pprof/")
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		writeJSONError(w, http.StatusNotFound, fmt.Errorf("%s: no such admin endpoint (there are %s)", req.URL.Path, strings.Join(endpoints, ", ")))
	})
	return r
}

// allowedMethods lists the methods router r routes path for, HEAD with
// GET (middleware.GetHead answers it).
func allowedMethods(r chi.Routes, path string) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodPatch} {
		if r.Match(chi.NewRouteContext(), m, path) {
			allow = append(allow, m)
			if m == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
	}
	return allow
}

// reload applies the config file again (Options.Reload). The caller
// leaving does not cut it short: a reload half done is worse than one
// finished for nobody.
func (p *Proxy) reload(w http.ResponseWriter, r *http.Request) {
	if n, _ := io.ReadFull(r.Body, make([]byte, 1)); n > 0 {
		// Not a config to apply: what it changes is the file's.
		writeJSONError(w, http.StatusBadRequest, errors.New("POST /-/reload takes no body: it reads the config file the proxy was started with (-config or PROXY_CONFIG) again"))
		return
	}
	res := p.opts.Reload(context.WithoutCancel(r.Context()))
	writeJSON(w, res.Status, res)
}

// promLogger sends the metrics handler's errors to the proxy's log.
type promLogger struct{ p *Proxy }

// Println implements promhttp.Logger. A scraper that hung up before its
// answer was written (a broken pipe, a reset) is no error of the proxy's:
// it is logged at Debug.
func (l promLogger) Println(v ...any) {
	level := zerolog.ErrorLevel
	for _, a := range v {
		if err, ok := a.(error); ok && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
			level = zerolog.DebugLevel
		}
	}
	l.p.opts.Log.WithLevel(level).Msgf("metrics: %v", v)
}

// healthz answers 200 while the proxy takes traffic, 503 before its
// replicas run (see Ready) and while it drains, as Serve's /-/healthz
// does.
func (p *Proxy) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case p.draining.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("This node is being drained.\n"))
	case !p.Ready():
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("Replicas are not running yet.\n"))
	default:
		_, _ = w.Write([]byte("success"))
	}
}

// routes answers the route table as JSON: route prefix to application.
func (p *Proxy) routes(w http.ResponseWriter, _ *http.Request) {
	m := make(map[string]string, len(p.table.Routes()))
	for _, r := range p.table.Routes() {
		m[r.Prefix] = r.Application
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}
