package main

// Replicas outside the proxy (issue 5), each test over real processes:
// cmd/hiserver replicas, the proxy binary, a DNS server on loopback.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// writeConfig writes a config file for one test and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// hiProcess is a cmd/hiserver replica the test started itself.
type hiProcess struct {
	cmd  *exec.Cmd
	addr string
	// stderr is what the process wrote there.
	stderr *lockedBuffer
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startHi starts a hiserver on a free loopback port and waits until it
// listens; it is killed at the end of the test.
func startHi(t *testing.T) *hiProcess {
	t.Helper()
	return startListening(t, hiBin, "-listen", "127.0.0.1:0")
}

// startListening starts bin with args, waits for its "listening on ADDR"
// line on stdout and kills it at the end of the test.
func startListening(t *testing.T, bin string, args ...string) *hiProcess {
	t.Helper()
	return startListeningEnv(t, nil, bin, args...)
}

// startListeningEnv is startListening with vars set in the environment.
func startListeningEnv(t *testing.T, vars map[string]string, bin string, args ...string) *hiProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(vars)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if err != nil || !ok {
		t.Fatalf("%s: %q %v", filepath.Base(bin), line, err)
	}
	return &hiProcess{cmd: cmd, addr: addr, stderr: stderr}
}

// applications reads the admin GET /-/applications.
type applications struct {
	Applications []struct {
		Name        string         `json:"name"`
		Status      string         `json:"status"`
		Message     string         `json:"message"`
		Deployments []deploymentOf `json:"deployments"`
	} `json:"applications"`
}

// deploymentOf is one deployment in GET /-/applications.
type deploymentOf struct {
	Name        string  `json:"name"`
	Status      string  `json:"status"`
	Message     string  `json:"message"`
	MaxOngoing  int     `json:"max_ongoing_requests"`
	HealthS     float64 `json:"health_check_period_s"`
	HealthTO    float64 `json:"health_check_timeout_s"`
	GraceS      float64 `json:"graceful_shutdown_timeout_s"`
	Unconnected []struct {
		Target string `json:"target"`
		Error  string `json:"error"`
	} `json:"unconnected_targets"`
	Replicas []struct {
		ID      string `json:"id"`
		Target  string `json:"target"`
		State   string `json:"state"`
		Healthy bool   `json:"healthy"`
		Served  int    `json:"served"`
		Ongoing int    `json:"ongoing"`
	} `json:"replicas"`
	DiscoveryError string `json:"discovery_error"`
}

func getApplications(t *testing.T, c *http.Client, p *proc) applications {
	t.Helper()
	r := get(t, c, "http://"+p.AdminAddr+"/-/applications")
	var a applications
	if err := json.Unmarshal([]byte(r.body), &a); err != nil || r.status != 200 {
		t.Fatalf("GET /-/applications: %d %s (%v)", r.status, r.body, err)
	}
	return a
}

// fixedRate sends GETs to url at rate per second for d (bounded), from
// as many goroutines as it needs, and counts the answers by status (0 for
// a failed round trip).
func fixedRate(t *testing.T, c *http.Client, url string, rate int, d time.Duration, during func()) map[int]int {
	t.Helper()
	var mu sync.Mutex
	counts := make(map[int]int)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	total := int(d.Seconds() * float64(rate))
	for i := range total {
		<-tick.C
		if i == total/3 && during != nil {
			during()
		}
		wg.Go(func() {
			status := 0
			if resp, err := c.Get(url); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			mu.Lock()
			counts[status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return counts
}

// killUnderLoad sends GETs at 300 a second for 3 s, calls kill a third of
// the way in, logs the success rate and checks that only requests in
// flight at the kill failed, with 502.
func killUnderLoad(t *testing.T, c *http.Client, p *proc, what string, kill func()) {
	t.Helper()
	const rate, length = 300, 3 * time.Second
	counts := fixedRate(t, c, "http://"+p.HTTPAddr+"/", rate, length, kill)
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("kill -9 of %s at %d req/s for %v: %d of %d answered 200 (%.2f%%), %d 502", what, rate, length, counts[200], total, 100*float64(counts[200])/float64(total), counts[502])
	for status, n := range counts {
		if status != 200 && status != 502 {
			t.Errorf("%d requests answered %d, want only 200 (and 502 for requests in flight at the kill)", n, status)
		}
	}
	if counts[502] > 5 {
		t.Errorf("%d requests got 502: more than were in flight at the kill", counts[502])
	}
}

func TestUpstreamKillMinus9(t *testing.T) {
	his := []*hiProcess{startHi(t), startHi(t), startHi(t)}
	var ups []string
	for _, h := range his {
		ups = append(ups, `"http://`+h.addr+`"`)
	}
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        upstreams: [`+strings.Join(ups, ", ")+`]
        health_check_path: /
        health_check_period_s: 1
        max_ongoing_requests: 20
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 50)
	killUnderLoad(t, c, p, "1 of 3 upstream replicas", func() { _ = his[1].cmd.Process.Signal(syscall.SIGKILL) })
	// Taken out at once (refused connections), and unhealthy in the metrics.
	var killed string
	apps := getApplications(t, c, p)
	for _, rep := range apps.Applications[0].Deployments[0].Replicas {
		if !rep.Healthy {
			killed = rep.ID
		}
	}
	if killed == "" {
		t.Fatal("no replica is unhealthy after a kill -9")
	}
	// As Serve: UNHEALTHY while a replica fails, saying which.
	if app, dep := apps.Applications[0], apps.Applications[0].Deployments[0]; app.Status != "UNHEALTHY" || dep.Status != "UNHEALTHY" ||
		!strings.Contains(dep.Message, killed) || !strings.Contains(app.Message, killed) {
		t.Errorf("after a kill -9: application %s (%q), deployment %s (%q); want UNHEALTHY naming %s",
			app.Status, app.Message, dep.Status, dep.Message, killed)
	}
	if m := get(t, c, "http://"+p.AdminAddr+"/metrics").body; !strings.Contains(m, fmt.Sprintf(`serve_deployment_replica_healthy{application="hi",deployment="hi",replica=%q} 0`, killed)) {
		t.Errorf("metrics do not show %s unhealthy", killed)
	}
	if !p.logged("replica unreachable: out of routing until a health check passes") {
		t.Error("no log line says the replica left routing")
	}
	// With why: a refused connection here (a TLS failure, say, elsewhere).
	if !slices.ContainsFunc(p.stderrLines(), func(l string) bool {
		return strings.Contains(l, "replica unreachable") && strings.Contains(l, "connection refused")
	}) {
		t.Error("the line that says the replica left routing does not say why")
	}
}

func TestCommandReplicasRestartAfterKill(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: command
        command: [sh, -c, 'exec "$HISERVER" -listen 127.0.0.1:$PORT']
        env: [HISERVER=`+hiBin+`]
        num_replicas: 3
        health_check_path: /
        health_check_period_s: 1
        max_ongoing_requests: 20
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 50)
	if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "hi" {
		t.Fatalf("GET / = %d %q", r.status, r.body)
	}
	pids := replicaPIDs(p)
	if len(pids) != 3 {
		t.Fatalf("replica pids from the log: %v, want 3", pids)
	}
	var victim int
	for _, pid := range pids {
		victim = pid
	}
	killUnderLoad(t, c, p, "1 of 3 command replicas", func() { _ = syscall.Kill(victim, syscall.SIGKILL) })
	if !p.waitLogged("replica process exited: replacing it", 10*time.Second) {
		t.Fatal("no log line says the killed replica is replaced")
	}
	waitUntil(t, "3 running replicas again", func() bool {
		n := 0
		for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
			if rep.State == "RUNNING" && rep.Healthy {
				n++
			}
		}
		return n == 3 && len(replicaPIDs(p)) == 4
	})
	// Four starts, as Ray Serve's serve_deployment_replica_starts counts
	// them: a crash loop's rate (found missing by a tester).
	if m := get(t, c, "http://"+p.AdminAddr+"/metrics").body; !strings.Contains(m, `serve_deployment_replica_starts_total{application="hi",deployment="hi"} 4`) {
		t.Errorf("metrics lack 4 replica starts:\n%s", m)
	}
	// On shutdown every replica process is stopped.
	p.stop()
	for _, pid := range replicaPIDs(p) {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("replica process %d still runs after the proxy stopped", pid)
		}
	}
}

