package proxycmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/replica"
)

// running is a proxy Run in this process, serving.
type running struct {
	httpAddr, adminAddr string
	code                <-chan int // Run's exit code, once it returns
	cancel              context.CancelFunc
}

// runServing calls Run with args, env and reg in the background and
// returns once its "serving" line is logged; the proxy is stopped at the
// end of the test.
func runServing(t *testing.T, args []string, env map[string]string, reg *replica.Registry) *running {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		code <- Run(ctx, args, env, reg, io.Discard, pw)
		pw.Close()
	}()
	r := &running{code: code, cancel: cancel}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("Run did not return within 20s of its context's end")
		}
	})
	type addrs struct{ http, admin string }
	serving := make(chan addrs, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m struct {
				Message   string `json:"message"`
				HTTPAddr  string `json:"http_addr"`
				AdminAddr string `json:"admin_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Message == "serving" {
				serving <- addrs{m.HTTPAddr, m.AdminAddr}
			}
		}
	}()
	select {
	case a := <-serving:
		r.httpAddr, r.adminAddr = a.http, a.admin
	case c := <-code:
		t.Fatalf("Run returned %d before serving", c)
	case <-time.After(20 * time.Second):
		t.Fatal("no serving line within 20s")
	}
	return r
}

// Run serves a kind its caller registered until its context ends, then
// shuts down as at SIGTERM: a proxy embedded in a program of its own.
func TestRunUntilTheContextEnds(t *testing.T) {
	reg := replica.NewRegistry()
	reg.MustRegister("hello", func(json.RawMessage) (replica.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello"+r.URL.Path) }), nil
	})
	path := filepath.Join(t.TempDir(), "serve.yaml")
	conf := "applications:\n  - name: a\n    route_prefix: /\n    deployments:\n      - name: d\n        handler: hello\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PROXY_HTTP_ADDR": "127.0.0.1:0", "PROXY_ADMIN_ADDR": "127.0.0.1:0", "PROXY_GC_TUNING": "false"}
	r := runServing(t, []string{"-config", path}, env, reg)
	url := "http://" + r.httpAddr
	resp, err := http.Get(url + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello/x" {
		t.Fatalf("GET /x: %d %q", resp.StatusCode, b)
	}
	r.cancel()
	select {
	case c := <-r.code:
		if c != exitOK {
			t.Fatalf("Run after its context ended: %d, want %d", c, exitOK)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of its context's end")
	}
}

// A factory that panics on the file's user_config is a problem -check
// names, with its field, not a crash of the proxy (the same check runs at
// a reload).
func TestCheckFactoryPanics(t *testing.T) {
	reg := replica.NewRegistry()
	reg.MustRegister("model", func(json.RawMessage) (replica.Handler, error) { panic("weights file is corrupt") })
	path := filepath.Join(t.TempDir(), "serve.yaml")
	conf := "applications:\n  - name: a\n    route_prefix: /\n    deployments:\n      - name: d\n        handler: model\n        user_config: {path: w.bin}\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	code := Run(context.Background(), []string{"-check", "-config", path}, map[string]string{}, reg, io.Discard, &out)
	if code != exitInvalid || !strings.Contains(out.String(), "user_config") || !strings.Contains(out.String(), "panic: weights file is corrupt") {
		t.Fatalf("-check with a panicking factory: exit %d, output %q", code, out.String())
	}
}

// A config path that is a directory is refused, naming where it came from.
func TestConfigDirectoryRefused(t *testing.T) {
	dir := t.TempDir()
	var out strings.Builder
	code := Run(context.Background(), []string{"-check"}, map[string]string{"PROXY_CONFIG": dir}, nil, io.Discard, &out)
	if code != exitInvalid || !strings.Contains(out.String(), "PROXY_CONFIG") || !strings.Contains(out.String(), "is a directory") {
		t.Fatalf("PROXY_CONFIG a directory: exit %d, output %q", code, out.String())
	}
}

// model is a handler whose factory counts the handlers built: a model
// loaded each time.
type model struct{ v atomic.Value }

func (m *model) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, m.v.Load().(string))
}

func (m *model) Reconfigure(_ context.Context, uc json.RawMessage) error {
	m.v.Store(string(uc))
	return nil
}

// A reload builds a handler to check a user_config only when the file
// changes it, and once: it built one for every deployment in the file,
// and a second for a changed one (found by a tester).
func TestReloadChecksOnlyWhatChanged(t *testing.T) {
	var built atomic.Int64
	reg := replica.NewRegistry()
	reg.MustRegister("model", func(uc json.RawMessage) (replica.Handler, error) {
		built.Add(1)
		m := &model{}
		m.v.Store(string(uc))
		return m, nil
	})
	path := filepath.Join(t.TempDir(), "serve.yaml")
	conf := func(v string) string {
		return "applications:\n" +
			"  - name: a\n    route_prefix: /a\n    deployments:\n      - {name: d, handler: model, num_replicas: 2, user_config: {v: " + v + "}}\n" +
			"  - name: b\n    route_prefix: /b\n    deployments:\n      - {name: e, handler: model, user_config: {v: 1}}\n"
	}
	if err := os.WriteFile(path, []byte(conf("1")), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PROXY_HTTP_ADDR": "127.0.0.1:0", "PROXY_ADMIN_ADDR": "127.0.0.1:0", "PROXY_GC_TUNING": "false"}
	a := runServing(t, []string{"-config", path}, env, reg)
	reload := func() string {
		t.Helper()
		resp, err := http.Post("http://"+a.adminAddr+"/-/reload", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /-/reload: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + a.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	atStart := built.Load() // a check for each deployment, then its replicas
	if atStart != 2+3 {
		t.Fatalf("%d handlers built at the start, want 5 (2 checks, 3 replicas)", atStart)
	}
	reload()
	if n := built.Load() - atStart; n != 0 {
		t.Errorf("reload of the same file built %d handlers, want 0", n)
	}
	if err := os.WriteFile(path, []byte(conf("2")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := reload(); !strings.Contains(out, `user_config {\"v\":2}`) {
		t.Fatalf("reload with a's user_config changed: %s", out)
	}
	if n := built.Load() - atStart; n != 1 {
		t.Errorf("reload with one user_config changed built %d handlers, want 1 (its check)", n)
	}
	for range 4 {
		if got := get("/a"); got != `{"v":2}` {
			t.Fatalf("GET /a after the reload = %q, want the new user_config", got)
		}
	}
}

// -check lists the environment's problems and the file's together: with
// a bad variable, it stopped there, and the file's came one fix later
// (found by a tester). The file is found through PROXY_CONFIG too.
func TestCheckListsEnvAndFileProblems(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serve.yaml")
	conf := "applications:\n  - name: a\n    route_prefix: nope\n    deployments:\n      - {name: d, handler: static, max_ongoing_requests: 0}\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-check", "-config", path}, map[string]string{"PROXY_LOG_LEVEL": "loud", "PROXY_GC_PERCENT": "x"}},
		{[]string{"-check"}, map[string]string{"PROXY_LOG_LEVEL": "loud", "PROXY_GC_PERCENT": "x", "PROXY_CONFIG": path}},
	} {
		var out strings.Builder
		code := Run(context.Background(), tc.args, tc.env, nil, io.Discard, &out)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if code != exitInvalid || len(lines) != 4 || !strings.HasPrefix(lines[0], "PROXY_LOG_LEVEL:") || !strings.HasPrefix(lines[1], "PROXY_GC_PERCENT:") ||
			!strings.Contains(lines[2], ":3: applications[0].route_prefix") || !strings.Contains(lines[3], ":5: applications[0].deployments[0].max_ongoing_requests") {
			t.Errorf("%v with %v: exit %d, output:\n%s\nwant 2, the two variables then the file's two problems", tc.args, tc.env, code, out.String())
		}
	}
	// The good variables still count (PROXY_ADMIN_ADDR: no clash with the
	// file's port 8080), and GOGC is checked too (found by review).
	good := filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(good, []byte("http_options: {port: 8080}\napplications:\n  - name: a\n    route_prefix: /\n    deployments:\n      - {name: d, handler: static}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	{
		var out strings.Builder
		code := Run(context.Background(), []string{"-check", "-config", good}, map[string]string{"PROXY_LOG_LEVEL": "loud", "GOGC": "bogus", "PROXY_ADMIN_ADDR": "127.0.0.1:9000"}, nil, io.Discard, &out)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if code != exitInvalid || len(lines) != 2 || !strings.HasPrefix(lines[0], "PROXY_LOG_LEVEL:") || !strings.HasPrefix(lines[1], "GOGC=bogus") {
			t.Errorf("-check with a bad PROXY_LOG_LEVEL and GOGC: exit %d, output:\n%s\nwant 2, those two lines alone", code, out.String())
		}
	}
	// Without -check, a bad variable stops the start before the file.
	var out strings.Builder
	if code := Run(context.Background(), []string{"-config", path}, map[string]string{"PROXY_LOG_LEVEL": "loud"}, nil, io.Discard, &out); code != exitInvalid || strings.Contains(out.String(), "route_prefix") {
		t.Errorf("start with a bad variable: exit %d, output %q", code, out.String())
	}
}

