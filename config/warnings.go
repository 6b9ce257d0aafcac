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
			shell := slices.Contains([]string{"sh", "bash", "dash", "zsh", "ksh", "ash"}, filepath.Base(d.Command[0]))
			for k, a := range d.Command[1:] {
				f := fmt.Sprintf("%s.command[%d]", field, k+1)
				if shell {
					continue
				}
				seen := map[string]bool{}
				for _, m := range shellVar.FindAllStringSubmatch(a, -1) {
					v := m[1] + m[2]
					if !seen[v] {
						seen[v] = true
						warn(f, "$%s is passed as it is (no shell runs); write $(%s) for the replica's %s", v, v, map[string]string{"PORT": "port", "REPLICA_ID": "id"}[v])
					}
				}
				for _, name := range unexpanded(a) {
					warn(f, "%s", unexpandedMsg(name))
				}
			}
			for k, e := range d.Env {
				_, val, _ := strings.Cut(e, "=")
				for _, name := range unexpanded(val) {
					warn(fmt.Sprintf("%s.env[%d]", field, k), "%s", unexpandedMsg(name))
				}
			}
		}
	}
	slices.SortStableFunc(ws, func(a, b FieldError) int { return a.Line - b.Line })
	return ws
}

// shellVar matches a shell's $PORT or ${PORT} (or REPLICA_ID's), which
// only a shell expands.
var shellVar = regexp.MustCompile(`\$(?:(PORT|REPLICA_ID)\b|\{(PORT|REPLICA_ID)\})`)

// varRef matches a Kubernetes-style $(NAME) reference, or its escape
// $$(NAME).
var varRef = regexp.MustCompile(`\$?\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

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
	if e.HTTPAddr != "" && (c.written("http_options.host") || c.written("http_options.port")) && (host != o.Host || port != o.Port) {
		note("http_options", "host and port (%s) are overridden by %sHTTP_ADDR=%s",
			net.JoinHostPort(o.Host, strconv.Itoa(o.Port)), envPrefix, e.HTTPAddr)
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
