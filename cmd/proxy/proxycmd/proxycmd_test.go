package proxycmd

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/serveproxy/serveproxy/replica"
)

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
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, []string{"-config", path}, env, reg, io.Discard, pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var m struct {
				Message  string `json:"message"`
				HTTPAddr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Message == "serving" {
				addr <- m.HTTPAddr
			}
		}
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case c := <-code:
		t.Fatalf("Run returned %d before serving", c)
	case <-time.After(20 * time.Second):
		t.Fatal("no serving line within 20s")
	}
	resp, err := http.Get(url + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello/x" {
		t.Fatalf("GET /x: %d %q", resp.StatusCode, b)
	}
	cancel()
	select {
	case c := <-code:
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