// -h prints the usage and exits 0: asked for, not a bad flag (it exited
// 2, found by a tester).
func TestHelpExitsZero(t *testing.T) {
	var out strings.Builder
	if code := Run(context.Background(), []string{"-h"}, nil, nil, io.Discard, &out); code != exitOK || !strings.Contains(out.String(), "-config") {
		t.Fatalf("-h: exit %d, output %q; want 0 and the usage", code, out.String())
	}
	if code := Run(context.Background(), []string{"-nope"}, nil, nil, io.Discard, io.Discard); code != exitInvalid {
		t.Fatalf("-nope: exit %d, want %d", code, exitInvalid)
	}
}

// A reload's refusal shows a scalar's old and new value, never a list's
// or a struct's, which may hold secrets (an env's token; found by
// review), and takes a list left out for one written as [].
func TestChangedFields(t *testing.T) {
	a := config.Deployment{Name: "d", MaxOngoingRequests: 5, Env: []string{"TOKEN=old"}, Command: []string{"srv"}}
	b := config.Deployment{Name: "d", MaxOngoingRequests: 10, Env: []string{"TOKEN=new"}, Command: []string{"srv"}, Upstreams: []string{}}
	got := map[string]string{}
	for _, c := range changedFields(a, b) {
		got[c.name] = c.what()
	}
	want := map[string]string{"max_ongoing_requests": "changed from 5 to 10", "env": "changed"}
	if !maps.Equal(got, want) {
		t.Errorf("changedFields = %v, want %v", got, want)
	}
}

