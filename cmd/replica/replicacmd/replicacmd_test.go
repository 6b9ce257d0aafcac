package replicacmd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/replica"
)

// childEnv makes the test binary run main instead of the tests, with the
// arguments it was given.
const childEnv = "REPLICA_MAIN_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(Main(nil))
	}
	goleak.VerifyTestMain(m)
}

// run is Run with the built-in handlers.
func run(ctx context.Context, args []string, env map[string]string, stdout, stderr io.Writer) int {
	return Run(ctx, args, env, nil, stdout, stderr)
}

// lineWriter passes what run prints to stdout on, line by line.
type lineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		s := w.buf.String()
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- s[:i]
		w.buf.Reset()
		w.buf.WriteString(s[i+1:])
	}
}

// listening waits for the "listening on ADDR" line and returns ADDR.
func listening(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case line := <-lines:
		addr, ok := strings.CutPrefix(line, "listening on ")
		if !ok {
			t.Fatalf("first line %q", line)
		}
		return addr
	case <-time.After(20 * time.Second):
		t.Fatal("no \"listening on\" line")
	}
	return ""
}

// get serves GET path on the host's replica k and returns the body.
func get(t *testing.T, c *replica.HostConn, k int, path string) (string, error) {
	t.Helper()
	r := c.Replicas()[k]
	release, ok := r.TryAcquire()
	if !ok {
		t.Fatal("no free slot")
	}
	defer release()
	w := httptest.NewRecorder()
	err := r.Serve(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w.Body.String(), err
}

func connect(t *testing.T, addr string) *replica.HostConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := replica.ConnectHost(ctx, addr, replica.HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas() {
		r.SetState(replica.StateRunning)
	}
	return c
}

func TestRunServesAndStops(t *testing.T) {
	addr, r := startRun(t, []string{"-handler", "static", "-replicas", "3", "-max-ongoing", "7", "-listen", "127.0.0.1:0", "-user-config", `{"body":"hi"}`})
	c := connect(t, addr)
	defer c.Close()
	rs := c.Replicas()
	if len(rs) != 3 || rs[2].ID() != addr+"/static#2" || rs[0].MaxOngoing() != 7 {
		t.Fatalf("%d replicas, %s, max %d", len(rs), rs[2].ID(), rs[0].MaxOngoing())
	}
	if body, err := get(t, c, 1, "/"); err != nil || body != "hi" {
		t.Fatalf("%q, %v", body, err)
	}
	r.stop(t)
}

// A binary of its own serves the kinds it registers, each actor built by
// the factory with the user_config, and its -help lists them.
func TestRunServesARegisteredKind(t *testing.T) {
	reg := replica.NewRegistry()
	reg.MustRegister("shout", func(uc json.RawMessage) (replica.Handler, error) {
		var c struct{ Word string }
		if err := json.Unmarshal(uc, &c); err != nil {
			return nil, err
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, strings.ToUpper(c.Word)+r.URL.Path)
		}), nil
	})
	addr, r := startRunWith(t, reg, []string{"-handler", "shout", "-replicas", "2", "-listen", "127.0.0.1:0", "-user-config", `{"word":"hey"}`})
	c := connect(t, addr)
	defer c.Close()
	if body, err := get(t, c, 1, "/x"); err != nil || body != "HEY/x" {
		t.Fatalf("%q, %v", body, err)
	}
	r.stop(t)

	var stderr strings.Builder
	if got := Run(context.Background(), []string{"-help"}, nil, reg, io.Discard, &stderr); got != exitOK ||
		!strings.Contains(stderr.String(), "(echo, shout, sleep, static)") {
		t.Errorf("-help: exit %d, %s", got, stderr.String())
	}
	if got := Run(context.Background(), []string{"-handler", "model"}, nil, reg, io.Discard, &stderr); got != exitInvalid ||
		!strings.Contains(stderr.String(), `-handler: unknown handler "model" (this binary's kinds: echo, shout, sleep, static)`) {
		t.Errorf("unknown kind: exit %d, %s", got, stderr.String())
	}
}

