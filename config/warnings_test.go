package config

import (
	"slices"
	"strings"
	"testing"
)

func TestWarnings(t *testing.T) {
	const file = `http_options: {host: 127.0.0.1, port: 8000, request_timeout_s: 30, keep_alive_timeout_s: 90}
applications:
  - name: a
    route_prefix: /
    deployments:
      - name: sh
        handler: command
        command: [sh, -c, "exec ./server --port $PORT --name $(hostname)"]
      - name: direct
        handler: command
        command: [./server, "$${PORT}", "$(REPLICA_ID)", "$$(LITERAL)", "$(A)$(B)", "$PORTAL", "$REPLICA_ID"]
        env: ["HOME_DIR=$(HOME)", "ID=$(REPLICA_ID)"]
      - name: envsh
        handler: command
        command: [env, -i, X=1, sh, -c, "exec ./server --port $PORT"]
        env: ["D=$PORT"]
`
	for _, tt := range []struct {
		name    string
		environ map[string]string
		want    []string
	}{
		{"file alone", nil, []string{
			`line 11: applications[0].deployments[1].command[1]: $PORT is passed as it is`,
			`line 11: applications[0].deployments[1].command[4]: $(A) is passed`,
			`line 11: applications[0].deployments[1].command[4]: $(B) is passed`,
			`line 11: applications[0].deployments[1].command[6]: $REPLICA_ID is passed as it is (no shell runs); write $(REPLICA_ID) for the replica's id`,
			`line 12: applications[0].deployments[1].env[0]: $(HOME) is passed`,
			// env(1) running a shell is a shell (found by a tester); no
			// shell reads an env value.
			`line 16: applications[0].deployments[2].env[0]: $PORT is passed as it is; write $(PORT) for the replica's port`,
		}},
		{"the same values in the environment", map[string]string{
			"PROXY_HTTP_ADDR": "127.0.0.1:8000", "PROXY_REQUEST_TIMEOUT": "30s", "PROXY_KEEP_ALIVE_TIMEOUT": "90s",
		}, nil},
		{"others", map[string]string{
			"PROXY_HTTP_ADDR": "0.0.0.0:8000", "PROXY_REQUEST_TIMEOUT": "0s", "PROXY_KEEP_ALIVE_TIMEOUT": "5s",
		}, []string{
			// The port is the same: only the host is lost (a default the
			// file left out was named as lost too, found by a tester).
			`line 1: http_options.host: 127.0.0.1 is overridden by PROXY_HTTP_ADDR=0.0.0.0:8000`,
			`line 1: http_options.request_timeout_s: 30 is overridden by PROXY_REQUEST_TIMEOUT=0s`,
			`line 1: http_options.keep_alive_timeout_s: 90 is overridden by PROXY_KEEP_ALIVE_TIMEOUT=5s`,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("", []byte(file))
			if err != nil {
				t.Fatal(err)
			}
			e, err := ReadEnv(tt.environ)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Apply(c); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range c.Warnings() {
				if tt.environ == nil || strings.Contains(w.Field, "http_options") {
					got = append(got, w.Error())
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Warnings:\n%s\nwant %d", strings.Join(got, "\n"), len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("warning %d = %q, want %q...", i, got[i], w)
				}
			}
		})
	}
}

func TestIgnoredEnv(t *testing.T) {
	for _, tt := range []struct {
		environ map[string]string
		want    []string
	}{
		{map[string]string{"PROXY_GC_PERCENT": "50"}, nil},
		{map[string]string{"PROXY_GC_TUNING": "false", "PROXY_GC_MEMORY_LIMIT": "1GiB"},
			[]string{"PROXY_GC_MEMORY_LIMIT=1GiB: not in force: PROXY_GC_TUNING=false leaves Go's defaults"}},
		{map[string]string{"PROXY_GC_PERCENT": "50", "GOGC": "200", "PROXY_GC_MEMORY_LIMIT": "1GiB"},
			[]string{"PROXY_GC_PERCENT=50: not in force: GOGC=200 wins over it"}},
		{map[string]string{"GOGC": "200", "GOMEMLIMIT": "1GiB"}, nil},
	} {
		if got := IgnoredEnv(tt.environ); !slices.Equal(got, tt.want) {
			t.Errorf("IgnoredEnv(%v) = %q, want %q", tt.environ, got, tt.want)
		}
	}
}

func TestRunsShell(t *testing.T) {
	for _, tt := range []struct {
		command []string
		want    bool
	}{
		{[]string{"sh", "-c", "x"}, true},
		{[]string{"/bin/bash", "-c", "x"}, true},
		{[]string{"env", "-i", "X=1", "sh", "-c", "x"}, true},
		{[]string{"env", "SHELL=/bin/sh", "./server"}, false}, // found by review
		{[]string{"./server", "env", "sh"}, false},
		{[]string{"python3", "server.py"}, false},
	} {
		if got := runsShell(tt.command); got != tt.want {
			t.Errorf("runsShell(%q) = %v, want %v", tt.command, got, tt.want)
		}
	}
}

// A replica host under two deployments is warned of: its actors take
// either's user_config for both (a tester saw /b answer what a PUT on /a
// set, while b reported its own).
func TestSharedHostWarning(t *testing.T) {
	c, err := Parse("", []byte(`applications:
  - name: a
    route_prefix: /a
    deployments:
      - {name: d, handler: host, hosts: ["127.0.0.1:9001"]}
  - name: b
    route_prefix: /b
    deployments:
      - {name: d, handler: host, hosts: ["127.0.0.1:9002", "127.0.0.1:9001"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Warnings()
	want := "line 9: applications[1].deployments[0].hosts[1]: 127.0.0.1:9001 is a host of applications[0].deployments[0] too: its actors serve both deployments with one user_config"
	if len(ws) != 1 || !strings.HasPrefix(ws[0].Error(), want) {
		t.Fatalf("Warnings() = %v, want one: %s...", ws, want)
	}
}

// An admin listener beyond loopback with no token is warned of: its
// address was its only protection (a tester: the image's 0.0.0.0:8080).
func TestOpenAdmin(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		warn        bool
	}{
		{"127.0.0.1:8080", "", false},
		{"[::1]:8080", "", false},
		{"localhost:8080", "", false},
		{"0.0.0.0:8080", "", true},
		{":8080", "", true},
		{"10.0.0.5:8080", "", true},
		{"proxy.internal:8080", "", true},
		{"0.0.0.0:8080", "s3cret", false},
	} {
		ws := OpenAdmin(Env{AdminAddr: tc.addr, AdminToken: tc.token})
		if got := len(ws) > 0; got != tc.warn || got && !strings.Contains(ws[0], "PROXY_ADMIN_TOKEN") {
			t.Errorf("%s with token %q: %q, want a warning %v", tc.addr, tc.token, ws, tc.warn)
		}
	}
}
