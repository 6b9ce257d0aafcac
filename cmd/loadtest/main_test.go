package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/serveproxy/serveproxy/loadtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// runCmd runs the command line args and returns its exit code and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code = run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// server starts a loopback server counting requests and recording the last
// one's method, header X-Test and body.
func server(t *testing.T) (*httptest.Server, *atomic.Int64, *atomic.Value) {
	t.Helper()
	var hits atomic.Int64
	var last atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hits.Add(1)
		last.Store(r.Method + " " + r.Header.Get("X-Test") + " " + string(b))
		_, _ = w.Write([]byte("hi"))
	}))
	t.Cleanup(srv.Close)
	return srv, &hits, &last
}

func TestFlagErrors(t *testing.T) {
	u := "http://127.0.0.1:1/"
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no url", []string{"-n", "1"}, "URL: missing"},
		{"two urls", []string{"-n", "1", u, u}, "unexpected arguments"},
		{"no limit", []string{u}, "-n, -t: set at least one"},
		// A subcommand mistyped is said to be one (a tester: "compar"
		// read as a URL).
		{"unknown subcommand", []string{"compar", "a=" + u}, `unknown subcommand "compar"`},
		{"negative n", []string{"-n", "-1", u}, "-n: must be >= 0"},
		{"zero c", []string{"-n", "1", "-c", "0", u}, "-c: must be >= 1"},
		{"bad c", []string{"-c", "many", u}, `invalid value "many" for flag -c`},
		{"bad t", []string{"-t", "10", u}, `invalid value "10" for flag -t: want a duration with its unit, such as 10s`},
		{"negative t", []string{"-t", "-1s", u}, "-t: must be >= 0"},
		{"unknown flag", []string{"-z", u}, "flag provided but not defined: -z"},
		{"bad header", []string{"-n", "1", "-H", "NoColon", u}, `for flag -H: want "Key: Value"`},
		{"body twice", []string{"-n", "1", "-d", "x", "-D", "f", u}, "-d, -D"},
		{"missing body file", []string{"-n", "1", "-D", "/nonexistent/body", u}, "-D:"},
		{"negative rate", []string{"-n", "1", "-rate", "-5", u}, "-rate: must be >= 0"},
		{"NaN rate", []string{"-n", "1", "-rate", "NaN", u}, "-rate: must be >= 0"}, // it ran the closed loop
		{"rate too high", []string{"-n", "1", "-rate", "1e9", u}, "-rate: must be <= 1e7"},
		{"c with rate", []string{"-n", "1", "-rate", "5", "-c", "3", u}, "-c: does not apply"},
		{"zero max-inflight", []string{"-n", "1", "-rate", "5", "-max-inflight", "0", u}, "-max-inflight"},
		{"zero timeout", []string{"-n", "1", "-timeout", "0s", u}, "-timeout: must be > 0"},
		{"bad method", []string{"-n", "1", "-m", "GE T", u}, "-m: not a valid HTTP method"},
		{"bad scheme", []string{"-n", "1", "ftp://127.0.0.1/"}, "URL: want http"},
		{"remote host", []string{"-n", "1", "http://192.0.2.1/"}, "not loopback"},
		{"remote name", []string{"-n", "1", "http://example.com/"}, "-allow-remote"},
		// Checked before the run, not as every request's failure (found by
		// a tester).
		{"port out of range", []string{"-n", "1", "http://127.0.0.1:99999/"}, `URL: port "99999" is not 1 to 65535`},
		{"CRLF in a header value", []string{"-n", "1", "-H", "X-Test: a\r\nEvil: 1", u}, "-H: the value of X-Test has a control character"},
		{"c over n", []string{"-n", "5", "-c", "10", u}, "-c: 10 workers for 5 requests (-n): -n must be at least -c"},
		{"max-inflight closed loop", []string{"-n", "3", "-max-inflight", "5", u}, "-max-inflight: applies to the open loop only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			if code != exitInvalid {
				t.Errorf("exit %d, want %d", code, exitInvalid)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q, want it to contain %q", stderr, tc.want)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

func TestParseLoad(t *testing.T) {
	body := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(body, []byte("from file"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := parseLoad([]string{"-n", "7", "-c", "3", "-k=false", "-m", "POST", "-H", "X-A: 1", "-H", "X-A: 2",
		"-D", body, "-t", "2s", "-timeout", "3s", "-json", "-q", "http://localhost:9/x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := opts.cfg
	if c.Requests != 7 || c.Concurrency != 3 || !c.DisableKeepAlives || c.Method != "POST" || string(c.Body) != "from file" ||
		c.Duration != 2*time.Second || c.Timeout != 3*time.Second || c.URL != "http://localhost:9/x" || !opts.json || c.Progress != nil {
		t.Errorf("config %+v", c)
	}
	if got := c.Header.Values("X-A"); len(got) != 2 || got[0] != "1" || got[1] != "2" {
		t.Errorf("headers %v", c.Header)
	}

	opts, err = parseLoad([]string{"-rate", "100", "-t", "1s", "-max-inflight", "5", "-d", "x", "http://127.0.0.1:9/"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := opts.cfg; c.Rate != 100 || c.MaxInFlight != 5 || string(c.Body) != "x" || c.DisableKeepAlives {
		t.Errorf("config %+v", c)
	}

	// The guard lifts only when asked.
	if _, err := parseLoad([]string{"-n", "1", "-allow-remote", "http://192.0.2.1/"}, io.Discard); err != nil {
		t.Errorf("-allow-remote: %v", err)
	}
}

func TestRunLoad(t *testing.T) {
	srv, hits, last := server(t)
	code, stdout, stderr := runCmd(t, "-n", "20", "-c", "2", "-m", "PUT", "-H", "X-Test: yes", "-d", "body", "-json", srv.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep loadtest.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, stdout)
	}
	if rep.Completed != 20 || hits.Load() != 20 || last.Load() != "PUT yes body" {
		t.Errorf("completed %d, server saw %d, last %v", rep.Completed, hits.Load(), last.Load())
	}

	code, stdout, stderr = runCmd(t, "-n", "10", "-k=false", srv.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	s, err := loadtest.ParseText(strings.NewReader(stdout))
	if err != nil || s.Complete != 10 || s.Failed != 0 || s.Percentiles[100] <= 0 {
		t.Errorf("ParseText: %+v, %v\n%s", s, err, stdout)
	}
	if stderr != "" {
		t.Errorf("stderr %q, want nothing (not a terminal: no progress bar)", stderr)
	}
}

// A run in which no request got a response fails: its rate is of
// failures (found by review).
func TestRunLoadNothingAnswered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	code, _, stderr := runCmd(t, "-n", "20", "-c", "2", "http://"+addr+"/")
	if code != exitFailed || !strings.Contains(stderr, "no request got a response (20 failed, 0 cancelled at the end)") {
		t.Fatalf("exit %d, stderr %q; want 1 saying no request got a response", code, stderr)
	}
	// A server that answers nothing: every request cancelled at the end
	// exited 0 (found by review).
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hung.Close)
	code, _, stderr = runCmd(t, "-q", "-t", "200ms", "-c", "2", "-timeout", "300ms", hung.URL)
	if code != exitFailed || !strings.Contains(stderr, "no request got a response") {
		t.Fatalf("against a hung server: exit %d, stderr %q; want 1", code, stderr)
	}
}

func TestCompareFlags(t *testing.T) {
	a, b := "a=http://127.0.0.1:1/", "b=http://127.0.0.1:2/"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one target", []string{a}, "at least two"},
		{"not a pair", []string{a, "http://127.0.0.1:2/"}, "want name=URL"},
		{"twice", []string{a, a}, "given twice"},
		{"remote", []string{a, "r=http://192.0.2.1/"}, "not loopback"},
		{"rounds", []string{"-rounds", "0", a, b}, "-rounds"},
		{"duration", []string{"-t", "0s", a, b}, "-t"},
		{"conns", []string{"-c", "0", a, b}, "-c"},
		{"tool", []string{"-tool", "ab", a, b}, "-tool"},
		{"wrk part seconds", []string{"-tool", "wrk", "-t", "500ms", a, b}, "-t: wrk runs whole seconds"},
		{"pid syntax", []string{"-pid", "a", a, b}, "want name=PID"},
		{"pid target", []string{"-pid", "c=1", a, b}, `-pid: "c" names no target`},
		{"backend-pid target", []string{"-backend-pid", "c=1", a, b}, `-backend-pid: "c" names no target`},
		{"backend-pid with stacks", []string{"-stacks", "-backend-pid", "a=1"}, "-backend-pid are not for started stacks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, append([]string{"compare"}, tc.args...)...)
			if code != exitInvalid || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, exitInvalid, tc.want)
			}
		})
	}
	cfg, err := parseCompare([]string{"-pid", "b=42", "-backend-pid", "b=43", "-tool", "builtin", "-rounds", "3", a, b}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Targets) != 2 || cfg.Targets[0].Name != "a" || cfg.Targets[1].PID != 42 || cfg.Targets[1].BackendPID != 43 ||
		cfg.Targets[0].BackendPID != 0 || cfg.Rounds != 3 || cfg.Tool != loadtest.ToolBuiltin {
		t.Errorf("config %+v", cfg)
	}
}

func TestRunCompare(t *testing.T) {
	a, hitsA, _ := server(t)
	b, hitsB, _ := server(t)
	code, stdout, stderr := runCmd(t, "compare", "-tool", "builtin", "-rounds", "2", "-t", "100ms", "-warmup", "0", "-c", "2",
		"-pid", "a="+strconv.Itoa(os.Getpid()), "a="+a.URL, "b="+b.URL)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// The builtin load runs in this process, so its CPU is the client's.
	for _, want := range []string{"round 1  a", "round 2  b", "median req/s", "ratio 1.00", "client cpu"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output has no %q:\n%s", want, stdout)
		}
	}
	if hitsA.Load() == 0 || hitsB.Load() == 0 {
		t.Errorf("hits %d %d", hitsA.Load(), hitsB.Load())
	}
}

func TestGCCompareFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"scenario", []string{"-scenario", "big"}, "-scenario"},
		{"rounds", []string{"-rounds", "0"}, "-rounds"},
		{"duration", []string{"-t", "0s"}, "-t"},
		{"rate", []string{"-rate", "0"}, "-rate"},
		{"NaN rate", []string{"-rate", "NaN", "-proxy", "/nonexistent/proxy"}, "-rate"},
		{"requests", []string{"-n", "0"}, "-n"},
		{"tool", []string{"-tool", "ab"}, "-tool: want wrk or builtin"},
		{"n with wrk", []string{"-tool", "wrk", "-n", "500"}, "-n: wrk has no request count"},
		{"closed-t", []string{"-closed-t", "0s"}, "-closed-t: must be > 0"},
		{"closed-t part seconds", []string{"-closed-t", "1500ms"}, "-closed-t: must be whole seconds"},
		{"closed-t with builtin", []string{"-tool", "builtin", "-closed-t", "5s"}, "-closed-t: applies to -tool wrk"},
		{"conns", []string{"-c", "0"}, "-c"},
		{"setting", []string{"-settings", "off,gogc9000"}, `unknown setting "gogc9000"`},
		{"setting twice", []string{"-settings", "off,off"}, "given twice"},
		{"args", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, append([]string{"gc-compare"}, tc.args...)...)
			if code != exitInvalid || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, exitInvalid, tc.want)
			}
		})
	}
	opts, err := parseGCCompare([]string{"-settings", "gogc400,off", "-scenario", "echo16k", "-access-log=false", "-proxy", "/bin/true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := opts.cfg
	if len(c.Settings) != 2 || c.Settings[0].Name != "gogc400" || c.Scenario != "echo16k" || c.AccessLog || c.ProxyPath != "/bin/true" || c.Rounds != 3 {
		t.Errorf("config %+v", c)
	}
	opts, err = parseGCCompare([]string{"-tool", "wrk", "-closed-t", "3s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := opts.cfg; c.Tool != loadtest.ToolWrk || c.ClosedDuration != 3*time.Second {
		t.Errorf("config %+v", c)
	}
	opts, err = parseGCCompare([]string{"-tool", "builtin", "-n", "500"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := opts.cfg; c.Tool != loadtest.ToolBuiltin || c.Requests != 500 || c.ClosedDuration != loadtest.DefaultGCClosedDuration {
		t.Errorf("config %+v", c)
	}
}

func TestSoakFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"rate", []string{"-rate", "0"}, "-rate"},
		{"NaN rate", []string{"-rate", "NaN", "-proxy", "/nonexistent/proxy"}, "-rate"},
		{"duration", []string{"-t", "0s"}, "-t"},
		{"every", []string{"-every", "0s"}, "-every"},
		{"warmup", []string{"-warmup", "-1s"}, "-warmup"},
		{"too short", []string{"-t", "30s", "-warmup", "25s"}, "-warmup + -every (25s + 10s) must be shorter than -t (30s)"},
		{"env syntax", []string{"-env", "NOEQUALS"}, "want KEY=VALUE"},
		{"env addr", []string{"-env", "PROXY_ADMIN_ADDR=:9"}, "-env: PROXY_ADMIN_ADDR"},
		{"args", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, append([]string{"soak"}, tc.args...)...)
			if code != exitInvalid || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, stderr, exitInvalid, tc.want)
			}
		})
	}
	opts, err := parseSoak([]string{"-t", "20s", "-every", "2s", "-rate", "300", "-env", "PROXY_GC_PERCENT=200", "-env", "GOGC=50", "-proxy", "/bin/true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := opts.cfg
	if c.Duration != 20*time.Second || c.Every != 2*time.Second || c.Rate != 300 || c.Warmup != 10*time.Second || c.ProxyPath != "/bin/true" ||
		len(c.Env) != 2 || c.Env["PROXY_GC_PERCENT"] != "200" || c.Env["GOGC"] != "50" {
		t.Errorf("config %+v", c)
	}
	if opts, err := parseSoak(nil, io.Discard); err != nil || opts.cfg.Duration != 5*time.Minute || opts.cfg.Rate != 2000 || opts.cfg.Warmup != 30*time.Second {
		t.Errorf("defaults %+v, %v", opts.cfg, err)
	}
	// A proxy that will not start fails the run, not the command line.
	code, _, stderr := runCmd(t, "soak", "-proxy", "/bin/false", "-t", "2s", "-every", "500ms")
	if code != exitFailed || !strings.Contains(stderr, "exited while starting") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// reverseproxy's bad flags are usage errors naming the flag: a target
// that is no http URL (it had answered every request 502), and a listen
// address off loopback (found by review).
func TestReverseProxyFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-target: required"},
		{[]string{"-target", "localhost:28001"}, `-target: want http://HOST:PORT, got "localhost:28001"`},
		{[]string{"-target", "ftp://127.0.0.1/"}, "-target: want http://HOST:PORT"},
		{[]string{"-target", "http://192.0.2.1/"}, "-target:"},
		{[]string{"-target", "http://127.0.0.1:1/", "-listen", "0.0.0.0:0"}, "-listen: want a loopback HOST:PORT"},
		{[]string{"-target", "http://127.0.0.1:1/", "extra"}, `unexpected arguments ["extra"]`}, // it served (a tester)
	} {
		code, _, stderr := runCmd(t, append([]string{"reverseproxy"}, tc.args...)...)
		if code != exitInvalid || !strings.Contains(stderr, tc.want) {
			t.Errorf("reverseproxy %v: exit %d, %q; want 2 with %q", tc.args, code, stderr, tc.want)
		}
	}
}