// A reload that gets its turn once the shutdown has begun (it waited for
// another, or its SIGHUP came with the SIGTERM) changes nothing, and says
// so.
func TestReloadRefusedWhenStopping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(path, []byte("applications: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	rl := newReloader(path, config.Env{}, replica.NewRegistry(), &config.Config{}, nil, zerolog.New(&logs))
	rl.stopping = func() bool { return true }
	res := rl.Reload(context.Background())
	if res.Status != http.StatusServiceUnavailable || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "shutting down") {
		t.Fatalf("Reload while stopping: %+v, want 503 saying the proxy is shutting down", res)
	}
	if !strings.Contains(logs.String(), "nothing is reloaded") {
		t.Fatalf("log %q, want the refusal", logs.String())
	}
}

// An empty -config path is refused rather than taken for no flag, and a
// PROXY_CONFIG that -config overrides is named in a warning (both found
// by a tester: the one served the built-in app, the other was dropped in
// silence).
func TestConfigFlagAndVariable(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.yaml")
	if err := os.WriteFile(good, []byte("applications:\n  - name: a\n    route_prefix: /\n    deployments:\n      - {name: d, handler: static}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code := Run(context.Background(), []string{"-check", "-config", ""}, map[string]string{"PROXY_CONFIG": good}, nil, io.Discard, &out); code != exitInvalid || !strings.Contains(out.String(), "-config: the path is empty") {
		t.Errorf("-config '': exit %d, %q; want 2 naming the empty path", code, out.String())
	}
	out.Reset()
	if code := Run(context.Background(), []string{"-check", "-config", good}, map[string]string{"PROXY_CONFIG": "/elsewhere.yaml"}, nil, io.Discard, &out); code != exitOK ||
		!strings.Contains(out.String(), "warning: PROXY_CONFIG=/elsewhere.yaml is ignored: -config "+good+" wins") {
		t.Errorf("-config with another PROXY_CONFIG: exit %d, %q; want 0 with a warning naming both", code, out.String())
	}
	out.Reset()
	if code := Run(context.Background(), []string{"-check", "-config", good}, map[string]string{"PROXY_CONFIG": good}, nil, io.Discard, &out); code != exitOK || strings.Contains(out.String(), "warning") {
		t.Errorf("-config and PROXY_CONFIG the same: exit %d, %q; want 0 and no warning", code, out.String())
	}
}
