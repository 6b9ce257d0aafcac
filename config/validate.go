package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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
	// given reports whether the file wrote a field; nil for configs built
	// in Go, whose fields all count as given only when not zero.
	given func(fieldPath) bool

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
	switch {
	case o.Host == "" && v.given != nil && v.given(p.child("host")):
		// net.Listen takes "" for every interface: too much to open by
		// an empty value in a file. (PROXY_HTTP_ADDR=:8000 says it as
		// Go does, on purpose.)
		v.report(p.child("host"), `must not be empty: "0.0.0.0" listens on every interface, "127.0.0.1" (the default) on this machine only`)
	case !validHost(o.Host):
		v.report(p.child("host"), "must be an IP address or a host name, got %q", o.Host)
	}
	if o.Port < 0 || o.Port > 65535 {
		v.report(p.child("port"), "must be between 0 and 65535, got %d", o.Port)
	}
	v.seconds(p.child("request_timeout_s"), o.RequestTimeoutS, true)
	v.seconds(p.child("keep_alive_timeout_s"), o.KeepAliveTimeoutS, false)
}

func (v *validator) application(a *Application, p fieldPath) {
	if msg := nameProblem(a.Name); msg != "" {
		v.report(p.child("name"), "%s", msg)
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
	case strings.Contains(prefix, "//") || HasDotSegment(prefix):
		// A backend that cleans paths would see another route's path.
		return `must not contain empty, "." or ".." segments`
	}
	return ""
}

