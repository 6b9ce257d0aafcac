package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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
	"text/template"
	"time"
)

// Bounds on a stack process's life.
const (
	// stackStartTimeout bounds the wait for a stack to answer "hi".
	stackStartTimeout = 20 * time.Second
	// stackStopTimeout is the grace between SIGTERM and SIGKILL.
	stackStopTimeout = 5 * time.Second
)

// StacksConfig says which binaries StartStacks runs, and where it writes
// their configs and logs.
type StacksConfig struct {
	// Dir holds the generated configs and the processes' logs; it must
	// exist. The caller removes it (or keeps it to read the configs).
	Dir string
	// HiserverPath is the cmd/hiserver binary of the bare stack. Required.
	HiserverPath string
	// ProxyPath is the cmd/proxy binary of the proxy stack. Required.
	ProxyPath string
	// NginxPath is the nginx binary. If empty, "nginx" is looked up in
	// PATH, then /usr/sbin/nginx; if none is found, the stack is skipped.
	NginxPath string
	// HAProxyPath is the haproxy binary, found like NginxPath.
	HAProxyPath string
	// ReplicaPath is the cmd/replica binary of the proxy-host stack (the
	// proxy in front of its own replica host serving "hi"). If empty, that
	// stack is skipped.
	ReplicaPath string
	// LoadtestPath is the cmd/loadtest binary, whose reverseproxy command
	// is the revproxy stack (Go's httputil.ReverseProxy in front of bare).
	// If empty, that stack is skipped.
	LoadtestPath string
}

// Stack is one started server.
type Stack struct {
	// Name is bare, proxy (answering in process), proxy-up (the proxy
	// forwarding to bare, handler upstream), proxy-host (the proxy in front
	// of a cmd/replica host), revproxy, nginx or haproxy.
	Name string
	// URL is where the stack answers "hi".
	URL string
	// PID is the process that serves the requests: for nginx its one
	// worker, not the master, whose CPU time says nothing of the load.
	PID int
	// BackendPID is the process the stack forwards to (bare, or
	// proxy-host's replica host), 0 for a stack that answers itself.
	BackendPID int
	// Config is the generated config file, "" for a stack without one.
	Config string
	// Log is the file the process's stdout and stderr go to.
	Log string

	stop func()
}

// SkippedStack is a stack StartStacks did not start, and why.
type SkippedStack struct {
	Name, Reason string
}

// Stacks are the servers StartStacks started.
type Stacks struct {
	// Started holds the running stacks, the baseline (bare) first.
	Started []Stack
	// Skipped holds the stacks whose binary is missing.
	Skipped []SkippedStack

	hosts []func() // stop the replica hosts behind stacks, after the stacks
}

// Targets returns the started stacks as comparison targets, PIDs set.
func (s *Stacks) Targets() []Target {
	out := make([]Target, 0, len(s.Started))
	for _, st := range s.Started {
		out = append(out, Target{Name: st.Name, URL: st.URL, PID: st.PID, BackendPID: st.BackendPID})
	}
	return out
}

// Stop stops every started stack, the last started first (the proxies
// before their upstream), each with SIGTERM and, after 5s, SIGKILL, and
// waits for them. It is safe to call twice.
func (s *Stacks) Stop() {
	for i := len(s.Started) - 1; i >= 0; i-- {
		if s.Started[i].stop != nil {
			s.Started[i].stop()
			s.Started[i].stop = nil
		}
	}
	for _, stop := range s.hosts {
		stop()
	}
	s.hosts = nil
}

