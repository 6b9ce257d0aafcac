package proxycmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

// reloadTimeout bounds each change a reload makes (one deployment's
// reconfigure, scale or new targets), as the admin calls are bounded.
const reloadTimeout = 30 * time.Second

// reloader applies the config file again to the running proxy, on SIGHUP
// or POST /-/reload, as Serve's `serve deploy` of a changed file does its
// light updates: a deployment's user_config (reconfigure), num_replicas
// (scale), max_ongoing_requests (SetMaxOngoing), health checks
// (SetHealthChecks), graceful shutdown timeout and its upstreams or hosts
// list change in place. A change to
// anything else takes a restart: a file that holds one, or any problem,
// changes nothing and says what.
//
// It is declarative: each deployment is made to match the file, whatever
// the admin API changed since.
type reloader struct {
	mu   sync.Mutex // one reload at a time
	path string
	env  config.Env
	reg  *replica.Registry
	// running is the config the proxy was built from: what takes a
	// restart is compared with it.
	running *config.Config
	apps    []*proxy.Application
	// targets are the upstreams or hosts lists last given to each
	// deployment, by [application][deployment]; nil for discovery.
	targets [][][]string
	// fileConfigs records, by [application][deployment], whether the
	// file last applied gave the deployment a user_config: one it no
	// longer gives is refused, but one it never gave leaves the admin
	// API's in place.
	fileConfigs [][]bool
	// checked is, by [application][deployment], the file's user_config
	// that loadConfig last had the handler's factory check (at the start,
	// or at a reload): the same one again is not checked again.
	checked [][]json.RawMessage
	log     zerolog.Logger
	// stopping, if set, reports that the proxy's shutdown has begun: a
	// reload asked for just before (a SIGHUP right after a SIGTERM, or
	// one that waited for another reload) then changes nothing.
	stopping func() bool
}

func newReloader(path string, e config.Env, reg *replica.Registry, running *config.Config, apps []*proxy.Application, log zerolog.Logger) *reloader {
	rl := &reloader{path: path, env: e, reg: reg, running: running, apps: apps, log: log}
	for _, a := range running.Applications {
		var ts [][]string
		var fc []bool
		var ck []json.RawMessage
		for _, d := range a.Deployments {
			ts = append(ts, staticTargets(d))
			fc = append(fc, d.UserConfig != nil)
			ck = append(ck, d.UserConfig)
		}
		rl.targets = append(rl.targets, ts)
		rl.fileConfigs = append(rl.fileConfigs, fc)
		rl.checked = append(rl.checked, ck)
	}
	return rl
}

// staticTargets is the upstreams or hosts list of d, nil for any other
// deployment (discovery included).
func staticTargets(d config.Deployment) []string {
	switch {
	case d.Discovery != "":
		return nil
	case d.Handler == config.HandlerUpstream:
		return upstreamTargets(d.Upstreams)
	case d.Handler == config.HandlerHost:
		return d.Hosts
	}
	return nil
}

// change is one live change a reload makes to a deployment.
type change struct {
	dep     *proxy.Deployment
	what    string                                         // for the result: `application "a" deployment "d": num_replicas from 1 to 3`
	apply   func(context.Context, *proxy.Deployment) error // nil for a record only
	applied func()                                         // if not nil, records the change once made
	// partial is set for a change that is made in part when it fails (a
	// targets list: the others connected, the gone ones retired).
	partial bool
}

// errShuttingDown is a reload's problem once the shutdown has begun.
const errShuttingDown = "the proxy is shutting down: nothing is reloaded"

// shuttingDown reports whether the proxy's shutdown has begun.
func (rl *reloader) shuttingDown() bool { return rl.stopping != nil && rl.stopping() }

