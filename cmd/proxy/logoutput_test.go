package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pipedProxy is the proxy binary with its stderr on a pipe the test reads
// only when it wants to: a log collector that stalls, or goes away.
type pipedProxy struct {
	cmd       *exec.Cmd
	stderr    *os.File // the pipe's read end
	exited    chan struct{}
	waitErr   error
	httpAddr  string
	adminAddr string
}

// spawnPipedProxy starts the proxy on config and reads its stderr up to
// the "serving" line, then no further.
func spawnPipedProxy(t *testing.T, config string) *pipedProxy {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(proxyBin, "-config", conf)
	cmd.Env = childEnv(nil)
	cmd.Stderr = w // an *os.File: the child writes to the pipe itself
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	p := &pipedProxy{cmd: cmd, stderr: r, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		go func() { _, _ = io.Copy(io.Discard, r) }() // let a blocked writer go
		<-p.exited
		r.Close()
	})

	found := make(chan servingLine, 1)
	go func() {
		br := bufio.NewReader(r) // reads past the line only what is already there
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			var s servingLine
			if json.Unmarshal([]byte(line), &s) == nil && s.Message == "serving" {
				found <- s
				return
			}
		}
	}()
	select {
	case s := <-found:
		p.httpAddr, p.adminAddr = s.HTTPAddr, s.AdminAddr
	case <-p.exited:
		t.Fatalf("proxy exited before serving: %v", p.waitErr)
	case <-time.After(startTimeout):
		t.Fatalf("no serving line within %v", startTimeout)
	}
	return p
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// faultConfig is an upstream deployment with a live and a dead replica,
// health-checked ten times a second (each failure a warning in the log),
// and an in-process app to fill the log with access lines.
func faultConfig(live, dead string) string {
	return fmt.Sprintf(`applications:
  - name: up
    route_prefix: /up
    deployments:
      - name: up
        handler: upstream
        upstreams: ["http://%s", "http://%s"]
        health_check_path: /
        health_check_period_s: 0.1
        health_check_timeout_s: 1
  - name: loc
    route_prefix: /loc
    deployments:
      - name: loc
        handler: static
        max_ongoing_requests: 100
        user_config: {body: hi}
`, live, dead)
}

// fillLog sends n requests to url, each an access-log line.
func fillLog(t *testing.T, c *http.Client, url string, n int) {
	t.Helper()
	for range n {
		if r := get(t, c, url); r.status != http.StatusOK {
			t.Fatalf("GET %s: %d while filling the log", url, r.status)
		}
	}
}