// StartStacks starts bare (hiserver), proxy (its default in-process "hi"
// app), and nginx and haproxy in front of bare when installed, every one
// on a free loopback port, and returns once each answers "hi". On error
// the stacks already started are stopped.
func StartStacks(ctx context.Context, cfg StacksConfig) (_ *Stacks, err error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("Dir: required")
	case cfg.HiserverPath == "":
		return nil, errors.New("HiserverPath: required")
	case cfg.ProxyPath == "":
		return nil, errors.New("ProxyPath: required")
	}
	s := &Stacks{}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()

	bare, err := startBare(ctx, cfg.HiserverPath, filepath.Join(cfg.Dir, "bare.log"))
	if err != nil {
		return nil, fmt.Errorf("bare: %w", err)
	}
	s.Started = append(s.Started, bare)
	_, portText, err := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(bare.URL, "http://"), "/"))
	if err != nil {
		return nil, fmt.Errorf("bare: %w", err)
	}
	barePort, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("bare: port %q: %w", portText, err)
	}

	px, err := startProxyStack(ctx, cfg.ProxyPath, filepath.Join(cfg.Dir, "proxy.log"))
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	s.Started = append(s.Started, px)

	up, err := startProxyUpstreamStack(ctx, cfg.ProxyPath, cfg.Dir, barePort)
	if err != nil {
		return nil, fmt.Errorf("proxy-up: %w", err)
	}
	up.BackendPID = bare.PID
	s.Started = append(s.Started, up)

	if cfg.ReplicaPath == "" {
		s.Skipped = append(s.Skipped, SkippedStack{Name: "proxy-host", Reason: "no replica binary given"})
	} else {
		ph, stopHost, err := startProxyHostStack(ctx, cfg.ProxyPath, cfg.ReplicaPath, cfg.Dir)
		if err != nil {
			return nil, fmt.Errorf("proxy-host: %w", err)
		}
		s.Started = append(s.Started, ph)
		s.hosts = append(s.hosts, stopHost)
	}

	if cfg.LoadtestPath == "" {
		s.Skipped = append(s.Skipped, SkippedStack{Name: "revproxy", Reason: "no loadtest binary given"})
	} else {
		rp, err := startRevProxy(ctx, cfg.LoadtestPath, cfg.Dir, barePort)
		if err != nil {
			return nil, fmt.Errorf("revproxy: %w", err)
		}
		rp.BackendPID = bare.PID
		s.Started = append(s.Started, rp)
	}

	for _, f := range []struct {
		name, path string
		start      func(ctx context.Context, bin, dir string, barePort int) (Stack, error)
	}{
		{"nginx", cfg.NginxPath, startNginx},
		{"haproxy", cfg.HAProxyPath, startHAProxy},
	} {
		bin, why := findBinary(f.name, f.path)
		if bin == "" {
			s.Skipped = append(s.Skipped, SkippedStack{Name: f.name, Reason: why})
			continue
		}
		// A free port may be taken between its probe and the server's
		// bind (see freePort): one retry on another port.
		st, err := f.start(ctx, bin, cfg.Dir, barePort)
		if err != nil && ctx.Err() == nil {
			st, err = f.start(ctx, bin, cfg.Dir, barePort)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		st.BackendPID = bare.PID
		s.Started = append(s.Started, st)
	}
	return s, nil
}

// findBinary returns path if set, else name on PATH, else /usr/sbin/name;
// with "" and the reason when there is none.
func findBinary(name, path string) (string, string) {
	if path != "" {
		if err := checkProxyPath(path); err != nil {
			return "", strings.TrimPrefix(err.Error(), "ProxyPath: ")
		}
		return path, ""
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, ""
	}
	if p := "/usr/sbin/" + name; checkProxyPath(p) == nil {
		return p, ""
	}
	return "", fmt.Sprintf("no %s binary on PATH or at /usr/sbin/%s", name, name)
}

// freePort returns a loopback port that was free a moment ago: it listens
// on 127.0.0.1:0 and closes. Another process may take the port before the
// server binds it; StartStacks retries once.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// stackProc is a started process and its stop function.
type stackProc struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once Wait returned
	waitErr error         // Wait's result; read after exited
}

