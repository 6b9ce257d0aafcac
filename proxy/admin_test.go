package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/replica"
)

func newTuner(t *testing.T) *gctune.Tuner {
	t.Helper()
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	l := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(p); debug.SetMemoryLimit(l) })
	environ := map[string]string{"PROXY_GC_MEMORY_LIMIT": "512MiB"}
	e, err := config.ReadEnv(environ)
	if err != nil {
		t.Fatal(err)
	}
	tu, err := gctune.Apply(e, environ)
	if err != nil {
		t.Fatal(err)
	}
	return tu
}

func put(t *testing.T, url, body, token string) (int, string) {
	t.Helper()
	auth := ""
	if token != "" {
		auth = "Bearer " + token
	}
	return call(t, http.MethodPut, url, body, auth)
}

// call sends an admin request with the Authorization header auth (none
// if empty) and returns its status and body.
func call(t *testing.T, method, url, body, auth string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestGCEndpoints(t *testing.T) {
	tu := newTuner(t)
	tp := startProxy(t, Options{GC: tu, AdminToken: "s3cret"}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	gcURL := tp.adminURL + "/-/gc"

	resp, body := get(t, gcURL)
	var s gctune.State
	if err := json.Unmarshal([]byte(body), &s); err != nil || resp.StatusCode != 200 || s.Percent != 400 || s.MemoryLimitBytes != 512<<20 {
		t.Fatalf("GET /-/gc = %d %s", resp.StatusCode, body)
	}

	// Without the token: 401, nothing changed.
	if code, body := put(t, gcURL, `{"percent": 300}`, ""); code != 401 || !strings.Contains(body, "Bearer") {
		t.Fatalf("PUT without token = %d %s, want 401", code, body)
	}
	if code, _ := put(t, gcURL, `{"percent": 300}`, "wrong"); code != 401 {
		t.Fatalf("PUT with a wrong token = %d, want 401", code)
	}
	if tu.State().Percent != 400 {
		t.Fatal("an unauthorized PUT changed the settings")
	}
	// The profiler needs the token too (it shows the command line).
	if resp, _ := get(t, tp.adminURL+"/debug/pprof/cmdline"); resp.StatusCode != 401 {
		t.Fatalf("pprof without the token = %d, want 401", resp.StatusCode)
	}
	if resp, _ := get(t, tp.adminURL+"/debug/pprof/cmdline", "Authorization", "Bearer s3cret"); resp.StatusCode != 200 {
		t.Fatalf("pprof with the token = %d, want 200", resp.StatusCode)
	}

	bad := []struct{ body, want string }{
		{`{"percent": 300`, "invalid JSON"},
		{`{"percnt": 300}`, `unknown field`},
		{`{"percent": 0}`, "percent: invalid GC percent"},
		{`{"percent": 2.5}`, "percent: invalid GC percent"},
		{`{"percent": 2147483648}`, "percent: invalid GC percent"},
		{`{"memory_limit": "lots"}`, "memory_limit: invalid memory limit"},
		// A number is read as its text, as percent's is: a bare byte
		// count gets the parser's word on units, not a JSON type error.
		{`{"memory_limit": 268435456}`, `memory_limit: invalid memory limit \"268435456\": a number with no unit could be bytes or a ratio (want a size with a unit, such as 268435456B or 512MiB`},
		{`{"memory_limit": 1}`, `a ratio with a decimal point, such as 0.9, where 1.0 is all the memory`},
		{`{"memory_limit": true}`, `memory_limit: invalid memory limit \"true\"`},
		{`{"percent": "off", "memory_limit": "none"}`, "without bound"},
		// A limit beyond the machine's memory bounds nothing either
		// (found by a tester).
		{`{"percent": "off", "memory_limit": "99999999GiB"}`, "more than the"},
		{`{"percent": 500, "memory_limit": "99999999GiB"}`, "would let the heap grow without bound"},
		{`{}`, "nothing to change"},
		{`{"percent": 300} {"percent": 1}`, "more than one value"},
		{`{"percent": 300, "percent": "off"}`, `the key \"percent\" is twice in one object`},
		{"{\"memory_limit\": \"1GiB\xff\"}", `invalid JSON: the body is not UTF-8 (a byte that is no UTF-8 at offset 22)`},
		{`{"MEMORY_LIMIT": 1}`, `unknown field \"MEMORY_LIMIT\": keys are matched exactly`},
		{`{"percent": 250, "PERCENT": 350}`, `unknown field \"PERCENT\": keys are matched exactly, the field is \"percent\"`},
		{`{"Memory_Limit": "1GiB"}`, `unknown field \"Memory_Limit\"`},
	}
	for _, tt := range bad {
		code, body := put(t, gcURL, tt.body, "s3cret")
		if code != 400 || !strings.Contains(body, tt.want) {
			t.Errorf("PUT %s = %d %s, want 400 with %q", tt.body, code, body, tt.want)
		}
	}
	// A body over the admin API's limit is a 413 (it was a 400, found by
	// a tester).
	if code, body := put(t, gcURL, `{"percent": 300, "memory_limit": "`+strings.Repeat(" ", maxAdminBody)+`"}`, "s3cret"); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "body larger than") {
		t.Errorf("PUT of a body over %d bytes = %d %s, want 413", maxAdminBody, code, body)
	}
	if s := tu.State(); s.Percent != 400 || s.MemoryLimitBytes != 512<<20 {
		t.Fatalf("rejected PUTs changed the settings: %+v", s)
	}

	code, body := put(t, gcURL, `{"percent": 300, "memory_limit": "256MiB"}`, "s3cret")
	if err := json.Unmarshal([]byte(body), &s); err != nil || code != 200 || s.Percent != 300 || s.MemoryLimitBytes != 256<<20 || s.PercentSource != gctune.SourceRuntime {
		t.Fatalf("PUT = %d %s", code, body)
	}
	if p := debug.SetGCPercent(300); p != 300 {
		t.Fatalf("runtime GOGC = %d, want 300", p)
	}
	_, m := get(t, tp.adminURL+"/metrics")
	for _, want := range []string{"serve_proxy_gc_percent 300", "serve_proxy_gc_memory_limit_bytes 2.68435456e+08", "serve_proxy_gc_tuning_enabled 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Nothing of this is on the public port: there the path is the app's.
	if code, body := put(t, tp.url+"/-/gc", `{"percent": 200}`, "s3cret"); body != "hi" || tu.State().Percent != 300 {
		t.Fatalf("public PUT /-/gc = %d %q, GOGC %d: reached the admin handler", code, body, tu.State().Percent)
	}
}

// Every GET of the admin listener answers HEAD too.
func TestAdminHead(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	for _, path := range []string{"/-/applications", "/-/healthz", "/-/routes", "/metrics"} {
		if code, body := call(t, http.MethodHead, tp.adminURL+path, "", ""); code != http.StatusOK || body != "" {
			t.Errorf("HEAD %s = %d %q, want 200 and no body", path, code, body)
		}
	}
}

// Refused admin calls are logged, at most once a second with their count:
// someone trying tokens must not flood the log. Those refused within the
// second are told at its end, whether or not another call comes (they
// were told only with the next refusal a second on: a tester), and each
// is counted in serve_proxy_admin_calls_refused_total.
func TestAdminRefusalsLoggedSparingly(t *testing.T) {
	logs := &syncBuffer{}
	tp := startProxy(t, Options{GC: newTuner(t), AdminToken: "s3cret", Log: zerolog.New(logs)}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	for range 20 {
		if code, _ := put(t, tp.adminURL+"/-/gc", `{"percent": 300}`, "guess"); code != 401 {
			t.Fatalf("PUT with a wrong token = %d, want 401", code)
		}
	}
	told := func() (lines, refused int) {
		for l := range strings.Lines(logs.String()) {
			var line struct {
				Message string `json:"message"`
				Refused int    `json:"refused"`
			}
			if json.Unmarshal([]byte(l), &line) == nil && strings.HasPrefix(line.Message, "admin call refused") {
				lines, refused = lines+1, refused+line.Refused
			}
		}
		return lines, refused
	}
	waitFor(t, "all 20 refusals told", func() bool { _, n := told(); return n == 20 })
	if lines, _ := told(); lines > 3 { // 20 calls take well under a second or two here
		t.Errorf("%d log lines for 20 refused calls, want at most one a second", lines)
	}
	if _, body := call(t, http.MethodGet, tp.adminURL+"/metrics", "", ""); !strings.Contains(body, "serve_proxy_admin_calls_refused_total 20") {
		t.Errorf("serve_proxy_admin_calls_refused_total is not 20")
	}
}

// A scraper that hangs up is no error of the proxy's: Debug, not Error.
func TestPromLoggerScraperGone(t *testing.T) {
	var out strings.Builder
	p := &Proxy{opts: Options{Log: zerolog.New(&out)}}
	l := promLogger{p}
	l.Println("error encoding and sending metric family:", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)})
	l.Println("error gathering metrics:", errors.New("collector failed"))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"level":"debug"`) || !strings.Contains(lines[1], `"level":"error"`) {
		t.Fatalf("log:\n%s\nwant the broken pipe at debug, the collector's failure at error", out.String())
	}
}

func TestDuplicateKey(t *testing.T) {
	for in, want := range map[string]string{
		`{"a": 1, "b": 2}`:                        "",
		`{"a": 1, "a": 2}`:                        "a",
		`{"a": {"x": 1, "y": {"x": 2}}}`:          "",
		`{"user_config": {"ms": 1, "ms": 2}}`:     "ms",
		`[{"a": 1}, {"a": 1}]`:                    "",
		`[{"k": [1, {"z": 1, "z": 2}]}]`:          "z",
		`{"a": 1, "a"`:                            "a",
		`{"a": [1, 2}`:                            "",
		`"just a string"`:                         "",
		`{"a": {"b": 1}, "c": {"b": 2}, "a": {}}`: "a",
	} {
		if got := duplicateKey([]byte(in)); got != want {
			t.Errorf("duplicateKey(%s) = %q, want %q", in, got, want)
		}
	}
}

// The admin listener's 405 and 404 are JSON naming the problem, the 405
// with its Allow (an empty body, found by a tester).
func TestAdminMethodNotAllowed(t *testing.T) {
	tp := startProxy(t, Options{GC: newTuner(t)}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	req, _ := http.NewRequest(http.MethodDelete, tp.adminURL+"/-/gc", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD, PUT" || !strings.Contains(string(b), "DELETE /-/gc: not a method of this endpoint; it takes GET, HEAD, PUT") {
		t.Errorf("DELETE /-/gc = %d, Allow %q, %s", resp.StatusCode, resp.Header.Get("Allow"), b)
	}
	resp, body := get(t, tp.adminURL+"/-/nope")
	if resp.StatusCode != 404 || !strings.Contains(body, "/-/nope: no such admin endpoint") {
		t.Errorf("GET /-/nope = %d %s", resp.StatusCode, body)
	}
}

// Refusals not told yet when the proxy closes are told then, before its
// log is closed, whether or not the timer that was to tell them has begun
// (found by review: a timer waiting for the lock was left to write after
// Close).
func TestAdminRefusalsToldAtClose(t *testing.T) {
	logs := &syncBuffer{}
	tp := startProxy(t, Options{GC: newTuner(t), AdminToken: "s3cret", Log: zerolog.New(logs)}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	for range 3 {
		if code, _ := put(t, tp.adminURL+"/-/gc", `{"percent": 300}`, "guess"); code != http.StatusUnauthorized {
			t.Fatalf("PUT with a wrong token = %d, want 401", code)
		}
	}
	if err := tp.stop(); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for l := range strings.Lines(logs.String()) {
		var line struct {
			Refused int `json:"refused"`
		}
		if strings.Contains(l, "admin call refused") && json.Unmarshal([]byte(l), &line) == nil {
			refused += line.Refused
		}
	}
	if refused != 3 {
		t.Errorf("%d refusals told by the time the proxy stopped, want 3:\n%s", refused, logs.String())
	}
}

// stalledGC is a replica whose set_gc never answers: a replica host
// stopped (SIGSTOP) after its handshake.
type stalledGC struct{ *replica.Local }

func (s stalledGC) Call(ctx context.Context, method string, payload []byte) ([]byte, error) {
	if method == replica.MethodSetGC {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Local.Call(ctx, method, payload)
}

// A replica that does not answer its set_gc fails alone, its error naming
// the wait: before, the deployments after its own waited out the whole
// timeout and were listed as failed with it, in-process ones included
// (a tester), each saying only "context deadline exceeded".
func TestGCBroadcastStalledReplicaFailsAlone(t *testing.T) {
	tu := newTuner(t)
	old := controlTimeout
	controlTimeout = 500 * time.Millisecond
	t.Cleanup(func() { controlTimeout = old })
	stalled := testDeployment{app: "stalled", prefix: "/s", targets: []string{"h:1"},
		connect: func(_ context.Context, id, _ string, onRelease func()) ([]replica.Replica, error) {
			return []replica.Replica{stalledGC{replica.NewLocal(id, replica.Echo{}, 1, onRelease)}}, nil
		}}
	local := testDeployment{app: "local", prefix: "/", factory: static("hi"), replicas: 2}
	tp := startProxy(t, Options{GC: tu}, stalled, local)
	code, body := put(t, tp.adminURL+"/-/gc", `{"percent": 300}`, "")
	var res struct {
		Failed []struct{ Application, Replica, Error string } `json:"failed"`
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatalf("PUT /-/gc = %d %s: %v", code, body, err)
	}
	if code != http.StatusMultiStatus || len(res.Failed) != 1 || res.Failed[0].Application != "stalled" ||
		!strings.Contains(res.Failed[0].Error, "no answer within 500ms") {
		t.Fatalf("PUT /-/gc = %d %s, want 207 with the stalled replica alone, its wait named", code, body)
	}
}
