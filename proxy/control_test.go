package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/replica"
)

// load sends GETs to url from c goroutines until stop is called (or a
// bound on count or time is hit), and counts the answers that were not a
// 200 with a body allowed by ok.
type load struct {
	sent, failed atomic.Int64
	firstFailure atomic.Value // string
	done         chan struct{}
	wg           sync.WaitGroup
}

func startLoad(t *testing.T, url string, c int, ok func(body string) bool) *load {
	t.Helper()
	const maxRequests, maxTime = 200_000, 60 * time.Second
	l := &load{done: make(chan struct{})}
	deadline := time.Now().Add(maxTime)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c}, Timeout: 10 * time.Second}
	for range c {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for l.sent.Add(1) <= maxRequests && time.Now().Before(deadline) {
				select {
				case <-l.done:
					return
				default:
				}
				resp, err := client.Get(url)
				if err != nil {
					l.fail(err.Error())
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !ok(string(b)) {
					l.fail(fmt.Sprintf("%d %q", resp.StatusCode, b))
				}
			}
		}()
	}
	t.Cleanup(func() { l.stop(); client.CloseIdleConnections() })
	return l
}

// waitSent waits until n more requests have been sent, so that a change
// made next happens under traffic.
func (l *load) waitSent(t *testing.T, n int64) {
	t.Helper()
	target := l.sent.Load() + n
	waitFor(t, fmt.Sprintf("%d requests of load", n), func() bool { return l.sent.Load() >= target })
}

func (l *load) fail(what string) {
	l.failed.Add(1)
	l.firstFailure.CompareAndSwap(nil, what)
}

// stop ends the load and returns how many requests failed, and the first.
func (l *load) stop() (int64, string) {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	l.wg.Wait()
	first, _ := l.firstFailure.Load().(string)
	return l.failed.Load(), first
}

func getApplications(t *testing.T, tp *testProxy) applicationsStatus {
	t.Helper()
	resp, body := get(t, tp.adminURL+"/-/applications")
	var out applicationsStatus
	if err := json.Unmarshal([]byte(body), &out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /-/applications = %d %s (%v)", resp.StatusCode, body, err)
	}
	return out
}

// putJSON sends a PUT and decodes a JSON answer into v (if not nil).
func putJSON(t *testing.T, url, body string, v any) int {
	t.Helper()
	code, got := put(t, url, body, "")
	if v != nil {
		if err := json.Unmarshal([]byte(got), v); err != nil {
			t.Fatalf("PUT %s: %d %s: %v", url, code, got, err)
		}
	}
	return code
}

type reconfigureAnswer struct {
	Error   string       `json:"error"`
	Results []callResult `json:"results"`
}

func newStatic(userConfig json.RawMessage) (replica.Handler, error) {
	return replica.NewStatic(userConfig)
}

func TestReconfigureReachesEveryReplica(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: newStatic, replicas: 4, maxOngoing: 10, userConfig: `{"body":"v1"}`})
	l := startLoad(t, tp.url+"/", 8, func(b string) bool { return b == "v1" || b == "v2" })
	l.waitSent(t, 200)

	var ans reconfigureAnswer
	if code := putJSON(t, tp.adminURL+"/-/applications/a/deployments/a-dep/user_config", `{"body":"v2"}`, &ans); code != 200 || len(ans.Results) != 4 {
		t.Fatalf("PUT user_config = %d %+v", code, ans)
	}
	for _, r := range ans.Results {
		if !r.OK {
			t.Fatalf("replica %s: %s", r.Replica, r.Error)
		}
	}
	l.waitSent(t, 200)
	if failed, first := l.stop(); failed > 0 {
		t.Fatalf("%d requests failed while reconfiguring; first: %s", failed, first)
	}
	for i := range 200 {
		if resp, body := get(t, tp.url+"/"); resp.StatusCode != 200 || body != "v2" {
			t.Fatalf("request %d after reconfigure = %d %q, want 200 v2", i, resp.StatusCode, body)
		}
	}
	dep := getApplications(t, tp).Applications[0].Deployments[0]
	var uc bytes.Buffer
	_ = json.Compact(&uc, dep.UserConfig)
	if uc.String() != `{"body":"v2"}` || dep.Status != statusHealthy || len(dep.Replicas) != 4 {
		t.Fatalf("after reconfigure: %+v", dep)
	}
}