// Reload reads the file, checks it, and makes the changes it asks for.
func (rl *reloader) Reload(ctx context.Context) proxy.ReloadResult {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.shuttingDown() {
		rl.log.Warn().Msg("config reload asked for as the proxy shuts down: nothing is reloaded")
		return proxy.ReloadResult{Config: displayName(rl.path), Status: http.StatusServiceUnavailable, Applied: []string{},
			Problems: []string{errShuttingDown}}
	}
	res := rl.reload(ctx)
	if res.Applied == nil {
		res.Applied = []string{}
	}
	ev := rl.log.Info()
	msg := "config reloaded"
	switch {
	case res.Status == http.StatusOK && len(res.Applied) == 0:
		msg = "config reloaded: nothing changed"
	case len(res.Problems) > 0:
		ev, msg = rl.log.Error().Strs("problems", res.Problems), "config reload refused: nothing changed"
	case len(res.Failed) > 0:
		ev, msg = rl.log.Error().Strs("failed", res.Failed), "config reload: some changes failed"
	case len(res.Partial) > 0:
		ev, msg = rl.log.Warn().Strs("partial", res.Partial), "config reloaded, but not every replica took every change"
	}
	if len(res.Warnings) > 0 {
		if len(res.Problems) == 0 && len(res.Failed) == 0 && len(res.Partial) == 0 {
			ev = rl.log.Warn()
		}
		ev = ev.Strs("warnings", res.Warnings)
	}
	ev.Str("config", res.Config).Strs("applied", res.Applied).Msg(msg)
	return res
}

func (rl *reloader) reload(ctx context.Context) proxy.ReloadResult {
	res := proxy.ReloadResult{Config: displayName(rl.path), Status: http.StatusOK}
	if rl.path == "" {
		res.Status = http.StatusConflict
		res.Problems = []string{"no config file: the proxy serves its built-in app (give -config or PROXY_CONFIG to reload one)"}
		return res
	}
	next, problems := loadConfig(rl.path, rl.env, rl.reg, rl.checkedBefore)
	if next != nil {
		// As -check and the start tell them: a port the environment
		// overrides is otherwise a file's edit that silently does nothing.
		for _, w := range next.Warnings() {
			w.File = displayName(rl.path)
			res.Warnings = append(res.Warnings, w.Error())
		}
	}
	if len(problems) > 0 {
		res.Status = http.StatusBadRequest
		for _, p := range problems {
			res.Problems = append(res.Problems, p.Error())
		}
		return res
	}
	rl.recordChecked(next)
	changes, restart := rl.plan(next)
	if len(restart) > 0 {
		res.Status = http.StatusConflict
		res.Problems = restart
		return res
	}
	if len(changes) > 0 && rl.shuttingDown() {
		// The shutdown began while the file was read and checked.
		res.Status = http.StatusServiceUnavailable
		res.Problems = []string{errShuttingDown}
		return res
	}
	for _, c := range changes {
		if c.apply == nil { // a record only: nothing to change
			c.applied()
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, reloadTimeout)
		err := c.apply(cctx, c.dep)
		cancel()
		var (
			pending *startPendingError
			untaken *untakenError
			refused *refusedTargetsError
		)
		errors.As(err, &refused)
		switch {
		case errors.As(err, &pending):
			res.Applied = append(res.Applied, fmt.Sprintf("%s (some replicas not started yet, retried in the background: %v)", c.what, pending.err))
			continue
		case errors.As(err, &untaken), refused != nil && refused.rest == nil:
			// Made, and recorded: the replicas that missed the
			// user_config get it again at each health check.
			res.Applied = append(res.Applied, fmt.Sprintf("%s (%v)", c.what, err))
			res.Partial = append(res.Partial, fmt.Sprintf("%s: %v", c.what, err))
			c.applied()
			continue
		case refused != nil:
			// Some targets not connected, others connected whose
			// replicas refused the user_config: each where it belongs.
			res.Partial = append(res.Partial, fmt.Sprintf("%s: %v", c.what, refused))
			res.Failed = append(res.Failed, fmt.Sprintf("%s: %v", c.what, refused.rest))
			res.Applied = append(res.Applied, c.what+" (all but the targets that failed)")
			c.applied()
			continue
		case err != nil:
			res.Failed = append(res.Failed, fmt.Sprintf("%s: %v", c.what, err))
			if c.partial {
				// The rest of the list was made: say so. The list is the
				// deployment's now, the failed targets retried at each
				// health check, and recorded as its: the next file is
				// compared with it. (Unrecorded, a target that then
				// connected and was taken out of the file again stayed:
				// the file matched the last list recorded, a tester.)
				res.Applied = append(res.Applied, c.what+" (all but the targets that failed)")
				c.applied()
			}
			continue
		}
		if c.applied != nil {
			c.applied()
		}
		res.Applied = append(res.Applied, c.what)
	}
	switch {
	case len(res.Failed) > 0:
		res.Status = http.StatusInternalServerError
	case len(res.Partial) > 0:
		res.Status = http.StatusMultiStatus // as PUT .../user_config
	}
	return res
}

