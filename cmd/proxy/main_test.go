package main

// Process-level tests: each one runs the real binary, built once with -race
// by TestMain, on ephemeral loopback ports and talks to it with real
// clients (net/http, and ab and hey when installed).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Upper bounds, generous on purpose: the binary runs under the race
// detector on a small shared machine.
const (
	startTimeout = 20 * time.Second // until "serving" and a healthy /-/healthz
	stopTimeout  = 10 * time.Second // from SIGTERM to exit, before SIGKILL
	runTimeout   = 20 * time.Second // a short run: -version, -check, bad env
	toolTimeout  = 2 * time.Minute  // one ab or hey run
)

// The binary's exit codes (proxycmd.Main's).
const (
	exitOK      = 0
	exitInvalid = 2
)

// proxyBin is the binary TestMain builds; the tests run it. hiBin is
// cmd/hiserver and replicaBin cmd/replica, replica processes for the
// remote kinds' tests.
var proxyBin, hiBin, replicaBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "serveproxy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	proxyBin = filepath.Join(dir, "proxy")
	build := exec.Command("go", "build", "-race", "-o", proxyBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "TestMain: go build -race: %v\n%s", err, out)
		return 1
	}

	hiBin = filepath.Join(dir, "hiserver")
	if out, err := exec.Command("go", "build", "-o", hiBin, "../hiserver").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "TestMain: go build hiserver: %v\n%s", err, out)
		return 1
	}

	replicaBin = filepath.Join(dir, "replica")
	if out, err := exec.Command("go", "build", "-race", "-o", replicaBin, "../replica").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "TestMain: go build replica: %v\n%s", err, out)
		return 1
	}

	code := m.Run()
	if code == 0 {
		// Every client and reader goroutine the tests start must be gone.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// childEnv is the binary's whole environment: PATH and HOME, ephemeral
// loopback addresses unless vars sets them, and vars. Nothing else is
// inherited, so a developer's PROXY_* variables cannot change a test.
func childEnv(vars map[string]string) []string {
	env := map[string]string{
		"PATH":             os.Getenv("PATH"),
		"HOME":             os.Getenv("HOME"),
		"PROXY_HTTP_ADDR":  "127.0.0.1:0",
		"PROXY_ADMIN_ADDR": "127.0.0.1:0",
	}
	for k, v := range vars {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// exitCode returns the exit code that cmd.Wait's err stands for; -1 for a
// process killed by a signal.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("running %s: %v", proxyBin, err)
	return -1
}

// runResult is how a short run of the binary ended.
type runResult struct {
	stdout, stderr string
	code           int
}

// runProxy runs the binary to completion (bounded by runTimeout) for the
// runs that exit by themselves.
func runProxy(t *testing.T, vars map[string]string, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, proxyBin, args...)
	cmd.Env = childEnv(vars)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("proxy %v did not exit within %v; stderr:\n%s", args, runTimeout, stderr.String())
	}
	res := runResult{stdout: stdout.String(), stderr: stderr.String(), code: exitCode(t, err)}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, res.code, res.stdout, res.stderr)
		}
	})
	return res
}

// proc is a running proxy process.
type proc struct {
	t   *testing.T
	cmd *exec.Cmd

	// HTTPAddr and AdminAddr are the bound addresses from the "serving" line.
	HTTPAddr, AdminAddr string

	// exited is closed once stderr is drained and Wait has returned;
	// waitErr is Wait's result, read only after exited is closed.
	exited  chan struct{}
	waitErr error

	// mu guards lines.
	mu    sync.Mutex
	lines []string // stderr, one entry a line
}

// servingLine is the part of the "serving" log line the tests use.
type servingLine struct {
	Message   string `json:"message"`
	HTTPAddr  string `json:"http_addr"`
	AdminAddr string `json:"admin_addr"`
}

// startProxy starts the binary with args and vars (see childEnv), waits for
// its "serving" line and a 200 from the admin /-/healthz, and stops it at
// the end of the test: SIGTERM, then SIGKILL after stopTimeout.
func startProxy(t *testing.T, vars map[string]string, args ...string) *proc {
	t.Helper()
	return startBinary(t, proxyBin, vars, args...)
}