// getWithin is a GET that must be answered within d.
func getWithin(t *testing.T, url string, d time.Duration) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	c := newClient(t, 1)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: no answer within %v: %v", url, d, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A log collector that stops reading costs log lines, not requests,
// metrics or the shutdown: before, a health check's warning blocked in its
// write to stderr while it held its deployment's lock, and with it the
// scrape, the request path's report of an unreachable replica, and the
// exit.
func TestStalledStderr(t *testing.T) {
	hi := startHi(t)
	p := spawnPipedProxy(t, faultConfig(hi.addr, deadAddr(t)))
	c := newClient(t, 4)
	base := "http://" + p.httpAddr
	// Far more access lines than the pipe and the log's buffers hold.
	fillLog(t, c, base+"/loc/", 4000)
	time.Sleep(time.Second) // ten rounds of failed health checks, logged into the stalled pipe

	for i := range 20 {
		code, _ := getWithin(t, base+"/up/", 10*time.Second)
		if code != http.StatusOK && code != http.StatusBadGateway {
			t.Fatalf("request %d to the upstream app: %d", i, code)
		}
	}
	code, body := getWithin(t, "http://"+p.adminAddr+"/metrics", 10*time.Second)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	dropped := metricValue(t, body, "serve_proxy_access_log_dropped_total")
	t.Logf("with stderr stalled: 4000 requests answered, %v access-log lines dropped", dropped)
	if dropped == 0 {
		t.Fatal("no access-log line counted as dropped: was stderr stalled at all?")
	}
	if !strings.Contains(body, "serve_proxy_log_dropped_total") {
		t.Fatal("/metrics has no serve_proxy_log_dropped_total")
	}

	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("proxy still running 60s after SIGTERM with its stderr stalled")
	}
	if got := exitCode(t, p.waitErr); got != exitOK {
		t.Fatalf("exit code %d after SIGTERM, want 0", got)
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// Lines lost to a log collector that stalled are said in the log once it
// reads again, with their number: an SRE reading the log sees the gap.
func TestStalledStderrReportsLostLines(t *testing.T) {
	hi := startHi(t)
	p := spawnPipedProxy(t, faultConfig(hi.addr, deadAddr(t)))
	c := newClient(t, 4)
	fillLog(t, c, "http://"+p.httpAddr+"/loc/", 4000)
	code, body := getWithin(t, "http://"+p.adminAddr+"/metrics", 10*time.Second)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	dropped := metricValue(t, body, "serve_proxy_access_log_dropped_total")
	if dropped == 0 {
		t.Fatal("no access-log line counted as dropped: was stderr stalled at all?")
	}
	reported := make(chan float64, 1)
	go func() { // the collector reads again
		sc := bufio.NewScanner(p.stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sum := 0.0
		for sc.Scan() {
			var l struct {
				Message string  `json:"message"`
				Lines   float64 `json:"lines"`
			}
			if json.Unmarshal(sc.Bytes(), &l) == nil && strings.HasPrefix(l.Message, "access-log lines were lost") {
				if sum += l.Lines; sum >= dropped {
					reported <- sum
					break
				}
			}
		}
		_, _ = io.Copy(io.Discard, p.stderr)
	}()
	select {
	case sum := <-reported:
		t.Logf("%v access-log lines lost, %v reported in the log", dropped, sum)
		if sum != dropped {
			t.Fatalf("the log reports %v lost access-log lines, the metric counts %v", sum, dropped)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no log line reports the %v access-log lines lost within 15s of the collector reading again", dropped)
	}
}

// A log collector that goes away (its pipe closed) leaves the proxy
// serving and its lines counted as lost, where Go's default for a write to
// a closed stderr is to die of SIGPIPE.
func TestClosedStderr(t *testing.T) {
	hi := startHi(t)
	p := spawnPipedProxy(t, faultConfig(hi.addr, deadAddr(t)))
	p.stderr.Close()
	c := newClient(t, 4)
	base := "http://" + p.httpAddr
	fillLog(t, c, base+"/loc/", 200)
	time.Sleep(300 * time.Millisecond) // the access log's writes out, and failed health checks logged
	select {
	case <-p.exited:
		t.Fatalf("proxy died once its stderr closed: %v", p.waitErr)
	default:
	}
	fillLog(t, c, base+"/loc/", 200)
	code, body := getWithin(t, "http://"+p.adminAddr+"/metrics", 10*time.Second)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if v := metricValue(t, body, "serve_proxy_log_dropped_total"); v == 0 {
		t.Fatal("serve_proxy_log_dropped_total is 0: the lines refused by the closed pipe were not counted")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("proxy still running 60s after SIGTERM")
	}
	if got := exitCode(t, p.waitErr); got != exitOK {
		t.Fatalf("exit code %d after SIGTERM, want 0", got)
	}
}

// metricValue returns the value of the unlabelled series name in a
// Prometheus text exposition.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// A replica process that prints a burst far larger than the log's buffers
// (20,000 lines a stream at once) has every line in the proxy's log when
// its reader keeps up: before, a burst of 5,000 lost lines (found by a
// tester), counted in serve_proxy_log_dropped_total and said nowhere.
func TestCommandOutputBurstIsKept(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: loud
    route_prefix: /
    deployments:
      - name: loud
        handler: command
        command: [sh, -c, 'seq 1 20000; seq 1 20000 >&2; exec "$HISERVER" -listen 127.0.0.1:$PORT']
        env: [HISERVER=`+hiBin+`]
        health_check_path: /
`)
	p := startProxy(t, nil, "-config", path)
	const want = 20000
	// seq's lines, by stream, in the order logged (hiserver's own
	// "listening" line aside).
	count := func() map[string][]string {
		got := map[string][]string{}
		for _, l := range p.stderrLines() {
			var e struct {
				Message, Stream, Line string
			}
			if json.Unmarshal([]byte(l), &e) == nil && e.Message == "replica output" && !strings.HasPrefix(e.Line, "listening") {
				got[e.Stream] = append(got[e.Stream], e.Line)
			}
		}
		return got
	}
	waitUntil(t, "every line of the replica's output in the log", func() bool {
		got := count()
		return len(got["stdout"]) >= want && len(got["stderr"]) >= want
	})
	for stream, lines := range count() {
		if len(lines) != want {
			t.Fatalf("%s: %d lines logged, want %d", stream, len(lines), want)
		}
		for i, l := range lines {
			if l != strconv.Itoa(i+1) {
				t.Fatalf("%s: line %d logged is %q, want %d", stream, i+1, l, i+1)
			}
		}
	}
	c := newClient(t, 1)
	_, body := getWithin(t, "http://"+p.AdminAddr+"/metrics", 10*time.Second)
	if v := metricValue(t, body, "serve_proxy_log_dropped_total"); v != 0 {
		t.Fatalf("serve_proxy_log_dropped_total = %v, want 0", v)
	}
	if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != http.StatusOK {
		t.Fatalf("GET / = %d", r.status)
	}
}