// replicaPIDs returns the pids the proxy's log gives its replica
// processes (from their output lines), in order of appearance.
func replicaPIDs(p *proc) []int {
	seen := map[int]bool{}
	var pids []int
	for _, l := range p.stderrLines() {
		if !strings.Contains(l, `"message":"replica output"`) {
			continue
		}
		var line struct {
			PID int `json:"pid"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && line.PID > 0 && !seen[line.PID] {
			seen[line.PID] = true
			pids = append(pids, line.PID)
		}
	}
	return pids
}

// waitUntil polls cond (bounded by startTimeout).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCommandCrashAtStart(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: ok
    route_prefix: /ok
    deployments:
      - {name: ok, handler: static, user_config: {body: fine}}
  - name: broken
    route_prefix: /broken
    deployments:
      - name: broken
        handler: command
        command: [sh, -c, 'echo "model file missing" >&2; exit 3']
        num_replicas: 2
        max_constructor_retry_count: 3
`)
	// Not startProxy: /-/healthz is 503 until the broken deployment gives
	// up.
	p := startProxyUnhealthy(t, path)
	if !p.waitLogged("deployment unhealthy: max_constructor_retry_count rounds of replica starts failed in a row", 30*time.Second) {
		t.Fatal("no log line says the deployment gave up")
	}
	// Then the proxy takes traffic for the application that works.
	p.waitHealthy(time.After(startTimeout))
	if !p.logged("model file missing") || !p.logged("exit status 3") {
		t.Error("the replica's stderr and exit status are not in the log")
	}
	c := newClient(t, 2)
	if r := get(t, c, "http://"+p.HTTPAddr+"/ok"); r.status != 200 || r.body != "fine" {
		t.Errorf("the healthy application: %d %q", r.status, r.body)
	}
	// With no Retry-After: it gave up, and a second later is no better
	// (it said 1).
	if r := get(t, c, "http://"+p.HTTPAddr+"/broken"); r.status != 503 || !strings.Contains(r.body, "No replicas are available") || r.header.Get("Retry-After") != "" {
		t.Errorf("the broken application: %d %q, Retry-After %q; want 503 No replicas are available, and none", r.status, r.body, r.header.Get("Retry-After"))
	}
	dep := getApplications(t, c, p).Applications[1].Deployments[0]
	if dep.Status != "UNHEALTHY" {
		t.Errorf("broken deployment status %q, want UNHEALTHY", dep.Status)
	}
	// An alert on the healthy count fires for a deployment without any
	// replica: its gauge is there, at 0.
	wantMetric(t, c, p, `serve_deployment_healthy_replicas{application="broken",deployment="broken"} 0`)
	wantMetric(t, c, p, `serve_deployment_healthy_replicas{application="ok",deployment="ok"} 1`)
}

// A replica process that never answers its health check is given up on at
// health_check_timeout_s, and the log line says that is the setting that
// bounds a start (a slow-loading model needs a larger one).
func TestCommandNeverHealthyNamesTheTimeout(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: slow
    route_prefix: /
    deployments:
      - name: slow
        handler: command
        command: [sleep, "30"]
        health_check_timeout_s: 1
        max_constructor_retry_count: 1
`)
	p := startProxyUnhealthy(t, path)
	if !p.waitLogged("a replica's start is bounded by health_check_timeout_s (1s)", 30*time.Second) {
		t.Fatal("no log line names health_check_timeout_s as what gave up")
	}
}

// wantMetric checks that p's /metrics has the line sample.
func wantMetric(t *testing.T, c *http.Client, p *proc, sample string) {
	t.Helper()
	m := get(t, c, "http://"+p.AdminAddr+"/metrics")
	if m.status != 200 || !slices.Contains(strings.Split(m.body, "\n"), sample) {
		t.Errorf("/metrics (%d) lacks %s", m.status, sample)
	}
}

// startProxyUnhealthy is startProxy without waiting for /-/healthz.
func startProxyUnhealthy(t *testing.T, config string) *proc {
	t.Helper()
	return launchProxy(t, nil, "-config", config)
}

// srvZone is a DNS server on loopback answering SRV records for one name,
// and A records (127.0.0.1) for their targets; the test changes the ports.
type srvZone struct {
	mu    sync.Mutex
	ports []int
	fail  bool // answer SERVFAIL
	addr  string
}

func startSRVZone(t *testing.T) *srvZone {
	t.Helper()
	z := &srvZone{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z.addr = pc.LocalAddr().String()
	started := make(chan struct{})
	s := &dns.Server{PacketConn: pc, Handler: z, NotifyStartedFunc: func() { close(started) }}
	go func() { _ = s.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = s.Shutdown() })
	return z
}

func (z *srvZone) set(ports ...int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.ports = ports
}

func (z *srvZone) setFail(fail bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.fail = fail
}

// ServeDNS implements dns.Handler.
func (z *srvZone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative, m.RecursionAvailable = true, true
	defer func() { _ = w.WriteMsg(m) }()
	z.mu.Lock()
	defer z.mu.Unlock()
	q := req.Question[0]
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 1}
	switch {
	case z.fail:
		m.Rcode = dns.RcodeServerFailure
	case q.Qtype == dns.TypeSRV && q.Name == "_http._tcp.hi.test.":
		if len(z.ports) == 0 {
			m.Rcode = dns.RcodeNameError // all gone
		}
		for i, port := range z.ports {
			m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr, Port: uint16(port), Target: "r" + strconv.Itoa(i) + ".hi.test."})
		}
	case q.Qtype == dns.TypeA && strings.HasSuffix(q.Name, ".hi.test."):
		m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(127, 0, 0, 1)})
	}
}

// portOf is the port of a loopback host:port.
func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// routable counts the RUNNING replicas of p's first deployment.
func routable(t *testing.T, c *http.Client, p *proc) int {
	t.Helper()
	n := 0
	for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
		if rep.State == "RUNNING" {
			n++
		}
	}
	return n
}

// wantNoReplicas checks that url answers 503 No replicas are available at
// once: a deployment left without replicas must not make requests hang.
func wantNoReplicas(t *testing.T, c *http.Client, url string) {
	t.Helper()
	start := time.Now()
	if r := get(t, c, url); r.status != 503 || !strings.Contains(r.body, "No replicas are available") {
		t.Fatalf("GET %s with no replica: %d %q, want 503 No replicas are available", url, r.status, r.body)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the 503 took %v: requests must not hang when no replica is left", took)
	}
}

func TestDiscoveryFollowsDNS(t *testing.T) {
	his := []*hiProcess{startHi(t), startHi(t), startHi(t)}
	port := func(h *hiProcess) int { return portOf(h.addr) }
	z := startSRVZone(t)
	z.set(port(his[0]), port(his[1]))
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        discovery: dns+srv://_http._tcp.hi.test.
        discovery_server: `+z.addr+`
        discovery_interval_s: 0.2
        health_check_path: /
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	replicas := func() int { return len(getApplications(t, c, p).Applications[0].Deployments[0].Replicas) }
	if n := routable(t, c, p); n != 2 {
		t.Fatalf("%d replicas from the first answer, want 2", n)
	}
	for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
		if rep.Target != "http://"+his[0].addr && rep.Target != "http://"+his[1].addr {
			t.Errorf("replica %s: target %q, want one of the upstreams in DNS", rep.ID, rep.Target)
		}
	}
	z.set(port(his[0]), port(his[1]), port(his[2]))
	waitUntil(t, "a third replica from DNS", func() bool { return routable(t, c, p) == 3 })
	z.set(port(his[2]))
	waitUntil(t, "two replicas gone from DNS", func() bool { return replicas() == 1 })
	if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "hi" {
		t.Fatalf("GET / with one replica: %d %q", r.status, r.body)
	}
	z.set() // all gone
	waitUntil(t, "every replica gone", func() bool { return replicas() == 0 })
	wantNoReplicas(t, c, "http://"+p.HTTPAddr+"/")
	z.set(port(his[1]))
	waitUntil(t, "a replica back", func() bool { return routable(t, c, p) == 1 })
	var served atomic.Int32
	for range 20 {
		if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status == 200 {
			served.Add(1)
		}
	}
	if served.Load() != 20 {
		t.Fatalf("%d of 20 requests served after the replica came back", served.Load())
	}
	// A resolver that fails keeps the replica, and GET /-/applications
	// says why no change comes (it said nothing; a tester).
	z.setFail(true)
	var d deploymentOf
	waitUntil(t, "the discovery's failure shown", func() bool {
		d = getApplications(t, c, p).Applications[0].Deployments[0]
		return d.DiscoveryError != ""
	})
	if !strings.Contains(d.Message, "DNS discovery is failing") || len(d.Replicas) != 1 {
		t.Errorf("while DNS fails: message %q, %d replicas; want the failure named and the replica kept", d.Message, len(d.Replicas))
	}
	z.setFail(false)
	waitUntil(t, "the failure cleared once DNS answers", func() bool {
		return getApplications(t, c, p).Applications[0].Deployments[0].DiscoveryError == ""
	})
}

// startHanging listens on loopback and never answers a request; with
// healthy, it answers GET /-/healthz with 200. It stops at cleanup.
func startHanging(t *testing.T, healthy bool) net.Listener {
	t.Helper()
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			held.Go(func() {
				defer c.Close()
				if healthy {
					b := make([]byte, 4096)
					n, _ := c.Read(b)
					if strings.HasPrefix(string(b[:n]), "GET /-/healthz") {
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
						return
					}
				}
				<-stop
			})
		}
	}()
	t.Cleanup(func() { hang.Close(); close(stop); held.Wait() })
	return hang
}

func TestHangingUpstream(t *testing.T) {
	// A replica that accepts and never answers, beside a good one.
	hang := startHanging(t, false)
	good := startHi(t)
	path := writeConfig(t, `http_options: {request_timeout_s: 1}
applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        upstreams: ["http://`+hang.Addr().String()+`", "http://`+good.addr+`"]
        health_check_path: /
        health_check_period_s: 0.3
        health_check_timeout_s: 0.3
`)
	p := startProxyUnhealthy(t, path)
	c := newClient(t, 8)
	// Until its checks fail three times, some requests land on the hung
	// replica and time out at the proxy's deadline.
	statuses := map[int]int{}
	for range 10 {
		statuses[get(t, c, "http://"+p.HTTPAddr+"/").status]++
	}
	t.Logf("first 10 requests: %v", statuses)
	for s := range statuses {
		if s != 200 && s != http.StatusRequestTimeout {
			t.Errorf("status %d, want 200 or 408", s)
		}
	}
	if !p.waitLogged("replica unhealthy: out of routing until it passes a health check", 20*time.Second) {
		t.Fatal("the hung replica was not taken out of routing")
	}
	for i := range 50 {
		if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 {
			t.Fatalf("request %d after the hung replica left routing: %d %q", i, r.status, r.body)
		}
	}
}

func TestSlowUpstreamGetsLess(t *testing.T) {
	// Two fast replicas and one that takes 50 ms; each names itself.
	var servers []string
	for _, name := range []string{"fast-a", "fast-b", "slow"} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if name == "slow" && r.URL.Path != "/-/healthz" {
				time.Sleep(50 * time.Millisecond)
			}
			_, _ = io.WriteString(w, name)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		servers = append(servers, `"http://`+ln.Addr().String()+`"`)
	}
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        upstreams: [`+strings.Join(servers, ", ")+`]
        max_ongoing_requests: 10
`)
	p := startProxy(t, nil, "-config", path)
	const workers, perWorker = 8, 150
	c := newClient(t, workers)
	var mu sync.Mutex
	served := map[string]int{}
	var fast []time.Duration
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				start := time.Now()
				r := get(t, c, "http://"+p.HTTPAddr+"/")
				took := time.Since(start)
				mu.Lock()
				served[r.body]++
				if strings.HasPrefix(r.body, "fast") {
					fast = append(fast, took)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(fast)
	p99 := fast[len(fast)*99/100]
	t.Logf("served: %v; p99 of the fast replicas' requests %v (the slow one takes 50ms)", served, p99)
	total := workers * perWorker
	if served["slow"]*3 >= total {
		t.Errorf("the slow replica served %d of %d: power of two choices should send it less than a third", served["slow"], total)
	}
	if p99 >= 50*time.Millisecond {
		t.Errorf("p99 of requests to the fast replicas is %v: the slow replica holds them up", p99)
	}
}

func TestRemoteBadInput(t *testing.T) {
	script := filepath.Join(t.TempDir(), "server.py")
	if err := os.WriteFile(script, []byte("#!/no/such/python3 -u\nprint('hi')\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, `applications:
  - name: a
    route_prefix: /a
    deployments:
      - name: a
        handler: upstream
        upstreams: ["http://10.0.0.5:8000", "http//missing-colon", "http://[::1"]
  - name: b
    route_prefix: /b
    deployments:
      - name: b
        handler: command
        command: [no-such-server-binary, --port, "$PORT"]
  - name: c
    route_prefix: /c
    deployments:
      - name: c
        handler: command
        command: [./relative/missing]
        working_dir: /nonexistent-dir
  - name: d
    route_prefix: /d
    deployments:
      - name: d
        handler: upstream
        discovery: dns://svc.local
  - name: e
    route_prefix: /e
    deployments:
      - name: e
        handler: host
        hosts: ["127.0.0.1:9001"]
        host_handler: nope
  - name: f
    route_prefix: /f
    deployments:
      - name: f
        handler: command
        command: [`+script+`]
  - name: g
    route_prefix: /g
    deployments:
      - name: g
        handler: command
        command: [/no/such/program]
        working_dir: /nonexistent-dir
`)
	want := []string{
		`:7: applications[0].deployments[0].upstreams[1]: must be an http:// or https:// URL, got "http//missing-colon"`,
		`:7: applications[0].deployments[0].upstreams[2]: must be a URL, got "http://[::1"`,
		`:13: applications[1].deployments[0].command: program "no-such-server-binary" not found on PATH`,
		`:20: applications[2].deployments[0].working_dir: "/nonexistent-dir": no such file or directory`,
		`:26: applications[3].deployments[0].discovery: must be dns://name:port`,
		`:33: applications[4].deployments[0].host_handler: unknown handler "nope"`,
		`:39: applications[5].deployments[0].command: program "` + script + `": its #! line names the interpreter "/no/such/python3", which does not exist`,
		// Both, the program not being relative to the directory (found
		// by a tester: the second was not said).
		`:45: applications[6].deployments[0].command: program "/no/such/program": no such file or directory`,
		`:46: applications[6].deployments[0].working_dir: "/nonexistent-dir": no such file or directory`,
	}
	for _, args := range [][]string{{"-check", "-config", path}, {"-config", path}} {
		res := runProxy(t, nil, args...)
		if res.code != 2 {
			t.Errorf("proxy %v: exit %d, want 2", args, res.code)
		}
		for _, w := range want {
			if !strings.Contains(res.stderr, w) {
				t.Errorf("proxy %v: no line with %q in:\n%s", args, w, res.stderr)
			}
		}
	}
}

// startReplicaHost starts cmd/replica with args on a free loopback port;
// it is killed at the end of the test.
func startReplicaHost(t *testing.T, args ...string) *hiProcess {
	t.Helper()
	return startListening(t, replicaBin, append([]string{"-listen", "127.0.0.1:0"}, args...)...)
}

func TestReplicaHosts(t *testing.T) {
	hosts := []*hiProcess{
		startReplicaHost(t, "-handler", "static", "-replicas", "4", "-max-ongoing", "20", "-user-config", `{"body":"hi"}`),
		startReplicaHost(t, "-handler", "static", "-replicas", "4", "-max-ongoing", "20", "-user-config", `{"body":"hi"}`),
	}
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["`+hosts[0].addr+`", "`+hosts[1].addr+`"]
        health_check_period_s: 1
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 50)
	dep := getApplications(t, c, p).Applications[0].Deployments[0]
	if len(dep.Replicas) != 8 || dep.Status != "HEALTHY" || dep.MaxOngoing != 20 {
		t.Fatalf("deployment over two hosts of 4 actors of limit 20 (the hosts' flags): %+v", dep)
	}
	wantMetric(t, c, p, `serve_deployment_healthy_replicas{application="hi",deployment="hi"} 8`)

	// A reconfigure reaches every actor through one control frame per host.
	if r := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hi/deployments/hi/user_config", `{"body":"v2"}`)); r.status != 200 {
		t.Fatalf("PUT user_config = %d %s", r.status, r.body)
	}
	for i := range 200 {
		if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "v2" {
			t.Fatalf("request %d after reconfigure: %d %q, want 200 v2", i, r.status, r.body)
		}
	}

	killUnderLoad(t, c, p, "1 of 2 replica hosts (4 actors each)", func() { _ = hosts[1].cmd.Process.Signal(syscall.SIGKILL) })
	unhealthy := 0
	for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
		if !rep.Healthy {
			unhealthy++
		}
	}
	if unhealthy != 4 {
		t.Errorf("%d replicas unhealthy after the kill, want the host's 4", unhealthy)
	}
	wantMetric(t, c, p, fmt.Sprintf(`serve_deployment_healthy_replicas{application="hi",deployment="hi"} %d`, 8-unhealthy))
}

