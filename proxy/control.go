package proxy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/replica"
)

// controlTimeout bounds an admin control call (reconfigure, scale) and the
// broadcasts it makes.
var controlTimeout = 30 * time.Second // a variable for tests

// The deployment statuses of GET /-/applications, as Serve names them.
const (
	statusHealthy  = "HEALTHY"  // every wanted replica runs and is healthy
	statusUpdating = "UPDATING" // fewer than num_replicas run, none failing
	// statusUnhealthy: none healthy, or one in routing fails its health
	// checks (Serve keeps a deployment UNHEALTHY until it recovers).
	statusUnhealthy = "UNHEALTHY"
)

// applicationsStatus is GET /-/applications's answer.
type applicationsStatus struct {
	Applications []applicationStatus `json:"applications"`
}

type applicationStatus struct {
	Name        string `json:"name"`
	RoutePrefix string `json:"route_prefix"`
	Status      string `json:"status"` // RUNNING, DEPLOYING or UNHEALTHY
	// Message says why the status is not RUNNING: its first deployment's
	// that is not HEALTHY.
	Message     string             `json:"message,omitempty"`
	Deployments []deploymentStatus `json:"deployments"`
}

type deploymentStatus struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// Message says why the status is not HEALTHY, as Serve's does.
	Message     string `json:"message,omitempty"`
	NumReplicas int    `json:"num_replicas"`
	// MaxOngoingRequests is absent if its replicas' limits differ.
	MaxOngoingRequests int `json:"max_ongoing_requests,omitempty"`
	MaxQueuedRequests  int `json:"max_queued_requests"`
	// The settings a reload may change, as they are in force (found
	// missing by a tester: only the reload's answer said them).
	HealthCheckPeriodS       float64                 `json:"health_check_period_s"`
	HealthCheckTimeoutS      float64                 `json:"health_check_timeout_s"`
	GracefulShutdownTimeoutS float64                 `json:"graceful_shutdown_timeout_s"`
	Queued                   int                     `json:"queued"`
	UserConfig               json.RawMessage         `json:"user_config,omitempty"`
	Replicas                 []replica.ReplicaStatus `json:"replicas"`
	// Unconnected are targets found (upstreams or replica hosts in DNS)
	// that it could not connect to yet.
	Unconnected []replica.TargetError `json:"unconnected_targets,omitempty"`
	// DiscoveryError is its DNS discovery's last failure, while it fails.
	DiscoveryError string `json:"discovery_error,omitempty"`
}

// deploymentStatusOf asks d's replicas for their stats (one broadcast).
func deploymentStatusOf(ctx context.Context, d *Deployment) deploymentStatus {
	return deploymentStatusFrom(d, d.Stats(ctx))
}

// deploymentStatusFrom is d's status with its replicas' stats.
func deploymentStatusFrom(d *Deployment, replicas []replica.ReplicaStatus) deploymentStatus {
	spec := d.Spec()
	status, message := deploymentHealth(replicas, spec.NumReplicas, d.GaveUp())
	discErr := d.DiscoveryError()
	if discErr != "" {
		if message != "" {
			message += "; "
		}
		message += "DNS discovery is failing, the last replicas it found kept (see discovery_error)"
	}
	return deploymentStatus{
		Name:                     spec.Name,
		Status:                   status,
		Message:                  message,
		NumReplicas:              spec.NumReplicas,
		MaxOngoingRequests:       maxOngoingOf(d, spec.MaxOngoingRequests),
		MaxQueuedRequests:        d.maxQueued,
		HealthCheckPeriodS:       spec.HealthCheckPeriod.Seconds(),
		HealthCheckTimeoutS:      spec.HealthCheckTimeout.Seconds(),
		GracefulShutdownTimeoutS: spec.GracefulShutdownTimeout.Seconds(),
		Queued:                   d.Scheduler.Queued(),
		UserConfig:               spec.UserConfig,
		Replicas:                 replicas,
		Unconnected:              d.Unconnected(),
		DiscoveryError:           discErr,
	}
}