func TestRunVersion(t *testing.T) {
	var stdout strings.Builder
	if got := run(context.Background(), []string{"-version"}, nil, &stdout, io.Discard); got != exitOK || !strings.HasPrefix(stdout.String(), "replica ") {
		t.Fatalf("-version: exit %d, %q", got, stdout.String())
	}
}

func TestRunBadInput(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tt := range []struct {
		name string
		args []string
		want string
		code int
	}{
		{"unknown handler", []string{"-handler", "nope"}, `unknown handler "nope"`, exitInvalid},
		{"bad user_config", []string{"-user-config", "{"}, "-user-config: must be a JSON object, got {", exitInvalid},
		{"user_config not an object", []string{"-user-config", "[1, 2]"}, "-user-config: must be a JSON object, got [1, 2]", exitInvalid},
		{"a kind for replicas elsewhere", []string{"-handler", "host"}, `-handler: handler "host" runs replicas outside the process`, exitInvalid},
		{"user_config the handler refuses", []string{"-user-config", `{"bogus": 1}`}, "bogus", exitInvalid},
		{"no replicas", []string{"-replicas", "0"}, "-replicas: must be 1 to 65535, got 0", exitInvalid},
		{"no slots", []string{"-max-ongoing", "0"}, "-max-ongoing: must be 1 to 4294967295, got 0", exitInvalid},
		{"negative grace", []string{"-grace", "-1s", "-listen", "127.0.0.1:0"}, "-grace: must be >= 0", exitInvalid},
		{"bad flag", []string{"-nope"}, "flag provided but not defined", exitInvalid},
		{"bad address", []string{"-listen", "256.0.0.1:1"}, `-listen: invalid address "256.0.0.1:1": "256.0.0.1" is not an IP address or a host name`, exitInvalid},
		{"an address with no port", []string{"-listen", "foo"}, `-listen: invalid address "foo": want host:port`, exitInvalid},
		{"a port out of range", []string{"-listen", "127.0.0.1:99999"}, "port must be a number between 0 and 65535", exitInvalid},
		{"port in use", []string{"-listen", taken.Addr().String()}, "-listen " + taken.Addr().String() + ": listen tcp " + taken.Addr().String() + ": bind: address already in use", exitFailed},
		{"tls cert without key", []string{"-tls-cert", tlsDir + "host.pem"}, "-tls-cert: needs -tls-key", exitInvalid},
		{"tls key without cert", []string{"-tls-key", tlsDir + "host-key.pem"}, "-tls-key: needs -tls-cert", exitInvalid},
		{"client CA alone", []string{"-tls-client-ca", tlsDir + "ca.pem"}, "-tls-client-ca: needs -tls-cert and -tls-key", exitInvalid},
		{"tls files that do not match", []string{"-tls-cert", tlsDir + "host.pem", "-tls-key", tlsDir + "proxy-key.pem"}, "private key does not match public key", exitInvalid},
		{"a client CA file of no certificate", []string{"-tls-cert", tlsDir + "host.pem", "-tls-key", tlsDir + "host-key.pem", "-tls-client-ca", tlsDir + "host-key.pem"}, "no PEM certificate", exitInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Bounded, so that input taken for good fails (exitOK) rather
			// than serving until the test's timeout.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stdout, stderr strings.Builder
			got := run(ctx, tt.args, map[string]string{"PROXY_GC_TUNING": "false"}, &stdout, &stderr)
			if got != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want %d, saying %q", got, stderr.String(), tt.code, tt.want)
			}
		})
	}
}

// running is a run started by startRun.
type running struct {
	cancel context.CancelFunc
	code   chan int
	stderr *lockedBuilder
}

// startRun starts run with args (GC tuning off: the test process's GC
// settings stay as they are) and returns the address it listens on. The
// run is cancelled at the end of the test if stop was not called.
func startRun(t *testing.T, args []string) (string, *running) {
	t.Helper()
	return startRunWith(t, nil, args)
}

