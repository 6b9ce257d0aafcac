// Package config holds serveproxy's settings: the Serve-shaped YAML config
// file (applications, their deployments and the HTTP options) and the
// PROXY_* environment variables, with their defaults and validation.
//
// It is plain data. The binary turns a Config into running parts; nothing
// here starts, dials or listens.
package config

import (
	"encoding/json"
	"math"
	"strings"
	"time"
)

// Config is a Serve-shaped config file.
type Config struct {
	// HTTPOptions are the ingress server's settings.
	HTTPOptions HTTPOptions `yaml:"http_options"`
	// Applications are served side by side, each at its own route prefix.
	// There is at least one.
	Applications []Application `yaml:"applications"`

	// lines maps field paths (as FieldError.Field spells them) to their
	// line in the file Parse read; nil for configs built in Go.
	lines map[string]int
	// overridden lists the file's http_options the environment overrode
	// (see Env.overrides), for Warnings.
	overridden []FieldError
}

// UserConfigField is the path of key within the user_config at field, as
// Line knows it (quoted when no plain name), or field itself when the file
// does not hold that key at the top level of the user_config.
func (c *Config) UserConfigField(field, key string) string {
	k := fieldPath{{key: key}}.String()
	if _, ok := c.lines[field+"."+k]; ok {
		return field + "." + k
	}
	return field
}