// startProc starts bin with args, stdout and stderr to the file logPath.
func startProc(bin string, args []string, logPath string) (*stackProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	// #nosec G204 -- bin is a server binary the caller chose or built, and
	// args are fixed flags and generated file paths.
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &stackProc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop stops the process (see stopProcess).
func (p *stackProc) stop() { stopProcess(p.cmd, p.exited, stackStopTimeout) }

// stopProcess sends cmd SIGTERM, then SIGKILL if it has not exited (closed
// exited) after grace, and waits for it.
func stopProcess(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-exited
	}
}

// startBare runs hiserver on 127.0.0.1:0 and reads the port it bound from
// its "listening on ADDR" line, so bare needs no free-port probe.
func startBare(ctx context.Context, bin, logPath string) (Stack, error) {
	p, err := startProc(bin, []string{"-listen", "127.0.0.1:0"}, logPath)
	if err != nil {
		return Stack{}, err
	}
	st := Stack{Name: "bare", PID: p.cmd.Process.Pid, Log: logPath, stop: p.stop}
	addr, err := waitListening(ctx, p, logPath)
	if err != nil {
		return Stack{}, err
	}
	st.URL = "http://" + addr + "/"
	if err := CheckLoopback(st.URL); err != nil {
		p.stop()
		return Stack{}, err
	}
	if err := waitHi(ctx, st.URL, p, logPath); err != nil {
		p.stop()
		return Stack{}, err
	}
	return st, nil
}