// HasDotSegment reports whether path (decoded, so %2e%2e counts) has a
// "." or ".." segment. Segments end at a '\' too (%5c: IIS and others
// take it for '/'), and a segment's ";parameters" do not count (Tomcat
// and Spring resolve "..;x" as ".."). The proxy refuses a request whose
// path has one (400), and a route_prefix with one is refused too: no
// request could reach it.
func HasDotSegment(path string) bool {
	if strings.IndexByte(path, '.') < 0 {
		return false // most paths: 3 ns, not the loop's 40 (BenchmarkHasDotSegment)
	}
	for len(path) > 0 {
		i := strings.IndexAny(path, `/\`)
		seg := path
		if i >= 0 {
			seg, path = path[:i], path[i+1:]
		} else {
			path = ""
		}
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// MaxNumReplicas bounds num_replicas, in the file and when scaling live:
// a typo must not start a hundred million replicas.
const MaxNumReplicas = 10000

func (v *validator) deployment(d *Deployment, p fieldPath) {
	if msg := nameProblem(d.Name); msg != "" {
		v.report(p.child("name"), "%s", msg)
	}
	if d.Handler == "" {
		// A Ray Serve user's deployment has none: its code is the
		// application's import_path.
		v.report(p.child("handler"), "is required: a built-in (static, echo, sleep), %s, %s or %s for replicas outside the proxy, or one registered through the Go API",
			HandlerUpstream, HandlerCommand, HandlerHost)
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
	v.period(p.child("health_check_period_s"), d.HealthCheckPeriodS)
	v.seconds(p.child("health_check_timeout_s"), d.HealthCheckTimeoutS, false)
	v.seconds(p.child("graceful_shutdown_timeout_s"), d.GracefulShutdownTimeoutS, true)
	if d.UserConfig != nil && !isJSONObject(d.UserConfig) {
		v.report(p.child("user_config"), "must be a mapping (a JSON object)")
	}
	if d.MaxConstructorRetryCount < 1 {
		v.report(p.child("max_constructor_retry_count"), "must be >= 1, got %d", d.MaxConstructorRetryCount)
	}
	if d.HealthCheckPath == "" || d.HealthCheckPath[0] != '/' {
		v.report(p.child("health_check_path"), `must start with "/", got %q`, d.HealthCheckPath)
	}
	v.period(p.child("discovery_interval_s"), d.DiscoveryIntervalS)
	v.seconds(p.child("replica_timeout_s"), d.ReplicaTimeoutS, true)
	if d.UpstreamHost != "" && !validHostHeader(d.UpstreamHost) {
		v.report(p.child("upstream_host"), "must be a host name or address, with a port or not (api.example.com, 10.0.0.5:8000), got %q", d.UpstreamHost)
	}
	v.handlerKind(d, p)
}

// handlerKind checks the fields that belong to one handler kind: set for
// it, and not set for the others.
func (v *validator) handlerKind(d *Deployment, p fieldPath) {
	only := func(field, kind string, set bool) {
		if set && d.Handler != kind {
			v.report(p.child(field), "is only for handler %q", kind)
		}
	}
	discovers := func(field string, set bool) {
		if set && d.Handler != HandlerUpstream && d.Handler != HandlerHost {
			v.report(p.child(field), "is only for handlers %q and %q", HandlerUpstream, HandlerHost)
		}
	}
	only("upstreams", HandlerUpstream, d.Upstreams != nil)
	only("upstream_host", HandlerUpstream, d.UpstreamHost != "")
	discovers("discovery", d.Discovery != "")
	discovers("discovery_server", d.DiscoveryServer != "")
	// (A zero is reported as out of range already, not as misplaced.)
	intervalSet := d.DiscoveryIntervalS != 0 && v.wrote(p.child("discovery_interval_s"), d.DiscoveryIntervalS != defaultDiscoveryIntervalS)
	discovers("discovery_interval_s", intervalSet)
	if d.Discovery == "" && (d.Handler == HandlerUpstream || d.Handler == HandlerHost) {
		// Of a static list, nothing is resolved: set, they would be
		// ignored in silence (a tester).
		list := "hosts"
		if d.Handler == HandlerUpstream {
			list = "upstreams"
		}
		if d.DiscoveryServer != "" {
			v.report(p.child("discovery_server"), "applies only with discovery (a static %s list is not resolved)", list)
		}
		if intervalSet {
			v.report(p.child("discovery_interval_s"), "applies only with discovery (a static %s list is not resolved)", list)
		}
	}
	only("command", HandlerCommand, d.Command != nil)
	only("env", HandlerCommand, d.Env != nil)
	only("working_dir", HandlerCommand, d.WorkingDir != "")
	only("hosts", HandlerHost, d.Hosts != nil)
	only("host_handler", HandlerHost, d.HostHandler != "")
	only("host_tls", HandlerHost, d.HostTLS != nil)
	if d.Handler != HandlerUpstream && d.Handler != HandlerCommand && d.Handler != HandlerHost && d.ReplicaTimeoutS != 0 {
		v.report(p.child("replica_timeout_s"), "is only for the handlers that forward (upstream, command, host); in process, request_timeout_s bounds a request")
	}
	if d.Handler != HandlerUpstream && d.Handler != HandlerCommand {
		if v.wrote(p.child("health_check_path"), d.HealthCheckPath != defaultHealthCheckPath && d.HealthCheckPath != "") {
			v.report(p.child("health_check_path"), "is only for handlers %q and %q (in-process handlers check their health in Go)", HandlerUpstream, HandlerCommand)
		}
	}

	switch d.Handler {
	case HandlerUpstream:
		switch {
		case len(d.Upstreams) == 0 && d.Discovery == "":
			v.report(p.child("upstreams"), `handler "upstream" needs upstreams (a list of URLs) or discovery`)
		case len(d.Upstreams) > 0 && d.Discovery != "":
			v.report(p.child("discovery"), "give upstreams or discovery, not both")
		}
		seen := make(map[string]int)
		for i, u := range d.Upstreams {
			up := p.child("upstreams").at(i)
			// "http://h/base" and "http://h/base/" are one server, one
			// replica.
			key := strings.TrimRight(u, "/")
			if msg := upstreamURLProblem(u); msg != "" {
				v.report(up, "%s, got %q", msg, redactURL(u))
			} else if j, dup := seen[key]; dup {
				v.report(up, "duplicate upstream %q (also upstreams[%d])", u, j)
			} else {
				seen[key] = i
			}
		}
		v.discovery(d, p)
		if v.wrote(p.child("num_replicas"), d.NumReplicas != defaultNumReplicas) {
			v.report(p.child("num_replicas"), `is not for handler "upstream": each upstream (or discovered address) is one replica`)
		}
		if d.UserConfig != nil {
			v.report(p.child("user_config"), `is not for handler "upstream": an HTTP server has no reconfigure call`)
		}
	case HandlerHost:
		switch {
		case len(d.Hosts) == 0 && d.Discovery == "":
			v.report(p.child("hosts"), `handler "host" needs hosts (the host:port of each replica host, cmd/replica) or discovery`)
		case len(d.Hosts) > 0 && d.Discovery != "":
			v.report(p.child("discovery"), "give hosts or discovery, not both")
		}
		v.discovery(d, p)
		seen := make(map[string]int)
		for i, h := range d.Hosts {
			hp := p.child("hosts").at(i)
			if msg := hostPortProblem(h); msg != "" {
				v.report(hp, "%s, got %q", msg, h)
			} else if j, dup := seen[h]; dup {
				v.report(hp, "duplicate host %q (also hosts[%d])", h, j)
			} else {
				seen[h] = i
			}
		}
		if d.HostHandler == "" {
			// Without host_handler, the hosts' own flags say what they run.
			for _, f := range []struct {
				field   string
				changed bool
			}{
				{"num_replicas", d.NumReplicas != defaultNumReplicas},
				{"max_ongoing_requests", d.MaxOngoingRequests != defaultMaxOngoingRequests},
			} {
				if v.wrote(p.child(f.field), f.changed) {
					v.report(p.child(f.field), `is for handler "host" only with host_handler (what each host runs when started from this file); otherwise the hosts' flags set it`)
				}
			}
			if d.UserConfig != nil {
				v.report(p.child("user_config"), `is for handler "host" only with host_handler; otherwise give it to cmd/replica (-user-config), or PUT it to the running deployment`)
			}
		}
		if t := d.HostTLS; t != nil {
			// The files are the proxy's (cmd/proxy reads them at -check
			// and at start); a host started from this file never needs
			// them. Only their pairing is checked here.
			switch {
			case t.CertFile != "" && t.KeyFile == "":
				v.report(p.child("host_tls").child("key_file"), "required with cert_file: the certificate's key")
			case t.KeyFile != "" && t.CertFile == "":
				v.report(p.child("host_tls").child("cert_file"), "required with key_file: the key's certificate")
			}
			if d.Discovery != "" && t.ServerName == "" {
				v.report(p.child("host_tls").child("server_name"), "required with discovery: it finds the hosts as IP addresses, so give the name on their certificates")
			}
		}
		if slices.Contains([]string{HandlerHost, HandlerUpstream, HandlerCommand}, d.HostHandler) {
			v.report(p.child("host_handler"), "must be an in-process handler kind (static, echo, sleep, or one registered in Go), got %q", d.HostHandler)
		}
	case HandlerCommand:
		if len(d.Command) == 0 || d.Command[0] == "" {
			v.report(p.child("command"), `handler "command" needs command: the program and its arguments, a list`)
		}
		seen := make(map[string]int, len(d.Env))
		for i, e := range d.Env {
			k, _, ok := strings.Cut(e, "=")
			first, again := seen[k]
			switch {
			case !ok || k == "":
				v.report(p.child("env").at(i), "must be KEY=VALUE, got %q", e)
			case strings.IndexFunc(k, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
				v.report(p.child("env").at(i), "must be KEY=VALUE with no space or control character in the KEY, got %q", k)
			case k == "PORT" || k == "REPLICA_ID":
				v.report(p.child("env").at(i), "sets %s, which the proxy sets for each replica (use $(%s) in a value or an argument)", k, k)
			case again:
				// The last would win, in silence.
				v.report(p.child("env").at(i), "sets %s again (env[%d] sets it too)", k, first)
			default:
				seen[k] = i
			}
		}
		if d.UserConfig != nil {
			v.report(p.child("user_config"), `is not for handler "command": a process has no reconfigure call`)
		}
	}
}