// Line returns the line of the file on which field (a path such as
// "applications[0].deployments[1].handler") or its nearest enclosing field
// is written, or 0 when the config did not come from a file.
func (c *Config) Line(field string) int {
	for c.lines != nil && field != "" {
		if l, ok := c.lines[field]; ok {
			return l
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// HTTPOptions are the ingress server's settings, named as in Ray Serve's
// http_options.
type HTTPOptions struct {
	// Host is the address to listen on; "127.0.0.1" by default.
	Host string `yaml:"host"`
	// Port is the TCP port to listen on, 0 to 65535, where 0 picks a free
	// port; 8000 by default.
	Port int `yaml:"port"`
	// RequestTimeoutS bounds a whole request, in seconds; 0, the default,
	// means no timeout, as in Serve.
	RequestTimeoutS float64 `yaml:"request_timeout_s"`
	// KeepAliveTimeoutS is how long an idle client connection is kept
	// open, in seconds; 90 by default, as in Serve.
	KeepAliveTimeoutS float64 `yaml:"keep_alive_timeout_s"`
}

// Application is a set of deployments reached through one route prefix.
type Application struct {
	// Name identifies the application; it is required and unique.
	Name string `yaml:"name"`
	// RoutePrefix is the path prefix the application serves, "/" by
	// default. It starts with "/", does not end with "/" (unless it is
	// "/"), is unique across applications, holds no "?", "#" or white
	// space, and does not fall under "/-/", which the proxy keeps for its
	// own endpoints.
	RoutePrefix string `yaml:"route_prefix"`
	// Deployments are the application's deployments; there is at least
	// one, and the first is the ingress that receives its HTTP requests.
	Deployments []Deployment `yaml:"deployments"`
}

// Deployment is a group of identical replicas running one handler.
type Deployment struct {
	// Name identifies the deployment within its application; it is
	// required and unique there.
	Name string `yaml:"name"`
	// Handler names the kind of replica to run. It is required; which
	// names exist is up to the registry of the binary that runs the config.
	Handler string `yaml:"handler"`
	// NumReplicas is how many replicas to run, at least 1; 1 by default.
	NumReplicas int `yaml:"num_replicas"`
	// MaxOngoingRequests is how many requests one replica serves at
	// once, at least 1; 5 by default.
	MaxOngoingRequests int `yaml:"max_ongoing_requests"`
	// MaxQueuedRequests is how many requests may wait for a free replica
	// before new ones are shed with 503; -1, the default, means no limit,
	// and any other value is at least 1.
	MaxQueuedRequests int `yaml:"max_queued_requests"`
	// HealthCheckPeriodS is the time between health checks of a replica,
	// in seconds, above 0; 10 by default.
	HealthCheckPeriodS float64 `yaml:"health_check_period_s"`
	// HealthCheckTimeoutS is how long a health check may take, in
	// seconds, above 0; 30 by default.
	HealthCheckTimeoutS float64 `yaml:"health_check_timeout_s"`
	// GracefulShutdownTimeoutS is how long a stopping replica may finish
	// its ongoing requests, in seconds, 0 or more; 20 by default.
	GracefulShutdownTimeoutS float64 `yaml:"graceful_shutdown_timeout_s"`
	// UserConfig is passed to the replicas' reconfigure call. It is a JSON
	// object (a YAML mapping in the file), or nil when the file has none.
	UserConfig json.RawMessage `yaml:"user_config"`
	// MaxConstructorRetryCount is how many rounds of replica starts in a
	// row may start none before the deployment stops trying and is marked
	// unhealthy, at least 1; 20 by default, as in Serve.
	MaxConstructorRetryCount int `yaml:"max_constructor_retry_count"`

	// Upstreams are the base URLs (http or https, no query) of the HTTP
	// servers that are the replicas of handler "upstream", one replica
	// each. Give either Upstreams or Discovery.
	Upstreams []string `yaml:"upstreams"`
	// Discovery finds the replicas of handler "upstream", or the replica
	// hosts of handler "host", in DNS: "dns://name:port" (A and AAAA
	// records) or "dns+srv://_svc._tcp.name" (SRV records), resolved
	// again every DiscoveryIntervalS.
	Discovery string `yaml:"discovery"`
	// DiscoveryIntervalS is the time between resolutions, in seconds,
	// above 0; 10 by default.
	DiscoveryIntervalS float64 `yaml:"discovery_interval_s"`
	// DiscoveryServer is the DNS server Discovery asks, host:port; the
	// system's resolvers (/etc/resolv.conf) if empty.
	DiscoveryServer string `yaml:"discovery_server"`
	// ReplicaTimeoutS bounds, for the handlers that forward (upstream,
	// command, host), the wait for a replica to begin its answer once it
	// has the request, in seconds: past it the answer is 504. 0, the
	// default, means no bound (the request's own timeout still holds).
	ReplicaTimeoutS float64 `yaml:"replica_timeout_s"`
	// HealthCheckPath is the path a replica of handler "upstream" or
	// "command" answers health checks on, with any 2xx; "/-/healthz" by
	// default.
	HealthCheckPath string `yaml:"health_check_path"`
	// UpstreamHost, for handler "upstream", is the Host header its
	// replicas get (nginx's proxy_set_header Host), for a server that
	// routes by virtual host; if empty, the client's Host goes on, as
	// HAProxy and Go's ReverseProxy pass it. X-Forwarded-Host keeps the
	// client's either way.
	UpstreamHost string `yaml:"upstream_host"`

	// Command is the program and arguments of handler "command": the
	// proxy starts NumReplicas of them, each with PORT and REPLICA_ID in
	// its environment (and $(PORT), $(REPLICA_ID) in the arguments
	// replaced by them), and forwards requests to 127.0.0.1:PORT.
	Command []string `yaml:"command"`
	// Env is added to the environment of handler "command", KEY=VALUE each.
	Env []string `yaml:"env"`
	// WorkingDir is the working directory of handler "command"; the
	// proxy's if empty.
	WorkingDir string `yaml:"working_dir"`

	// Hosts are the replica hosts (cmd/replica) whose actors are the
	// replicas of handler "host", as host:port each; each actor's limit is
	// its host's. Give either Hosts or Discovery.
	Hosts []string `yaml:"hosts"`
	// HostHandler, for handler "host", is the registered handler kind each
	// host runs when started from this file (cmd/replica -config FILE
	// -deployment APP/NAME): NumReplicas actors per host, of
	// MaxOngoingRequests each, given UserConfig. Empty: the hosts are
	// configured by their own flags.
	HostHandler string `yaml:"host_handler"`
	// HostTLS, for handler "host", is TLS to the hosts; nil for plain TCP.
	HostTLS *HostTLS `yaml:"host_tls"`
}

// The handler kinds that are not in-process handlers: the proxy forwards
// their requests over HTTP.
const (
	// HandlerUpstream is any HTTP server as a replica (Upstreams or
	// Discovery).
	HandlerUpstream = "upstream"
	// HandlerCommand is a process the proxy starts per replica (Command).
	HandlerCommand = "command"
	// HandlerHost is the actors of replica hosts of this project (Hosts
	// or Discovery).
	HandlerHost = "host"
)

// RequestTimeout returns RequestTimeoutS as a duration; 0 means no timeout.
func (o HTTPOptions) RequestTimeout() time.Duration { return seconds(o.RequestTimeoutS) }

// KeepAliveTimeout returns KeepAliveTimeoutS as a duration.
func (o HTTPOptions) KeepAliveTimeout() time.Duration { return seconds(o.KeepAliveTimeoutS) }

// HealthCheckPeriod returns HealthCheckPeriodS as a duration.
func (d Deployment) HealthCheckPeriod() time.Duration { return seconds(d.HealthCheckPeriodS) }

// HealthCheckTimeout returns HealthCheckTimeoutS as a duration.
func (d Deployment) HealthCheckTimeout() time.Duration { return seconds(d.HealthCheckTimeoutS) }

// ReplicaTimeout returns ReplicaTimeoutS as a duration; 0 means none.
func (d Deployment) ReplicaTimeout() time.Duration { return seconds(d.ReplicaTimeoutS) }

// DiscoveryInterval returns DiscoveryIntervalS as a duration.
func (d Deployment) DiscoveryInterval() time.Duration { return seconds(d.DiscoveryIntervalS) }

// GracefulShutdownTimeout returns GracefulShutdownTimeoutS as a duration.
func (d Deployment) GracefulShutdownTimeout() time.Duration {
	return seconds(d.GracefulShutdownTimeoutS)
}

// maxSeconds is the largest whole number of seconds a time.Duration holds
// (about 292 years); validation keeps every *_s field at or below it.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// seconds converts a number of seconds to a duration. Validate keeps the
// fields in range; the clamping only keeps an unvalidated value from
// wrapping around, since out-of-range float conversions are unspecified.
func seconds(s float64) time.Duration {
	switch {
	case s != s || s <= 0: // NaN or not positive
		return 0
	case s >= float64(maxSeconds):
		return time.Duration(maxSeconds) * time.Second
	}
	return time.Duration(s * float64(time.Second))
}