// TestReplicaHostMutualTLS serves through a replica host that takes only
// proxies with a client certificate of its CA, shows a proxy with another
// CA's refused, and -check finding a bad certificate file before anything
// starts.
func TestReplicaHostMutualTLS(t *testing.T) {
	tlsDir, err := filepath.Abs("../../config/testdata/tls")
	if err != nil {
		t.Fatal(err)
	}
	host := startReplicaHost(t, "-handler", "static", "-replicas", "2", "-max-ongoing", "10", "-user-config", `{"body":"sealed"}`,
		"-tls-cert", tlsDir+"/host.pem", "-tls-key", tlsDir+"/host-key.pem", "-tls-client-ca", tlsDir+"/ca.pem")
	// conf is a config of the host with these host_tls fields.
	conf := func(fields string) string {
		return writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["`+host.addr+`"]
        host_tls:
`+fields)
	}
	withCert := func(cert string) string {
		return conf("          ca_file: " + tlsDir + "/ca.pem\n          cert_file: " + tlsDir + "/" + cert + ".pem\n          key_file: " + tlsDir + "/" + cert + "-key.pem\n")
	}
	p := startProxy(t, nil, "-config", withCert("proxy"))
	c := newClient(t, 10)
	for i := range 50 {
		if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "sealed" {
			t.Fatalf("request %d over TLS: %d %q", i, r.status, r.body)
		}
	}

	// A proxy whose certificate another CA signed: the host refuses it,
	// and, as for a host down at start, the proxy exits naming the host
	// and why.
	res := runProxy(t, nil, "-config", withCert("stranger"))
	if res.code != 1 || !strings.Contains(res.stderr, "replica host "+host.addr) || !strings.Contains(res.stderr, "tls: certificate required") {
		t.Errorf("a proxy the host refuses: exit %d, stderr %s; want 1 naming the host and the TLS alert", res.code, res.stderr)
	}

	res = runProxy(t, nil, "-check", "-config", conf("          ca_file: "+tlsDir+"/host-key.pem\n"))
	if res.code != 2 || !strings.Contains(res.stderr, ":9: applications[0].deployments[0].host_tls.ca_file: "+tlsDir+"/host-key.pem: no PEM certificate in it") {
		t.Errorf("-check with a key for a CA: exit %d\n%s", res.code, res.stderr)
	}
}

// TestProxyTLSFilesReloaded changes the proxy's client certificate on disk
// while it runs: its redials to a restarted host use the files as they
// are then, refused with another CA's certificate and let in with its own
// again, with no restart of the proxy.
func TestProxyTLSFilesReloaded(t *testing.T) {
	tlsDir, err := filepath.Abs("../../config/testdata/tls")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	use := func(name string) { // the proxy's certificate and key become name's
		for _, f := range [][2]string{{name + ".pem", "cert.pem"}, {name + "-key.pem", "key.pem"}} {
			b, err := os.ReadFile(filepath.Join(tlsDir, f[0]))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f[1]), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	use("proxy")
	args := []string{"-handler", "static", "-user-config", `{"body":"hi"}`,
		"-tls-cert", tlsDir + "/host.pem", "-tls-key", tlsDir + "/host-key.pem", "-tls-client-ca", tlsDir + "/ca.pem"}
	host := startReplicaHost(t, args...)
	p := startProxy(t, nil, "-config", writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["`+host.addr+`"]
        health_check_period_s: 60
        host_tls: {ca_file: `+tlsDir+`/ca.pem, cert_file: `+dir+`/cert.pem, key_file: `+dir+`/key.pem}
`))
	c := newClient(t, 4)
	c.Timeout = 5 * time.Second
	url := "http://" + p.HTTPAddr + "/"
	if r := get(t, c, url); r.status != 200 {
		t.Fatalf("before the change: %d %q", r.status, r.body)
	}

	use("stranger")
	_ = host.cmd.Process.Signal(syscall.SIGKILL)
	startListening(t, replicaBin, append([]string{"-listen", host.addr}, args...)...)
	if !p.waitLogged("certificate required", 20*time.Second) {
		t.Fatalf("the redial with another CA's certificate was not refused, or not logged:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	if r := get(t, c, url); r.status != http.StatusServiceUnavailable {
		t.Errorf("while the host refuses the proxy: %d %q, want 503", r.status, r.body)
	}

	use("proxy")
	waitUntil(t, "200 once the proxy's own certificate is back", func() bool { return get(t, c, url).status == http.StatusOK })
}