// wrote reports whether the file wrote the field at p; for configs built
// in Go, whether it differs from its default (changed).
func (v *validator) wrote(p fieldPath, changed bool) bool {
	if v.given == nil {
		return changed
	}
	return v.given(p)
}

// nameProblem returns what is wrong with an application's or a
// deployment's name, or "". A name is a label value in every metric and a
// field of every log line: a control character would break a line or a
// dashboard's legend, and surrounding space makes two names that look the
// same. "/" is fine: the admin API takes it escaped (a%2Fb).
func nameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case !utf8.ValidString(name):
		return fmt.Sprintf("must be UTF-8, got %q", name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Sprintf("must not hold a control character, got %q", name)
	case strings.TrimSpace(name) != name:
		return fmt.Sprintf("must not begin or end with whitespace, got %q", name)
	}
	return ""
}

// hostPortProblem returns what is wrong with a replica host's address, or
// "".
func hostPortProblem(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return "must be host:port"
	}
	if !validPort(port) {
		return "must have a port between 1 and 65535"
	}
	if !validHost(host) {
		return fmt.Sprintf("%q is not an IP address or a host name", host)
	}
	return ""
}

// redactURL is s with any password in it replaced, for an error message.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}

// upstreamURLProblem returns what is wrong with an upstream's base URL, or "".
func upstreamURLProblem(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "must be a URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return `must be an http:// or https:// URL`
	case u.Host == "" || u.Hostname() == "":
		return "must name a host"
	case !validHost(u.Hostname()):
		return fmt.Sprintf("%q is not an IP address or a host name", u.Hostname())
	case u.User != nil:
		return "must not hold a user or password"
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "must not hold a query or fragment"
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "must have a port between 1 and 65535"
		}
	}
	return ""
}

// discovery checks d's discovery target, if it has one.
func (v *validator) discovery(d *Deployment, p fieldPath) {
	if d.Discovery == "" {
		return
	}
	if msg := discoveryProblem(d.Discovery); msg != "" {
		v.report(p.child("discovery"), "%s, got %q", msg, d.Discovery)
	}
	if d.DiscoveryServer != "" {
		if msg := hostPortProblem(d.DiscoveryServer); msg != "" {
			v.report(p.child("discovery_server"), "%s (a DNS server, 10.96.0.10:53), got %q", msg, d.DiscoveryServer)
		}
	}
}