// startBinary is startProxy for another binary built on proxycmd.
func startBinary(t *testing.T, bin string, vars map[string]string, args ...string) *proc {
	t.Helper()
	p := launchBinary(t, bin, vars, args...)
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	p.waitHealthy(timer.C)
	return p
}

// launchProxy is startProxy up to the "serving" line: it does not wait for
// /-/healthz, for a proxy whose replicas are not all running.
func launchProxy(t *testing.T, vars map[string]string, args ...string) *proc {
	t.Helper()
	return launchBinary(t, proxyBin, vars, args...)
}

// launchBinary is launchProxy for another binary built on proxycmd.
func launchBinary(t *testing.T, bin string, vars map[string]string, args ...string) *proc {
	t.Helper()
	p, serving := spawnBinary(t, bin, vars, args...)
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s := <-serving:
		p.HTTPAddr, p.AdminAddr = s.HTTPAddr, s.AdminAddr
	case <-p.exited:
		t.Fatalf("proxy exited with code %d before serving", exitCode(t, p.waitErr))
	case <-timer.C:
		t.Fatalf("no serving line within %v", startTimeout)
	}
	if p.HTTPAddr == "" || p.AdminAddr == "" {
		t.Fatalf("serving line without addresses: http_addr %q, admin_addr %q", p.HTTPAddr, p.AdminAddr)
	}
	return p
}

// spawnProxy starts the proxy binary without waiting for it to serve; its
// "serving" line comes on the channel.
func spawnProxy(t *testing.T, vars map[string]string, args ...string) (*proc, <-chan servingLine) {
	t.Helper()
	return spawnBinary(t, proxyBin, vars, args...)
}

// spawnBinary is spawnProxy for another binary built on proxycmd.
func spawnBinary(t *testing.T, bin string, vars map[string]string, args ...string) (*proc, <-chan servingLine) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(vars)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, exited: make(chan struct{})}
	serving := make(chan servingLine, 1)
	go p.readStderr(stderr, serving)
	t.Cleanup(p.stop)
	return p, serving
}

// readStderr keeps every stderr line, hands the "serving" line over, and
// reaps the process once stderr is closed (Wait must follow the reads).
func (p *proc) readStderr(r io.Reader, serving chan<- servingLine) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		p.lines = append(p.lines, line)
		p.mu.Unlock()
		if serving == nil || !strings.Contains(line, `"message":"serving"`) {
			continue
		}
		var s servingLine
		if json.Unmarshal([]byte(line), &s) == nil && s.Message == "serving" {
			serving <- s
			serving = nil
		}
	}
	_, _ = io.Copy(io.Discard, r) // after an over-long line: never block the child
	p.waitErr = p.cmd.Wait()
	close(p.exited)
}

// waitHealthy polls the admin /-/healthz until it answers 200: replicas
// start after the listeners, and until then requests may be shed.
func (p *proc) waitHealthy(deadline <-chan time.Time) {
	p.t.Helper()
	c := newClient(p.t, 1)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := c.Get("http://" + p.AdminAddr + "/-/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			p.t.Fatalf("admin /-/healthz not 200 within %v (last error: %v)", startTimeout, err)
		case <-p.exited:
			p.t.Fatalf("proxy exited with code %d while starting", exitCode(p.t, p.waitErr))
		}
	}
}

// signal sends sig to the process.
func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits up to d for the process to exit and returns its exit code;
// ok is false if it is still running.
func (p *proc) wait(d time.Duration) (code int, ok bool) {
	p.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.exited:
		return exitCode(p.t, p.waitErr), true
	case <-timer.C:
		return 0, false
	}
}

