package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// Validate checks c against the same rules Parse applies to a file, and
// returns every problem found as Errors, or nil. It is for configs built in
// Go, such as Default(); the errors carry field paths but no lines.
func (c *Config) Validate() error {
	var v validator
	v.config(c)
	if len(v.problems) == 0 {
		return nil
	}
	errs := make(Errors, len(v.problems))
	for i, p := range v.problems {
		errs[i] = FieldError{Field: p.path.String(), Msg: p.msg}
	}
	return errs
}

// problem is a rule broken at path.
type problem struct {
	path fieldPath
	msg  string
}

// validator holds the one rule set, shared by Validate and Parse.
type validator struct {
	// skip holds the paths the decoder already reported: a value that
	// could not be decoded kept its default, so rules about it, or about
	// anything under it, would only repeat the report or be wrong.
	skip []fieldPath

	problems []problem
}

func (v *validator) skipped(p fieldPath) bool {
	for _, s := range v.skip {
		if p.within(s) {
			return true
		}
	}
	return false
}

func (v *validator) report(p fieldPath, format string, args ...any) {
	if v.skipped(p) {
		return
	}
	v.problems = append(v.problems, problem{path: p, msg: fmt.Sprintf(format, args...)})
}

func (v *validator) config(c *Config) {
	v.httpOptions(&c.HTTPOptions, fieldPath{}.child("http_options"))

	apps := fieldPath{}.child("applications")
	if len(c.Applications) == 0 {
		v.report(apps, "at least one application is required")
		return
	}
	names := make(map[string]int)
	prefixes := make(map[string]string) // route prefix to application name
	for i := range c.Applications {
		a := &c.Applications[i]
		p := apps.at(i)
		v.application(a, p)

		if np := p.child("name"); a.Name != "" && !v.skipped(np) {
			if j, dup := names[a.Name]; dup {
				v.report(np, "duplicate application name %q (also used by applications[%d])", a.Name, j)
			} else {
				names[a.Name] = i
			}
		}
		if rp := p.child("route_prefix"); routePrefixProblem(a.RoutePrefix) == "" && !v.skipped(rp) {
			if other, dup := prefixes[a.RoutePrefix]; dup {
				v.report(rp, "duplicate route_prefix %q (also used by application %q)", a.RoutePrefix, other)
			} else {
				prefixes[a.RoutePrefix] = a.Name
			}
		}
	}
}

func (v *validator) httpOptions(o *HTTPOptions, p fieldPath) {
	if o.Port < 0 || o.Port > 65535 {
		v.report(p.child("port"), "must be between 0 and 65535, got %d", o.Port)
	}
	v.seconds(p.child("request_timeout_s"), o.RequestTimeoutS, true)
	v.seconds(p.child("keep_alive_timeout_s"), o.KeepAliveTimeoutS, false)
}

func (v *validator) application(a *Application, p fieldPath) {
	if a.Name == "" {
		v.report(p.child("name"), "is required")
	}
	if msg := routePrefixProblem(a.RoutePrefix); msg != "" {
		v.report(p.child("route_prefix"), "%s, got %q", msg, a.RoutePrefix)
	}

	deps := p.child("deployments")
	if len(a.Deployments) == 0 {
		v.report(deps, "at least one deployment is required (the first is the ingress)")
		return
	}
	names := make(map[string]int)
	for i := range a.Deployments {
		d := &a.Deployments[i]
		dp := deps.at(i)
		v.deployment(d, dp)
		if np := dp.child("name"); d.Name != "" && !v.skipped(np) {
			if j, dup := names[d.Name]; dup {
				v.report(np, "duplicate deployment name %q (also used by deployments[%d])", d.Name, j)
			} else {
				names[d.Name] = i
			}
		}
	}
}

// routePrefixProblem returns what is wrong with prefix, or "".
func routePrefixProblem(prefix string) string {
	switch {
	case !strings.HasPrefix(prefix, "/"):
		return `must start with "/"`
	case prefix != "/" && strings.HasSuffix(prefix, "/"):
		return `must not end with "/" unless it is "/"`
	case strings.ContainsFunc(prefix, func(r rune) bool {
		return r == '?' || r == '#' || unicode.IsSpace(r) || unicode.IsControl(r)
	}):
		return `must not contain "?", "#", white space or control characters`
	case prefix == "/-" || strings.HasPrefix(prefix, "/-/"):
		// "/-" itself would match "/-/healthz" on a "/" boundary.
		return `must not be "/-" or start with "/-/", which are reserved for the proxy's own endpoints`
	case strings.Contains(prefix, "%"):
		// Routes match the decoded path: an escape could never match.
		return `must not contain "%": routes match the decoded path`
	case strings.Contains(prefix, "//") || slices.Contains(strings.Split(prefix, "/"), ".") || slices.Contains(strings.Split(prefix, "/"), ".."):
		// A backend that cleans paths would see another route's path.
		return `must not contain empty, "." or ".." segments`
	}
	return ""
}

// MaxNumReplicas bounds num_replicas, in the file and when scaling live:
// a typo must not start a hundred million replicas.
const MaxNumReplicas = 10000

func (v *validator) deployment(d *Deployment, p fieldPath) {
	if d.Name == "" {
		v.report(p.child("name"), "is required")
	}
	if d.Handler == "" {
		v.report(p.child("handler"), "is required")
	}
	if d.NumReplicas < 1 || d.NumReplicas > MaxNumReplicas {
		v.report(p.child("num_replicas"), "must be in [1, %d], got %d", MaxNumReplicas, d.NumReplicas)
	}
	if d.MaxOngoingRequests < 1 {
		v.report(p.child("max_ongoing_requests"), "must be >= 1, got %d", d.MaxOngoingRequests)
	}
	if q := d.MaxQueuedRequests; q != -1 && q < 1 {
		v.report(p.child("max_queued_requests"), "must be -1 (no limit) or >= 1, got %d", q)
	}
	v.seconds(p.child("health_check_period_s"), d.HealthCheckPeriodS, false)
	v.seconds(p.child("health_check_timeout_s"), d.HealthCheckTimeoutS, false)
	v.seconds(p.child("graceful_shutdown_timeout_s"), d.GracefulShutdownTimeoutS, true)
	if d.UserConfig != nil && !isJSONObject(d.UserConfig) {
		v.report(p.child("user_config"), "must be a mapping (a JSON object)")
	}
}

// seconds checks a duration field: above 0, or at least 0 when zeroOK, and
// small enough for a time.Duration. NaN fails both comparisons.
func (v *validator) seconds(p fieldPath, s float64, zeroOK bool) {
	low, ok := ">", s > 0
	if zeroOK {
		low, ok = ">=", s >= 0
	}
	if !ok || s > float64(maxSeconds) {
		v.report(p, "must be %s 0 and <= %d seconds, got %v", low, maxSeconds, s)
	}
}

func isJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
