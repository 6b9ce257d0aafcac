package config

import (
	"encoding/json"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// withDeployment returns a one-deployment file whose deployment ends with
// extra, which starts at line 6.
func withDeployment(extra string) string {
	return `applications:
  - name: app
    deployments:
      - name: dep
        handler: echo
` + extra
}

// kindDeployment is withDeployment with another handler.
func kindDeployment(handler, extra string) string {
	return strings.Replace(withDeployment(extra), "handler: echo", "handler: "+handler, 1)
}

// parseErrors parses src, which must fail, and returns its Errors.
func parseErrors(t *testing.T, src string) Errors {
	t.Helper()
	c, err := Parse("test.yaml", []byte(src))
	if err == nil {
		t.Fatalf("Parse succeeded: %+v", c)
	}
	_ = c // what could be decoded, for more checks by the caller
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Parse error is %T, not Errors: %v", err, err)
	}
	return errs
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		field string
		line  int
		msg   string // part of the message
	}{
		// The file's shape.
		{"empty file", "", "applications", 0, "at least one application is required"},
		{"only comments", "# nothing\n", "applications", 0, "at least one application is required"},
		{"no applications", "http_options: {port: 1}\n", "applications", 0, "at least one application is required"},
		{"empty applications", "applications: []\n", "applications", 1, "at least one application is required"},
		{"null applications", "applications:\n", "applications", 1, "at least one application is required"},
		{"root not a mapping", "- a\n- b\n", "", 1, "must be a mapping, got a list"},
		{"two documents", minimalYAML + "---\nfoo: 1\n", "", 7, "one YAML document"},

		// Unknown fields, at every level.
		{"unknown top-level field", "version: 2\n" + minimalYAML, "version", 1, `unknown field; known fields are http_options, applications`},
		{"unknown http_options field", "http_options:\n  hots: x\n" + minimalYAML, "http_options.hots", 2, "unknown field"},
		{"unknown application field", "applications:\n  - name: a\n    prefix: /a\n    deployments: [{name: d, handler: h}]\n", "applications[0].prefix", 3, "known fields are name, route_prefix, deployments"},
		{"unknown deployment field", withDeployment("        replicas: 2\n"), "applications[0].deployments[0].replicas", 6, "unknown field"},
		{"a typo of a field", withDeployment("        num_replica: 2\n"), "applications[0].deployments[0].num_replica", 6, "unknown field (num_replicas?); known fields are"},

		// Ray Serve's own fields, each with what to do instead.
		{"serve proxy_location", "proxy_location: EveryNode\n" + minimalYAML, "proxy_location", 1, "a Ray Serve field this proxy does not take: where Ray runs its proxies"},
		{"serve root_path", "http_options:\n  root_path: /x\n" + minimalYAML, "http_options.root_path", 2, "put the path in each application's route_prefix"},
		{"serve import_path", "applications:\n  - name: a\n    import_path: app:main\n    deployments: [{name: d, handler: h}]\n", "applications[0].import_path", 3, "handler: command"},
		{"serve autoscaling_config", withDeployment("        autoscaling_config: {min_replicas: 1}\n"), "applications[0].deployments[0].autoscaling_config", 6, "autoscaling is not supported: set num_replicas"},
		{"serve ray_actor_options", withDeployment("        ray_actor_options: {num_cpus: 1}\n"), "applications[0].deployments[0].ray_actor_options", 6, "Ray's resources"},
		{"serve route_prefix on a deployment", withDeployment("        route_prefix: /x\n"), "applications[0].deployments[0].route_prefix", 6, "set the application's route_prefix"},
		{"serve num_replicas auto", withDeployment("        num_replicas: auto\n"), "applications[0].deployments[0].num_replicas", 6, `got "auto": autoscaling is not supported`},
		{"serve max_concurrent_queries", withDeployment("        max_concurrent_queries: 3\n"), "applications[0].deployments[0].max_concurrent_queries", 6, "use max_ongoing_requests"},
		{"serve ssl_certfile", "http_options:\n  ssl_certfile: c.pem\n" + minimalYAML, "http_options.ssl_certfile", 2, "terminate TLS in front of it"},
		{"command as one string", withDeployment("        command: python3 app.py\n"), "applications[0].deployments[0].command", 6, `got string "python3 app.py": the program and its arguments, each an item`},
		{"env as a mapping", withDeployment("        env: {A: b}\n"), "applications[0].deployments[0].env", 6, "got a mapping: KEY=VALUE items"},
		{"a Serve field where Serve has none", "applications:\n  - name: a\n    autoscaling_config: {}\n    deployments: [{name: d, handler: h}]\n", "applications[0].autoscaling_config", 3, "unknown field; known fields are"},

		// Wrong types.
		{"int as string", withDeployment("        num_replicas: two\n"), "applications[0].deployments[0].num_replicas", 6, `must be an integer, got string "two"`},
		{"int as float", withDeployment("        num_replicas: 2.5\n"), "applications[0].deployments[0].num_replicas", 6, "must be an integer, got number 2.5"},
		{"int too large", withDeployment("        max_ongoing_requests: 9223372036854775808\n"), "applications[0].deployments[0].max_ongoing_requests", 6, "must be an integer of at most 64 bits"},
		{"int as list", withDeployment("        max_queued_requests: [1]\n"), "applications[0].deployments[0].max_queued_requests", 6, "must be an integer, got a list"},
		{"float as string", "http_options: {request_timeout_s: soon}\n" + minimalYAML, "http_options.request_timeout_s", 1, `must be a number, got string "soon"`},
		{"float out of range", "http_options: {request_timeout_s: 1e999}\n" + minimalYAML, "http_options.request_timeout_s", 1, `must be a number, got 1e999: out of range`},
		{"int out of range as float", withDeployment("        num_replicas: 1e999\n"), "applications[0].deployments[0].num_replicas", 6, `must be an integer, got 1e999: out of range`},
		{"quoted number stays a string", withDeployment("        num_replicas: \"1e999\"\n"), "applications[0].deployments[0].num_replicas", 6, `must be an integer, got string "1e999"`},
		{"string as list", "applications:\n  - name: a\n    deployments:\n      - name: d\n        handler: [echo]\n", "applications[0].deployments[0].handler", 5, "must be a string, got a list"},
		{"string as integer", "applications:\n  - name: 12\n    deployments: [{name: d, handler: h}]\n", "applications[0].name", 2, "must be a string, got integer 12"},
		{"string as null", "applications:\n  - name: ~\n    deployments: [{name: d, handler: h}]\n", "applications[0].name", 2, "must be a string, got null"},
		{"route_prefix null", "applications:\n  - name: a\n    route_prefix: null\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, "Serve's route_prefix: null) is not supported"},
		{"list as string", "applications:\n  - name: a\n    deployments: dep\n", "applications[0].deployments", 3, `must be a list, got string "dep"`},
		{"mapping as integer", "http_options: 5\n" + minimalYAML, "http_options", 1, "must be a mapping, got integer 5"},
		{"element not a mapping", "applications: [a]\n", "applications[0]", 1, `must be a mapping, got string "a"`},
		{"user_config not a mapping", withDeployment("        user_config: [1, 2]\n"), "applications[0].deployments[0].user_config", 6, "must be a mapping, got a list"},
		{"user_config scalar", withDeployment("        user_config: hi\n"), "applications[0].deployments[0].user_config", 6, `must be a mapping, got string "hi"`},
		{"user_config infinity", withDeployment("        user_config:\n          x: [1, .inf]\n"), "applications[0].deployments[0].user_config.x[1]", 7, "+Inf cannot be represented in JSON"},
		{"alias without anchor", withDeployment("        user_config: *nope\n"), "applications[0].deployments[0].user_config", 6, "alias *nope has no anchor &nope before it"},
		{"alias inside its anchor", withDeployment("        user_config: &u {a: *u}\n"), "applications[0].deployments[0].user_config.a", 6, "alias *u is inside its own anchor &u"},
		{"merge of a scalar", withDeployment("        <<: 5\n"), "applications[0].deployments[0]", 6, "merge key << takes a mapping or a list of mappings, got integer 5"},

		// http_options ranges.
		{"port too large", "http_options: {port: 70000}\n" + minimalYAML, "http_options.port", 1, "must be between 0 and 65535, got 70000"},
		{"port negative", "http_options: {port: -1}\n" + minimalYAML, "http_options.port", 1, "must be between 0 and 65535, got -1"},
		{"request timeout negative", "http_options: {request_timeout_s: -1}\n" + minimalYAML, "http_options.request_timeout_s", 1, "must be >= 0 and <= 9223372036 seconds, got -1"},
		{"request timeout below a millisecond", "http_options: {request_timeout_s: 0.0000000001}\n" + minimalYAML, "http_options.request_timeout_s", 1, "must be 0 or at least 0.001 seconds, got 1e-10"},
		{"keep alive below a millisecond", "http_options: {keep_alive_timeout_s: 0.0001}\n" + minimalYAML, "http_options.keep_alive_timeout_s", 1, "must be at least 0.001 seconds, got 0.0001"},
		{"host empty", "http_options: {host: \"\"}\n" + minimalYAML, "http_options.host", 1, `must not be empty: "0.0.0.0" listens on every interface`},
		{"request timeout NaN", "http_options: {request_timeout_s: .nan}\n" + minimalYAML, "http_options.request_timeout_s", 1, "got NaN"},
		{"keep alive zero", "http_options:\n  keep_alive_timeout_s: 0\n" + minimalYAML, "http_options.keep_alive_timeout_s", 2, "must be > 0 and <= 9223372036 seconds, got 0"},
		{"keep alive infinite", "http_options:\n  keep_alive_timeout_s: .inf\n" + minimalYAML, "http_options.keep_alive_timeout_s", 2, "got +Inf"},

		// Applications.
		{"application name missing", "applications:\n  - route_prefix: /a\n    deployments: [{name: d, handler: h}]\n", "applications[0].name", 2, "is required"},
		{"application name empty", "applications:\n  - name: \"\"\n    deployments: [{name: d, handler: h}]\n", "applications[0].name", 2, "is required"},
		{"duplicate application name", "applications:\n  - {name: a, route_prefix: /a, deployments: [{name: d, handler: h}]}\n  - {name: a, route_prefix: /b, deployments: [{name: d, handler: h}]}\n", "applications[1].name", 3, `duplicate application name "a" (also used by applications[0])`},
		{"route prefix without slash", "applications:\n  - name: a\n    route_prefix: api\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must start with "/", got "api"`},
		{"route prefix empty", "applications:\n  - name: a\n    route_prefix: \"\"\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must start with "/", got ""`},
		{"route prefix trailing slash", "applications:\n  - name: a\n    route_prefix: /api/\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not end with "/" unless it is "/", got "/api/"`},
		{"route prefix query", "applications:\n  - name: a\n    route_prefix: /a?b\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain "?", "#"`},
		{"route prefix escape", "applications:\n  - name: a\n    route_prefix: /a%2Fb\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain "%"`},
		{"route prefix dot dot", "applications:\n  - name: a\n    route_prefix: /a/../b\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain empty, "." or ".." segments`},
		{"route prefix dot dot with parameters", "applications:\n  - name: a\n    route_prefix: \"/..;\"\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain empty, "." or ".." segments`},
		{"route prefix dot after a backslash", "applications:\n  - name: a\n    route_prefix: \"/a\\\\.\"\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain empty, "." or ".." segments`},
		{"route prefix double slash", "applications:\n  - name: a\n    route_prefix: /a//b\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain empty`},
		{"route prefix fragment", "applications:\n  - name: a\n    route_prefix: \"/a#b\"\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, `must not contain "?", "#"`},
		{"route prefix space", "applications:\n  - name: a\n    route_prefix: /a b\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, "white space"},
		{"route prefix reserved", "applications:\n  - name: a\n    route_prefix: /-/healthz\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, "reserved for the proxy's own endpoints"},
		{"route prefix reserved root", "applications:\n  - name: a\n    route_prefix: /-\n    deployments: [{name: d, handler: h}]\n", "applications[0].route_prefix", 3, "reserved for the proxy's own endpoints"},
		{"duplicate route prefix", "applications:\n  - {name: x, route_prefix: /api, deployments: [{name: d, handler: h}]}\n  - {name: y, route_prefix: /api, deployments: [{name: d, handler: h}]}\n", "applications[1].route_prefix", 3, `duplicate route_prefix "/api" (also used by application "x")`},
		{"duplicate default route prefix", "applications:\n  - {name: x, deployments: [{name: d, handler: h}]}\n  - {name: y, deployments: [{name: d, handler: h}]}\n", "applications[1].route_prefix", 3, `duplicate route_prefix "/" (also used by application "x")`},
		{"deployments missing", "applications:\n  - name: a\n", "applications[0].deployments", 2, "at least one deployment is required"},
		{"deployments empty", "applications:\n  - name: a\n    deployments: []\n", "applications[0].deployments", 3, "at least one deployment is required"},

		// Deployments.
		{"application name with a tab", "applications:\n  - name: \"a\\tb\"\n    deployments: [{name: d, handler: echo}]\n", "applications[0].name", 2, `must not hold a control character, got "a\tb"`},
		{"application name with space around", "applications:\n  - name: \" api\"\n    deployments: [{name: d, handler: echo}]\n", "applications[0].name", 2, `must not begin or end with whitespace, got " api"`},
		{"deployment name with a NUL", "applications:\n  - name: a\n    deployments:\n      - name: \"d\\0\"\n        handler: echo\n", "applications[0].deployments[0].name", 4, `must not hold a control character, got "d\x00"`},
		{"deployment name missing", "applications:\n  - name: a\n    deployments:\n      - handler: h\n", "applications[0].deployments[0].name", 4, "is required"},
		{"handler missing", "applications:\n  - name: a\n    deployments:\n      - name: d\n", "applications[0].deployments[0].handler", 4, "is required: a built-in (static, echo, sleep), upstream, command or host"},
		{"handler empty", "applications:\n  - name: a\n    deployments:\n      - name: d\n        handler: ''\n", "applications[0].deployments[0].handler", 5, "is required"},
		// Handler kinds' own fields.
		{"host bad address", kindDeployment("host", "        hosts: [\"127.0.0.1\"]\n"), "applications[0].deployments[0].hosts[0]", 6, "must be host:port"},
		{"host signed port", kindDeployment("host", "        hosts: [\"127.0.0.1:+9001\"]\n"), "applications[0].deployments[0].hosts[0]", 6, "must have a port between 1 and 65535"},
		{"host bad port", kindDeployment("host", "        hosts: [\"127.0.0.1:99999\"]\n"), "applications[0].deployments[0].hosts[0]", 6, "port between 1 and 65535"},
		{"host not an address", kindDeployment("host", "        hosts: [\"300.1.1.1:9001\"]\n"), "applications[0].deployments[0].hosts[0]", 6, `"300.1.1.1" is not an IP address or a host name, got "300.1.1.1:9001"`},
		{"host name with a space", kindDeployment("host", "        hosts: [\"replica host:9001\"]\n"), "applications[0].deployments[0].hosts[0]", 6, `"replica host" is not an IP address or a host name`},
		{"upstream not an address", kindDeployment("upstream", "        upstreams: [http://10.0.0.256:8000]\n"), "applications[0].deployments[0].upstreams[0]", 6, `"10.0.0.256" is not an IP address or a host name, got "http://10.0.0.256:8000"`},
		{"discovery bad name", kindDeployment("upstream", "        discovery: dns://svc..local:8000\n"), "applications[0].deployments[0].discovery", 6, `"svc..local" is not a host name, got "dns://svc..local:8000"`},
		{"discovery_server not an address", kindDeployment("upstream", "        discovery: dns://svc.local:8000\n        discovery_server: 10.96.0.300:53\n"), "applications[0].deployments[0].discovery_server", 7, `"10.96.0.300" is not an IP address or a host name`},
		{"host without hosts", kindDeployment("host", ""), "applications[0].deployments[0].hosts", 4, `needs hosts (the host:port of each replica host, cmd/replica) or discovery`},
		{"host both", kindDeployment("host", "        hosts: [\"a:1\"]\n        discovery: dns://hosts.local:9001\n"), "applications[0].deployments[0].discovery", 7, "give hosts or discovery, not both"},
		{"host discovery no port", kindDeployment("host", "        discovery: dns://hosts.local\n"), "applications[0].deployments[0].discovery", 6, "dns://name:port"},
		{"env key twice", kindDeployment("command", "        command: [./x]\n        env: [A=1, B=2, A=3]\n"), "applications[0].deployments[0].env[2]", 7, "sets A again (env[0] sets it too)"},
		{"env key with a space", kindDeployment("command", "        command: [./x]\n        env: [\" Y=1\"]\n"), "applications[0].deployments[0].env[0]", 7, `no space or control character in the KEY, got " Y"`},
		{"discovery_server on command", kindDeployment("command", "        command: [./x]\n        discovery_server: 127.0.0.1:53\n"), "applications[0].deployments[0].discovery_server", 7, `is only for handlers "upstream" and "host"`},
		{"discovery without its slashes", kindDeployment("upstream", "        discovery: dns:a.test:80\n"), "applications[0].deployments[0].discovery", 6, "must be dns://name..., the name right after the two slashes"},
		{"discovery with three slashes", kindDeployment("upstream", "        discovery: dns:///a.test:80\n"), "applications[0].deployments[0].discovery", 6, "must be dns://name..., the name right after the two slashes"},
		// Of a static list they would be ignored in silence (a tester).
		{"discovery_server with a static list", kindDeployment("upstream", "        upstreams: [http://127.0.0.1:9000]\n        discovery_server: 127.0.0.1:53\n"), "applications[0].deployments[0].discovery_server", 7, "applies only with discovery (a static upstreams list is not resolved)"},
		{"discovery_interval_s with a static list", kindDeployment("host", "        hosts: [\"127.0.0.1:9001\"]\n        discovery_interval_s: 1\n"), "applications[0].deployments[0].discovery_interval_s", 7, "applies only with discovery (a static hosts list is not resolved)"},
		// A zero is out of range, said once (found by review).
		{"discovery_interval_s zero with a static list", kindDeployment("host", "        hosts: [\"127.0.0.1:9001\"]\n        discovery_interval_s: 0\n"), "applications[0].deployments[0].discovery_interval_s", 7, "must be > 0"},
		{"discovery_interval_s zero on command", kindDeployment("command", "        command: [./x]\n        discovery_interval_s: 0\n"), "applications[0].deployments[0].discovery_interval_s", 7, "must be > 0"},
		{"discovery_server bad port", kindDeployment("upstream", "        discovery: dns://svc.local:8000\n        discovery_server: 127.0.0.1:99999\n"), "applications[0].deployments[0].discovery_server", 7, `must have a port between 1 and 65535 (a DNS server, 10.96.0.10:53), got "127.0.0.1:99999"`},
		{"host_tls discovery without server_name", kindDeployment("host", "        discovery: dns://hosts.local:9001\n        host_tls: {ca_file: ca.pem}\n"), "applications[0].deployments[0].host_tls.server_name", 7, "required with discovery"},
		{"host duplicate", kindDeployment("host", "        hosts: [\"a:1\", \"a:1\"]\n"), "applications[0].deployments[0].hosts[1]", 6, "duplicate host"},
		{"host max_ongoing", kindDeployment("host", "        hosts: [\"a:1\"]\n        max_ongoing_requests: 9\n"), "applications[0].deployments[0].max_ongoing_requests", 7, "only with host_handler"},
		{"host_handler remote", kindDeployment("host", "        hosts: [\"a:1\"]\n        host_handler: command\n"), "applications[0].deployments[0].host_handler", 7, "must be an in-process handler kind"},
		{"replica_timeout_s on echo", withDeployment("        replica_timeout_s: 5\n"), "applications[0].deployments[0].replica_timeout_s", 6, "only for the handlers that forward"},
		{"replica_timeout_s negative", kindDeployment("upstream", "        upstreams: [http://a:1]\n        replica_timeout_s: -1\n"), "applications[0].deployments[0].replica_timeout_s", 7, "must be >= 0"},
		{"host_handler on echo", withDeployment("        host_handler: static\n"), "applications[0].deployments[0].host_handler", 6, `is only for handler "host"`},
		{"hosts on echo", withDeployment("        hosts: [\"a:1\"]\n"), "applications[0].deployments[0].hosts", 6, `is only for handler "host"`},
		{"upstream_host with a scheme", kindDeployment("upstream", "        upstreams: [http://a:1]\n        upstream_host: http://api.example.com\n"), "applications[0].deployments[0].upstream_host", 7, `must be a host name or address, with a port or not (api.example.com, 10.0.0.5:8000), got "http://api.example.com"`},
		{"upstream_host with a path", kindDeployment("upstream", "        upstreams: [http://a:1]\n        upstream_host: api.example.com/v1\n"), "applications[0].deployments[0].upstream_host", 7, "must be a host name or address"},
		{"upstream_host bad port", kindDeployment("upstream", "        upstreams: [http://a:1]\n        upstream_host: api.example.com:70000\n"), "applications[0].deployments[0].upstream_host", 7, "must be a host name or address"},
		{"upstream_host bare IPv6", kindDeployment("upstream", "        upstreams: [http://a:1]\n        upstream_host: \"::1\"\n"), "applications[0].deployments[0].upstream_host", 7, "must be a host name or address"},
		{"upstream_host on command", kindDeployment("command", "        command: [./x]\n        upstream_host: api.example.com\n"), "applications[0].deployments[0].upstream_host", 7, `is only for handler "upstream"`},
		{"upstream without upstreams", kindDeployment("upstream", ""), "applications[0].deployments[0].upstreams", 4, `needs upstreams (a list of URLs) or discovery`},
		{"upstream both", kindDeployment("upstream", "        upstreams: [http://10.0.0.5:8000]\n        discovery: dns://svc.local:8000\n"), "applications[0].deployments[0].discovery", 7, "not both"},
		{"upstream bad scheme", kindDeployment("upstream", "        upstreams: [ftp://10.0.0.5]\n"), "applications[0].deployments[0].upstreams[0]", 6, "http:// or https://"},
		{"upstream query", kindDeployment("upstream", "        upstreams: ['http://a:1/?x=1']\n"), "applications[0].deployments[0].upstreams[0]", 6, "query"},
		{"upstream bad port", kindDeployment("upstream", "        upstreams: ['http://a:0']\n"), "applications[0].deployments[0].upstreams[0]", 6, "port between 1 and 65535"},
		{"upstream duplicate", kindDeployment("upstream", "        upstreams:\n          - http://a:1\n          - http://a:1\n"), "applications[0].deployments[0].upstreams[1]", 8, "duplicate upstream"},
		{"upstream duplicate but a slash", kindDeployment("upstream", "        upstreams:\n          - http://a:1/base\n          - http://a:1/base/\n"), "applications[0].deployments[0].upstreams[1]", 8, "duplicate upstream"},
		{"upstream password", kindDeployment("upstream", "        upstreams: ['http://user:pw@a:1']\n"), "applications[0].deployments[0].upstreams[0]", 6, `must not hold a user or password, got "http://user:xxxxx@a:1"`},
		{"upstream num_replicas", kindDeployment("upstream", "        upstreams: [http://a:1]\n        num_replicas: 1\n"), "applications[0].deployments[0].num_replicas", 7, "each upstream (or discovered address) is one replica"},
		{"upstream user_config", kindDeployment("upstream", "        upstreams: [http://a:1]\n        user_config: {a: 1}\n"), "applications[0].deployments[0].user_config", 7, "no reconfigure call"},
		{"discovery no port", kindDeployment("upstream", "        discovery: dns://svc.local\n"), "applications[0].deployments[0].discovery", 6, "dns://name:port"},
		{"discovery srv with port", kindDeployment("upstream", "        discovery: dns+srv://_http._tcp.svc.local:80\n"), "applications[0].deployments[0].discovery", 6, "without a port"},
		{"discovery scheme", kindDeployment("upstream", "        discovery: consul://svc\n"), "applications[0].deployments[0].discovery", 6, "must be dns://name:port or dns+srv://"},
		{"command missing", kindDeployment("command", ""), "applications[0].deployments[0].command", 4, "needs command"},
		{"command bad env", kindDeployment("command", "        command: [./server]\n        env: [NOEQUALS]\n"), "applications[0].deployments[0].env[0]", 7, "KEY=VALUE"},
		{"command env sets PORT", kindDeployment("command", "        command: [./server]\n        env: [A=1, PORT=1234]\n"), "applications[0].deployments[0].env[1]", 7, "sets PORT, which the proxy sets for each replica"},
		{"upstreams on echo", withDeployment("        upstreams: [http://a:1]\n"), "applications[0].deployments[0].upstreams", 6, `is only for handler "upstream"`},
		{"command on echo", withDeployment("        command: [./x]\n"), "applications[0].deployments[0].command", 6, `is only for handler "command"`},
		{"discovery interval on echo", withDeployment("        discovery_interval_s: 5\n"), "applications[0].deployments[0].discovery_interval_s", 6, `is only for handlers "upstream" and "host"`},
		{"health path on echo", withDeployment("        health_check_path: /healthz\n"), "applications[0].deployments[0].health_check_path", 6, `is only for handlers "upstream" and "command"`},
		{"health path relative", kindDeployment("command", "        command: [./x]\n        health_check_path: healthz\n"), "applications[0].deployments[0].health_check_path", 7, `must start with "/"`},
		{"max_constructor_retry_count zero", withDeployment("        max_constructor_retry_count: 0\n"), "applications[0].deployments[0].max_constructor_retry_count", 6, "must be >= 1, got 0"},
		{"duplicate deployment name", withDeployment("      - name: dep\n        handler: echo\n"), "applications[0].deployments[1].name", 6, `duplicate deployment name "dep" (also used by deployments[0])`},
		{"num_replicas zero", withDeployment("        num_replicas: 0\n"), "applications[0].deployments[0].num_replicas", 6, "must be in [1, 10000], got 0"},
		{"num_replicas huge", withDeployment("        num_replicas: 100000000\n"), "applications[0].deployments[0].num_replicas", 6, "must be in [1, 10000], got 100000000"},
		{"max_ongoing_requests zero", withDeployment("        max_ongoing_requests: 0\n"), "applications[0].deployments[0].max_ongoing_requests", 6, "must be >= 1, got 0"},
		{"max_queued_requests zero", withDeployment("        max_queued_requests: 0\n"), "applications[0].deployments[0].max_queued_requests", 6, "must be -1 (no limit) or >= 1, got 0"},
		{"max_queued_requests below -1", withDeployment("        max_queued_requests: -2\n"), "applications[0].deployments[0].max_queued_requests", 6, "must be -1 (no limit) or >= 1, got -2"},
		{"health_check_period_s zero", withDeployment("        health_check_period_s: 0\n"), "applications[0].deployments[0].health_check_period_s", 6, "must be > 0 and <= 9223372036 seconds, got 0"},
		{"health_check_period_s a busy loop", withDeployment("        health_check_period_s: 0.000000001\n"), "applications[0].deployments[0].health_check_period_s", 6, "must be at least 0.1 seconds (a shorter period is a busy loop), got 1e-09"},
		{"health_check_timeout_s negative", withDeployment("        health_check_timeout_s: -1\n"), "applications[0].deployments[0].health_check_timeout_s", 6, "must be > 0 and <= 9223372036 seconds, got -1"},
		{"graceful_shutdown_timeout_s negative", withDeployment("        graceful_shutdown_timeout_s: -0.5\n"), "applications[0].deployments[0].graceful_shutdown_timeout_s", 6, "must be >= 0 and <= 9223372036 seconds, got -0.5"},
		// Tags that ask for a meaning nothing gives them (a tester: !env
		// HOME was the string "HOME").
		{"tag in user_config", withDeployment("        user_config: {body: !env HOME}\n"), "applications[0].deployments[0].user_config.body", 6, "the YAML tag !env is not supported"},
		{"binary in user_config", withDeployment("        user_config:\n          body: !!binary aGk=\n"), "applications[0].deployments[0].user_config.body", 7, "the YAML tag !!binary is not supported"},
		{"tag behind an alias", withDeployment("        user_config:\n          a: &x !env HOME\n          b: *x\n"), "applications[0].deployments[0].user_config.a", 7, "the YAML tag !env is not supported"},
		{"tag on a field", withDeployment("        num_replicas: !custom 3\n"), "applications[0].deployments[0].num_replicas", 6, "the YAML tag !custom is not supported"},
		{"graceful_shutdown_timeout_s too large", withDeployment("        graceful_shutdown_timeout_s: 1.0e+10\n"), "applications[0].deployments[0].graceful_shutdown_timeout_s", 6, "got 1e+10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.src)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), errs)
			}
			e := errs[0]
			if e.File != "test.yaml" || e.Field != tt.field || e.Line != tt.line || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("got  %s\nwant test.yaml:%d: %s: ...%s...", e.Error(), tt.line, tt.field, tt.msg)
			}
		})
	}
}

func TestParseReportsEveryProblemInFileOrder(t *testing.T) {
	src := `http_options:
  port: 70000
  colour: blue
applications:
  - name: a
    route_prefix: /api
    deployments:
      - name: d
        handler: h
        num_replicas: two
        max_queued_requests: 0
      - name: d
        handler: h
        replicas: 3
  - name: a
    route_prefix: /api
    deployments: []
  - route_prefix: api/
    deployments:
      - handler: ""
`
	want := []struct {
		line  int
		field string
	}{
		{2, "http_options.port"},
		{3, "http_options.colour"},
		{10, "applications[0].deployments[0].num_replicas"},
		{11, "applications[0].deployments[0].max_queued_requests"},
		{12, "applications[0].deployments[1].name"},
		{14, "applications[0].deployments[1].replicas"},
		{15, "applications[1].name"},
		{16, "applications[1].route_prefix"},
		{17, "applications[1].deployments"},
		{18, "applications[2].name"},
		{18, "applications[2].route_prefix"},
		{20, "applications[2].deployments[0].name"},
		{20, "applications[2].deployments[0].handler"},
	}
	errs := parseErrors(t, src)
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	for i, w := range want {
		if errs[i].Line != w.line || errs[i].Field != w.field {
			t.Errorf("error %d = %s, want line %d field %s", i, errs[i].Error(), w.line, w.field)
		}
	}
	if !strings.HasPrefix(errs.Error(), "test.yaml:2: http_options.port: must be between 0 and 65535, got 70000\ntest.yaml:3: http_options.colour: unknown field") {
		t.Errorf("Error() = %s", errs.Error())
	}
}

func TestParseOrdersProblemsWithinALine(t *testing.T) {
	src := "http_options: {port: 70000, colour: blue, keep_alive_timeout_s: 0, size: 1}\n" + minimalYAML
	errs := parseErrors(t, src)
	var got []string
	for _, e := range errs {
		got = append(got, e.Field)
	}
	want := []string{"http_options.port", "http_options.colour", "http_options.keep_alive_timeout_s", "http_options.size"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("fields = %v, want %v", got, want)
	}
}

func TestParseSyntaxError(t *testing.T) {
	tests := []struct {
		name string
		src  string
		line int
		says string // in the message, if set
	}{
		{"unclosed flow sequence", "applications: [\n  {name: a}\n", 1, ""},
		// The key out of line is named, with a hint (a tester: the
		// parser's words alone named nothing).
		{"bad indentation", "applications:\n  - name: a\n   deployments: []\n", 3, `("deployments" at column 4): is it indented as the lines beside it are?`},
		// Indented deeper, it ran on as the value above's last word.
		{"key indented deeper", "applications:\n  - name: a\n     route_prefix: /a\n", 3, `("route_prefix" at column 6): is it indented deeper than the lines beside it?`},
		{"key indented deeper in http_options", "http_options:\n  host: 127.0.0.1\n    port: 8000\n" + minimalYAML, 3, `("port" at column 5)`},
		{"key indented less", "applications:\n  - name: py\n    deployments:\n      - name: py\n        handler: echo\n       num_replicas: 2\n", 6, `("num_replicas" at column 8)`},
		{"unterminated quote", minimalYAML + "http_options: {host: 'x}\n", 6, ""},
		{"tab indentation", "applications:\n\t- name: a\n", 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := parseErrors(t, tt.src)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), errs)
			}
			if e := errs[0]; e.Line != tt.line || e.Field != "" || !strings.HasPrefix(e.Msg, "invalid YAML: ") || !strings.Contains(e.Msg, tt.says) {
				t.Errorf("got %q, want line %d and an invalid YAML message saying %q", e.Error(), tt.line, tt.says)
			}
		})
	}
}

func TestParseBillionLaughs(t *testing.T) {
	src := withDeployment(`        user_config:
          a: &a [x, x, x, x, x, x, x, x, x, x]
          b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
          c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
          d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
          e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
          f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
          g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
          h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
`)
	errs := parseErrors(t, src)
	if len(errs) != 1 || !strings.Contains(errs[0].Msg, "config too large") {
		t.Fatalf("got %v, want one config too large error", errs)
	}
}

// Brackets nested deep are refused before the parser, whose time and
// memory grow with the square of the depth: a 40 KB file nested 20000
// deep took 660 MB, one of 200 KB more than 10 GB (a tester). Within
// maxFlowDepth, user_config's own bound says it.
func TestParseDeepBrackets(t *testing.T) {
	for _, tc := range []struct {
		depth int
		want  string
	}{
		{20000, "invalid YAML: [ ] or { } nested more than 200 levels deep (user_config may nest 100)"},
		{150, "nested more than 100 levels deep"},
	} {
		src := withDeployment("        user_config: {x: " + strings.Repeat("[", tc.depth) + strings.Repeat("]", tc.depth) + "}\n")
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		errs := parseErrors(t, src)
		runtime.ReadMemStats(&after)
		if len(errs) != 1 || !strings.Contains(errs[0].Msg, tc.want) || errs[0].Line == 0 {
			t.Fatalf("depth %d: got %v, want one error at a line: %s", tc.depth, errs, tc.want)
		}
		if mb := (after.TotalAlloc - before.TotalAlloc) >> 20; mb > 64 {
			t.Errorf("depth %d: %d MB allocated to refuse it, want at most 64", tc.depth, mb)
		}
	}
}

func TestLoad(t *testing.T) {
	path := t.TempDir() + "/serve.yaml"
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Load of a missing file = %v, want an error naming the path", err)
	}
	if err := writeFile(path, "applications: []\n"); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if want := path + ":1: applications: at least one application is required"; err == nil || err.Error() != want {
		t.Errorf("Load = %v, want %s", err, want)
	}
	if err := writeFile(path, exampleYAML); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(path); err != nil || c.Applications[0].Name != "api" {
		t.Errorf("Load = %+v, %v", c, err)
	}
}

func TestValidate(t *testing.T) {
	valid := func() *Config {
		c := Default()
		c.Applications = append(c.Applications, Application{
			Name:        "api",
			RoutePrefix: "/api",
			Deployments: []Deployment{Default().Applications[0].Deployments[0]},
		})
		return c
	}
	tests := []struct {
		name   string
		change func(c *Config)
		want   string // the whole Error(), no file or lines
	}{
		{"valid", func(*Config) {}, ""},
		{"zero config", func(c *Config) { *c = Config{} }, "http_options.keep_alive_timeout_s: must be > 0 and <= 9223372036 seconds, got 0\napplications: at least one application is required"},
		{"zero deployment", func(c *Config) { c.Applications[1].Deployments[0] = Deployment{} }, strings.Join([]string{
			"applications[1].deployments[0].name: is required",
			"applications[1].deployments[0].handler: is required: a built-in (static, echo, sleep), upstream, command or host for replicas outside the proxy, or one registered through the Go API",
			"applications[1].deployments[0].num_replicas: must be in [1, 10000], got 0",
			"applications[1].deployments[0].max_ongoing_requests: must be >= 1, got 0",
			"applications[1].deployments[0].max_queued_requests: must be -1 (no limit) or >= 1, got 0",
			"applications[1].deployments[0].health_check_period_s: must be > 0 and <= 9223372036 seconds, got 0",
			"applications[1].deployments[0].health_check_timeout_s: must be > 0 and <= 9223372036 seconds, got 0",
			"applications[1].deployments[0].max_constructor_retry_count: must be >= 1, got 0",
			`applications[1].deployments[0].health_check_path: must start with "/", got ""`,
			"applications[1].deployments[0].discovery_interval_s: must be > 0 and <= 9223372036 seconds, got 0",
		}, "\n")},
		{"user_config not an object", func(c *Config) { c.Applications[0].Deployments[0].UserConfig = json.RawMessage(`[1]`) }, "applications[0].deployments[0].user_config: must be a mapping (a JSON object)"},
		{"user_config not JSON", func(c *Config) { c.Applications[0].Deployments[0].UserConfig = json.RawMessage(`{`) }, "applications[0].deployments[0].user_config: must be a mapping (a JSON object)"},
		{"duplicate prefix", func(c *Config) { c.Applications[1].RoutePrefix = "/" }, `applications[1].route_prefix: duplicate route_prefix "/" (also used by application "default")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.change(c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("Validate() =\n%v\nwant\n%s", err, tt.want)
			}
			var fe FieldError
			if err != nil && (!errors.As(err, &fe) || fe.Line != 0 || fe.File != "") {
				t.Errorf("Validate() error %#v has a file or line", fe)
			}
		})
	}
}

func TestParseRemoteKinds(t *testing.T) {
	src := `applications:
  - name: a
    route_prefix: /a
    deployments:
      - name: fixed
        handler: upstream
        upstreams: [http://10.0.0.5:8000, "https://replica-2.internal"]
        health_check_path: /healthz
  - name: b
    route_prefix: /b
    deployments:
      - name: found
        handler: upstream
        discovery: dns+srv://_http._tcp.model.default.svc.cluster.local
        discovery_interval_s: 2
        discovery_server: 127.0.0.1:5353
  - name: c
    route_prefix: /c
    deployments:
      - name: started
        handler: command
        command: [python3, server.py]
        env: [MODEL=small]
        working_dir: /srv
        num_replicas: 3
        max_constructor_retry_count: 5
  - name: d
    route_prefix: /d
    deployments:
      - name: hosts
        handler: host
        discovery: dns://replica-hosts.default.svc.cluster.local:9001
        discovery_interval_s: 3
        host_handler: static
        num_replicas: 8
`
	c, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if hosts := c.Applications[3].Deployments[0]; hosts.Discovery != "dns://replica-hosts.default.svc.cluster.local:9001" || hosts.DiscoveryInterval() != 3*time.Second {
		t.Fatalf("decoded: %+v", hosts)
	}
	fixed, found, started := c.Applications[0].Deployments[0], c.Applications[1].Deployments[0], c.Applications[2].Deployments[0]
	if len(fixed.Upstreams) != 2 || fixed.HealthCheckPath != "/healthz" || found.DiscoveryInterval() != 2*time.Second ||
		found.DiscoveryServer != "127.0.0.1:5353" || started.Command[1] != "server.py" || started.Env[0] != "MODEL=small" ||
		started.MaxConstructorRetryCount != 5 || started.HealthCheckPath != "/-/healthz" {
		t.Fatalf("decoded: %+v\n%+v\n%+v", fixed, found, started)
	}
}

// A repeated key is one problem among the others, each on its own line,
// not a parse error that hides the rest.
func TestDuplicateKeyAmongOtherProblems(t *testing.T) {
	errs := parseErrors(t, `applications:
  - name: a
    deployments:
      - name: d
        handler: static
        num_replicas: 2
        num_replicas: 3
        max_ongoing: 0
        bogus: 1
applications: []
`)
	want := []string{
		"test.yaml:7: applications[0].deployments[0].num_replicas: duplicate key (also on line 6)",
		"test.yaml:8: applications[0].deployments[0].max_ongoing: unknown field",
		"test.yaml:9: applications[0].deployments[0].bogus: unknown field",
		"test.yaml:10: applications: duplicate key (also on line 1)",
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("problem %d = %q, want %q...", i, got[i], w)
		}
	}
}

// A key given twice keeps its first value, which is checked as any: a
// second applications key had hidden every problem of the first list.
func TestDuplicateKeyStillChecksTheFirst(t *testing.T) {
	errs := parseErrors(t, `applications:
  - name: a
    deployments: [{name: d, handler: static, num_replicas: 0}]
applications: []
`)
	want := []string{
		"test.yaml:3: applications[0].deployments[0].num_replicas: must be in [1, 10000], got 0",
		"test.yaml:4: applications: duplicate key (also on line 1)",
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Numbers as YAML 1.2 writes them are numbers (1e3, which the parser
// reads as a string); a quoted one is a string, and an integer too long
// for 64 bits says so.
func TestYAML12Numbers(t *testing.T) {
	errs := parseErrors(t, `http_options: {request_timeout_s: 1e3, port: 99999999999999999999999}
applications:
  - name: a
    deployments:
      - {name: d, handler: static, health_check_period_s: "5", graceful_shutdown_timeout_s: 2.5e1}
`)
	want := []string{
		"test.yaml:1: http_options.port: must be an integer of at most 64 bits, got 99999999999999999999999",
		`test.yaml:5: applications[0].deployments[0].health_check_period_s: must be a number, got string "5"`,
	}
	if len(errs) != len(want) {
		t.Fatalf("got %v, want %v", errs, want)
	}
	for i, w := range want {
		if errs[i].Error() != w {
			t.Errorf("problem %d = %q, want %q", i, errs[i].Error(), w)
		}
	}
	c, err := Parse("test.yaml", []byte("http_options: {request_timeout_s: 1e3}\n"+minimalYAML))
	if err != nil || c.HTTPOptions.RequestTimeoutS != 1000 {
		t.Errorf("request_timeout_s: 1e3 = %v, %v; want 1000", c.HTTPOptions.RequestTimeoutS, err)
	}

	// In a user_config, what PyYAML (Serve's) reads: an integer too large
	// for 64 bits is a number still (it was a string, which a handler
	// refused as such, "want a number, got a JSON string": a tester);
	// 1e3 (no dot) and 08 (no octal) are strings, as a review found a
	// body: 08 must stay.
	c, err = Parse("test.yaml", []byte(withDeployment("        user_config: {a: 1e3, b: 99999999999999999999999, c: +5, d: -2.5E-1, e: 08, f: -099999999999999999999, g: ! 08}\n")))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(c.Applications[0].Deployments[0].UserConfig), `{"a":"1e3","b":99999999999999999999999,"c":5,"d":-0.25,"e":"08","f":"-099999999999999999999","g":"08"}`; got != want {
		t.Errorf("user_config = %s, want %s", got, want)
	}
	for _, tc := range []struct{ src, want string }{
		{"        num_replicas: 08\n", "test.yaml:6: applications[0].deployments[0].num_replicas: must be an integer, got 08: a leading 0 makes YAML read an integer as octal, which has no 8 or 9: write it without the 0"},
		{"        user_config: {!env HOME: 1}\n", "test.yaml:6: applications[0].deployments[0].user_config.HOME: the YAML tag !env is not supported: a config holds plain values (of the tags, only the core schema's !!str, !!int, !!float, !!bool, !!null, !!map and !!seq) (on the key)"},
	} {
		errs := parseErrors(t, withDeployment(tc.src))
		if len(errs) != 1 || errs[0].Error() != tc.want {
			t.Errorf("%q: got %v, want %s", tc.src, errs, tc.want)
		}
	}
}

// A key that is no plain name is quoted in the problem's path: one
// holding a newline cannot split the line.
func TestOddKeyQuoted(t *testing.T) {
	errs := parseErrors(t, minimalYAML+"\"bogus\\nfield\": 1\n")
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `"bogus\nfield": unknown field`) || strings.Contains(errs[0].Error(), "\n") {
		t.Fatalf("got %q, want the key quoted on one line", errs)
	}
}

func TestValidHostHeader(t *testing.T) {
	for h, want := range map[string]bool{
		"api.example.com": true, "api.example.com:8443": true, "10.0.0.5": true, "10.0.0.5:80": true,
		"[::1]": true, "[::1]:8000": true, "localhost": true,
		"": false, "::1": false, "[::1": false, "[10.0.0.5]": false, "api.example.com:": false, "api.example.com:0": false,
		"api.example.com:x": false, "http://api": false, "a/b": false, "a b": false, "user@api": false, "-api": false,
		"api.example.com:+80": false, "api.example.com:080": true, "[10.0.0.5]:80": false, "[fe80::1%eth0]": false,
		"[fe80::1%eth0]:80": false, "[::1]:": false, "[::1]:+1": false, "[]": false, "[]:80": false, ":80": false,
	} {
		if got := validHostHeader(h); got != want {
			t.Errorf("validHostHeader(%q) = %v, want %v", h, got, want)
		}
	}
}

func TestValidHost(t *testing.T) {
	for h, want := range map[string]bool{
		"": true, "10.0.0.5": true, "::1": true, "fe80::1%eth0": true, "localhost": true, "api.example.com.": true,
		"replica-0.svc.cluster.local": true, "_http._tcp.svc.local": true, "1.example.com": true, "a.b9": true,
		"300.1.1.1": false, "10.0.0.256": false, "1.2.3": false, "127.1": false, "10": true, "0": true, "12345": true, "a..b": false, "-a.b": false, "a-.b": false,
		"a b": false, "a/b": false, ".": false, "a.b.": true, strings.Repeat("a", 64) + ".com": false,
		strings.Repeat("a.", 127) + "a": false, strings.Repeat("a.", 126) + "a": true,
	} {
		if got := validHost(h); got != want {
			t.Errorf("validHost(%q) = %v, want %v", h, got, want)
		}
	}
}

// A config built in Go can hold what no YAML file can: a name that is not
// UTF-8, which a metric's label would refuse at the first request.
func TestValidateNameNotUTF8(t *testing.T) {
	c := Default()
	c.Applications[0].Deployments[0].Name = "hello\xff"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), `applications[0].deployments[0].name: must be UTF-8, got "hello\xff"`) {
		t.Fatalf("Validate() = %v, want the name refused as not UTF-8", err)
	}
}