// stop shuts the process down gracefully unless it has exited already,
// expecting exit code 0, and checks that the race detector stayed quiet.
// On failure it logs all of stderr.
func (p *proc) stop() {
	t := p.t
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code, ok := p.wait(stopTimeout); !ok {
			t.Errorf("proxy still running %v after SIGTERM; killing it", stopTimeout)
			_ = p.cmd.Process.Kill()
			<-p.exited
		} else if code != 0 {
			t.Errorf("proxy exited with code %d after SIGTERM, want 0", code)
		}
	}
	if p.logged("WARNING: DATA RACE") {
		t.Error("the race detector reported a data race in the proxy")
	}
	if t.Failed() {
		t.Logf("proxy stderr:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
}

// stderrLines returns a copy of the stderr lines read so far.
func (p *proc) stderrLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// logged reports whether a stderr line read so far contains s.
func (p *proc) logged(s string) bool {
	for _, l := range p.stderrLines() {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// waitLogged waits up to d for a stderr line containing s; the access log
// is buffered, so its lines reach stderr a moment after the response.
func (p *proc) waitLogged(s string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !p.logged(s) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// newClient returns a keep-alive client of its own, keeping up to idle
// connections, whose connections are closed when the test ends.
func newClient(t *testing.T, idle int) *http.Client {
	t.Helper()
	tr := &http.Transport{
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     30 * time.Second,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// response is a whole answer.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends req and reads the whole answer, failing the test on error.
func do(t *testing.T, c *http.Client, req *http.Request) response {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// get is do for a GET of url.
func get(t *testing.T, c *http.Client, url string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, c, req)
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // prefix
		wantStderr string // substring
	}{
		{name: "version", args: []string{"-version"}, wantCode: 0, wantStdout: "proxy "},
		{name: "unknown flag", args: []string{"-nope"}, wantCode: 2, wantStderr: "flag provided but not defined: -nope"},
		{name: "extra args", args: []string{"extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "extra args after flag", args: []string{"-check", "extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runProxy(t, nil, tt.args...)
			if res.code != tt.wantCode {
				t.Errorf("exit code %d, want %d", res.code, tt.wantCode)
			}
			if !strings.HasPrefix(res.stdout, tt.wantStdout) {
				t.Errorf("stdout %q, want it to start with %q", res.stdout, tt.wantStdout)
			}
			if !strings.Contains(res.stderr, tt.wantStderr) {
				t.Errorf("stderr %q, want it to contain %q", res.stderr, tt.wantStderr)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	t.Run("valid", func(t *testing.T) {
		res := runProxy(t, nil, "-check", "-config", "testdata/apps.yaml")
		if res.code != 0 {
			t.Errorf("exit code %d, want 0", res.code)
		}
		if want := "testdata/apps.yaml: ok"; !strings.Contains(res.stdout, want) {
			t.Errorf("stdout %q, want it to contain %q", res.stdout, want)
		}
	})

	// Every problem of testdata/bad.yaml: "file:line: field: " and a piece
	// of the message.
	const file = "testdata/bad.yaml"
	wantProblems := []struct{ prefix, msg string }{
		{file + ":5: applications[0].colour: ", "unknown field"},
		{file + ":9: applications[0].deployments[0].max_ongoing_requests: ", "must be >= 1"},
		{file + ":11: applications[1].route_prefix: ", "duplicate route_prefix"},
		{file + ":14: applications[1].deployments[0].handler: ", `unknown handler "nope"`},
		// At the key's line, not the user_config's (a tester).
		{file + ":22: applications[2].deployments[0].user_config.bdy: ", `unknown field "bdy"`},
	}
	checkProblems := func(t *testing.T, stderr string) {
		t.Helper()
		var problems []string
		for _, l := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(l, file+":") {
				problems = append(problems, l)
			}
		}
		for _, w := range wantProblems {
			found := false
			for _, l := range problems {
				if strings.HasPrefix(l, w.prefix) && strings.Contains(l, w.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("no line %q...%q", w.prefix, w.msg)
			}
		}
		if len(problems) != len(wantProblems) {
			t.Errorf("%d problem lines, want %d:\n%s", len(problems), len(wantProblems), strings.Join(problems, "\n"))
		}
	}

	t.Run("invalid", func(t *testing.T) {
		res := runProxy(t, nil, "-check", "-config", file)
		if res.code != 2 {
			t.Errorf("exit code %d, want 2", res.code)
		}
		checkProblems(t, res.stderr)
		if res.stdout != "" {
			t.Errorf("stdout %q, want nothing", res.stdout)
		}
	})

	t.Run("invalid without -check", func(t *testing.T) {
		res := runProxy(t, nil, "-config", file)
		if res.code != 2 {
			t.Errorf("exit code %d, want 2", res.code)
		}
		checkProblems(t, res.stderr)
		if !strings.Contains(res.stderr, "nothing started") {
			t.Errorf("stderr does not say that nothing started")
		}
		for _, msg := range []string{`"message":"starting"`, `"message":"serving"`} {
			if strings.Contains(res.stderr, msg) {
				t.Errorf("stderr has %s: the proxy started", msg)
			}
		}
	})
}

func TestBadEnv(t *testing.T) {
	tests := []struct{ name, value string }{
		{"PROXY_REQUEST_TIMEOUT", "5x"},
		{"PROXY_LOG_FORMAT", "xml"},
		{"PROXY_ACCESS_LOG", "maybe"},
		{"PROXY_MAX_BODY_BYTES", "-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runProxy(t, map[string]string{tt.name: tt.value})
			if res.code != 2 {
				t.Errorf("exit code %d, want 2", res.code)
			}
			if !strings.Contains(res.stderr, tt.name) {
				t.Errorf("stderr %q does not name %s", res.stderr, tt.name)
			}
			if strings.Contains(res.stderr, `"message":"serving"`) {
				t.Error("the proxy started")
			}
		})
	}
}

// A PROXY_ variable the proxy does not read is warned of, by -check and
// at the start, with the name it may have meant: a typo in
// PROXY_ADMIN_TOKEN had left the admin API open without a word.
func TestUnknownEnvWarned(t *testing.T) {
	vars := map[string]string{"PROXY_ADMIN_TOKN": "secret"}
	res := runProxy(t, vars, "-check")
	want := "PROXY_ADMIN_TOKN: not a variable the proxy reads; ignored (PROXY_ADMIN_TOKEN?)"
	if res.code != 0 || !strings.Contains(res.stderr, "warning: "+want) {
		t.Fatalf("-check: exit %d, stderr %q; want 0 and the warning", res.code, res.stderr)
	}
	p := startProxy(t, vars)
	if !p.waitLogged(want, 5*time.Second) {
		t.Fatal("no warning logged at the start")
	}
}

func TestDefaultApp(t *testing.T) {
	p := startProxy(t, nil)
	c := newClient(t, 2)
	public, admin := "http://"+p.HTTPAddr, "http://"+p.AdminAddr

	r := get(t, c, public+"/")
	if r.status != http.StatusOK || r.body != "hi" {
		t.Errorf("GET /: %d %q, want 200 \"hi\"", r.status, r.body)
	}
	if r.header.Get("X-Request-Id") == "" {
		t.Error("GET /: no X-Request-Id header")
	}

	for _, base := range []string{public, admin} {
		if r := get(t, c, base+"/-/healthz"); r.status != http.StatusOK {
			t.Errorf("GET %s/-/healthz: %d %q, want 200", base, r.status, r.body)
		}
		r := get(t, c, base+"/-/routes")
		var routes map[string]string
		if err := json.Unmarshal([]byte(r.body), &routes); err != nil || r.status != http.StatusOK ||
			len(routes) != 1 || routes["/"] != "default" {
			t.Errorf(`GET %s/-/routes: %d %q, want 200 {"/":"default"}`, base, r.status, r.body)
		}
	}

	r = get(t, c, admin+"/metrics")
	if r.status != http.StatusOK || !strings.Contains(r.body, "serve_num_http_requests_total") {
		t.Errorf("GET admin /metrics: %d, serve_num_http_requests_total missing:\n%s", r.status, r.body)
	}
	// The app owns "/", so the public /metrics is the app's "hi", never
	// the metrics; TestConfigFile checks the 404 where nothing owns it.
	if r := get(t, c, public+"/metrics"); strings.Contains(r.body, "serve_num_http_requests_total") {
		t.Errorf("the public port serves the metrics:\n%s", r.body)
	}
	if !p.waitLogged(`"component":"access"`, 5*time.Second) {
		t.Error("no access log line within 5s")
	}
}

// requireTool returns the path of an external client, skipping the test
// when it is missing, except in CI, which installs it.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed (CI must install it): %v", name, err)
		}
		t.Skipf("%s is not installed", name)
	}
	return path
}

// runTool runs an external client to completion and returns its output.
func runTool(t *testing.T, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not finish within %v:\n%s", path, toolTimeout, out)
	}
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", path, args, err, out)
	}
	return string(out)
}

// abField returns the value of ab's report line "name: value".
func abField(out, name string) (string, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `:\s*(\S+)`).FindStringSubmatch(out)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func TestInteropAB(t *testing.T) {
	ab := requireTool(t, "ab")
	p := startProxy(t, nil)
	url := "http://" + p.HTTPAddr + "/"
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"close", nil},
		{"keep-alive", []string{"-k"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{"-n", "2000", "-c", "100"}, tt.args...), url)
			out := runTool(t, ab, args...)
			if v, ok := abField(out, "Complete requests"); v != "2000" {
				t.Errorf("Complete requests: %q (found %v), want 2000", v, ok)
			}
			if v, ok := abField(out, "Failed requests"); v != "0" {
				t.Errorf("Failed requests: %q (found %v), want 0", v, ok)
			}
			if strings.Contains(out, "Non-2xx responses") {
				t.Error("ab saw non-2xx responses")
			}
			if t.Failed() {
				t.Logf("ab output:\n%s", out)
			}
		})
	}
}