// waitListening waits (bounded by stackStartTimeout) for p's "listening on
// ADDR" line in the file at logPath and returns ADDR; p is stopped on
// error.
func waitListening(ctx context.Context, p *stackProc, logPath string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, stackStartTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if addr, ok := findListening(logPath); ok {
			return addr, nil
		}
		select {
		case <-p.exited:
			return "", fmt.Errorf("exited while starting: %v; log:\n%s", p.waitErr, tailFile(logPath, 10))
		case <-ctx.Done():
			p.stop()
			return "", fmt.Errorf("no \"listening on\" line within %v: %w", stackStartTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// findListening returns ADDR from hiserver's "listening on ADDR" line in
// the file at path.
func findListening(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening on "); ok && addr != "" {
			return strings.TrimSpace(addr), true
		}
	}
	return "", false
}

// startProxyStack runs the proxy with no config (its default app answers
// "hi" in process) on ephemeral ports read from its "serving" line. Its
// access log is off, as nginx's and haproxy's are here.
func startProxyStack(ctx context.Context, bin, logPath string) (Stack, error) {
	p, err := startProxy(ctx, bin, map[string]string{
		"PROXY_HTTP_ADDR":  "127.0.0.1:0",
		"PROXY_ADMIN_ADDR": "127.0.0.1:0",
		"PROXY_ACCESS_LOG": "false",
	}, logPath)
	if err != nil {
		return Stack{}, fmt.Errorf("%w; log:\n%s", err, tailFile(logPath, 10))
	}
	stop := func() { stopProcess(p.cmd, p.exited, stackStopTimeout) }
	st := Stack{Name: "proxy", URL: "http://" + p.HTTPAddr + "/", PID: p.cmd.Process.Pid, Log: logPath, stop: stop}
	sp := &stackProc{cmd: p.cmd, exited: p.exited}
	if err := waitHi(ctx, st.URL, sp, logPath); err != nil {
		stop()
		return Stack{}, err
	}
	return st, nil
}

// ProxyUpstreamConfig returns the proxy's config for the proxy-up stack:
// one upstream replica, the bare server, with room for the whole load
// (max_ongoing_requests 1000, as nginx and HAProxy have no limit here).
func ProxyUpstreamConfig(barePort int) string {
	return fmt.Sprintf(`applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: upstream
        upstreams: ["http://127.0.0.1:%d"]
        health_check_path: /
        max_ongoing_requests: 1000
`, barePort)
}

// startProxyUpstreamStack runs the proxy forwarding to bare, its access
// log off like the other front proxies'.
func startProxyUpstreamStack(ctx context.Context, bin, dir string, barePort int) (Stack, error) {
	conf := filepath.Join(dir, "proxy-up.yaml")
	if err := os.WriteFile(conf, []byte(ProxyUpstreamConfig(barePort)), 0o600); err != nil {
		return Stack{}, err
	}
	logPath := filepath.Join(dir, "proxy-up.log")
	p, err := startProxy(ctx, bin, map[string]string{
		"PROXY_HTTP_ADDR":  "127.0.0.1:0",
		"PROXY_ADMIN_ADDR": "127.0.0.1:0",
		"PROXY_ACCESS_LOG": "false",
		"PROXY_CONFIG":     conf,
	}, logPath)
	if err != nil {
		return Stack{}, fmt.Errorf("%w; log:\n%s", err, tailFile(logPath, 10))
	}
	stop := func() { stopProcess(p.cmd, p.exited, stackStopTimeout) }
	st := Stack{Name: "proxy-up", URL: "http://" + p.HTTPAddr + "/", PID: p.cmd.Process.Pid, Config: conf, Log: logPath, stop: stop}
	if err := waitHi(ctx, st.URL, &stackProc{cmd: p.cmd, exited: p.exited}, logPath); err != nil {
		stop()
		return Stack{}, err
	}
	return st, nil
}

// ReplicaHostArgs are the flags of the proxy-host stack's replica host:
// the seed's app (static "hi") on 16 actors of 100, as the proxy's
// default app has in process.
var ReplicaHostArgs = []string{"-handler", "static", "-replicas", "16", "-max-ongoing", "100", "-user-config", `{"body":"hi"}`, "-listen", "127.0.0.1:0"}

// startProxyHostStack runs a replica host and the proxy in front of it
// (handler host). The Stack is the proxy (its PID, its CPU); stopHost
// stops the host after the proxy.
func startProxyHostStack(ctx context.Context, proxyBin, replicaBin, dir string) (_ Stack, stopHost func(), err error) {
	hostLog := filepath.Join(dir, "replica-host.log")
	h, err := startProc(replicaBin, ReplicaHostArgs, hostLog)
	if err != nil {
		return Stack{}, nil, err
	}
	defer func() {
		if err != nil {
			h.stop()
		}
	}()
	addr, err := waitListening(ctx, h, hostLog)
	if err != nil {
		return Stack{}, nil, fmt.Errorf("replica host: %w", err)
	}
	conf := filepath.Join(dir, "proxy-host.yaml")
	yaml := fmt.Sprintf("applications:\n  - name: hi\n    route_prefix: /\n    deployments:\n      - name: hi\n        handler: host\n        hosts: [%q]\n", addr)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		return Stack{}, nil, err
	}
	logPath := filepath.Join(dir, "proxy-host.log")
	p, err := startProxy(ctx, proxyBin, map[string]string{
		"PROXY_HTTP_ADDR":  "127.0.0.1:0",
		"PROXY_ADMIN_ADDR": "127.0.0.1:0",
		"PROXY_ACCESS_LOG": "false",
		"PROXY_CONFIG":     conf,
	}, logPath)
	if err != nil {
		return Stack{}, nil, fmt.Errorf("%w; log:\n%s", err, tailFile(logPath, 10))
	}
	stop := func() { stopProcess(p.cmd, p.exited, stackStopTimeout) }
	st := Stack{Name: "proxy-host", URL: "http://" + p.HTTPAddr + "/", PID: p.cmd.Process.Pid, BackendPID: h.cmd.Process.Pid, Config: conf, Log: logPath, stop: stop}
	if err := waitHi(ctx, st.URL, &stackProc{cmd: p.cmd, exited: p.exited}, logPath); err != nil {
		stop()
		return Stack{}, nil, err
	}
	return st, h.stop, nil
}

