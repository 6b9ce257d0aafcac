package loadtest

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// updateGolden, set by `go test -run Config -args -update`, rewrites the golden
// configs in testdata.
var updateGolden = flag.Bool("update", false, "rewrite testdata/stacks-*.golden")

// checkGolden compares got with testdata/name, or writes it with -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("config differs from %s (go test -run Config -args -update rewrites it):\n%s", path, got)
	}
}

func TestNginxConfig(t *testing.T) {
	got := NginxConfig("/tmp/stk", "root", 8081, 9001)
	for _, want := range []string{
		"user root;\n",
		"worker_processes 1;\n",
		"error_log /tmp/stk/error.log warn;\n",
		"pid /tmp/stk/nginx.pid;\n",
		"worker_connections 4096;\n",
		"access_log off;\n",
		"client_body_temp_path /tmp/stk/client_body_temp;\n",
		"proxy_temp_path /tmp/stk/proxy_temp;\n",
		"server 127.0.0.1:9001;\n        keepalive 64;\n",
		"listen 127.0.0.1:8081;\n",
		"proxy_pass http://bare;\n",
		"proxy_http_version 1.1;\n",
		"proxy_set_header Connection \"\";\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("nginx.conf lacks %q:\n%s", want, got)
		}
	}
	// Every path nginx writes is under the prefix, none under /var.
	if strings.Contains(got, "/var") {
		t.Errorf("nginx.conf names /var:\n%s", got)
	}
	checkGolden(t, "stacks-nginx.conf.golden", got)
	if c := NginxConfig("/tmp/stk", "", 8081, 9001); strings.Contains(c, "user ") {
		t.Errorf("no user wanted, got:\n%s", c)
	}
}

func TestHAProxyConfig(t *testing.T) {
	got := HAProxyConfig(8082, 9001)
	for _, want := range []string{
		"nbthread 1\n",
		"maxconn 10000\n",
		"no strict-limits\n",
		"mode http\n",
		"timeout connect 5s\n",
		"timeout client 30s\n",
		"timeout server 30s\n",
		"http-reuse always\n",
		"option http-keep-alive\n",
		"bind 127.0.0.1:8082\n",
		"server bare 127.0.0.1:9001\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("haproxy.cfg lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "log ") {
		t.Errorf("haproxy.cfg logs:\n%s", got)
	}
	checkGolden(t, "stacks-haproxy.cfg.golden", got)
}

func TestFindListening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if _, ok := findListening(path); ok {
		t.Error("found a line in a missing file")
	}
	if err := os.WriteFile(path, []byte("noise\nlistening on 127.0.0.1:4321\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if addr, ok := findListening(path); !ok || addr != "127.0.0.1:4321" {
		t.Errorf("got %q, %t", addr, ok)
	}
}

// TestStartBareAndFronts starts hiserver and, in front of it, nginx and
// haproxy when installed (CI installs neither), checks that each answers
// "hi" through its upstream, stops them and checks no process is left.
func TestStartBareAndFronts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts servers")
	}
	fronts := []struct {
		name  string
		start func(ctx context.Context, bin, dir string, barePort int) (Stack, error)
	}{
		{"nginx", startNginx},
		{"haproxy", startHAProxy},
	}
	var bins []string
	for _, f := range fronts {
		bin, why := findBinary(f.name, "")
		if bin == "" {
			t.Logf("%s: %s", f.name, why)
		}
		bins = append(bins, bin)
	}
	if bins[0] == "" {
		// CI does not install nginx, so its absence is a skip there too.
		t.Skip("nginx is not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	hiserver := filepath.Join(dir, "hiserver")
	if err := GoBuild(ctx, "github.com/serveproxy/serveproxy/cmd/hiserver", hiserver, os.Stderr); err != nil {
		t.Fatal(err)
	}
	bare, err := startBare(ctx, hiserver, filepath.Join(dir, "bare.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bare.stop)
	u, err := url.Parse(bare.URL)
	if err != nil {
		t.Fatal(err)
	}
	barePort, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}

	for i, f := range fronts {
		t.Run(f.name, func(t *testing.T) {
			if bins[i] == "" {
				t.Skipf("%s is not installed", f.name)
			}
			st, err := f.start(ctx, bins[i], dir, barePort)
			if err != nil {
				t.Fatal(err)
			}
			pids := []int{st.PID}
			if master := masterPID(st); master != st.PID {
				pids = append(pids, master)
			}
			tr := &http.Transport{Proxy: nil}
			defer tr.CloseIdleConnections()
			if err := getHi(ctx, &http.Client{Transport: tr, Timeout: 5 * time.Second}, st.URL); err != nil {
				st.stop()
				t.Fatalf("%s through %s: %v", st.URL, f.name, err)
			}
			if cpu, err := ProcCPU(st.PID); err != nil {
				t.Errorf("CPU of the serving pid %d: %v (%v)", st.PID, err, cpu)
			}
			st.stop()
			for _, pid := range pids {
				waitGone(t, pid)
			}
		})
	}
	bare.stop()
	waitGone(t, bare.PID)
}

// masterPID returns the parent of st's serving process if that parent is
// not this test (nginx's master), else st.PID.
func masterPID(st Stack) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/stat")
	if err != nil {
		return st.PID
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return st.PID
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil || ppid == os.Getpid() {
		return st.PID
	}
	return ppid
}

// waitGone fails t unless process pid is gone within 2s.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
	}
	t.Errorf("process %d still running after stop", pid)
}

func TestStacksTargetsCarryBackend(t *testing.T) {
	s := &Stacks{Started: []Stack{
		{Name: "bare", URL: "http://127.0.0.1:1/", PID: 10},
		{Name: "nginx", URL: "http://127.0.0.1:2/", PID: 11, BackendPID: 10},
	}}
	want := []Target{
		{Name: "bare", URL: "http://127.0.0.1:1/", PID: 10},
		{Name: "nginx", URL: "http://127.0.0.1:2/", PID: 11, BackendPID: 10},
	}
	if got := s.Targets(); !slices.Equal(got, want) {
		t.Errorf("Targets() = %+v, want %+v", got, want)
	}
}