func TestInteropHey(t *testing.T) {
	hey := requireTool(t, "hey")
	p := startProxy(t, nil)
	out := runTool(t, hey, "-n", "2000", "-c", "100", "http://"+p.HTTPAddr+"/")

	statuses := regexp.MustCompile(`(?m)^\s*\[(\d+)\]\s+(\d+) responses`).FindAllString(out, -1)
	if len(statuses) != 1 || strings.TrimSpace(statuses[0]) != "[200]\t2000 responses" {
		t.Errorf("status code distribution %q, want exactly [200]\\t2000 responses", statuses)
	}
	if strings.Contains(out, "Error distribution") {
		t.Error("hey saw errors")
	}
	if t.Failed() {
		t.Logf("hey output:\n%s", out)
	}
}

func TestConfigFile(t *testing.T) {
	tests := []struct {
		name string
		vars map[string]string
		args []string
	}{
		{name: "flag", args: []string{"-config", "testdata/apps.yaml"}},
		{name: "PROXY_CONFIG", vars: map[string]string{"PROXY_CONFIG": "testdata/apps.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, tt.vars, tt.args...)
			c := newClient(t, 2)
			public := "http://" + p.HTTPAddr

			if r := get(t, c, public+"/api"); r.status != http.StatusOK || r.body != "slept" {
				t.Errorf("GET /api: %d %q, want 200 \"slept\"", r.status, r.body)
			}

			req, err := http.NewRequest(http.MethodPost, public+"/echo/x?a=1&a=2", strings.NewReader("payload"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Test", "yes")
			r := do(t, c, req)
			var echo struct {
				Method  string              `json:"method"`
				Path    string              `json:"path"`
				Query   map[string][]string `json:"query"`
				Headers map[string][]string `json:"headers"`
				Body    *string             `json:"body"`
			}
			if err := json.Unmarshal([]byte(r.body), &echo); err != nil || r.status != http.StatusOK {
				t.Fatalf("POST /echo/x: %d %q (%v), want 200 and JSON", r.status, r.body, err)
			}
			if echo.Method != http.MethodPost || echo.Path != "/echo/x" ||
				strings.Join(echo.Query["a"], ",") != "1,2" ||
				strings.Join(echo.Headers["X-Test"], ",") != "yes" ||
				echo.Body == nil || *echo.Body != "payload" {
				t.Errorf("POST /echo/x: echo %s, want method POST, path /echo/x, query a=1&a=2, header X-Test: yes, body payload", r.body)
			}

			r = get(t, c, public+"/-/routes")
			var routes map[string]string
			if err := json.Unmarshal([]byte(r.body), &routes); err != nil ||
				len(routes) != 2 || routes["/api"] != "api" || routes["/echo"] != "echo" {
				t.Errorf("GET /-/routes: %d %q, want /api and /echo", r.status, r.body)
			}
			for _, path := range []string{"/", "/metrics"} {
				if r := get(t, c, public+path); r.status != http.StatusNotFound {
					t.Errorf("GET %s on the public port: %d, want 404", path, r.status)
				}
			}
		})
	}
}

// isDialError reports whether err is a refused connection: the request
// never reached the proxy.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && errors.Is(err, syscall.ECONNREFUSED)
}

func TestGracefulShutdownUnderLoad(t *testing.T) {
	const (
		workers    = 40
		perWorker  = 500 // bounds each worker's loop
		signalFrom = 200 // successes before SIGTERM
	)
	p := startProxy(t, nil, "-config", "testdata/graceful.yaml")
	c := newClient(t, workers)
	url := "http://" + p.HTTPAddr + "/"

	ctx, cancel := context.WithCancel(context.Background())
	var (
		ok, dialErrs atomic.Int64
		enough       = make(chan struct{})
		enoughOnce   sync.Once
		wg           sync.WaitGroup

		mu       sync.Mutex
		failures []string // guarded by mu
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	worker := func() {
		for range perWorker {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				fail("new request: %v", err)
				return
			}
			resp, err := c.Do(req)
			if ctx.Err() != nil {
				if err == nil {
					resp.Body.Close()
				}
				return // the test gave up; it reports why
			}
			if err != nil {
				if isDialError(err) {
					dialErrs.Add(1) // not accepted: fine once the listener is closed
				} else {
					fail("request error: %v", err)
				}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case err != nil:
				fail("reading body after %d: %v", resp.StatusCode, err)
				return
			case resp.StatusCode != http.StatusOK || string(body) != "ok":
				fail("answer %d %q, want 200 \"ok\"", resp.StatusCode, body)
			default:
				if ok.Add(1) >= signalFrom {
					enoughOnce.Do(func() { close(enough) })
				}
			}
		}
	}
	for range workers {
		wg.Go(worker)
	}
	workersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(workersDone)
	}()
	defer func() {
		cancel()
		<-workersDone
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-enough:
	case <-workersDone:
		t.Fatalf("workers stopped after %d successes, before %d: %q", ok.Load(), signalFrom, failures)
	case <-timer.C:
		t.Fatalf("only %d successes within %v", ok.Load(), startTimeout)
	}
	okAtSignal := ok.Load()
	p.signal(syscall.SIGTERM)

	code, exited := p.wait(2 * stopTimeout)
	if !exited {
		t.Fatalf("proxy still running %v after SIGTERM", 2*stopTimeout)
	}
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	timer.Reset(stopTimeout)
	select {
	case <-workersDone:
	case <-timer.C:
		t.Fatalf("workers still running %v after the proxy exited", stopTimeout)
	}

	t.Logf("%d requests answered 200 (%d at SIGTERM, %d after), %d not accepted (connection refused), %d failures",
		ok.Load(), okAtSignal, ok.Load()-okAtSignal, dialErrs.Load(), len(failures))
	for _, f := range failures {
		t.Error(f)
	}
	if !p.logged("draining") {
		t.Error(`no "draining" message in stderr`)
	}
}