// TestReplicaHostGoneThenBack kills a deployment's only replica host, with
// health checks a minute apart: requests are answered 503 "No replicas are
// available" at once (within the client's 5 s bound), not queued for the
// host until its checks fail; a host started again on the address is
// reconnected, checked at once and serves.
func TestReplicaHostGoneThenBack(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-max-ongoing", "10", "-user-config", `{"body":"hi"}`}
	host := startReplicaHost(t, args...)
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["`+host.addr+`"]
        health_check_period_s: 60
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 10)
	c.Timeout = 5 * time.Second
	url := "http://" + p.HTTPAddr + "/"
	if r := get(t, c, url); r.status != 200 || r.body != "hi" {
		t.Fatalf("before the kill: %d %q", r.status, r.body)
	}
	_ = host.cmd.Process.Signal(syscall.SIGKILL)
	start := time.Now()
	waitUntil(t, "503 once the host is gone", func() bool {
		r := get(t, c, url)
		return r.status == http.StatusServiceUnavailable && strings.Contains(r.body, "No replicas are available")
	})
	t.Logf("503 No replicas are available %v after the kill", time.Since(start).Round(time.Millisecond))
	if r := get(t, c, url); r.status != http.StatusServiceUnavailable {
		t.Fatalf("a request while the host is gone: %d %q, want 503", r.status, r.body)
	}
	// The proxy stays ready: a deployment without replicas answers 503 on
	// its own route, and the proxy's other routes (none here) still serve.
	if r := get(t, c, "http://"+p.HTTPAddr+"/-/healthz"); r.status != http.StatusOK {
		t.Fatalf("/-/healthz while the host is gone: %d %q, want 200", r.status, r.body)
	}

	startListening(t, replicaBin, append([]string{"-listen", host.addr}, args...)...)
	start = time.Now()
	waitUntil(t, "200 from the host started again", func() bool { return get(t, c, url).status == http.StatusOK })
	t.Logf("serving again %v after the host was started again", time.Since(start).Round(time.Millisecond))
}