// picky is a static handler whose first replica rejects every new config.
type picky struct {
	*replica.Static
	reject bool
}

func (p picky) Reconfigure(ctx context.Context, userConfig json.RawMessage) error {
	if p.reject {
		return errors.New("this replica is picky")
	}
	return p.Static.Reconfigure(ctx, userConfig)
}

func TestReconfigureFailureIsReplaced(t *testing.T) {
	var built atomic.Int32
	factory := func(userConfig json.RawMessage) (replica.Handler, error) {
		h, err := replica.NewStatic(userConfig)
		if err != nil {
			return nil, err
		}
		return picky{Static: h.(*replica.Static), reject: built.Add(1) == 1}, nil
	}
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: factory, replicas: 3, userConfig: `{"body":"v1"}`})
	var ans reconfigureAnswer
	if code := putJSON(t, tp.adminURL+"/-/applications/a/deployments/a-dep/user_config", `{"body":"v2"}`, &ans); code != 200 {
		t.Fatalf("PUT user_config = %d %+v", code, ans)
	}
	var bad string
	for _, r := range ans.Results {
		if !r.OK {
			if bad != "" || !r.Replaced || !strings.Contains(r.Error, "picky") {
				t.Fatalf("results: %+v", ans.Results)
			}
			bad = r.Replica
		}
	}
	if bad == "" {
		t.Fatalf("no replica reported its failure: %+v", ans.Results)
	}
	// The replacement runs the new config; the picky one is gone.
	waitFor(t, "the failed replica replaced", func() bool {
		dep := getApplications(t, tp).Applications[0].Deployments[0]
		running := 0
		for _, r := range dep.Replicas {
			if r.ID == bad && r.State != replica.StateStopped && r.State != replica.StateDraining {
				return false
			}
			if r.State == replica.StateRunning {
				running++
			}
		}
		return running == 3
	})
	for range 50 {
		if _, body := get(t, tp.url+"/"); body != "v2" {
			t.Fatalf("after reconfigure: %q, want v2", body)
		}
	}
}

func TestReconfigureRejectedChangesNothing(t *testing.T) {
	tp := startProxy(t, Options{},
		testDeployment{app: "a", prefix: "/a", factory: newStatic, replicas: 2, userConfig: `{"body":"v1"}`},
		testDeployment{app: "e", prefix: "/e", factory: func(c json.RawMessage) (replica.Handler, error) { return replica.NewEcho(c) }})
	before := getApplications(t, tp)

	var ans reconfigureAnswer
	// The static handler knows no field "colour": every replica rejects it.
	if code := putJSON(t, tp.adminURL+"/-/applications/a/deployments/a-dep/user_config", `{"colour":"red"}`, &ans); code != 422 ||
		!strings.Contains(ans.Error, "user_config rejected") || !strings.Contains(ans.Error, "colour") {
		t.Fatalf("PUT a bad user_config = %d %+v", code, ans)
	}
	// Echo takes no user_config at all.
	if code := putJSON(t, tp.adminURL+"/-/applications/e/deployments/e-dep/user_config", `{"x":1}`, &ans); code != 422 ||
		!strings.Contains(ans.Error, "take no user_config") {
		t.Fatalf("PUT user_config to echo = %d %+v", code, ans)
	}
	after := getApplications(t, tp)
	for i, app := range after.Applications {
		for j, dep := range app.Deployments {
			was := before.Applications[i].Deployments[j]
			if string(dep.UserConfig) != string(was.UserConfig) || len(dep.Replicas) != len(was.Replicas) || dep.Replicas[0].ID != was.Replicas[0].ID {
				t.Fatalf("rejected config changed %s: %+v, was %+v", app.Name, dep, was)
			}
		}
	}
	if _, body := get(t, tp.url+"/a"); body != "v1" {
		t.Fatalf("after a rejected config: %q, want v1", body)
	}
}