// refusedTargetsError is a list of targets made whose new targets'
// replicas, connected, did not all take the user_config; rest is the
// error of the targets that could not be connected to, if any.
type refusedTargetsError struct {
	refused []*replica.ConfigRefusedError
	rest    error
}

// Error implements error: the refusals (rest is said apart).
func (e *refusedTargetsError) Error() string {
	msgs := make([]string, len(e.refused))
	for i, r := range e.refused {
		msgs[i] = r.Error()
	}
	return strings.Join(msgs, "; ")
}

// untakenError is a user_config change that some replicas have not taken
// and that is not replacing them (see proxy.Deployment.Untaken).
type untakenError struct{ untaken, of int }

func (e *untakenError) Error() string {
	return fmt.Sprintf("%d of %d replicas have not taken it, and were not replaced: they are given it again at each health check, or when their host reconnects", e.untaken, e.of)
}

// checkedBefore reports whether application app's deployment d, under
// the handler it runs, has a user_config that the handler's factory was
// last asked about and took (at the start or at the last reload): a
// reload checks only what the file changed.
func (rl *reloader) checkedBefore(app string, d config.Deployment) bool {
	i, j, ok := rl.index(app, d.Name)
	if !ok {
		return false
	}
	cd := rl.running.Applications[i].Deployments[j]
	if cd.Handler != d.Handler || cd.HostHandler != d.HostHandler {
		return false
	}
	same, err := replica.SameUserConfig(rl.checked[i][j], d.UserConfig)
	return err == nil && same
}

// recordChecked records next's user_configs, which loadConfig found good,
// as checked (see checkedBefore).
func (rl *reloader) recordChecked(next *config.Config) {
	for _, a := range next.Applications {
		for _, d := range a.Deployments {
			i, j, ok := rl.index(a.Name, d.Name)
			if !ok {
				continue
			}
			if cd := rl.running.Applications[i].Deployments[j]; cd.Handler == d.Handler && cd.HostHandler == d.HostHandler {
				rl.checked[i][j] = d.UserConfig
			}
		}
	}
}

// index returns the indices of application app's deployment dep in the
// running config.
func (rl *reloader) index(app, dep string) (i, j int, ok bool) {
	for i, a := range rl.running.Applications {
		if a.Name != app {
			continue
		}
		for j, d := range a.Deployments {
			if d.Name == dep {
				return i, j, true
			}
		}
	}
	return 0, 0, false
}

// startPendingError is a scale that set num_replicas but could not start
// every replica yet.
type startPendingError struct{ err error }

func (e *startPendingError) Error() string { return e.err.Error() }

// liveFields are the deployment fields a reload changes in place.
var liveFields = []string{"user_config", "num_replicas", "max_ongoing_requests", "upstreams", "hosts", "health_check_period_s", "health_check_timeout_s", "graceful_shutdown_timeout_s"}

