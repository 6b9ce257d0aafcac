package config

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Warnings returns what the file sets that is not taken as it reads, one
// FieldError each (File left empty for the caller), in line order: values
// the environment overrides (see Env.Apply) and command arguments passed
// on as they are. None of it stops the proxy: -check prints them, the
// start logs them.
func (c *Config) Warnings() []FieldError {
	ws := slices.Clone(c.overridden)
	ws = append(ws, c.sharedHosts()...)
	for i, app := range c.Applications {
		for j, d := range app.Deployments {
			if d.Handler != HandlerCommand || len(d.Command) == 0 {
				continue
			}
			field := fmt.Sprintf("applications[%d].deployments[%d]", i, j)
			warn := func(f, format string, args ...any) {
				ws = append(ws, FieldError{Line: c.Line(f), Field: f, Msg: fmt.Sprintf(format, args...)})
			}
			// A shell's arguments are its script: $PORT and $(cmd) are
			// the shell's to expand.
			args := d.Command[1:]
			if runsShell(d.Command) {
				args = nil
			}
			for k, a := range args {
				f := fmt.Sprintf("%s.command[%d]", field, k+1)
				for _, v := range shellVars(a) {
					warn(f, "$%s is passed as it is (no shell runs); write $(%s) for the replica's %s", v, v, shellVarNoun[v])
				}
				for _, name := range unexpanded(a) {
					warn(f, "%s", unexpandedMsg(name))
				}
			}
			for k, e := range d.Env {
				_, val, _ := strings.Cut(e, "=")
				f := fmt.Sprintf("%s.env[%d]", field, k)
				for _, name := range unexpanded(val) {
					warn(f, "%s", unexpandedMsg(name))
				}
				for _, v := range shellVars(val) {
					// No shell reads an env value, whatever the program.
					warn(f, "$%s is passed as it is; write $(%s) for the replica's %s", v, v, shellVarNoun[v])
				}
			}
		}
	}
	slices.SortStableFunc(ws, func(a, b FieldError) int { return a.Line - b.Line })
	return ws
}

// sharedHosts warns of each replica host listed under a second
// deployment: its actors serve both, with one user_config, so that a
// reconfigure of either changes what the other's requests get (a tester),
// while each deployment reports its own.
func (c *Config) sharedHosts() []FieldError {
	var ws []FieldError
	first := make(map[string]string) // host address -> the deployment that listed it first
	for i, app := range c.Applications {
		for j, d := range app.Deployments {
			if d.Handler != HandlerHost {
				continue
			}
			dep := fmt.Sprintf("applications[%d].deployments[%d]", i, j)
			for k, h := range d.Hosts {
				key := strings.ToLower(h)
				prev, ok := first[key]
				if !ok {
					first[key] = dep
					continue
				}
				if prev == dep {
					continue // a duplicate in one list is an error of its own
				}
				f := fmt.Sprintf("%s.hosts[%d]", dep, k)
				ws = append(ws, FieldError{Line: c.Line(f), Field: f, Msg: fmt.Sprintf(
					"%s is a host of %s too: its actors serve both deployments with one user_config, and a reconfigure of either (a reload, PUT .../user_config) changes what the other's requests get", h, prev)})
			}
		}
	}
	return ws
}

// shellVar matches a shell's $PORT or ${PORT} (or REPLICA_ID's), which
// only a shell expands.
var shellVar = regexp.MustCompile(`\$(?:(PORT|REPLICA_ID)\b|\{(PORT|REPLICA_ID)\})`)

// shellVarNoun is what each of shellVar's variables is of the replica.
var shellVarNoun = map[string]string{"PORT": "port", "REPLICA_ID": "id"}