// TestJoiningHostsGetTheUserConfig reconfigures a host deployment through
// the admin API, then restarts its host, which comes back with its flags'
// user_config, and adds a second host (flags alike) by reload: each serves
// the deployment's user_config from its first request on.
func TestJoiningHostsGetTheUserConfig(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-user-config", `{"body":"hi"}`}
	first := startReplicaHost(t, args...)
	conf := func(hosts string) string {
		return `applications:
  - name: hi
    route_prefix: /
    deployments:
      - {name: hi, handler: host, hosts: [` + hosts + `], health_check_period_s: 60}
`
	}
	path := writeConfig(t, conf(`"`+first.addr+`"`))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	c.Timeout = 5 * time.Second
	url := "http://" + p.HTTPAddr + "/"
	if r := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hi/deployments/hi/user_config", `{"body":"v2"}`)); r.status != 200 {
		t.Fatalf("PUT user_config = %d %s", r.status, r.body)
	}
	allV2 := func(when string) {
		t.Helper()
		for i := range 100 {
			if r := get(t, c, url); r.status != 200 || r.body != "v2" {
				t.Fatalf("request %d %s: %d %q, want 200 v2", i, when, r.status, r.body)
			}
		}
	}
	allV2("after the reconfigure")

	_ = first.cmd.Process.Signal(syscall.SIGKILL)
	startListening(t, replicaBin, append([]string{"-listen", first.addr}, args...)...)
	waitUntil(t, "the restarted host serving", func() bool {
		r := get(t, c, url)
		if r.status == 200 && r.body != "v2" {
			t.Fatalf("the restarted host's first answer: %q, want the deployment's v2", r.body)
		}
		return r.status == 200
	})
	allV2("from the restarted host")

	second := startReplicaHost(t, args...)
	if err := os.WriteFile(path, []byte(conf(`"`+first.addr+`", "`+second.addr+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Fatalf("reload adding a host: %d %+v", status, res)
	}
	if n := len(getApplications(t, c, p).Applications[0].Deployments[0].Replicas); n != 4 {
		t.Fatalf("%d replicas after the second host joined, want 4", n)
	}
	allV2("with a second host added by reload")
}

// TestReplicaHostDiscovery follows replica hosts through DNS (SRV records
// from a real DNS server on loopback): a host in DNS that does not answer
// yet is no reason to fail the start, and is connected once it answers; a
// host gone from DNS takes its actors out and its connection closes; no
// host left is 503 at once.
func TestReplicaHostDiscovery(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-max-ongoing", "10", "-user-config", `{"body":"hi"}`}
	hosts := []*hiProcess{
		// Debug, for its "proxy disconnected".
		startListeningEnv(t, map[string]string{"PROXY_LOG_LEVEL": "debug"}, replicaBin, append([]string{"-listen", "127.0.0.1:0"}, args...)...),
		startReplicaHost(t, args...),
	}
	port := portOf
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	late := closed.Addr().String() // a host in DNS before it listens
	closed.Close()

	z := startSRVZone(t)
	z.set(port(hosts[0].addr), port(late))
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        discovery: dns+srv://_http._tcp.hi.test.
        discovery_server: `+z.addr+`
        discovery_interval_s: 0.2
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	c.Timeout = 5 * time.Second
	url := "http://" + p.HTTPAddr + "/"
	if n := routable(t, c, p); n != 2 {
		t.Fatalf("%d replicas from the first answer (one host up, one not yet), want the 2 actors of the one up", n)
	}
	if !p.waitLogged("discovery: connecting to replicas failed", 5*time.Second) || !p.logged(late) {
		t.Errorf("no error line naming the host in DNS that does not answer:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	if u := getApplications(t, c, p).Applications[0].Deployments[0].Unconnected; len(u) != 1 || u[0].Target != late || !strings.Contains(u[0].Error, "connection refused") {
		t.Errorf("unconnected_targets = %+v, want %s refused", u, late)
	}
	// And in the metrics: the healthy replicas' count cannot show a host
	// that never connected (found by a tester).
	unconnectedSeries := `serve_deployment_unconnected_targets{application="hi",deployment="hi"} `
	if m := get(t, c, "http://"+p.AdminAddr+"/metrics").body; !strings.Contains(m, unconnectedSeries+"1") {
		t.Errorf("metrics lack %s1", unconnectedSeries)
	}
	startListening(t, replicaBin, append([]string{"-listen", late}, args...)...)
	waitUntil(t, "the late host connected at a later resolution", func() bool { return routable(t, c, p) == 4 })
	if u := getApplications(t, c, p).Applications[0].Deployments[0].Unconnected; len(u) != 0 {
		t.Errorf("unconnected_targets once connected = %+v, want none", u)
	}
	if m := get(t, c, "http://"+p.AdminAddr+"/metrics").body; !strings.Contains(m, unconnectedSeries+"0") {
		t.Errorf("metrics lack %s0 once connected", unconnectedSeries)
	}

	z.set(port(late), port(hosts[1].addr))
	waitUntil(t, "a host gone from DNS and one added", func() bool {
		on := map[string]int{}
		for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
			host, _, _ := strings.Cut(rep.ID, "/")
			on[host]++
		}
		return on[hosts[0].addr] == 0 && on[hosts[1].addr] == 2 && routable(t, c, p) == 4
	})
	for i := range 50 {
		if r := get(t, c, url); r.status != 200 || r.body != "hi" {
			t.Fatalf("request %d after the change: %d %q", i, r.status, r.body)
		}
	}
	// The proxy closes its connection to the host that left (the drain
	// of its idle actors is at once).
	waitUntil(t, "the proxy's connection to the host gone from DNS closed", func() bool {
		return strings.Contains(hosts[0].stderr.String(), "proxy disconnected")
	})

	z.set() // every host gone
	waitUntil(t, "every host gone", func() bool { return len(getApplications(t, c, p).Applications[0].Deployments[0].Replicas) == 0 })
	wantNoReplicas(t, c, url)
}

// mustRequest builds a request with a body.
func mustRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestPortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, v := range []string{"PROXY_HTTP_ADDR", "PROXY_ADMIN_ADDR"} {
		res := runProxy(t, map[string]string{v: taken.Addr().String()})
		if res.code != 1 || !strings.Contains(res.stderr, "address already in use") || !strings.Contains(res.stderr, taken.Addr().String()) {
			t.Errorf("%s on a port in use: exit %d, stderr %s; want 1 and the address named", v, res.code, res.stderr)
		}
	}
}