// plan compares next with what runs: the live changes to make, or the
// changes that take a restart, one line each naming the field.
func (rl *reloader) plan(next *config.Config) (changes []change, restart []string) {
	cur := rl.running
	needs := func(field, what string) {
		restart = append(restart, fieldError(next, rl.path, field, fmt.Errorf("%s; that takes a restart (a reload changes user_config, num_replicas of in-process and command deployments, max_ongoing_requests of all but replica hosts', upstreams, hosts, health_check_period_s, health_check_timeout_s and graceful_shutdown_timeout_s)", what)).Error())
	}
	for _, f := range changedFields(cur.HTTPOptions, next.HTTPOptions) {
		needs("http_options."+f.name, f.what())
	}
	if len(next.Applications) != len(cur.Applications) {
		needs("applications", fmt.Sprintf("%d applications in the file, %d running%s", len(next.Applications), len(cur.Applications), appsDiff(cur, next)))
		return nil, restart
	}
	// Applications are known by name, as in Serve: their order in the
	// file changes nothing.
	running := make(map[string]int, len(cur.Applications))
	for i, a := range cur.Applications {
		running[a.Name] = i
	}
	for ni, na := range next.Applications {
		af := fmt.Sprintf("applications[%d]", ni)
		i, ok := running[na.Name]
		if !ok {
			needs(af+".name", fmt.Sprintf("%q is no application that runs (they are %s): adding, removing or renaming one", na.Name, appNames(cur)))
			continue
		}
		ca := cur.Applications[i]
		if na.RoutePrefix != ca.RoutePrefix {
			needs(af+".route_prefix", fmt.Sprintf("%q, running %q", na.RoutePrefix, ca.RoutePrefix))
		}
		if len(na.Deployments) != len(ca.Deployments) {
			needs(af+".deployments", fmt.Sprintf("%d deployments in the file, %d running", len(na.Deployments), len(ca.Deployments)))
			continue
		}
		for j, nd := range na.Deployments {
			cd := ca.Deployments[j]
			df := fmt.Sprintf("%s.deployments[%d]", af, j)
			if nd.Name != cd.Name {
				needs(df+".name", fmt.Sprintf("%q, running %q", nd.Name, cd.Name))
				continue
			}
			for _, f := range changedFields(cd, nd, liveFields...) {
				needs(df+"."+f.name, f.what())
			}
			if nd.Handler == config.HandlerHost && nd.NumReplicas != cd.NumReplicas {
				// The hosts' actors per host: they read it when they
				// start, and the proxy learns them when it connects.
				needs(df+".num_replicas", fmt.Sprintf("changed from %d to %d; the replica hosts read it when they start, and the proxy learns their actors when it connects", cd.NumReplicas, nd.NumReplicas))
			}
			if nd.Handler == config.HandlerHost && nd.MaxOngoingRequests != cd.MaxOngoingRequests {
				// Each actor enforces its own, authoritatively.
				needs(df+".max_ongoing_requests", fmt.Sprintf("%d, running %d; the replica hosts' actors enforce their own, read when the hosts start (replica -max-ongoing)", nd.MaxOngoingRequests, cd.MaxOngoingRequests))
			}
			if nd.Handler != cd.Handler {
				continue // what is live differs too
			}
			cs, problem := rl.deploymentChanges(next, i, j, nd, df)
			if problem != "" {
				restart = append(restart, problem)
			}
			changes = append(changes, cs...)
		}
	}
	if len(restart) > 0 {
		return nil, restart
	}
	return changes, nil
}