func TestScaleLiveUnderLoad(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi"), replicas: 2, maxOngoing: 4})
	l := startLoad(t, tp.url+"/", 8, func(b string) bool { return b == "hi" })
	l.waitSent(t, 300)
	url := tp.adminURL + "/-/applications/a/deployments/a-dep/num_replicas"
	running := func() int {
		n := 0
		for _, r := range getApplications(t, tp).Applications[0].Deployments[0].Replicas {
			if r.State == replica.StateRunning {
				n++
			}
		}
		return n
	}

	for _, n := range []int{6, 1, 3} {
		var ds deploymentStatus
		if code := putJSON(t, url, fmt.Sprintf(`{"num_replicas": %d}`, n), &ds); code != 200 || ds.NumReplicas != n {
			t.Fatalf("PUT num_replicas %d = %d %+v", n, code, ds)
		}
		if got := running(); got != n {
			t.Fatalf("after scaling to %d: %d running", n, got)
		}
		l.waitSent(t, 300) // traffic on the new set
	}
	if failed, first := l.stop(); failed > 0 {
		t.Fatalf("%d of %d requests failed while scaling; first: %s", failed, l.sent.Load(), first)
	}
	waitFor(t, "the drained replicas gone", func() bool {
		return len(getApplications(t, tp).Applications[0].Deployments[0].Replicas) == 3
	})
}

func TestControlEndpointsBadInput(t *testing.T) {
	tp := startProxy(t, Options{AdminToken: "s3cret"}, testDeployment{app: "a", prefix: "/", factory: newStatic, replicas: 2, userConfig: `{"body":"v1"}`})
	base := tp.adminURL + "/-/applications/"
	before := getApplications(t, tp)
	for _, c := range []struct {
		path, body, token string
		code              int
		want              string
	}{
		{"nope/deployments/a-dep/user_config", `{}`, "s3cret", 404, `no application \"nope\"`},
		{"a/deployments/nope/user_config", `{}`, "s3cret", 404, `has no deployment \"nope\"`},
		{"a/deployments/a-dep/user_config", `{"body":`, "s3cret", 400, "invalid JSON"},
		{"a/deployments/a-dep/user_config", ` `, "s3cret", 400, "the body is empty: it must be a JSON object"},
		{"a/deployments/a-dep/user_config", `["v2"]`, "s3cret", 400, "must be a JSON object"},
		{"a/deployments/a-dep/user_config", `{"body":"v2"} {}`, "s3cret", 400, "more than one value"},
		{"a/deployments/a-dep/user_config", `{"body":"v2"}`, "", 401, "Bearer"},
		{"a/deployments/a-dep/num_replicas", `{"num_replicas": 0}`, "s3cret", 400, "must be in [1, 10000], got 0"},
		{"a/deployments/a-dep/num_replicas", `{"num_replicas": 100000000}`, "s3cret", 400, "got 100000000"},
		{"a/deployments/a-dep/num_replicas", `{"num_replicas": "3"}`, "s3cret", 400, "invalid JSON"},
		{"a/deployments/a-dep/num_replicas", `{"replicas": 3}`, "s3cret", 400, "unknown field"},
		{"a/deployments/a-dep/num_replicas", `{}`, "s3cret", 400, `give \"num_replicas\"`},
		{"nope/deployments/a-dep/num_replicas", `{"num_replicas": 3}`, "s3cret", 404, "no application"},
		{"a/deployments/a-dep/num_replicas", `{"num_replicas": 3}`, "", 401, "Bearer"},
	} {
		code, body := put(t, base+c.path, c.body, c.token)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("PUT %s %s = %d %s, want %d with %q", c.path, c.body, code, body, c.code, c.want)
		}
	}
	after := getApplications(t, tp)
	b, _ := json.Marshal(before)
	a, _ := json.Marshal(after)
	if string(a) != string(b) {
		t.Fatalf("bad input changed the deployment:\n before %s\n after  %s", b, a)
	}
}