// startRevProxy runs `loadtest reverseproxy` in front of bare.
func startRevProxy(ctx context.Context, bin, dir string, barePort int) (Stack, error) {
	logPath := filepath.Join(dir, "revproxy.log")
	p, err := startProc(bin, []string{"reverseproxy", "-listen", "127.0.0.1:0", "-target", fmt.Sprintf("http://127.0.0.1:%d", barePort)}, logPath)
	if err != nil {
		return Stack{}, err
	}
	st := Stack{Name: "revproxy", PID: p.cmd.Process.Pid, Log: logPath, stop: p.stop}
	addr, err := waitListening(ctx, p, logPath)
	if err != nil {
		return Stack{}, err
	}
	st.URL = "http://" + addr + "/"
	if err := waitHi(ctx, st.URL, p, logPath); err != nil {
		p.stop()
		return Stack{}, err
	}
	return st, nil
}

// NginxConfig returns an nginx.conf for one worker proxying
// 127.0.0.1:port to an upstream of kept-alive connections to
// 127.0.0.1:barePort, every file it writes under dir. user is the
// worker's user, or "" for none (when not run as root, nginx ignores it).
func NginxConfig(dir, user string, port, barePort int) string {
	return mustExec(nginxTemplate, map[string]any{"Dir": dir, "User": user, "Port": port, "BarePort": barePort})
}

var nginxTemplate = template.Must(template.New("nginx").Parse(`# Written by loadtest compare -stacks.
{{if .User}}user {{.User}};
{{end}}worker_processes 1;
error_log {{.Dir}}/error.log warn;
pid {{.Dir}}/nginx.pid;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path {{.Dir}}/client_body_temp;
    proxy_temp_path {{.Dir}}/proxy_temp;
    fastcgi_temp_path {{.Dir}}/fastcgi_temp;
    uwsgi_temp_path {{.Dir}}/uwsgi_temp;
    scgi_temp_path {{.Dir}}/scgi_temp;

    upstream bare {
        server 127.0.0.1:{{.BarePort}};
        keepalive 64;
    }

    server {
        listen 127.0.0.1:{{.Port}};
        location / {
            proxy_pass http://bare;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
`))

// HAProxyConfig returns a haproxy.cfg for one thread proxying
// 127.0.0.1:port to 127.0.0.1:barePort with kept-alive, reused server
// connections, and no logging. maxconn 10000 wants 20000+ descriptors;
// "no strict-limits" lets haproxy start under a lower RLIMIT_NOFILE (a
// warning, not a fatal error), which a loopback load of -c connections
// never comes near.
func HAProxyConfig(port, barePort int) string {
	return mustExec(haproxyTemplate, map[string]any{"Port": port, "BarePort": barePort})
}

var haproxyTemplate = template.Must(template.New("haproxy").Parse(`# Written by loadtest compare -stacks.
global
    nbthread 1
    maxconn 10000
    no strict-limits

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    http-reuse always
    option http-keep-alive

frontend hi
    bind 127.0.0.1:{{.Port}}
    default_backend bare

backend bare
    server bare 127.0.0.1:{{.BarePort}}
`))

// mustExec executes a template whose data cannot fail it.
func mustExec(t *template.Template, data any) string {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		panic(err)
	}
	return b.String()
}