// appsDiff names the applications next adds to cur and those it removes,
// as ": adds "b"; removes "c"" (empty if it does neither).
func appsDiff(cur, next *config.Config) string {
	missing := func(from, in *config.Config) []string {
		var names []string
		for _, a := range from.Applications {
			if !slices.ContainsFunc(in.Applications, func(b config.Application) bool { return b.Name == a.Name }) {
				names = append(names, strconv.Quote(a.Name))
			}
		}
		return names
	}
	var parts []string
	if added := missing(next, cur); len(added) > 0 {
		parts = append(parts, "adds "+strings.Join(added, ", "))
	}
	if removed := missing(cur, next); len(removed) > 0 {
		parts = append(parts, "removes "+strings.Join(removed, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, "; ")
}

// appNames lists c's application names, quoted.
func appNames(c *config.Config) string {
	names := make([]string, len(c.Applications))
	for i, a := range c.Applications {
		names[i] = strconv.Quote(a.Name)
	}
	return strings.Join(names, ", ")
}

// deploymentChanges are the live changes that make running deployment
// [i][j] match nd, its entry in next (field df).
func (rl *reloader) deploymentChanges(next *config.Config, i, j int, nd config.Deployment, df string) ([]change, string) {
	dep := rl.apps[i].Deployments[j]
	spec := dep.Spec()
	name := fmt.Sprintf("application %q deployment %q", spec.App, spec.Name)
	var out []change
	if n := nd.MaxOngoingRequests; n != spec.MaxOngoingRequests && nd.Handler != config.HandlerHost {
		// Before the targets and a scale: the replicas they bring join
		// with it, and take no queued request under the old one.
		out = append(out, change{dep: dep,
			what:  fmt.Sprintf("%s: max_ongoing_requests from %d to %d", name, spec.MaxOngoingRequests, n),
			apply: func(_ context.Context, d *proxy.Deployment) error { return d.SetMaxOngoing(n) }})
	}
	// Then the targets: replicas a new upstream or host brings get the
	// reconfigure that follows.
	if list := staticTargets(nd); list != nil && !sameTargets(list, rl.targets[i][j]) {
		field := "upstreams"
		if nd.Handler == config.HandlerHost {
			field = "hosts"
		}
		out = append(out, change{dep: dep, what: fmt.Sprintf("%s: %s %v", name, field, list),
			apply: func(_ context.Context, d *proxy.Deployment) error {
				err := d.SetTargets(list)
				if refused, rest := replica.SplitConfigRefused(err); len(refused) > 0 {
					return &refusedTargetsError{refused: refused, rest: rest}
				}
				return err
			},
			applied: func() { rl.targets[i][j] = list }, partial: true})
	}
	// The file cannot give these a user_config, or never gave this one
	// any (the admin API can): what runs stays.
	fileHasNone := nd.Handler == config.HandlerUpstream || nd.Handler == config.HandlerHost && nd.HostHandler == "" ||
		nd.UserConfig == nil && !rl.fileConfigs[i][j]
	switch same, err := replica.SameUserConfig(spec.UserConfig, nd.UserConfig); {
	case fileHasNone:
	case err != nil:
		return nil, fieldError(next, rl.path, df+".user_config", err).Error()
	case same:
		if nd.UserConfig != nil { // the file gives it now: taking it out later is a removal
			out = append(out, change{applied: func() { rl.fileConfigs[i][j] = true }})
		}
	case nd.UserConfig == nil:
		return nil, fieldError(next, rl.path, df+".user_config",
			errors.New("removed, and a reload cannot take a user_config away: give the one the replicas should have, or restart")).Error()
	default:
		uc := nd.UserConfig
		out = append(out, change{dep: dep, what: name + ": user_config " + string(compactJSON(uc)),
			apply: func(ctx context.Context, d *proxy.Deployment) error {
				// loadConfig had the factory check it.
				results, err := d.ReconfigureChecked(ctx, uc)
				if n := d.Untaken(results, err); n > 0 {
					return &untakenError{untaken: n, of: len(results)}
				}
				return err
			},
			applied: func() { rl.fileConfigs[i][j] = true }})
	}
	if period, timeout := nd.HealthCheckPeriod(), nd.HealthCheckTimeout(); period != spec.HealthCheckPeriod || timeout != spec.HealthCheckTimeout {
		// Before a scale, whose new replicas' starts the timeout bounds.
		var what []string
		if period != spec.HealthCheckPeriod {
			what = append(what, fmt.Sprintf("health_check_period_s from %v to %v", spec.HealthCheckPeriod.Seconds(), period.Seconds()))
		}
		if timeout != spec.HealthCheckTimeout {
			what = append(what, fmt.Sprintf("health_check_timeout_s from %v to %v", spec.HealthCheckTimeout.Seconds(), timeout.Seconds()))
		}
		out = append(out, change{dep: dep, what: name + ": " + strings.Join(what, ", "),
			apply: func(_ context.Context, d *proxy.Deployment) error { return d.SetHealthChecks(period, timeout) }})
	}
	if grace := nd.GracefulShutdownTimeout(); grace != spec.GracefulShutdownTimeout {
		// Before a scale, whose retired replicas drain for it.
		out = append(out, change{dep: dep,
			what:  fmt.Sprintf("%s: graceful_shutdown_timeout_s from %v to %v", name, spec.GracefulShutdownTimeout.Seconds(), grace.Seconds()),
			apply: func(_ context.Context, d *proxy.Deployment) error { return d.SetGracefulShutdownTimeout(grace) }})
	}
	if dep.Replaces() && nd.NumReplicas != spec.NumReplicas {
		n := nd.NumReplicas
		out = append(out, change{dep: dep, what: fmt.Sprintf("%s: num_replicas from %d to %d", name, spec.NumReplicas, n),
			apply: func(ctx context.Context, d *proxy.Deployment) error {
				err := d.Scale(ctx, n)
				if err != nil && !errors.Is(err, replica.ErrStopped) {
					// num_replicas is n now: what did not start is retried
					// in the background.
					return &startPendingError{err}
				}
				return err
			}})
	}
	return out, ""
}

// sameTargets reports whether a and b list the same targets, in any order
// and whatever a trailing slash.
func sameTargets(a, b []string) bool {
	norm := func(l []string) []string {
		out := make([]string, len(l))
		for i, t := range l {
			out[i] = strings.TrimRight(t, "/")
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(norm(a), norm(b))
}

// fieldChange is a field that differs between what runs and the file.
type fieldChange struct {
	name     string // its YAML name
	from, to string // the values, as showValue writes them; "" when not shown
}

// what says what changed, for a reload's refusal.
func (c fieldChange) what() string {
	if c.from == "" {
		return "changed" // not shown: see scalar
	}
	return fmt.Sprintf("changed from %s to %s", c.from, c.to)
}

// changedFields returns the exported fields of a and b, structs of one
// type, that differ, except those in skip (YAML names), with both values:
// "changed" alone left the user to find what they had changed.
func changedFields(a, b any, skip ...string) []fieldChange {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []fieldChange
	for i := range va.NumField() {
		f := va.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" || slices.Contains(skip, name) {
			continue
		}
		fa, fb := va.Field(i), vb.Field(i)
		if reflect.DeepEqual(fa.Interface(), fb.Interface()) || emptyList(fa) && emptyList(fb) {
			continue
		}
		c := fieldChange{name: name}
		if scalar(fa) {
			c.from, c.to = showValue(fa), showValue(fb)
		}
		out = append(out, c)
	}
	return out
}

// emptyList reports whether v is a nil or empty slice or map: a list the
// file leaves out and one it writes as [] are the same.
func emptyList(v reflect.Value) bool {
	return (v.Kind() == reflect.Slice || v.Kind() == reflect.Map) && v.Len() == 0
}

// scalar reports whether v is a value a refusal may show: a number, a
// bool, a string. Lists and structs (a command's arguments, env, TLS
// files) may hold secrets, and go to the log and the answer: those are
// named, not shown.
func scalar(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64, reflect.String:
		return true
	}
	return false
}

// showValue writes a scalar config value for a log line: a string quoted,
// anything else as %v.
func showValue(v reflect.Value) string {
	if v.Kind() == reflect.String {
		return strconv.Quote(v.String())
	}
	return fmt.Sprintf("%v", v.Interface())
}

// compactJSON is b without its spaces, for a log line.
func compactJSON(b json.RawMessage) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}