// -h is asked for: exit 0 with the usage, as the proxy's and the
// replica's (it was 2, found by a tester).
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"soak", "-h"}, {"compare", "-h"}, {"reverseproxy", "-h"}} {
		code, _, stderr := runCmd(t, args...)
		if code != exitOK || !strings.Contains(stderr, "usage: loadtest") {
			t.Errorf("loadtest %v: exit %d, stderr %q; want 0 and the usage", args, code, stderr)
		}
	}
}

// A -pid with no process behind it is refused before the run (it failed
// after it, exit 1).
func TestComparePIDChecked(t *testing.T) {
	code, _, stderr := runCmd(t, "compare", "-pid", "a=99999999", "a=http://127.0.0.1:9/", "b=http://127.0.0.1:9/")
	if code != exitInvalid || !strings.Contains(stderr, "-pid: a=99999999: no process") {
		t.Errorf("exit %d, stderr %q; want 2 naming the pid", code, stderr)
	}
}

// A -proxy that is no binary is refused before anything runs, naming the
// flag (a tester: gc-compare printed its header, then failed with exit 1).
func TestProxyFlagChecked(t *testing.T) {
	for _, args := range [][]string{
		{"gc-compare", "-proxy", "/nonexistent/proxy"},
		{"soak", "-proxy", "/nonexistent/proxy"},
		{"compare", "-stacks", "-proxy", "/nonexistent/proxy"},
	} {
		code, stdout, stderr := runCmd(t, args...)
		if code != exitInvalid || !strings.Contains(stderr, "-proxy: ") || stdout != "" {
			t.Errorf("loadtest %v: exit %d, stdout %q, stderr %q; want 2 naming -proxy, nothing run", args, code, stdout, stderr)
		}
	}
}