// discoveryProblem returns what is wrong with a discovery target, or "".
func discoveryProblem(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return `must be dns://name:port or dns+srv://_service._tcp.name`
	}
	if (u.Scheme == "dns" || u.Scheme == "dns+srv") && (u.Opaque != "" || u.Host == "" && strings.HasPrefix(u.Path, "/")) {
		// dns:name:port and dns:///name:port: the name is not where
		// two slashes put it, whatever the port (a tester was told of
		// the port).
		return fmt.Sprintf(`must be %s://name..., the name right after the two slashes`, u.Scheme)
	}
	switch u.Scheme {
	case "dns":
		n, err := strconv.Atoi(u.Port())
		if u.Hostname() == "" || err != nil || n < 1 || n > 65535 {
			return `must be dns://name:port, with a port between 1 and 65535`
		}
	case "dns+srv":
		if u.Hostname() == "" || u.Port() != "" {
			return `must be dns+srv://_service._tcp.name, without a port (the SRV records give them)`
		}
	default:
		return `must be dns://name:port or dns+srv://_service._tcp.name`
	}
	if !validHost(u.Hostname()) {
		return fmt.Sprintf("%q is not a host name", u.Hostname())
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "must be only a scheme, a name and a port"
	}
	return ""
}

// seconds checks a duration field: above 0, or at least 0 when zeroOK, and
// small enough for a time.Duration. NaN fails both comparisons.
func (v *validator) seconds(p fieldPath, s float64, zeroOK bool) {
	low, ok := ">", s > 0
	if zeroOK {
		low, ok = ">=", s >= 0
	}
	switch {
	case !ok || s > float64(maxSeconds):
		v.report(p, "must be %s 0 and <= %d seconds, got %v", low, maxSeconds, s)
	case s > 0 && s < minSeconds && zeroOK:
		// Below a nanosecond it was 0, which is "none" where 0 is allowed.
		v.report(p, "must be 0 or at least %v seconds, got %v", minSeconds, s)
	case s > 0 && s < minSeconds:
		v.report(p, "must be at least %v seconds, got %v", minSeconds, s)
	}
}

// minSeconds is the shortest time in seconds the config takes, but 0.
const minSeconds = 0.001

// minPeriodS is the shortest period of a loop the config sets (health
// checks, discovery): a shorter one spins a core on an idle proxy.
const minPeriodS = 0.1

// period checks a loop's period in seconds.
func (v *validator) period(p fieldPath, s float64) {
	if s > 0 && s < minPeriodS {
		v.report(p, "must be at least %v seconds (a shorter period is a busy loop), got %v", minPeriodS, s)
		return
	}
	v.seconds(p, s, false)
}

func isJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// validHost reports whether h can be listened on or dialed: empty (every
// interface), an IP address, or a host name of letters, digits, hyphens,
// underscores (Go's resolver takes them, SRV names have them) and dots,
// whose last label is not a number if it has several: "300.1.1.1" is no
// address, and a resolver would only look it up and fail, at run time (a
// name of one label, "0" or a container's id, is the resolver's to find).
func validHost(h string) bool {
	if h == "" {
		return true
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	name := strings.TrimSuffix(h, ".")
	if len(name) > 253 {
		return false
	}
	dot := strings.LastIndexByte(name, '.')
	if last := name[dot+1:]; dot >= 0 && last != "" && strings.Trim(last, "0123456789") == "" {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// validHostHeader reports whether h is a Host header's value: a host
// name or an IP address (IPv6 in brackets, without a zone: a zone is the
// proxy's own business), then a port or not.
func validHostHeader(h string) bool {
	host, bracketed := h, strings.HasPrefix(h, "[")
	if hp, port, err := net.SplitHostPort(h); err == nil {
		if !validPort(port) {
			return false
		}
		host = hp
	} else if bracketed && strings.HasSuffix(h, "]") {
		host = h[1 : len(h)-1]
	} else if strings.Contains(h, ":") {
		return false // a bare IPv6 address, an empty port, a stray colon
	}
	if bracketed {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Is6() && a.Zone() == ""
	}
	return host != "" && validHost(host)
}

// validPort reports whether p is a port number, 1 to 65535, in digits only
// (strconv.Atoi takes a sign).
func validPort(p string) bool {
	if p == "" || len(p) > 5 || strings.Trim(p, "0123456789") != "" {
		return false
	}
	n, _ := strconv.Atoi(p)
	return n >= 1 && n <= 65535
}