// deploymentHealth is a deployment's status and, unless HEALTHY, why,
// from its replicas' stats (the draining ones included), the number it
// wants, and whether it gave up starting the missing ones.
func deploymentHealth(replicas []replica.ReplicaStatus, want int, gaveUp bool) (status, message string) {
	healthy := 0
	var failing, unsynced []string // running, out of routing
	for _, r := range replicas {
		switch {
		case r.Healthy:
			healthy++
		case r.State == replica.StateRunning && r.Unsynced:
			unsynced = append(unsynced, r.ID)
		case r.State == replica.StateRunning:
			failing = append(failing, r.ID)
		}
	}
	switch {
	case len(unsynced) > 0:
		return statusUnhealthy, fmt.Sprintf("%d of %d replicas have not taken the deployment's user_config (%s): out of routing until they do (the log says why)",
			len(unsynced), healthy+len(unsynced)+len(failing), strings.Join(unsynced, ", "))
	case len(failing) > 0:
		// Failing, not yet out: a replica leaves routing after 3 checks.
		return statusUnhealthy, fmt.Sprintf("%d of %d replicas failing health checks (%s): the deployment is UNHEALTHY until they recover",
			len(failing), healthy+len(failing), strings.Join(failing, ", "))
	case healthy == 0 && gaveUp:
		return statusUnhealthy, fmt.Sprintf("no replica is running (%d wanted), and starting them failed max_constructor_retry_count rounds in a row: requests get 503, and no more attempts until num_replicas is set again", want)
	case healthy == 0:
		return statusUnhealthy, fmt.Sprintf("no replica is running (%d wanted): requests get 503", want)
	case healthy < want && gaveUp:
		return statusUnhealthy, fmt.Sprintf("%d of %d replicas running; starting the others failed max_constructor_retry_count rounds in a row: no more attempts until num_replicas is set again, or a replica process still running exits", healthy, want)
	case healthy < want:
		return statusUpdating, fmt.Sprintf("%d of %d replicas running", healthy, want)
	}
	return statusHealthy, ""
}

// maxOngoingOf is the max_ongoing_requests d's replicas share: spec's,
// except for replica hosts, whose actors have the limit their host
// announced; 0 if they differ, spec if there is no replica.
func maxOngoingOf(d *Deployment, spec int) int {
	limit := 0
	for _, r := range d.Replicas() {
		switch m := r.MaxOngoing(); {
		case limit == 0:
			limit = m
		case m != limit:
			return 0
		}
	}
	if limit == 0 {
		return spec
	}
	return limit
}

// getApplications answers every application, deployment and replica.
// The stats come from all deployments at once, within statsTimeout, not
// controlTimeout: a stalled replica host must not hold a status page
// (and whatever polls it) for 30 s.
func (p *Proxy) getApplications(w http.ResponseWriter, r *http.Request) {
	var deployments []*Deployment
	for _, app := range p.opts.Applications {
		deployments = append(deployments, app.Deployments...)
	}
	ctx, cancel := context.WithTimeout(r.Context(), statsTimeout)
	stats := statsOf(ctx, deployments)
	cancel()
	out := applicationsStatus{Applications: []applicationStatus{}}
	for _, app := range p.opts.Applications {
		as := applicationStatus{Name: app.Name, RoutePrefix: app.RoutePrefix, Status: "RUNNING"}
		for _, d := range app.Deployments {
			ds := deploymentStatusFrom(d, stats[0])
			stats = stats[1:]
			switch {
			case ds.Status == statusUnhealthy && as.Status != "UNHEALTHY":
				as.Status = "UNHEALTHY"
				as.Message = fmt.Sprintf("deployment %q: %s", ds.Name, ds.Message)
			case ds.Status == statusUpdating && as.Status == "RUNNING":
				as.Status = "DEPLOYING"
				as.Message = fmt.Sprintf("deployment %q: %s", ds.Name, ds.Message)
			}
			as.Deployments = append(as.Deployments, ds)
		}
		out.Applications = append(out.Applications, as)
	}
	writeJSON(w, http.StatusOK, out)
}