// Names that need escaping in a path reach their deployments: chi
// matches the escaped path when it has escapes of its own.
func TestControlEscapedNames(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a/b", prefix: "/ab", factory: newStatic}, testDeployment{app: "50%", prefix: "/p", factory: newStatic})
	for _, path := range []string{"a%2Fb/deployments/a%2Fb-dep", "50%25/deployments/50%25-dep"} {
		if code, body := put(t, tp.adminURL+"/-/applications/"+path+"/num_replicas", `{"num_replicas": 2}`, ""); code != http.StatusOK {
			t.Errorf("PUT %s/num_replicas = %d %s, want 200", path, code, body)
		}
	}
}

// sickly fails its health checks once sick is set.
type sickly struct {
	replica.Handler
	sick *atomic.Bool
}

func (s sickly) CheckHealth(context.Context) error {
	if s.sick.Load() {
		return errors.New("out of memory, say")
	}
	return nil
}

func TestUnhealthyReplicaReplacedUnderLoad(t *testing.T) {
	var built atomic.Int32
	var sick atomic.Bool
	factory := func(json.RawMessage) (replica.Handler, error) {
		h, _ := replica.NewStatic(json.RawMessage(`{"body":"hi"}`))
		flag := new(atomic.Bool)
		if built.Add(1) == 1 {
			flag = &sick // only the first replica falls ill
		}
		return sickly{h, flag}, nil
	}
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)},
		testDeployment{app: "a", prefix: "/", factory: factory, replicas: 3, healthPeriod: 100 * time.Millisecond})
	first := tp.Deployments()[0].Replicas()[0].ID()
	l := startLoad(t, tp.url+"/", 8, func(b string) bool { return b == "hi" })
	l.waitSent(t, 300)
	sick.Store(true)

	// Its first failed check shows at once in the metrics; after three it
	// leaves routing and a new replica takes its place.
	waitFor(t, "serve_deployment_replica_healthy 0", func() bool {
		_, body := get(t, tp.adminURL+"/metrics")
		return strings.Contains(body, fmt.Sprintf(`serve_deployment_replica_healthy{application="a",deployment="a-dep",replica=%q} 0`, first))
	})
	waitFor(t, "the unhealthy replica replaced", func() bool {
		reps := tp.Deployments()[0].Replicas()
		for _, r := range reps {
			if r.ID() == first {
				return false
			}
		}
		return len(reps) == 3
	})
	l.waitSent(t, 300)
	if failed, first := l.stop(); failed > 0 {
		t.Fatalf("%d of %d requests failed while a replica was replaced; first: %s", failed, l.sent.Load(), first)
	}
	if log := logs.String(); !strings.Contains(log, "replica unhealthy: taken out of routing") || !strings.Contains(log, first) {
		t.Fatalf("no log line names the unhealthy replica:\n%s", log)
	}
}

func TestUpstreamDeploymentControl(t *testing.T) {
	var targets []string
	for _, name := range []string{"one", "two"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		targets = append(targets, srv.URL)
	}
	tp := startProxy(t, Options{}, testDeployment{app: "up", prefix: "/", targets: targets})
	seen := map[string]bool{}
	for range 40 {
		_, body := get(t, tp.url+"/")
		seen[body] = true
	}
	if !seen["one"] || !seen["two"] || len(seen) != 2 {
		t.Fatalf("answers from %v, want one and two", seen)
	}
	dep := getApplications(t, tp).Applications[0].Deployments[0]
	if dep.NumReplicas != 2 || dep.Status != statusHealthy || len(dep.Replicas) != 2 {
		t.Fatalf("upstream deployment: %+v", dep)
	}
	base := tp.adminURL + "/-/applications/up/deployments/up-dep/"
	if code, body := put(t, base+"num_replicas", `{"num_replicas": 5}`, ""); code != http.StatusConflict || !strings.Contains(body, "its replicas are its upstreams") {
		t.Fatalf("PUT num_replicas on upstreams = %d %s, want 409", code, body)
	}
	if code, body := put(t, base+"user_config", `{"a": 1}`, ""); code != http.StatusUnprocessableEntity || !strings.Contains(body, "take no user_config") {
		t.Fatalf("PUT user_config on upstreams = %d %s, want 422", code, body)
	}
}