// startRunWith is startRun serving the handler kinds of reg.
func startRunWith(t *testing.T, reg *replica.Registry, args []string) (string, *running) {
	t.Helper()
	stdout := &lineWriter{lines: make(chan string, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &running{cancel: cancel, code: make(chan int, 1), stderr: &lockedBuilder{}}
	go func() { r.code <- Run(ctx, args, map[string]string{"PROXY_GC_TUNING": "false"}, reg, stdout, r.stderr) }()
	return listening(t, stdout.lines), r
}

// stop cancels the run and waits for its exit code, which must be exitOK.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case got := <-r.code:
		if got != exitOK {
			t.Fatalf("exit %d, stderr %s", got, r.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return")
	}
}

// tlsDir holds the tests' certificates (see its README).
const tlsDir = "../../../config/testdata/tls/"

// lockedBuilder is a strings.Builder that several goroutines' loggers may
// write at once, as they may an *os.File.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestRunServesMutualTLS(t *testing.T) {
	addr, r := startRun(t, []string{"-handler", "static", "-listen", "127.0.0.1:0", "-user-config", `{"body":"sealed"}`,
		"-tls-cert", tlsDir + "host.pem", "-tls-key", tlsDir + "host-key.pem", "-tls-client-ca", tlsDir + "ca.pem"})
	cfg, err := (&config.HostTLS{CAFile: tlsDir + "ca.pem", CertFile: tlsDir + "proxy.pem", KeyFile: tlsDir + "proxy-key.pem"}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c, err := replica.ConnectHost(cctx, addr, replica.HostOptions{Dial: (&tls.Dialer{Config: cfg}).DialContext})
	if err != nil {
		t.Fatal(err)
	}
	c.Replicas()[0].SetState(replica.StateRunning)
	body, err := get(t, c, 0, "/")
	c.Close()
	if err != nil || body != "sealed" {
		t.Fatalf("over TLS: %q, %v", body, err)
	}
	// Without a client certificate the host refuses the proxy.
	if c, err := replica.ConnectHost(cctx, addr, replica.HostOptions{}); err == nil {
		c.Close()
		t.Fatal("plain TCP connected to a TLS host")
	}
	r.stop(t)
	if log := r.stderr.String(); !strings.Contains(log, `"tls":true,"tls_client_auth":true`) || strings.Contains(log, "without -tls-client-ca") {
		t.Errorf("log:\n%s", log)
	}
}

// copyFile copies the test certificate file name to path.
func copyFile(t *testing.T, name, path string) {
	t.Helper()
	b, err := os.ReadFile(tlsDir + name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLSFilesReloaded changes the host's client CA file while it runs: a
// proxy it refused is let in at its next connection, with no restart, and
// a file caught half-written keeps the last good one.
func TestTLSFilesReloaded(t *testing.T) {
	clientCA := filepath.Join(t.TempDir(), "client-ca.pem")
	copyFile(t, "other-ca.pem", clientCA) // not the proxy's CA
	addr, r := startRun(t, []string{"-handler", "static", "-listen", "127.0.0.1:0", "-user-config", `{"body":"renewed"}`,
		"-tls-cert", tlsDir + "host.pem", "-tls-key", tlsDir + "host-key.pem", "-tls-client-ca", clientCA})
	cfg, err := (&config.HostTLS{CAFile: tlsDir + "ca.pem", CertFile: tlsDir + "proxy.pem", KeyFile: tlsDir + "proxy-key.pem"}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (*replica.HostConn, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		return replica.ConnectHost(cctx, addr, replica.HostOptions{Dial: (&tls.Dialer{Config: cfg}).DialContext})
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Fatal("a proxy of a CA the host does not trust connected")
	}
	for i, file := range []string{"ca.pem", "README.md"} { // the proxies' CA, then a file of no certificate
		copyFile(t, file, clientCA)
		c, err := dial()
		if err != nil {
			t.Fatalf("after client-ca.pem became %s: %v", file, err)
		}
		c.Replicas()[0].SetState(replica.StateRunning)
		body, err := get(t, c, 0, "/")
		c.Close()
		if err != nil || body != "renewed" {
			t.Fatalf("connection %d: %q, %v", i, body, err)
		}
	}
	r.stop(t)
	if log := r.stderr.String(); !strings.Contains(log, "reloading the TLS files failed; serving with the last ones that loaded") ||
		!strings.Contains(log, "-tls-client-ca: "+clientCA+": no PEM certificate in it") {
		t.Errorf("no warning of the bad file:\n%s", log)
	}
}

// TestSIGTERMDrains runs the binary: SIGHUP changes nothing (it had
// killed the host, cutting its requests), SIGTERM lets the request in
// flight finish, then the process exits 0.
func TestSIGTERMDrains(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-handler", "sleep", "-replicas", "2", "-max-ongoing", "4", "-listen", "127.0.0.1:0",
		"-user-config", `{"ms": 300, "body": "slept"}`, "-grace", "10s")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
		close(lines)
	}()
	addr := listening(t, lines)
	c := connect(t, addr)
	defer c.Close()

	type answer struct {
		body string
		err  error
	}
	inFlight := make(chan answer, 1)
	go func() {
		body, err := get(t, c, 0, "/")
		inFlight <- answer{body, err}
	}()
	time.Sleep(100 * time.Millisecond) // the request is at the host
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if a := <-inFlight; a.err != nil || a.body != "slept" {
		t.Fatalf("the request in flight at SIGTERM: %q, %v", a.body, a.err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatalf("exit: %v; stderr %s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the replica host did not exit after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "replica host stopped") || !strings.Contains(stderr.String(), "SIGHUP ignored") {
		t.Fatalf("stderr: %s", stderr.String())
	}
}

// The proxy's own config file says what its hosts run.
const hostsConfig = `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["127.0.0.1:9001"]
        host_handler: static
        num_replicas: 2
        max_ongoing_requests: 9
        user_config: {body: from the file}
        host_tls:   # the proxy's files, not on the host's machine: never read here
          ca_file: /proxy-only/ca.pem
          cert_file: /proxy-only/proxy.pem
          key_file: /proxy-only/proxy-key.pem
      - name: plain
        handler: host
        hosts: ["127.0.0.1:9002"]
`

func TestRunFromConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(path, []byte(hostsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, r := startRun(t, []string{"-config", path, "-deployment", "hi/hi", "-listen", "127.0.0.1:0"})
	c := connect(t, addr)
	defer c.Close()
	rs := c.Replicas()
	if len(rs) != 2 || rs[1].ID() != addr+"/hi#1" || rs[0].MaxOngoing() != 9 {
		t.Fatalf("%d replicas, %s, max %d", len(rs), rs[len(rs)-1].ID(), rs[0].MaxOngoing())
	}
	if body, err := get(t, c, 0, "/"); err != nil || body != "from the file" {
		t.Fatalf("%q, %v", body, err)
	}
	r.stop(t)

	nope := filepath.Join(t.TempDir(), "nope.yaml")
	if err := os.WriteFile(nope, []byte(strings.Replace(hostsConfig, "host_handler: static", "host_handler: nope", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badConfig, []byte(strings.Replace(hostsConfig, "user_config: {body: from the file}", "user_config: {colour: red}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", path}, "-config and -deployment go together"},
		{[]string{"-config", path, "-deployment", "hi"}, "want app/name"},
		{[]string{"-config", path, "-deployment", "hi/nope"}, "no such deployment in " + path + "; its replica hosts' deployments: hi/hi"},
		{[]string{"-config", path, "-deployment", "hi/plain"}, "not handler: host with a host_handler"},
		{[]string{"-config", path, "-deployment", "hi/hi", "-replicas", "3"}, "-replicas: not with -config"},
		{[]string{"-config", "/nonexistent.yaml", "-deployment", "hi/hi"}, "-config:"},
		// With the field's line, as proxy -check says it (found by a
		// tester).
		{[]string{"-config", nope, "-deployment", "hi/hi"}, nope + `:8: applications[0].deployments[0].host_handler: unknown handler "nope" (this binary's kinds: echo, sleep, static)`},
		{[]string{"-config", badConfig, "-deployment", "hi/hi"}, badConfig + `:11: applications[0].deployments[0].user_config.colour (deployment hi/hi): replica host: static: user_config: unknown field "colour"`},
	} {
		var stderr strings.Builder
		if got := run(context.Background(), tt.args, map[string]string{"PROXY_GC_TUNING": "false"}, io.Discard, &stderr); got != exitInvalid || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, got, stderr.String(), tt.want)
		}
	}
}
