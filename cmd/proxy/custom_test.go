package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCustomBinary builds testdata/shout, a binary of its own on proxycmd
// and replicacmd that registers the kind "shout", as the README's Go API
// section shows: it serves the kind in process and from its replica
// hosts, started from the same file; the stock binary refuses the file,
// naming the kind it lacks and those it has.
func TestCustomBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shout")
	if out, err := exec.Command("go", "build", "-race", "-o", bin, "./testdata/shout").CombinedOutput(); err != nil {
		t.Fatalf("go build ./testdata/shout: %v\n%s", err, out)
	}
	conf := `applications:
  - name: local
    route_prefix: /
    deployments:
      - name: shout
        handler: shout
        num_replicas: 2
        user_config: {word: hey}
  - name: remote
    route_prefix: /h
    deployments:
      - name: shouts
        handler: host
        hosts: [HOST]
        host_handler: shout
        num_replicas: 2
        user_config: {word: host}
`
	// The host takes its deployment from the file; its address is not
	// known before it listens, and the file must name one to parse.
	path := writeConfig(t, strings.Replace(conf, "HOST", `"127.0.0.1:1"`, 1))
	host := startListening(t, bin, "replica", "-config", path, "-deployment", "remote/shouts", "-listen", "127.0.0.1:0")
	path = writeConfig(t, strings.Replace(conf, "HOST", `"`+host.addr+`"`, 1))
	p := startBinary(t, bin, nil, "-config", path)

	c := newClient(t, 4)
	for _, tc := range []struct{ path, want string }{
		{"/x", "HEY/x"},
		{"/h/y", "HOST/h/y"},
	} {
		if r := get(t, c, "http://"+p.HTTPAddr+tc.path); r.status != 200 || r.body != tc.want {
			t.Errorf("GET %s: %d %q, want 200 %q", tc.path, r.status, r.body, tc.want)
		}
	}

	res := runProxy(t, nil, "-check", "-config", path)
	for _, want := range []string{
		`applications[0].deployments[0].handler: unknown handler "shout" (registered: echo, sleep, static; and upstream, command, host for replicas outside the process)`,
		`applications[1].deployments[0].host_handler: unknown handler "shout"`,
	} {
		if res.code != exitInvalid || !strings.Contains(res.stderr, want) {
			t.Errorf("the stock binary's -check: exit %d, want %d and %q in:\n%s", res.code, exitInvalid, want, res.stderr)
		}
	}
}