func TestRequestTimeout(t *testing.T) {
	tests := []struct {
		name string
		vars map[string]string
		args []string
	}{
		{name: "file", args: []string{"-config", "testdata/timeout.yaml"}},
		{
			name: "PROXY_REQUEST_TIMEOUT overrides the file",
			vars: map[string]string{"PROXY_REQUEST_TIMEOUT": "100ms"},
			args: []string{"-config", "testdata/timeout30.yaml"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, tt.vars, tt.args...)
			c := newClient(t, 1)
			start := time.Now()
			r := get(t, c, "http://"+p.HTTPAddr+"/")
			elapsed := time.Since(start)
			if r.status != http.StatusRequestTimeout {
				t.Errorf("GET /: %d %q, want 408", r.status, r.body)
			}
			// The handler sleeps 5s; the timeout must cut it well short.
			if elapsed > 4*time.Second {
				t.Errorf("408 after %v, want well before the handler's 5s", elapsed)
			}
		})
	}
}

func TestMaxQueuedRequests(t *testing.T) {
	p := startProxy(t, nil, "-config", "testdata/queue.yaml")
	c := newClient(t, 3)
	url := "http://" + p.HTTPAddr + "/"

	const n = 3
	var (
		wg        sync.WaitGroup
		responses [n]response
		errs      [n]error
	)
	for i := range n {
		wg.Go(func() {
			resp, err := c.Get(url)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			responses[i], errs[i] = response{status: resp.StatusCode, header: resp.Header, body: string(body)}, err
		})
		// One request at the replica, one queued, then one too many:
		// the stagger lets each reach its place first.
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait() // bounded by the client's timeout

	var ok, shed int
	for i, r := range responses {
		switch {
		case errs[i] != nil:
			t.Errorf("request %d: %v", i, errs[i])
		case r.status == http.StatusOK && r.body == "ok":
			ok++
		case r.status == http.StatusServiceUnavailable:
			shed++
			if ra := r.header.Get("Retry-After"); ra == "" {
				t.Errorf("request %d: 503 without Retry-After", i)
			} else if _, err := strconv.Atoi(ra); err != nil {
				t.Errorf("request %d: Retry-After %q is not a number of seconds", i, ra)
			}
		default:
			t.Errorf("request %d: %d %q", i, r.status, r.body)
		}
	}
	if ok != 2 || shed != 1 {
		t.Errorf("%d answered 200 and %d shed with 503, want 2 and 1", ok, shed)
	}
}

// Listen addresses that cannot work are config errors at -check, not
// failures at start (found by an exploratory run).
func TestCheckListenAddresses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yaml string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	app := "applications:\n  - name: a\n    deployments:\n      - {name: a, handler: static}\n"
	for _, c := range []struct {
		name string
		vars map[string]string
		file string
		want string
	}{
		{"the admin port", map[string]string{"PROXY_ADMIN_ADDR": "127.0.0.1:21040", "PROXY_HTTP_ADDR": ""}, "http_options: {port: 21040}\n" + app,
			"clash.yaml:1: http_options.port: 21040 is the admin listener's port too (PROXY_ADMIN_ADDR 127.0.0.1:21040)"},
		{"the admin port on every interface", map[string]string{"PROXY_ADMIN_ADDR": "0.0.0.0:21041", "PROXY_HTTP_ADDR": ""}, "http_options: {port: 21041}\n" + app,
			"http_options.port: 21041 is the admin listener's port too"},
		{"the admin port on localhost", map[string]string{"PROXY_ADMIN_ADDR": "localhost:21042", "PROXY_HTTP_ADDR": ""}, "http_options: {host: 127.0.0.1, port: 21042}\n" + app,
			"http_options.port: 21042 is the admin listener's port too"},
		{"both addresses from the environment", map[string]string{"PROXY_ADMIN_ADDR": "127.0.0.1:21043", "PROXY_HTTP_ADDR": "127.0.0.1:21043"}, "http_options: {port: 21044}\n" + app,
			"PROXY_HTTP_ADDR: 127.0.0.1:21043: 21043 is the admin listener's port too"},
		{"the admin port, with another problem", map[string]string{"PROXY_ADMIN_ADDR": "127.0.0.1:21045", "PROXY_HTTP_ADDR": ""},
			"http_options: {port: 21045}\n" + strings.Replace(app, "handler: static", "handler: static, num_replicas: 0", 1),
			"clash.yaml:1: http_options.port: 21045 is the admin listener's port too"},
		{"a host that is no name", nil, "http_options: {host: \"not a host\"}\n" + app,
			`http_options.host: must be an IP address or a host name, got "not a host"`},
		{"an env host that is no name", map[string]string{"PROXY_HTTP_ADDR": "bad host:80"}, app,
			`PROXY_HTTP_ADDR: invalid address "bad host:80": "bad host" is not an IP address or a host name`},
	} {
		path := write("clash.yaml", c.file)
		res := runProxy(t, c.vars, "-check", "-config", path)
		if res.code != exitInvalid || !strings.Contains(res.stderr, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.name, res.code, res.stderr, exitInvalid, c.want)
		}
	}
}