func TestReplicaHostDownAtStart(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	closed.Close()
	// The command replicas start first; the host's error must stop them.
	path := writeConfig(t, `applications:
  - name: cmd
    route_prefix: /cmd
    deployments:
      - name: cmd
        handler: command
        command: [sh, -c, 'exec "$HISERVER" -listen 127.0.0.1:$PORT']
        env: [HISERVER=`+hiBin+`]
        health_check_path: /
        num_replicas: 2
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["`+addr+`"]
`)
	res := runProxy(t, nil, "-config", path)
	if res.code != 1 || !strings.Contains(res.stderr, addr) || !strings.Contains(res.stderr, "connection refused") {
		t.Fatalf("a replica host down at start: exit %d, stderr %s; want 1 naming the host", res.code, res.stderr)
	}
	var pids []int
	for _, l := range strings.Split(res.stderr, "\n") {
		var line struct {
			Message string `json:"message"`
			PID     int    `json:"pid"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && line.Message == "replica output" && line.PID > 0 {
			pids = append(pids, line.PID)
		}
	}
	if len(pids) == 0 {
		t.Fatalf("no replica process started before the error:\n%s", res.stderr)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("replica process %d still runs after the proxy failed to start", pid)
		}
	}
}

func TestReplicaTimeout504(t *testing.T) {
	hang := startHanging(t, true)
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        upstreams: ["http://`+hang.Addr().String()+`"]
        replica_timeout_s: 0.5
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 2)
	start := time.Now()
	r := get(t, c, "http://"+p.HTTPAddr+"/")
	if r.status != http.StatusGatewayTimeout || !strings.Contains(r.body, "did not answer in time") {
		t.Fatalf("a replica that never answers, replica_timeout_s 0.5: %d %q, want 504", r.status, r.body)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the 504 took %v", took)
	}
}

// TestCommandPortArgument: $(PORT) in a command's arguments is the
// replica's port, with no shell; a $PORT given to a program that is not a
// shell is warned of at start, as it is passed as it is.
func TestCommandPortArgument(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: direct
    route_prefix: /
    deployments:
      - name: direct
        handler: command
        command: [`+hiBin+`, -listen, "127.0.0.1:$(PORT)"]
        health_check_path: /
  - name: literal
    route_prefix: /literal
    deployments:
      - name: literal
        handler: command
        command: [`+hiBin+`, -listen, "127.0.0.1:$PORT"]
        health_check_path: /
        max_constructor_retry_count: 1
`)
	p := startProxyUnhealthy(t, path)
	if !p.waitLogged("write $(PORT) for the replica's port", 20*time.Second) {
		t.Errorf("no warning for $PORT given to a program that is not a shell:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	p.waitHealthy(time.After(startTimeout)) // once literal gives up
	if r := get(t, newClient(t, 1), "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "hi" {
		t.Fatalf("the replica started with $(PORT): %d %q", r.status, r.body)
	}
}

// Deployments start side by side, and a SIGTERM during their start ends
// the proxy at once, with their processes stopped, rather than after every
// health_check_timeout_s in turn (found by an exploratory run: two
// replicas that never answer kept the proxy closed, deaf to SIGTERM, for
// twice the timeout).
func TestSignalDuringStart(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: a
    route_prefix: /a
    deployments:
      - {name: a, handler: command, command: [sh, -c, "echo up; exec sleep 600"], health_check_timeout_s: 120}
  - name: b
    route_prefix: /b
    deployments:
      - {name: b, handler: command, command: [sh, -c, "echo up; exec sleep 600"], health_check_timeout_s: 120}
`)
	p, _ := spawnProxy(t, nil, "-config", path)
	var pids []int
	waitUntil(t, "both replica processes started", func() bool { pids = replicaPIDs(p); return len(pids) == 2 })
	// A SIGHUP meanwhile waits for the start (Go's default would end the
	// proxy, leaving its replicas; found by review).
	p.signal(syscall.SIGHUP)
	if code, exited := p.wait(500 * time.Millisecond); exited {
		t.Fatalf("SIGHUP during the start ended the proxy (exit %d)", code)
	}
	// And it says so as it comes (it was silent; a tester).
	if !p.waitLogged("SIGHUP during the start: the file is reloaded once the start is done", 10*time.Second) {
		t.Errorf("no log line for the SIGHUP during the start:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	p.signal(syscall.SIGTERM)
	code, ok := p.wait(30 * time.Second)
	if !ok {
		t.Fatal("the proxy did not exit within 30 s of SIGTERM during its start")
	}
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM during the start, want 0", code)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("replica process %d runs on after the proxy stopped", pid)
		}
	}
}

// TestStartAnswers503 starts a proxy whose replica process waits for a
// file before it listens: meanwhile both ports answer 503 (with
// Retry-After; /-/healthz says why), each on a connection closed after, and
// once the replica is up the same ports serve. A second proxy on the
// first's HTTP port fails before its replica process starts.
func TestStartAnswers503(t *testing.T) {
	dir := t.TempDir()
	gate, ran := filepath.Join(dir, "go"), filepath.Join(dir, "ran")
	conf := func(command string) string {
		return writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: command
        command: [sh, -c, '`+command+`']
        env: [HISERVER=`+hiBin+`, GATE=`+gate+`, RAN=`+ran+`]
        health_check_path: /
        health_check_timeout_s: 60
`)
	}
	p, serving := spawnProxy(t, nil, "-config", conf(`while [ ! -e "$GATE" ]; do sleep 0.05; done; exec "$HISERVER" -listen 127.0.0.1:$PORT`))
	var addrs servingLine
	waitUntil(t, "the listening line", func() bool {
		for _, line := range p.stderrLines() {
			if strings.Contains(line, `"message":"listening;`) {
				return json.Unmarshal([]byte(line), &addrs) == nil
			}
		}
		return false
	})
	c := newClient(t, 4)
	for _, url := range []string{"http://" + addrs.HTTPAddr + "/", "http://" + addrs.HTTPAddr + "/-/healthz", "http://" + addrs.AdminAddr + "/-/healthz", "http://" + addrs.AdminAddr + "/-/applications"} {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s during the start: %v", url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !resp.Close || !strings.Contains(string(body), "not running yet") {
			t.Errorf("GET %s during the start: %d Retry-After %q close %v %q, want 503 with Retry-After on a closed connection", url, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, body)
		}
		// The admin API answers its errors in JSON, this one too (found
		// by a tester).
		if strings.HasSuffix(url, "/-/applications") && (resp.Header.Get("Content-Type") != "application/json" || !json.Valid(body)) {
			t.Errorf("GET %s during the start: %s %q, want a JSON error", url, resp.Header.Get("Content-Type"), body)
		}
	}

	res := runProxy(t, map[string]string{"PROXY_HTTP_ADDR": addrs.HTTPAddr}, "-config", conf(`touch "$RAN"; exec sleep 600`))
	if res.code != 1 || !strings.Contains(res.stderr, "http listener") || !strings.Contains(res.stderr, "address already in use") {
		t.Errorf("a proxy on a port in use: exit %d, want 1 naming the listener\n%s", res.code, res.stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("a proxy whose port is in use started its replica process")
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-serving:
	case <-time.After(startTimeout):
		t.Fatal("not serving after the replica started")
	}
	if r := get(t, c, "http://"+addrs.HTTPAddr+"/"); r.status != 200 || r.body != "hi" {
		t.Fatalf("GET / once serving: %d %q", r.status, r.body)
	}
	// The start's 503s came before the access log: a line counts them.
	found := false
	for _, line := range p.stderrLines() {
		if strings.Contains(line, `"requests":4`) && strings.Contains(line, "answered 503 during the start") {
			found = true
		}
	}
	if !found {
		t.Errorf("no log line counting the 4 answers of the start:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
}

// TestReplicaHostBackWithOtherActors restarts a deployment's replica host
// on its address with fewer actors, then more: each time the deployment
// replaces the host's replicas with the new ones, HEALTHY, rather than
// keep the missing ones failing (UNHEALTHY for ever) or leave the new ones
// without requests.
func TestReplicaHostBackWithOtherActors(t *testing.T) {
	args := func(n string) []string {
		return []string{"-handler", "static", "-replicas", n, "-max-ongoing", "10", "-user-config", `{"body":"hi"}`}
	}
	host := startReplicaHost(t, args("2")...)
	p := startProxy(t, nil, "-config", writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - {name: hi, handler: host, hosts: ["`+host.addr+`"], health_check_period_s: 60}
`))
	c := newClient(t, 10)
	c.Timeout = 5 * time.Second
	for _, n := range []string{"1", "3"} {
		_ = host.cmd.Process.Signal(syscall.SIGKILL)
		_ = host.cmd.Wait()
		host = startListening(t, replicaBin, append([]string{"-listen", host.addr}, args(n)...)...)
		want, _ := strconv.Atoi(n)
		waitUntil(t, "the deployment HEALTHY with the host's "+n+" actors", func() bool {
			dep := getApplications(t, c, p).Applications[0].Deployments[0]
			return dep.Status == "HEALTHY" && len(dep.Replicas) == want
		})
		seen := map[string]bool{}
		for range 200 {
			r := get(t, c, "http://"+p.HTTPAddr+"/")
			if r.status != 200 || r.body != "hi" {
				t.Fatalf("with %s actors: %d %q", n, r.status, r.body)
			}
		}
		for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
			if rep.Served > 0 {
				seen[rep.ID] = true
			}
		}
		if len(seen) != want {
			t.Errorf("with %s actors, %d served: %v", n, len(seen), seen)
		}
	}
}

// TestHostsGetTheUserConfigAtStart starts a proxy in front of replica
// hosts started with another user_config than the file's: from the first
// request on, they serve the file's (they had served their own, while
// /-/applications showed the file's; found by an exploratory run).
func TestHostsGetTheUserConfigAtStart(t *testing.T) {
	a := startReplicaHost(t, "-handler", "static", "-replicas", "2", "-user-config", `{"body":"flag1"}`)
	b := startReplicaHost(t, "-handler", "static", "-replicas", "2", "-user-config", `{"body":"flag2"}`)
	p := startProxy(t, nil, "-config", writeConfig(t, `applications:
  - name: h
    route_prefix: /
    deployments:
      - name: h
        handler: host
        hosts: ["`+a.addr+`", "`+b.addr+`"]
        host_handler: static
        num_replicas: 2
        user_config: {body: file}
`))
	c := newClient(t, 8)
	for i := range 100 {
		if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.status != 200 || r.body != "file" {
			t.Fatalf("request %d: %d %q, want the file's user_config", i, r.status, r.body)
		}
	}
}

// A host that runs another number of actors than the file's num_replicas
// says (started with flags), or with another max_ongoing_requests, is
// served as it is, with a warning naming both (found by testers).
func TestHostActorCountDiffersFromTheFile(t *testing.T) {
	h := startReplicaHost(t, "-handler", "static", "-replicas", "3", "-max-ongoing", "7", "-user-config", `{"body":"hi"}`)
	p := startProxy(t, nil, "-config", writeConfig(t, `applications:
  - name: h
    route_prefix: /
    deployments:
      - name: h
        handler: host
        hosts: ["`+h.addr+`"]
        host_handler: static
        num_replicas: 2
`))
	if !p.waitLogged(`"actors":3,"num_replicas":2`, 10*time.Second) {
		t.Fatalf("no warning of 3 actors against num_replicas 2:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	// And its limit, 7 against the default 5 (found by a tester).
	if !p.waitLogged(`"actor_max_ongoing_requests":7,"max_ongoing_requests":5`, 10*time.Second) {
		t.Fatalf("no warning of max_ongoing_requests 7 against 5:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	if r := get(t, newClient(t, 1), "http://"+p.HTTPAddr+"/"); r.status != 200 {
		t.Fatalf("GET: %d %q", r.status, r.body)
	}
}

// A second SIGTERM or SIGINT kills the proxy at once during the start too,
// as it does while serving: a first one stops the replicas started so far,
// each with its graceful_shutdown_timeout_s, and a double Ctrl-C had to
// wait that out.
func TestSecondSignalDuringTheStart(t *testing.T) {
	ran := filepath.Join(t.TempDir(), "ran")
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: command
        command: [sh, -c, 'trap "" TERM; touch "$RAN"; while :; do sleep 0.05; done']
        env: [RAN=`+ran+`]
        health_check_path: /
        health_check_timeout_s: 60
        graceful_shutdown_timeout_s: 60
`)
	p, _ := spawnProxy(t, nil, "-config", path)
	waitUntil(t, "the replica process", func() bool { _, err := os.Stat(ran); return err == nil })
	p.signal(syscall.SIGTERM)
	time.Sleep(500 * time.Millisecond) // the first one's stop is under way
	p.signal(syscall.SIGINT)
	if _, ok := p.wait(10 * time.Second); !ok {
		t.Fatal("the proxy still runs 10 s after a second signal during the start (the replica's grace is 60 s)")
	}
}

// A replica process that exits soon after it became healthy, again and
// again (one that dies of its first request, say), is replaced after a
// backoff that grows, as a failed start is: it had been restarted about 6
// times a second, for ever (found by an exploratory run).
func TestCrashLoopBacksOff(t *testing.T) {
	path := writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: command
        command: [sh, -c, '"$HISERVER" -listen 127.0.0.1:$PORT & sleep 0.3; exit 1']
        env: [HISERVER=`+hiBin+`]
        health_check_path: /
`)
	p, _ := spawnProxy(t, nil, "-config", path)
	if !p.waitLogged("replica process exited: replacing it", 20*time.Second) {
		t.Fatal("the replica never exited")
	}
	time.Sleep(4 * time.Second)
	exits := 0
	for _, l := range p.stderrLines() {
		if strings.Contains(l, "replica process exited: replacing it") {
			exits++
			if !strings.Contains(l, `"backoff"`) {
				t.Errorf("the exit's line gives no backoff: %s", l)
			}
		}
	}
	// Without a backoff a cycle takes about 0.4 s: 10 or more in 4 s.
	// With it, 100 ms doubling: about 5.
	t.Logf("%d exits in the 4 s after the first", exits-1)
	if exits-1 > 7 {
		t.Errorf("%d restarts in 4 s: no backoff", exits-1)
	}
}

// TestStalledHostBoundsStatus stops (SIGSTOP) the replica host of three
// deployments, beside a fourth on a host that still answers: a /metrics
// scrape must stay within Prometheus's default scrape_timeout of 10 s (it
// took 5 s a deployment, one after another), GET /-/applications within
// the same bound (it took the 30 s controlTimeout), and the answering
// host's counts must be in both (a shared deadline that the stalled
// deployments used up must not leave the others without theirs).
func TestStalledHostBoundsStatus(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-max-ongoing", "10", "-user-config", `{"body":"hi"}`}
	stalled, live := startReplicaHost(t, args...), startReplicaHost(t, args...)
	p := startProxy(t, nil, "-config", writeConfig(t, `applications:
  - name: hi
    route_prefix: /
    deployments:
      - {name: a, handler: host, hosts: ["`+stalled.addr+`"], health_check_period_s: 60}
      - {name: b, handler: host, hosts: ["`+stalled.addr+`"], health_check_period_s: 60}
      - {name: c, handler: host, hosts: ["`+stalled.addr+`"], health_check_period_s: 60}
      - {name: d, handler: host, hosts: ["`+live.addr+`"], health_check_period_s: 60}
`))
	// Killed before the proxy's stop (cleanups run last first), so that
	// the stop does not wait on a host that cannot answer.
	t.Cleanup(func() { _ = stalled.cmd.Process.Kill() })
	c := newClient(t, 4)
	c.Timeout = time.Minute // long enough to measure the old 30 s
	if err := stalled.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const bound = 10 * time.Second // Prometheus's default scrape_timeout

	start := time.Now()
	m := get(t, c, "http://"+p.AdminAddr+"/metrics")
	took := time.Since(start)
	t.Logf("/metrics with a stopped host under 3 of 4 deployments: %v", took.Round(time.Millisecond))
	if m.status != 200 || took > bound {
		t.Errorf("/metrics: %d in %v, want 200 within %v", m.status, took, bound)
	}
	if !strings.Contains(m.body, `serve_replica_processing_queries{application="hi",deployment="d",`) {
		t.Error("/metrics lacks the counts of the deployment whose host answers")
	}

	start = time.Now()
	r := get(t, c, "http://"+p.AdminAddr+"/-/applications")
	took = time.Since(start)
	t.Logf("/-/applications with a stopped host under 3 of 4 deployments: %v", took.Round(time.Millisecond))
	if r.status != 200 || took > bound {
		t.Errorf("/-/applications: %d in %v, want 200 within %v", r.status, took, bound)
	}
	var a struct {
		Applications []struct {
			Deployments []struct {
				Name     string `json:"name"`
				Replicas []struct {
					ID    string `json:"id"`
					Error string `json:"error"`
				} `json:"replicas"`
			} `json:"deployments"`
		} `json:"applications"`
	}
	if err := json.Unmarshal([]byte(r.body), &a); err != nil || len(a.Applications) != 1 || len(a.Applications[0].Deployments) != 4 {
		t.Fatalf("GET /-/applications: %v %s", err, r.body)
	}
	for _, d := range a.Applications[0].Deployments {
		for _, rep := range d.Replicas {
			if stalledDep := d.Name != "d"; stalledDep == (rep.Error == "") {
				t.Errorf("deployment %s, replica %s: stats error %q (want one only under the stopped host)", d.Name, rep.ID, rep.Error)
			}
		}
	}
}

// setGCPercents returns the GOGC of each set_gc a replica host applied,
// from its log, in order.
func setGCPercents(h *hiProcess) []int {
	var out []int
	for line := range strings.SplitSeq(h.stderr.String(), "\n") {
		var l struct {
			Message string `json:"message"`
			Percent int    `json:"percent"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "replica host: GC retuned by set_gc" {
			out = append(out, l.Percent)
		}
	}
	return out
}

// TestReplicaHostsGetTheGCSettings retunes the GC through PUT /-/gc while
// one of two replica hosts is down: the answer names its actors as
// failed (207, not 200); restarted on its address, with its env's
// GOGC 400, it is given the proxy's 300 once it reconnects, as is a host
// that joins later by reload, so that every host runs what GET /-/gc
// reports.
func TestReplicaHostsGetTheGCSettings(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2"}
	up, down := startReplicaHost(t, args...), startReplicaHost(t, args...)
	conf := func(hosts ...string) string {
		return `applications:
  - name: hi
    route_prefix: /
    deployments:
      - {name: hi, handler: host, hosts: ["` + strings.Join(hosts, `", "`) + `"], health_check_period_s: 60}
`
	}
	path := writeConfig(t, conf(up.addr, down.addr))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	c.Timeout = 10 * time.Second

	_ = down.cmd.Process.Signal(syscall.SIGKILL)
	if !p.waitLogged("replica host connection lost", startTimeout) {
		t.Fatal("the proxy did not see the killed host go")
	}
	r := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/gc", `{"percent": 300, "memory_limit": "0.5"}`))
	var answer struct {
		Percent int    `json:"percent"`
		Message string `json:"message"`
		Failed  []struct {
			Application string `json:"application"`
			Deployment  string `json:"deployment"`
			Replica     string `json:"replica"`
			OK          bool   `json:"ok"`
			Error       string `json:"error"`
		} `json:"failed"`
	}
	if err := json.Unmarshal([]byte(r.body), &answer); err != nil {
		t.Fatalf("PUT /-/gc: %d %q: %v", r.status, r.body, err)
	}
	if r.status != http.StatusMultiStatus || answer.Percent != 300 || len(answer.Failed) != 2 || !strings.Contains(answer.Message, "reconnects") {
		t.Fatalf("PUT /-/gc with a host down = %d %s, want 207 naming its 2 actors as failed", r.status, r.body)
	}
	for _, f := range answer.Failed {
		if f.Application != "hi" || f.Deployment != "hi" || !strings.HasPrefix(f.Replica, down.addr+"/") || f.OK || f.Error == "" {
			t.Errorf("failed entry %+v, want an actor of the host down (%s), with why", f, down.addr)
		}
	}
	if got := setGCPercents(up); !slices.Equal(got, []int{300}) {
		t.Errorf("the host up applied set_gc %v, want [300]", got)
	}

	// Restarted with its env's settings (GOGC 400), it is given the
	// proxy's once the proxy has reconnected, with no health round due
	// for a minute.
	back := startListening(t, replicaBin, append([]string{"-listen", down.addr}, args...)...)
	waitUntil(t, "the restarted host given set_gc", func() bool { return len(setGCPercents(back)) > 0 })
	if got := setGCPercents(back); !slices.Equal(got, []int{300}) {
		t.Errorf("the restarted host applied set_gc %v, want [300]", got)
	}

	joined := startReplicaHost(t, args...)
	if err := os.WriteFile(path, []byte(conf(up.addr, down.addr, joined.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Fatalf("reload adding a host: %d %+v", status, res)
	}
	waitUntil(t, "the joining host given set_gc", func() bool { return len(setGCPercents(joined)) > 0 })
	if got := setGCPercents(joined); !slices.Equal(got, []int{300}) {
		t.Errorf("the joining host applied set_gc %v, want [300]", got)
	}
	if got := setGCPercents(up); !slices.Equal(got, []int{300}) {
		t.Errorf("the host that was up all along applied set_gc %v, want [300] only", got)
	}
	if r := get(t, c, "http://"+p.AdminAddr+"/-/gc"); r.status != 200 || !strings.Contains(r.body, `"percent": 300`) {
		t.Errorf("GET /-/gc = %d %s, want percent 300", r.status, r.body)
	}
}

// slowPair starts a proxy whose command deployment runs two replicas
// (the proxy itself, serving a 4 s sleep, one request at a time) with
// graceful_shutdown_timeout_s grace, sends one request to each, and
// returns the statuses' channel once both are in flight.
func slowPair(t *testing.T, grace string) (*proc, *http.Client, <-chan int) {
	t.Helper()
	inner := writeConfig(t, `applications:
  - name: s
    route_prefix: /
    deployments:
      - {name: s, handler: sleep, user_config: {ms: 4000, body: slept}}
`)
	path := writeConfig(t, `applications:
  - name: slow
    route_prefix: /
    deployments:
      - name: slow
        handler: command
        command: [`+proxyBin+`]
        env: ["PROXY_HTTP_ADDR=127.0.0.1:$(PORT)", "PROXY_ADMIN_ADDR=127.0.0.1:0", "PROXY_CONFIG=`+inner+`"]
        health_check_path: /-/healthz
        num_replicas: 2
        max_ongoing_requests: 1
        graceful_shutdown_timeout_s: `+grace+`
`)
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	c.Timeout = 30 * time.Second
	statuses := make(chan int, 2)
	for range 2 { // one on each replica: each takes one at a time
		go func() {
			resp, err := c.Get("http://" + p.HTTPAddr + "/")
			if err != nil {
				statuses <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	waitUntil(t, "both requests in flight", func() bool {
		n := 0
		for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
			n += rep.Ongoing
		}
		return n == 2
	})
	r := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/slow/deployments/slow/num_replicas", `{"num_replicas": 1}`))
	if r.status != http.StatusOK {
		t.Fatalf("PUT num_replicas: %d %s", r.status, r.body)
	}
	return p, c, statuses
}

// wantOneCut checks that of the two requests, one was answered and one
// failed with 502.
func wantOneCut(t *testing.T, statuses <-chan int) {
	t.Helper()
	got := []int{<-statuses, <-statuses}
	slices.Sort(got)
	if !slices.Equal(got, []int{http.StatusOK, http.StatusBadGateway}) {
		t.Fatalf("statuses %v, want one 200 (the replica kept) and one 502 (the one gone under its request)", got)
	}
}

// A request cut because the proxy stopped its replica (a scale-down, its
// graceful_shutdown_timeout_s over) says so in its access-log line, where
// it read "unreachable: EOF", as for a replica that failed (found by a
// tester).
func TestScaleDownCutSaysSo(t *testing.T) {
	p, _, statuses := slowPair(t, "0.5")
	wantOneCut(t, statuses)
	if !p.waitLogged("cut: the proxy stopped the replica, its graceful_shutdown_timeout_s over", 10*time.Second) {
		t.Fatal("the cut request's access-log line does not say the proxy stopped its replica")
	}
}

// A replica process that dies while it drains (retired by a scale-down,
// not yet stopped) is logged, with the requests it had: nothing said so
// but their 502s (found by a tester).
func TestExitWhileDrainingIsLogged(t *testing.T) {
	p, c, statuses := slowPair(t, "30")
	draining := ""
	for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
		if rep.State == "DRAINING" {
			draining = rep.ID
		}
	}
	victim := 0
	for _, l := range p.stderrLines() {
		var e struct {
			Message, Replica string
			PID              int
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Message == "replica output" && e.Replica == draining {
			victim = e.PID
		}
	}
	if victim == 0 {
		t.Fatal("no pid for the retired replica in the log")
	}
	_ = syscall.Kill(victim, syscall.SIGKILL)
	wantOneCut(t, statuses)
	if !p.waitLogged("replica process exited on its own after it was retired", 10*time.Second) {
		t.Fatal("no log line says the draining replica exited")
	}
	if p.logged("cut: the proxy stopped the replica") {
		t.Error("a replica that died on its own is logged as stopped by the proxy")
	}
}