// lookupDeployment finds the deployment named by the URL, or answers 404
// naming what exists.
func (p *Proxy) lookupDeployment(w http.ResponseWriter, r *http.Request) (*Deployment, bool) {
	appName, err1 := pathParam(r, "app")
	depName, err2 := pathParam(r, "deployment")
	if err := cmp.Or(err1, err2); err != nil {
		writeJSONError(w, http.StatusBadRequest, err)
		return nil, false
	}
	var apps []string
	for _, app := range p.opts.Applications {
		apps = append(apps, app.Name)
		if app.Name != appName {
			continue
		}
		var deps []string
		for _, d := range app.Deployments {
			if d.Name() == depName {
				return d, true
			}
			deps = append(deps, d.Name())
		}
		writeJSONError(w, http.StatusNotFound, fmt.Errorf("application %q has no deployment %q (it has: %q)", appName, depName, deps))
		return nil, false
	}
	slices.Sort(apps)
	writeJSONError(w, http.StatusNotFound, fmt.Errorf("no application %q (there are: %q)", appName, apps))
	return nil, false
}

// pathParam is the URL parameter name, decoded: chi matches the escaped
// path when it has escapes of its own (an application named "a/b" is
// a%2Fb), and then gives the parameter as it was sent.
func pathParam(r *http.Request, name string) (string, error) {
	v := chi.URLParam(r, name)
	if r.URL.RawPath == "" {
		return v, nil // chi matched the decoded path
	}
	s, err := url.PathUnescape(v)
	if err != nil {
		return "", fmt.Errorf("%s %q: %v", name, v, err)
	}
	return s, nil
}

// callResult is one replica's answer to a control call, as JSON.
type callResult struct {
	Replica string `json:"replica"`
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	// Replaced is set when the failure took the replica out of routing
	// and a new one is being started in its place.
	Replaced bool `json:"replaced,omitempty"`
}

// putUserConfig reconfigures every replica of a deployment with the body,
// a JSON object, through one broadcast. Bad input changes nothing.
func (p *Proxy) putUserConfig(w http.ResponseWriter, r *http.Request) {
	d, ok := p.lookupDeployment(w, r)
	if !ok {
		return
	}
	var body json.RawMessage
	if err := decodeJSON(r, &body); err != nil {
		writeJSONError(w, decodeStatus(err), err)
		return
	}
	// Not cancelled when the caller leaves: a reconfigure half done is
	// worse than one finished for nobody.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), controlTimeout)
	defer cancel()
	results, err := d.Reconfigure(ctx, body)
	out := struct {
		Application string       `json:"application"`
		Deployment  string       `json:"deployment"`
		Error       string       `json:"error,omitempty"`
		Results     []callResult `json:"results"`
	}{Application: d.App(), Deployment: d.Name(), Results: make([]callResult, len(results))}
	for i, res := range results {
		out.Results[i] = callResult{Replica: res.Actor, OK: res.Err == nil}
		if res.Err != nil {
			out.Results[i].Error = callError(res.Err, controlTimeout).Error()
			out.Results[i].Replaced = d.replacedFor(res, err)
		}
	}
	kept := d.Untaken(results, err)
	status := http.StatusOK
	switch {
	case err == nil && kept > 0:
		status = http.StatusMultiStatus // as PUT /-/gc with a replica that failed
		out.Error = fmt.Sprintf("%d of %d replicas have not taken it, and were not replaced (see results)", kept, len(out.Results))
	case errors.Is(err, replica.ErrNotAnObject):
		writeJSONError(w, http.StatusBadRequest, err)
		return
	case errors.Is(err, replica.ErrStopped), errors.Is(err, replica.ErrUnreached):
		status = http.StatusServiceUnavailable // nothing changed; try again later
		out.Error = err.Error()
	case err != nil:
		status = http.StatusUnprocessableEntity // nothing changed
		out.Error = err.Error()
	}
	switch status {
	case http.StatusOK:
		p.opts.Log.Info().Str("application", d.App()).Str("deployment", d.Name()).Int("status", status).
			Msg("user_config changed through the admin API")
	case http.StatusMultiStatus:
		p.opts.Log.Warn().Str("application", d.App()).Str("deployment", d.Name()).Int("status", status).Str("error", out.Error).
			Msg("user_config changed through the admin API, but not on every replica")
	default:
		p.opts.Log.Warn().Str("application", d.App()).Str("deployment", d.Name()).Int("status", status).Str("error", out.Error).
			Msg("user_config change through the admin API refused; nothing changed")
	}
	writeJSON(w, status, out)
}