// What the file or the environment sets that is not in force is warned
// of by -check and at the start, each naming the field and its line (a
// tester found each passing without a word): a $(NAME) that is not
// replaced, a $PORT given to a program that is no shell, the file's port
// overridden by PROXY_HTTP_ADDR, PROXY_GC_PERCENT with tuning off.
func TestSettingsNotInForceWarned(t *testing.T) {
	path := writeConfig(t, `http_options: {port: 19999}
applications:
  - name: a
    route_prefix: /
    deployments:
      - name: a
        handler: command
        command: [`+hiBin+`, -listen, "127.0.0.1:$(PORT)", "$(NOPE)", "$$(ESCAPED)", "$PORT"]
        env: ["X=$(PROT)"]
        health_check_path: /
`)
	vars := map[string]string{"PROXY_GC_TUNING": "false", "PROXY_GC_PERCENT": "50"}
	res := runProxy(t, vars, "-check", "-config", path)
	wants := []string{
		path + ":1: http_options.port: 19999 is overridden by PROXY_HTTP_ADDR=",
		path + ":8: applications[0].deployments[0].command[3]: $(NOPE) is passed as it is: only $(PORT) and $(REPLICA_ID) are replaced",
		path + ":8: applications[0].deployments[0].command[5]: $PORT is passed as it is (no shell runs)",
		path + ":9: applications[0].deployments[0].env[0]: $(PROT) is passed as it is",
		"PROXY_GC_PERCENT=50: not in force: PROXY_GC_TUNING=false leaves Go's defaults",
	}
	for _, want := range wants {
		if res.code != 0 || !strings.Contains(res.stderr, "warning: "+want) {
			t.Errorf("-check: exit %d; stderr lacks %q:\n%s", res.code, want, res.stderr)
		}
	}
	if strings.Contains(res.stderr, "ESCAPED") {
		t.Errorf("an escaped $$(ESCAPED) was warned of:\n%s", res.stderr)
	}
	p := startProxy(t, vars, "-config", path)
	for _, want := range wants[1:] {
		if !p.waitLogged(want, 20*time.Second) {
			t.Errorf("not logged at the start: %q", want)
		}
	}
}

// -check lists the file's warnings with its errors, not only once they
// are fixed (a tester: a $PORT passed as it is came to light only after
// the num_replicas beside it was mended).
func TestCheckWarnsBesideErrors(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: a
    route_prefix: /
    deployments:
      - name: a
        handler: command
        command: [`+hiBin+`, -listen, "$PORT"]
        num_replicas: 0
`)
	res := runProxy(t, nil, "-check", "-config", path)
	for _, want := range []string{
		path + ":8: applications[0].deployments[0].num_replicas: must be in [1, 10000], got 0",
		"warning: " + path + ":7: applications[0].deployments[0].command[2]: $PORT is passed as it is",
	} {
		if res.code != 2 || !strings.Contains(res.stderr, want) {
			t.Errorf("-check: exit %d; stderr lacks %q:\n%s", res.code, want, res.stderr)
		}
	}
}