func TestDeploymentHealth(t *testing.T) {
	rs := func(states ...string) []replica.ReplicaStatus {
		var out []replica.ReplicaStatus
		for i, st := range states {
			r := replica.ReplicaStatus{Stats: replica.Stats{ID: fmt.Sprintf("r%d", i)}}
			switch st {
			case "ok":
				r.State, r.Healthy = replica.StateRunning, true
			case "failing":
				r.State = replica.StateRunning
			case "draining":
				r.State = replica.StateDraining
			case "unsynced":
				r.State, r.Unsynced = replica.StateRunning, true
			}
			out = append(out, r)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		replicas []replica.ReplicaStatus
		want     int
		gaveUp   bool
		status   string
		message  string
	}{
		{"all healthy", rs("ok", "ok"), 2, false, statusHealthy, ""},
		{"draining extra after a scale down", rs("ok", "ok", "draining"), 2, false, statusHealthy, ""},
		{"scaling up", rs("ok"), 2, false, statusUpdating, "1 of 2 replicas running"},
		{"gave up starting the rest", rs("ok"), 3, true, statusUnhealthy, "1 of 3 replicas running; starting the others failed max_constructor_retry_count rounds"},
		{"one failing", rs("ok", "failing", "ok"), 3, false, statusUnhealthy, "1 of 3 replicas failing health checks (r1)"},
		{"one refusing the user_config", rs("ok", "unsynced"), 2, false, statusUnhealthy, "1 of 2 replicas have not taken the deployment's user_config (r1)"},
		{"the only one failing, still in routing", rs("failing", "draining"), 2, false, statusUnhealthy, "1 of 1 replicas failing health checks (r0)"},
		{"none running", rs("draining"), 2, false, statusUnhealthy, "no replica is running (2 wanted): requests get 503"},
		{"no replica at all", nil, 0, false, statusUnhealthy, "no replica is running (0 wanted)"},
		{"gave up with none running", nil, 2, true, statusUnhealthy, "no replica is running (2 wanted), and starting them failed max_constructor_retry_count rounds in a row: requests get 503, and no more attempts until num_replicas is set again"},
	} {
		status, message := deploymentHealth(tc.replicas, tc.want, tc.gaveUp)
		if status != tc.status || !strings.Contains(message, tc.message) || (tc.message == "") != (message == "") {
			t.Errorf("%s: %s %q, want %s %q", tc.name, status, message, tc.status, tc.message)
		}
	}
}

func TestReloadEndpoint(t *testing.T) {
	var calls atomic.Int32
	tp := startProxy(t, Options{AdminToken: "s3cret", Reload: func(context.Context) ReloadResult {
		calls.Add(1)
		return ReloadResult{Config: "serve.yaml", Status: http.StatusConflict, Applied: []string{}, Problems: []string{"serve.yaml:3: applications[0].route_prefix: changed"}}
	}}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	post := func(auth string) (int, string) { return call(t, http.MethodPost, tp.adminURL+"/-/reload", "", auth) }
	if code, body := post(""); code != http.StatusUnauthorized || calls.Load() != 0 {
		t.Errorf("POST /-/reload without the token = %d %s (%d reloads), want 401 and none", code, body, calls.Load())
	}
	if code, body := post("Bearer nope"); code != http.StatusUnauthorized {
		t.Errorf("POST /-/reload with a wrong token = %d %s, want 401", code, body)
	}
	if code, body := post("Bearer s3cret"); code != http.StatusConflict || !strings.Contains(body, "route_prefix: changed") || strings.Contains(body, `"status"`) {
		t.Errorf("POST /-/reload = %d %s, want the result's 409 and its problems", code, body)
	}
	if code, body := post("bearer s3cret"); code != http.StatusConflict { // the scheme is case-insensitive
		t.Errorf("POST /-/reload with the scheme in lower case = %d %s, want it taken", code, body)
	}
	// A body is refused: a reload applies the file, not a config sent
	// (it was ignored, found by a tester).
	if code, body := call(t, http.MethodPost, tp.adminURL+"/-/reload", `{"config":"x"}`, "Bearer s3cret"); code != http.StatusBadRequest || !strings.Contains(body, "takes no body") {
		t.Errorf("POST /-/reload with a body = %d %s, want 400", code, body)
	}
	if calls.Load() != 2 {
		t.Errorf("%d reloads, want 2", calls.Load())
	}
	tp.SetDraining() // shutting down: nothing is reloaded (found by an exploratory run)
	if code, body := post("Bearer s3cret"); code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") || calls.Load() != 2 {
		t.Errorf("POST /-/reload while draining = %d %s (%d reloads), want 503 and none", code, body, calls.Load())
	}
	// Nor is a deployment changed (a scale would start replicas).
	for _, path := range []string{"num_replicas", "user_config"} {
		body := `{"num_replicas": 4}`
		if path == "user_config" {
			body = `{"body": "x"}`
		}
		if code, out := call(t, http.MethodPut, tp.adminURL+"/-/applications/a/deployments/a-dep/"+path, body, "Bearer s3cret"); code != http.StatusServiceUnavailable || !strings.Contains(out, "shutting down") {
			t.Errorf("PUT %s while draining = %d %s, want 503", path, code, out)
		}
	}
	if n := len(tp.opts.Applications[0].Deployments[0].Replicas()); n != 1 {
		t.Errorf("%d replicas after a scale while draining, want 1", n)
	}
}

// refusingStatic is a static handler whose Reconfigure always fails.
type refusingStatic struct{ replica.Handler }

func (refusingStatic) Reconfigure(context.Context, json.RawMessage) error {
	return errors.New("not today")
}

// A reconfigure that some replicas it cannot replace refused (a replica
// host's actors) answers 207, each replica's result listed, as PUT /-/gc
// does: a 200 had read as "every replica has it".
func TestReconfigurePartialIs207(t *testing.T) {
	connect := func(_ context.Context, id, target string, onRelease func()) ([]replica.Replica, error) {
		st, err := replica.NewStatic(json.RawMessage(`{"body":"v1"}`))
		if err != nil {
			return nil, err
		}
		var h replica.Handler = st
		if target == "bad" {
			h = refusingStatic{st}
		}
		return []replica.Replica{replica.NewLocal(id, h, 5, onRelease)}, nil
	}
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", targets: []string{"good", "bad"}, connect: connect})
	waitFor(t, "both replicas routable", func() bool { return len(tp.Deployments()[0].Scheduler.Replicas()) == 2 })
	var ans reconfigureAnswer
	code := putJSON(t, tp.adminURL+"/-/applications/a/deployments/a-dep/user_config", `{"body":"v2"}`, &ans)
	if code != http.StatusMultiStatus || !strings.Contains(ans.Error, "1 of 2 replicas have not taken it") || len(ans.Results) != 2 {
		t.Fatalf("PUT user_config with one refusing = %d %+v, want 207", code, ans)
	}
	for _, r := range ans.Results {
		if r.OK == strings.Contains(r.Error, "not today") {
			t.Errorf("result %+v", r)
		}
	}
	for i := range 20 {
		if _, body := get(t, tp.url+"/"); body != "v2" {
			t.Fatalf("request %d: %q, want the new config from the replica that took it (the other out of routing)", i, body)
		}
	}
}