// replacedFor reports whether the replica of res, one result of a
// Reconfigure that returned err, is being replaced for failing it.
func (d *Deployment) replacedFor(res replica.Result, err error) bool {
	return res.Err != nil && err == nil && d.Replaces() && !errors.Is(res.Err, context.DeadlineExceeded)
}

// Untaken counts the replicas of results, Reconfigure's, that have not
// taken its user_config and are not being replaced either (an upstream's,
// a host's actor that was unreachable, one that did not answer in time):
// they are given it again at each health check, or when their host
// reconnects. A change they missed is no full success: PUT .../user_config
// and POST /-/reload answer 207 for it.
func (d *Deployment) Untaken(results []replica.Result, err error) int {
	if err != nil {
		return 0 // nothing changed
	}
	n := 0
	for _, res := range results {
		if res.Err != nil && !d.replacedFor(res, err) {
			n++
		}
	}
	return n
}

// numReplicasBody is PUT .../num_replicas's body.
type numReplicasBody struct {
	NumReplicas *int `json:"num_replicas"`
}

// putNumReplicas scales a deployment live and answers its status.
func (p *Proxy) putNumReplicas(w http.ResponseWriter, r *http.Request) {
	d, ok := p.lookupDeployment(w, r)
	if !ok {
		return
	}
	var body numReplicasBody
	if err := decodeJSON(r, &body); err != nil {
		writeJSONError(w, decodeStatus(err), err)
		return
	}
	if body.NumReplicas == nil {
		writeJSONError(w, http.StatusBadRequest, errors.New(`give "num_replicas"`))
		return
	}
	if n := *body.NumReplicas; n < 1 || n > config.MaxNumReplicas {
		writeJSONError(w, http.StatusBadRequest, fmt.Errorf("num_replicas must be in [1, %d], got %d", config.MaxNumReplicas, n))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), controlTimeout)
	defer cancel()
	err := d.Scale(ctx, *body.NumReplicas)
	ev, msg := p.opts.Log.Info(), "num_replicas changed through the admin API"
	switch {
	case errors.Is(err, replica.ErrStopped), errors.Is(err, replica.ErrFixedReplicas):
		ev, msg = p.opts.Log.Warn(), "num_replicas change through the admin API refused; nothing changed"
	case err != nil:
		ev, msg = p.opts.Log.Error(), "num_replicas changed through the admin API, but starting a replica failed (retried with backoff)"
	}
	ev.Str("application", d.App()).Str("deployment", d.Name()).Int("num_replicas", *body.NumReplicas).AnErr("error", err).Msg(msg)
	switch {
	case errors.Is(err, replica.ErrStopped):
		writeJSONError(w, http.StatusServiceUnavailable, err)
		return
	case errors.Is(err, replica.ErrFixedReplicas):
		writeJSONError(w, http.StatusConflict, fmt.Errorf("num_replicas cannot be set: %w", err))
		return
	case err != nil:
		writeJSONError(w, http.StatusInternalServerError, fmt.Errorf("num_replicas is %d, but starting a replica failed (retried with backoff): %w", *body.NumReplicas, err))
		return
	}
	writeJSON(w, http.StatusOK, deploymentStatusOf(ctx, d))
}