// startNginx writes dir/nginx/nginx.conf and runs nginx in the foreground
// with dir/nginx as its prefix.
func startNginx(ctx context.Context, bin, dir string, bp int) (Stack, error) {
	prefix, err := filepath.Abs(filepath.Join(dir, "nginx"))
	if err != nil {
		return Stack{}, err
	}
	if err := os.MkdirAll(prefix, 0o700); err != nil {
		return Stack{}, err
	}
	port, err := freePort()
	if err != nil {
		return Stack{}, err
	}
	// As root, the worker runs as root: the temp dir is 0700, so nobody
	// could not reach its temp paths. Otherwise nginx runs as the caller.
	user := ""
	if os.Geteuid() == 0 {
		user = "root"
	}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, []byte(NginxConfig(prefix, user, port, bp)), 0o600); err != nil {
		return Stack{}, err
	}
	logPath := filepath.Join(prefix, "stderr.log")
	// -e (nginx 1.19.5+) keeps the startup error log, before the config
	// is read, out of the build's /var/log/nginx.
	p, err := startProc(bin, []string{"-p", prefix, "-e", filepath.Join(prefix, "error.log"), "-c", conf, "-g", "daemon off;"}, logPath)
	if err != nil {
		return Stack{}, err
	}
	st := Stack{Name: "nginx", URL: fmt.Sprintf("http://127.0.0.1:%d/", port), Config: conf, Log: logPath, stop: p.stop}
	if err := waitHi(ctx, st.URL, p, logPath, filepath.Join(prefix, "error.log")); err != nil {
		p.stop()
		return Stack{}, err
	}
	// The master only forks: CPU per request is the worker's.
	workers, err := childPIDs(p.cmd.Process.Pid)
	if err != nil || len(workers) != 1 {
		p.stop()
		return Stack{}, fmt.Errorf("finding the one nginx worker: %d children, %v", len(workers), err)
	}
	st.PID = workers[0]
	return st, nil
}

// startHAProxy writes dir/haproxy/haproxy.cfg and runs haproxy in the
// foreground (-db, one process).
func startHAProxy(ctx context.Context, bin, dir string, bp int) (Stack, error) {
	sub := filepath.Join(dir, "haproxy")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return Stack{}, err
	}
	port, err := freePort()
	if err != nil {
		return Stack{}, err
	}
	conf := filepath.Join(sub, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(HAProxyConfig(port, bp)), 0o600); err != nil {
		return Stack{}, err
	}
	logPath := filepath.Join(sub, "stderr.log")
	p, err := startProc(bin, []string{"-f", conf, "-db"}, logPath)
	if err != nil {
		return Stack{}, err
	}
	st := Stack{Name: "haproxy", URL: fmt.Sprintf("http://127.0.0.1:%d/", port), PID: p.cmd.Process.Pid, Config: conf, Log: logPath, stop: p.stop}
	if err := waitHi(ctx, st.URL, p, logPath); err != nil {
		p.stop()
		return Stack{}, err
	}
	return st, nil
}

// childPIDs returns the processes whose parent is pid, from /proc.
func childPIDs(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue // exited meanwhile
		}
		// The ppid is the second field after the command name's ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}

// waitHi polls GET url until it answers 200 "hi", failing when p exits
// (with the tail of logs) or after stackStartTimeout.
func waitHi(ctx context.Context, url string, p *stackProc, logs ...string) error {
	ctx, cancel := context.WithTimeout(ctx, stackStartTimeout)
	defer cancel()
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: time.Second, Transport: tr}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = getHi(ctx, client, url); last == nil {
			return nil
		}
		select {
		case <-p.exited:
			var tails []string
			for _, l := range logs {
				tails = append(tails, l+":\n"+tailFile(l, 10))
			}
			return fmt.Errorf("exited while starting: %v; %s", p.waitErr, strings.Join(tails, "\n"))
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer \"hi\" within %v: %w", url, stackStartTimeout, last)
		case <-tick.C:
		}
	}
}

// getHi checks that GET url answers 200 with the body "hi".
func getHi(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != "hi" {
		return fmt.Errorf("status %d, body %q; want 200 \"hi\"", resp.StatusCode, body)
	}
	return nil
}

// GoBuild runs `go build -o out pkg`, its output to w.
func GoBuild(ctx context.Context, pkg, out string, w io.Writer) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("building %s: %w", pkg, err)
	}
	// #nosec G204 -- the go tool, and a package of this module.
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}