// shellVars returns the variables of shellVar that s names, once each.
func shellVars(s string) []string {
	var vs []string
	for _, m := range shellVar.FindAllStringSubmatch(s, -1) {
		if v := m[1] + m[2]; !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	return vs
}

// runsShell reports whether command runs a shell, directly or through
// env(1) (env [-flags] [NAME=VALUE...] sh -c ...): its arguments are then
// the shell's to expand.
func runsShell(command []string) bool {
	shells := []string{"sh", "bash", "dash", "zsh", "ksh", "ash"}
	viaEnv := len(command) > 0 && filepath.Base(command[0]) == "env"
	for i, a := range command {
		switch {
		case i == 0 && viaEnv:
		case i > 0 && viaEnv && (strings.HasPrefix(a, "-") || strings.Contains(a, "=")):
			// env's flags and assignments (SHELL=/bin/sh is no shell run;
			// found by review)
		default:
			return slices.Contains(shells, filepath.Base(a))
		}
	}
	return false
}

// varRef matches a Kubernetes-style $(NAME) reference, or its escape
// $$(NAME).
var varRef = regexp.MustCompile(`\$?\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// ExpandReplicaVars replaces $(PORT) and $(REPLICA_ID) in s, a command
// replica's argument or env value, with port and id, as Kubernetes expands
// a container's args and env: $$(NAME) is the text $(NAME), any other
// $(NAME) is left as it is (Warnings says so), and so is any other $ (a
// shell's own $PORT). One definition for the start and for Warnings, so
// that what is warned of is what the start does.
func ExpandReplicaVars(s, port, id string) string {
	return varRef.ReplaceAllStringFunc(s, func(v string) string {
		switch {
		case strings.HasPrefix(v, "$$"):
			return v[1:] // escaped
		case v == "$(PORT)":
			return port
		case v == "$(REPLICA_ID)":
			return id
		default:
			return v // no such variable: the text, as Kubernetes leaves it
		}
	})
}

// unexpanded returns the names of the $(NAME) references in s that a
// replica process's start leaves as they are: all but $(PORT) and
// $(REPLICA_ID), and their escapes.
func unexpanded(s string) []string {
	var names []string
	for _, m := range varRef.FindAllStringSubmatch(s, -1) {
		if strings.HasPrefix(m[0], "$$") || m[1] == "PORT" || m[1] == "REPLICA_ID" {
			continue
		}
		names = append(names, m[1])
	}
	return names
}

func unexpandedMsg(name string) string {
	return fmt.Sprintf("$(%s) is passed as it is: only $(PORT) and $(REPLICA_ID) are replaced (write $$(%s) to mean the text)", name, name)
}

// overrides records, in c.overridden, the file's http_options that e
// overrides with another value: the environment wins (as the README
// says), and an image that sets PROXY_HTTP_ADDR must not leave a mounted
// file's port silently unused. A file that wrote nothing of them, or the
// same values, gets no word.
func (e Env) overrides(c *Config, host string, port int, setRequest, setKeepAlive bool) {
	o := c.HTTPOptions
	note := func(field, format string, args ...any) {
		c.overridden = append(c.overridden, FieldError{Line: c.Line(field), Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if e.HTTPAddr != "" {
		// Only what the file wrote: a default it left is no setting lost.
		hostLost := c.written("http_options.host") && host != o.Host
		portLost := c.written("http_options.port") && port != o.Port
		switch {
		case hostLost && portLost:
			note("http_options", "host and port (%s) are overridden by %sHTTP_ADDR=%s", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)), envPrefix, e.HTTPAddr)
		case hostLost:
			note("http_options.host", "%s is overridden by %sHTTP_ADDR=%s", o.Host, envPrefix, e.HTTPAddr)
		case portLost:
			note("http_options.port", "%d is overridden by %sHTTP_ADDR=%s", o.Port, envPrefix, e.HTTPAddr)
		}
	}
	if setRequest && c.written("http_options.request_timeout_s") && e.RequestTimeout.Seconds() != o.RequestTimeoutS {
		note("http_options.request_timeout_s", "%v is overridden by %sREQUEST_TIMEOUT=%v", o.RequestTimeoutS, envPrefix, e.RequestTimeout)
	}
	if setKeepAlive && c.written("http_options.keep_alive_timeout_s") && e.KeepAliveTimeout.Seconds() != o.KeepAliveTimeoutS {
		note("http_options.keep_alive_timeout_s", "%v is overridden by %sKEEP_ALIVE_TIMEOUT=%v", o.KeepAliveTimeoutS, envPrefix, e.KeepAliveTimeout)
	}
}

// written reports whether the file wrote field itself.
func (c *Config) written(field string) bool {
	_, ok := c.lines[field]
	return ok
}

// IgnoredEnv returns a warning for each PROXY_GC_ variable in environ
// that is set but not in force: PROXY_GC_TUNING=false leaves Go's
// defaults, and GOGC or GOMEMLIMIT win over what they tune. environ is
// taken to have passed ReadEnv.
func IgnoredEnv(environ map[string]string) []string {
	var ws []string
	tuning := true
	if v := environ[envPrefix+"GC_TUNING"]; v != "" {
		tuning, _ = strconv.ParseBool(v)
	}
	for _, v := range []struct{ name, runtime string }{
		{envPrefix + "GC_PERCENT", "GOGC"},
		{envPrefix + "GC_MEMORY_LIMIT", "GOMEMLIMIT"},
	} {
		val := environ[v.name]
		switch {
		case val == "":
		case !tuning:
			ws = append(ws, fmt.Sprintf("%s=%s: not in force: %sGC_TUNING=false leaves Go's defaults", v.name, val, envPrefix))
		case environ[v.runtime] != "":
			ws = append(ws, fmt.Sprintf("%s=%s: not in force: %s=%s wins over it", v.name, val, v.runtime, environ[v.runtime]))
		}
	}
	return ws
}

// OpenAdmin returns a warning when the admin listener (PROXY_ADMIN_ADDR)
// is reachable beyond loopback with no PROXY_ADMIN_TOKEN: its loopback
// address is then no longer what protects its mutating calls and the
// profiler (a tester found the image's 0.0.0.0 without a word).
func OpenAdmin(e Env) []string {
	if e.AdminToken != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(e.AdminAddr)
	if err != nil || host == "localhost" {
		return nil // a bad address is told as an error
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return []string{fmt.Sprintf("%sADMIN_ADDR=%s is reachable beyond loopback and %sADMIN_TOKEN is not set: "+
		"whoever reaches it can retune the GC, scale and reconfigure deployments, reload the config and read /debug/pprof/ "+
		"(set a token, or keep the port from all but the scraper)", envPrefix, e.AdminAddr, envPrefix)}
}
