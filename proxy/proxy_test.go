package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/serveproxy/serveproxy/replica"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testDeployment describes one deployment of a test proxy.
type testDeployment struct {
	app, prefix string
	factory     replica.Factory
	replicas    int
	maxOngoing  int
	maxQueued   int
	// healthPeriod is health_check_period_s; an hour if zero.
	healthPeriod time.Duration
	// grace is graceful_shutdown_timeout_s; 10 s if zero.
	grace      time.Duration
	userConfig string
	// targets, if set, makes the deployment's replicas upstreams to them,
	// or what connect returns for each, if set.
	targets []string
	connect func(ctx context.Context, id, target string, onRelease func()) ([]replica.Replica, error)
}

// testProxy is a proxy serving on loopback listeners.
type testProxy struct {
	*Proxy
	url, adminURL string
	access        *syncBuffer
	stop          func() error
	// accepted is the public listener's record of the connections the
	// proxy accepted.
	accepted *recordingListener
}

// recordingListener records the remote address of every connection its
// Accept returns: a connection the kernel completed that the proxy never
// accepted (its listener closed first) is reset, and was never the
// proxy's to answer.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	addrs map[string]bool
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.addrs[c.RemoteAddr().String()] = true
		l.mu.Unlock()
	}
	return c, err
}

// has reports whether the connection from addr was accepted.
func (l *recordingListener) has(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addrs[addr]
}

// syncBuffer is an io.Writer safe for concurrent use, for the access log.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startProxy(t *testing.T, opts Options, deps ...testDeployment) *testProxy {
	t.Helper()
	return startProxyWith(t, opts, ServerOptions{ReadHeaderTimeout: 5 * time.Second, KeepAliveTimeout: 90 * time.Second, MaxHeaderBytes: 8 << 10}, deps...)
}

func startProxyWith(t *testing.T, opts Options, so ServerOptions, deps ...testDeployment) *testProxy {
	t.Helper()
	apps := map[string]*Application{}
	var order []*Application
	for _, td := range deps {
		if td.replicas == 0 {
			td.replicas = 1
		}
		if td.maxOngoing == 0 {
			td.maxOngoing = 5
		}
		if td.maxQueued == 0 {
			td.maxQueued = -1
		}
		if td.healthPeriod == 0 {
			td.healthPeriod = time.Hour
		}
		if td.grace == 0 {
			td.grace = 10 * time.Second
		}
		var userConfig json.RawMessage
		if td.userConfig != "" {
			userConfig = json.RawMessage(td.userConfig)
		}
		connect := td.connect
		if td.targets != nil && connect == nil {
			maxOngoing := td.maxOngoing
			connect = func(_ context.Context, id, target string, onRelease func()) ([]replica.Replica, error) {
				r, err := replica.NewUpstreamReplica(id, target, replica.UpstreamOptions{MaxOngoing: maxOngoing, OnRelease: onRelease, HealthPath: "/"})
				return []replica.Replica{r}, err
			}
		}
		d, err := NewDeployment(context.Background(), replica.DeploymentSpec{
			App: td.app, Name: td.app + "-dep", Factory: td.factory, UserConfig: userConfig,
			Connect: connect, Targets: td.targets,
			NumReplicas: td.replicas, MaxOngoingRequests: td.maxOngoing,
			HealthCheckPeriod: td.healthPeriod, HealthCheckTimeout: time.Second,
			GracefulShutdownTimeout: td.grace,
		}, td.maxQueued, opts.Log)
		if err != nil {
			t.Fatal(err)
		}
		a := apps[td.app]
		if a == nil {
			a = &Application{Name: td.app, RoutePrefix: td.prefix}
			apps[td.app] = a
			order = append(order, a)
		}
		a.Deployments = append(a.Deployments, d)
	}
	opts.Applications = order
	access := &syncBuffer{}
	if opts.AccessLog == nil {
		opts.AccessLog = access
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pub := &recordingListener{Listener: l, addrs: map[string]bool{}}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- p.Serve(ctx, pub, adm, so)
	}()
	var once sync.Once
	var stopErr error
	tp := &testProxy{Proxy: p, url: "http://" + pub.Addr().String(), adminURL: "http://" + adm.Addr().String(), access: access, accepted: pub}
	tp.stop = func() error {
		once.Do(func() {
			cancel()
			stopErr = <-errc
			http.DefaultClient.CloseIdleConnections()
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := tp.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	waitFor(t, "proxy ready", func() bool { return p.Ready() })
	return tp
}

// dialProxy opens a raw connection to tp's public listener, closed at the
// end of the test, with a deadline of 10 s for everything on it.
func dialProxy(t *testing.T, tp *testProxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(tp.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// waitFor polls cond for at most 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func static(body string) replica.Factory {
	return func(json.RawMessage) (replica.Handler, error) {
		return replica.NewStatic(json.RawMessage(fmt.Sprintf(`{"body":%q}`, body)))
	}
}

func handlerFunc(f http.HandlerFunc) replica.Factory {
	return func(json.RawMessage) (replica.Handler, error) { return f, nil }
}

func TestRoutingAndOwnEndpoints(t *testing.T) {
	tp := startProxy(t, Options{},
		testDeployment{app: "api", prefix: "/api", factory: static("api")},
		testDeployment{app: "v2", prefix: "/api/v2", factory: static("v2")},
	)
	for path, want := range map[string]string{"/api": "api", "/api/x": "api", "/api/v2/m": "v2", "/api/v20": "api"} {
		if resp, b := get(t, tp.url+path); resp.StatusCode != 200 || b != want {
			t.Errorf("%s: %d %q, want 200 %q", path, resp.StatusCode, b, want)
		}
	}
	resp, b := get(t, tp.url+"/nope")
	if resp.StatusCode != 404 || !strings.Contains(b, "/-/routes") {
		t.Fatalf("unknown path: %d %q, want 404 naming /-/routes", resp.StatusCode, b)
	}
	resp, b = get(t, tp.url+"/-/routes")
	var routes map[string]string
	if err := json.Unmarshal([]byte(b), &routes); err != nil || routes["/api"] != "api" || routes["/api/v2"] != "v2" {
		t.Fatalf("/-/routes = %d %q", resp.StatusCode, b)
	}
	if resp, b := get(t, tp.url+"/-/healthz"); resp.StatusCode != 200 || b != "success" {
		t.Fatalf("/-/healthz = %d %q", resp.StatusCode, b)
	}
	// The public port has no metrics and nothing of the admin's.
	if resp, _ := get(t, tp.url+"/metrics"); resp.StatusCode != 404 {
		t.Fatalf("/metrics on the public port = %d, want 404", resp.StatusCode)
	}
	// Its own endpoints only read: another method is a 405, as on the
	// admin listener (they answered 200 to a PUT; a tester).
	for _, url := range []string{tp.url + "/-/healthz", tp.url + "/-/routes", tp.adminURL + "/metrics"} {
		req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("x"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(resp.Header.Get("Allow"), "GET") {
			t.Errorf("PUT %s = %d (Allow %q), want 405 allowing GET", url, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	if resp, _ := get(t, tp.adminURL+"/metrics"); resp.StatusCode != 200 {
		t.Errorf("GET /metrics = %d", resp.StatusCode)
	}
}

func TestRequestID(t *testing.T) {
	var seen, seenAll atomic.Value
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("X-Request-ID"))
		seenAll.Store(strings.Join(r.Header.Values("X-Request-ID"), ","))
	})})
	resp, _ := get(t, tp.url+"/", "X-Request-ID", "abc-123")
	if got := resp.Header.Get("X-Request-ID"); got != "abc-123" || seen.Load() != "abc-123" {
		t.Fatalf("echoed %q, replica saw %q, want abc-123", got, seen.Load())
	}
	resp, _ = get(t, tp.url+"/")
	id := resp.Header.Get("X-Request-ID")
	if len(id) != 36 || seen.Load() != id {
		t.Fatalf("generated id %q (replica saw %q), want a 36-character UUID seen by both", id, seen.Load())
	}
	// Two ids: the first is the request's, for the replica too.
	resp, _ = get(t, tp.url+"/", "X-Request-ID", "first", "X-Request-ID", "second")
	if got := strings.Join(resp.Header.Values("X-Request-ID"), ","); got != "first" || seenAll.Load() != "first" {
		t.Fatalf("two ids: echoed %q, replica saw %q; want first alone for both", got, seenAll.Load())
	}
}

// TestLimitNeverExceeded sends far more concurrent requests than there are
// slots and checks that no replica ever held more than its limit, by the
// handler's own count and by the replica's.
func TestLimitNeverExceeded(t *testing.T) {
	for max := 1; max <= 5; max++ {
		t.Run(fmt.Sprint("max_ongoing_requests=", max), func(t *testing.T) {
			var mu sync.Mutex
			var peaks []*atomic.Int64
			factory := func(json.RawMessage) (replica.Handler, error) {
				var in, peak atomic.Int64
				mu.Lock()
				peaks = append(peaks, &peak)
				mu.Unlock()
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := in.Add(1)
					defer in.Add(-1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Millisecond)
					_, _ = io.WriteString(w, "ok")
				}), nil
			}
			tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: factory, replicas: 3, maxOngoing: max})
			var wg sync.WaitGroup
			var failed atomic.Int64
			for range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 15 {
						resp, err := http.Get(tp.url + "/")
						if err != nil {
							failed.Add(1)
							continue
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if failed.Load() != 0 {
				t.Fatalf("%d requests failed", failed.Load())
			}
			for _, p := range peaks {
				if p.Load() > int64(max) {
					t.Fatalf("a handler saw %d concurrent requests, limit %d", p.Load(), max)
				}
			}
			for _, s := range tp.Deployments()[0].Stats(context.Background()) {
				if s.Error != "" || s.Peak > max {
					t.Fatalf("replica %s peaked at %d, limit %d (%s)", s.ID, s.Peak, max, s.Error)
				}
			}
		})
	}
}

// blocker is a handler that holds every request until released.
type blocker struct {
	entered chan struct{}
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blocker) factory(json.RawMessage) (replica.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.entered <- struct{}{}
		select {
		case <-b.release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, r.URL.Query().Get("n"))
	}), nil
}

func TestQueueThenBackPressure(t *testing.T) {
	b := newBlocker()
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: b.factory, maxOngoing: 1, maxQueued: 2})
	sched := tp.Deployments()[0].Scheduler
	type answer struct {
		n      int
		status int
		body   string
	}
	answers := make(chan answer, 3)
	for n := range 3 {
		go func() {
			resp, err := http.Get(fmt.Sprintf("%s/?n=%d", tp.url, n))
			if err != nil {
				answers <- answer{n: n, status: -1, body: err.Error()}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers <- answer{n, resp.StatusCode, string(body)}
		}()
		if n == 0 {
			<-b.entered
		} else {
			waitFor(t, fmt.Sprint(n, " queued"), func() bool { return sched.Queued() == n })
		}
	}
	resp, body := get(t, tp.url+"/?n=3")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "max_queued_requests=2") {
		t.Fatalf("over the queue: %d %q (Retry-After %q), want 503 with Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	close(b.release)
	for range 3 {
		a := <-answers
		if a.status != 200 || a.body != fmt.Sprint(a.n) {
			t.Fatalf("request %d: %d %q", a.n, a.status, a.body)
		}
	}
}

func TestTimeout408(t *testing.T) {
	var stubborn atomic.Int64
	tp := startProxy(t, Options{RequestTimeout: 50 * time.Millisecond},
		testDeployment{app: "sleepy", prefix: "/sleepy", factory: func(json.RawMessage) (replica.Handler, error) {
			return replica.NewSleep(json.RawMessage(`{"ms": 10000}`))
		}},
		// A handler that ignores its context: the proxy still answers at the
		// deadline, and the replica's slot stays held until it returns.
		testDeployment{app: "stubborn", prefix: "/stubborn", maxOngoing: 1, factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			stubborn.Add(1)
			defer stubborn.Add(-1)
			time.Sleep(300 * time.Millisecond)
			_, _ = io.WriteString(w, "late")
		})},
	)
	for _, path := range []string{"/sleepy", "/stubborn"} {
		start := time.Now()
		resp, body := get(t, tp.url+path)
		if resp.StatusCode != 408 {
			t.Fatalf("%s: %d %q, want 408", path, resp.StatusCode, body)
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%s: answered after %v", path, time.Since(start))
		}
	}
	stub := tp.Deployments()[1].Replicas()[0]
	if stub.Ongoing() != 1 || stubborn.Load() != 1 {
		t.Fatalf("stubborn replica ongoing = %d (handler %d), want its slot held while it runs", stub.Ongoing(), stubborn.Load())
	}
	waitFor(t, "stubborn handler done", func() bool { return stub.Ongoing() == 0 })
}

func TestClientGone499(t *testing.T) {
	b := newBlocker()
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: b.factory})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", tp.url+"/", nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-b.entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	waitFor(t, "499 in the metrics", func() bool {
		_, m := get(t, tp.adminURL+"/metrics")
		return strings.Contains(m, `serve_num_http_requests_total{application="a",method="GET",route="/",status_code="499"} 1`)
	})
	waitFor(t, "499 in the access log", func() bool { return strings.Contains(tp.access.String(), `"status":499`) })
	if l := tp.Deployments()[0].Replicas()[0]; l.Ongoing() != 0 {
		t.Fatalf("replica still holds %d requests", l.Ongoing())
	}
}

// A client that half-closes its connection after the request (shutdown
// of its write side, as nc -N does) ends the request's context: the
// request is a 499, and the client gets no answer. net/http had sent an
// empty 200 for the handler that wrote nothing.
func TestHalfClosedClientGetsNoEmpty200(t *testing.T) {
	b := newBlocker()
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: b.factory})
	c := dialProxy(t, tp)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-b.entered
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || len(got) != 0 {
		t.Fatalf("a half-closed client got %q (%v), want the connection closed with nothing", got, err)
	}
	waitFor(t, "499 in the access log", func() bool { return strings.Contains(tp.access.String(), `"status":499`) })
}

// CONNECT asks for a tunnel, which a reverse proxy does not make: 501,
// never a replica's 2xx, which would tell the client one is open (found by
// an exploratory run).
func TestConnect501(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	for _, target := range []string{"127.0.0.1:1", "/x"} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || res.StatusCode != http.StatusNotImplemented || !res.Close {
			t.Fatalf("CONNECT %s: %v, %v; want 501 closing the connection", target, res, err)
		}
	}
}

// A '#' in the request target, which no target may have, is a 400: it
// had been forwarded as %23, another path (found by an exploratory run).
func TestFragmentInTarget400(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /a#frag HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != http.StatusBadRequest {
		t.Fatalf("GET /a#frag: %v, %v; want 400", res, err)
	}
}

// A dot segment in the path is a 400: matched as it was, /a/../b went to
// /a's replicas, which resolved it to their /b, out of the prefix (found
// by an exploratory run). Encoded dots count; dots within a name do not.
func TestDotSegments400(t *testing.T) {
	tp := startProxy(t,
		Options{},
		testDeployment{app: "a", prefix: "/a", factory: static("a")},
		testDeployment{app: "b", prefix: "/b", factory: static("b")},
	)
	for _, tc := range []struct {
		target string
		status int
	}{
		{"/a/../b", http.StatusBadRequest},
		{"/a/..", http.StatusBadRequest},
		{"/a/./x", http.StatusBadRequest},
		{"/a/%2e%2e/b", http.StatusBadRequest},
		{"/a/.%2E/b", http.StatusBadRequest},
		{"/a/..%2fb", http.StatusBadRequest},
		{"/a/..;/b", http.StatusBadRequest},
		{"/a/..;x=1/b", http.StatusBadRequest},
		{"/a/..%5cb", http.StatusBadRequest},
		{`/a/..\b`, http.StatusBadRequest},
		{"/a/x;y/..z", http.StatusOK},
		{"/a/..x/.y/x..", http.StatusOK},
		{"/a/...", http.StatusOK},
	} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "GET "+tc.target+" HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || res.StatusCode != tc.status {
			t.Errorf("GET %s: %v, %v; want %d", tc.target, res, err, tc.status)
		}
	}
}

// The asterisk form is the server's own: OPTIONS * is answered by the
// proxy, any other method with it is a 400, where both had gone to the
// application at / (found by an exploratory run).
func TestAsteriskTarget(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	for _, tc := range []struct {
		method string
		status int
	}{{"OPTIONS", http.StatusOK}, {"GET", http.StatusBadRequest}} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, tc.method+" * HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || res.StatusCode != tc.status {
			t.Fatalf("%s *: %v, %v; want %d", tc.method, res, err, tc.status)
		}
		b, _ := io.ReadAll(io.LimitReader(res.Body, 100))
		c.Close()
		if strings.Contains(string(b), "hi") {
			t.Fatalf("%s * reached the application: %q", tc.method, b)
		}
	}
}

func TestPanic500(t *testing.T) {
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("panic") != "" {
			panic("boom")
		}
		_, _ = io.WriteString(w, "fine")
	})})
	if resp, _ := get(t, tp.url+"/?panic=1", "X-Request-ID", "rid-panic"); resp.StatusCode != 500 {
		t.Fatalf("panic: %d, want 500", resp.StatusCode)
	}
	// The panic's line names what its access-log line does.
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "handler panicked") {
			_ = json.Unmarshal([]byte(l), &line)
		}
	}
	if line["panic"] != "boom" || line["request_id"] != "rid-panic" || line["application"] != "a" || line["deployment"] != "a-dep" ||
		!strings.HasPrefix(fmt.Sprint(line["replica"]), "a-dep#") {
		t.Errorf("the panic's log line = %v", line)
	}
	if resp, b := get(t, tp.url+"/"); resp.StatusCode != 200 || b != "fine" {
		t.Fatalf("after the panic: %d %q, want the replica still serving", resp.StatusCode, b)
	}
}

func TestLimits413And431(t *testing.T) {
	tp := startProxy(t, Options{MaxBodyBytes: 1024}, testDeployment{app: "a", prefix: "/", factory: replica.NewEcho})
	resp, err := http.Post(tp.url+"/", "text/plain", strings.NewReader(strings.Repeat("x", 2048)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("declared big body: %d, want 413", resp.StatusCode)
	}
	// A chunked body that only turns out too large while being read.
	resp, err = http.Post(tp.url+"/", "text/plain", io.MultiReader(strings.NewReader(strings.Repeat("x", 2048))))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || !strings.Contains(string(b), "the limit is 1024 bytes (PROXY_MAX_BODY_BYTES)") {
		t.Fatalf("chunked big body: %d %q, want 413 naming the limit and its setting", resp.StatusCode, b)
	}
	resp, _ = get(t, tp.url+"/", "X-Big", strings.Repeat("y", 64<<10))
	if resp.StatusCode != 431 {
		t.Fatalf("big header: %d, want 431", resp.StatusCode)
	}
}

func TestMetricsPresent(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/a", factory: static("hi")})
	get(t, tp.url+"/a")
	get(t, tp.url+"/missing")
	_, m := get(t, tp.adminURL+"/metrics")
	dep := tp.Deployments()[0]
	rid := dep.Replicas()[0].ID()
	for _, want := range []string{
		`serve_num_http_requests_total{application="a",method="GET",route="/a",status_code="200"} 1`,
		`serve_num_http_requests_total{application="",method="GET",route="",status_code="404"} 1`,
		`serve_num_http_error_requests_total{application="",error_code="404",method="GET",route=""} 1`,
		`serve_http_request_latency_ms_bucket{application="a",method="GET",route="/a",status_code="200",le="1"}`,
		`serve_num_ongoing_http_requests `,
		`serve_deployment_queued_queries{application="a",deployment="a-dep"} 0`,
		`serve_replica_processing_queries{application="a",deployment="a-dep",replica="` + rid + `"} 0`,
		`serve_deployment_request_counter_total{application="a",deployment="a-dep",replica="` + rid + `",route="/a"} 1`,
		`serve_deployment_error_counter_total{application="a",deployment="a-dep",replica="` + rid + `",route="/a"} 0`,
		`serve_deployment_processing_latency_ms_bucket{application="a",deployment="a-dep",replica="` + rid + `",route="/a",le="1"}`,
		`serve_deployment_replica_healthy{application="a",deployment="a-dep",replica="` + rid + `"} 1`,
		`serve_replica_peak_processing_queries{application="a",deployment="a-dep",replica="` + rid + `"} 1`,
		`serve_deployment_healthy_replicas{application="a",deployment="a-dep"} 1`,
		`serve_proxy_access_log_dropped_total 0`,
		`serve_proxy_admin_calls_refused_total 0`,
		`serve_deployment_discovery_failing{application="a",deployment="a-dep"} 0`,
		`go_gc_duration_seconds`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// A failing discovery shows (a tester found /metrics looked healthy
	// while the replica set was kept from the last answer).
	dep.SetDiscoveryError(errors.New("lookup failed"))
	if _, m := get(t, tp.adminURL+"/metrics"); !strings.Contains(m, `serve_deployment_discovery_failing{application="a",deployment="a-dep"} 1`) {
		t.Error("serve_deployment_discovery_failing is not 1 while discovery fails")
	}
}

func TestAccessLogLine(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	get(t, tp.url+"/x?q=1", "X-Request-ID", "rid-1")
	waitFor(t, "the access-log line", func() bool { return strings.Contains(tp.access.String(), "rid-1") })
	var line map[string]any
	for _, l := range strings.Split(tp.access.String(), "\n") {
		if strings.Contains(l, "rid-1") {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatalf("access log line %q: %v", l, err)
			}
		}
	}
	for _, k := range []string{"time", "request_id", "method", "path", "status", "bytes", "latency_ms", "application", "route", "deployment", "replica", "remote_addr"} {
		if _, ok := line[k]; !ok {
			t.Errorf("access log line lacks %q: %v", k, line)
		}
	}
	if line["path"] != "/x" || line["status"] != float64(200) || line["bytes"] != float64(2) ||
		!strings.HasPrefix(line["remote_addr"].(string), "127.0.0.1:") {
		t.Fatalf("access log line = %v", line)
	}

	// A HEAD's body, written by its handler, is dropped by net/http: none
	// was sent.
	req, _ := http.NewRequest(http.MethodHead, tp.url+"/", nil)
	req.Header.Set("X-Request-ID", "rid-head")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, "the HEAD's line", func() bool { return strings.Contains(tp.access.String(), "rid-head") })
	for _, l := range strings.Split(tp.access.String(), "\n") {
		if strings.Contains(l, "rid-head") && !strings.Contains(l, `"bytes":0,`) {
			t.Errorf("a HEAD's line = %s, want bytes 0", l)
		}
	}
}

// The public /-/healthz and /-/routes, and their 405, each get a line as
// every other request does, with the request id echoed; no request
// metric counts them (they would read as 404s under the empty route).
func TestAccessLogOwnEndpoints(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	waitFor(t, "healthy", func() bool { res, _ := get(t, tp.url+"/-/healthz"); return res.StatusCode == 200 })
	for _, c := range []struct{ method, path, id, want string }{
		{"GET", "/-/healthz", "rid-health", `"method":"GET","path":"/-/healthz","status":200`},
		{"GET", "/-/routes", "rid-routes", `"method":"GET","path":"/-/routes","status":200`},
		{"POST", "/-/healthz", "rid-post", `"method":"POST","path":"/-/healthz","status":405`},
		{"HEAD", "/-/routes", "rid-head", `"method":"HEAD","path":"/-/routes","status":200,"bytes":0,`},
	} {
		req, _ := http.NewRequest(c.method, tp.url+c.path, nil)
		req.Header.Set("X-Request-ID", c.id)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if got := res.Header.Get("X-Request-ID"); got != c.id {
			t.Errorf("%s %s: X-Request-ID = %q, want %q", c.method, c.path, got, c.id)
		}
		waitFor(t, c.id+" logged", func() bool { return strings.Contains(tp.access.String(), c.id) })
		for _, l := range strings.Split(tp.access.String(), "\n") {
			if strings.Contains(l, `"request_id":"`+c.id+`"`) && (!strings.Contains(l, c.want) || !strings.Contains(l, `"application":"","route":"","deployment":""`)) {
				t.Errorf("line %s, want %s", l, c.want)
			}
		}
	}
	_, m := get(t, tp.adminURL+"/metrics")
	if strings.Contains(m, `serve_num_http_requests_total{application="",`) {
		t.Errorf("the proxy's own endpoints are counted as requests:\n%s", m)
	}
}

// A 5xx's access-log line says why; a 200's has no error.
// A path, request id or method longer than a log buffer is cut in the
// line, not the line dropped: a client could keep its request out of the
// log.
func TestAccessLogClipsLongValues(t *testing.T) {
	tp := startProxyWith(t, Options{}, ServerOptions{ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 1 << 20},
		testDeployment{app: "a", prefix: "/", factory: static("hi")})
	long := strings.Repeat("a", 70_000)
	res, _ := get(t, tp.url+"/"+long, "X-Request-ID", long)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	want := `"path":"/` + strings.Repeat("a", maxLoggedValue-1) + `..."`
	waitFor(t, "the access-log line", func() bool { return strings.Contains(tp.access.String(), want) })
	if !strings.Contains(tp.access.String(), `"request_id":"`+long[:maxLoggedValue]+`..."`) {
		t.Errorf("the request id is not clipped in the line")
	}
	// A method is a token of any length too (found by a tester: a line of
	// a megabyte, or none).
	method := strings.Repeat("M", 70_000)
	req, err := http.NewRequest(method, tp.url+"/m", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want = `"method":"` + method[:maxLoggedValue] + `...","path":"/m"`
	waitFor(t, "the long method's line, clipped", func() bool { return strings.Contains(tp.access.String(), want) })
}

func TestAccessLogError(t *testing.T) {
	// An upstream that answers what is no HTTP, but to its health check
	// as it joins.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			n, _ := c.Read(buf)
			if strings.Contains(string(buf[:n]), "serveproxy-health-check") {
				_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			} else {
				_, _ = c.Write([]byte("garbage\r\n\r\n"))
			}
			c.Close()
		}
	}()
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")}, testDeployment{app: "b", prefix: "/b", targets: []string{"http://" + l.Addr().String()}})
	get(t, tp.url+"/", "X-Request-ID", "ok-1")
	get(t, tp.url+"/b", "X-Request-ID", "bad-1")
	lines := map[string]map[string]any{}
	waitFor(t, "both access-log lines", func() bool {
		for _, l := range strings.Split(tp.access.String(), "\n") {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) == nil {
				if id, _ := line["request_id"].(string); id != "" {
					lines[id] = line
				}
			}
		}
		return lines["ok-1"] != nil && lines["bad-1"] != nil
	})
	if _, ok := lines["ok-1"]["error"]; ok {
		t.Errorf("a 200's line has an error: %v", lines["ok-1"])
	}
	if msg, _ := lines["bad-1"]["error"].(string); lines["bad-1"]["status"] != float64(502) || !strings.Contains(msg, "malformed") {
		t.Errorf("the line of a 502 for a malformed answer = %v, want its error saying so", lines["bad-1"])
	}
}

// TestGracefulShutdownUnderLoad stops the proxy while requests are in
// flight: every request the proxy accepted gets its answer.
func TestGracefulShutdownUnderLoad(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", replicas: 4, maxOngoing: 5, factory: func(json.RawMessage) (replica.Handler, error) {
		return replica.NewSleep(json.RawMessage(`{"ms": 20, "body": "ok"}`))
	}})
	var ok, refused, failed atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
	defer client.CloseIdleConnections()
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				// The connection each try went out on (a retry's is the
				// last): one the proxy never accepted was not its to answer.
				var local string
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { local = i.Conn.LocalAddr().String() }}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, tp.url+"/", nil)
				resp, err := client.Do(req)
				if err != nil {
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" || local != "" && !tp.accepted.has(local) {
						// Not accepted: the listener is closed, or closed
						// with this connection in its backlog.
						refused.Add(1)
						return
					}
					failed.Add(1)
					t.Logf("%v (connection from %s, accepted)", err, local)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "ok" {
					failed.Add(1)
					t.Logf("status %d %q", resp.StatusCode, body)
					return
				}
				ok.Add(1)
			}
		}()
	}
	waitFor(t, "load to build", func() bool { return ok.Load() > 100 })
	if err := tp.stop(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("answered %d, refused after close %d, failed %d", ok.Load(), refused.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d accepted requests failed during shutdown", failed.Load())
	}
}

// TestAbortHandler: a handler that aborts (as httputil.ReverseProxy does
// when its backend dies mid-body) cuts the client's connection, releases
// its slot and leaves the proxy serving, with and without a deadline.
func TestAbortHandler(t *testing.T) {
	for _, timeout := range []time.Duration{0, 5 * time.Second} {
		t.Run(fmt.Sprint("timeout=", timeout), func(t *testing.T) {
			tp := startProxy(t, Options{RequestTimeout: timeout}, testDeployment{app: "a", prefix: "/", maxOngoing: 1, factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("abort") != "" {
					_, _ = io.WriteString(w, "partial")
					if f, ok := w.(http.Flusher); ok {
						f.Flush()
					}
					panic(http.ErrAbortHandler)
				}
				_, _ = io.WriteString(w, "fine")
			})})
			for range 3 { // more aborts than the one slot: each released it
				resp, err := http.Get(tp.url + "/?abort=1")
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				if err == nil {
					t.Fatal("an aborted response read as complete")
				}
			}
			if resp, b := get(t, tp.url+"/"); resp.StatusCode != 200 || b != "fine" {
				t.Fatalf("after aborts: %d %q", resp.StatusCode, b)
			}
		})
	}
}

// TestDrainDelay: on shutdown with a drain delay, /-/healthz answers 503
// while requests are still accepted and answered; then the listener closes.
func TestDrainDelay(t *testing.T) {
	tp := startProxyWith(t, Options{}, ServerOptions{ReadHeaderTimeout: 5 * time.Second, KeepAliveTimeout: time.Second, DrainDelay: 2 * time.Second},
		testDeployment{app: "a", prefix: "/", factory: static("hi")})
	stopped := make(chan error, 1)
	go func() { stopped <- tp.stop() }()
	waitFor(t, "draining", func() bool { return tp.draining.Load() })
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(tp.url + "/-/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("healthz while draining = %d, want 503", resp.StatusCode)
	}
	resp, err = client.Get(tp.url + "/")
	if err != nil {
		t.Fatalf("a new connection during the drain delay was refused: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hi" {
		t.Fatalf("during the drain delay: %d %q", resp.StatusCode, b)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after the drain delay")
	}
	if _, err := client.Get(tp.url + "/"); err == nil {
		t.Fatal("the listener still accepts after the drain delay")
	}
}

// With a request timeout, the handler runs behind the deadline writer,
// which must still let a replica stream both ways.
func TestFullDuplexWithTimeout(t *testing.T) {
	tp := startProxy(t, Options{RequestTimeout: 10 * time.Second}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, r.Body) // reads after writing began
	})})
	req, _ := http.NewRequest("POST", tp.url+"/", strings.NewReader(strings.Repeat("x", 1<<20)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || len(b) != 1<<20 {
		t.Fatalf("full duplex behind a request timeout: %d, %d bytes back (%q...)", resp.StatusCode, len(b), string(b[:min(len(b), 80)]))
	}
}

// With a request timeout, what a handler sets in the header after writing
// it (trailers), or before returning without writing (a 200 with headers),
// reaches the client as it would without one.
func TestHeaderAfterTheFactWithTimeout(t *testing.T) {
	for _, timeout := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprint("timeout=", timeout), func(t *testing.T) {
			tp := startProxy(t, Options{RequestTimeout: timeout},
				testDeployment{app: "t", prefix: "/trailer", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Trailer", "X-Checksum")
					_, _ = io.WriteString(w, "body")
					w.Header().Set("X-Checksum", "abc")
					w.Header().Set(http.TrailerPrefix+"X-Late", "def")
				})},
				testDeployment{app: "e", prefix: "/empty", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("X-Only", "header")
				})})
			resp, err := http.Get(tp.url + "/trailer")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "body" || resp.Trailer.Get("X-Checksum") != "abc" || resp.Trailer.Get("X-Late") != "def" {
				t.Errorf("trailers: %q, %v", b, resp.Trailer)
			}
			resp, err = http.Get(tp.url + "/empty")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Only") != "header" {
				t.Errorf("a handler that only sets a header: %d %v", resp.StatusCode, resp.Header)
			}
		})
	}
}

// TestMetricsOfGoneReplicasPruned checks that a replica scaled away takes
// its per-replica series with it once the grace has passed, so that
// replica churn cannot grow /metrics without bound, and that scrapes
// within the grace still see its final counts.
func TestMetricsOfGoneReplicasPruned(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/a", factory: static("hi"), replicas: 2})
	dep := tp.Deployments()[0]
	setGrace := func(g time.Duration) {
		rm := dep.replicaMetrics
		rm.pruneMu.Lock()
		rm.pruneGrace = g
		rm.pruneMu.Unlock()
	}
	setGrace(time.Hour)
	ids := map[string]bool{}
	for i := 0; i < 200 && len(ids) < 2; i++ { // power of two spreads them
		get(t, tp.url+"/a")
		_, m := get(t, tp.adminURL+"/metrics")
		for _, r := range dep.Replicas() {
			if strings.Contains(m, `serve_deployment_processing_latency_ms_count{application="a",deployment="a-dep",replica="`+r.ID()+`"`) {
				ids[r.ID()] = true
			}
		}
	}
	if len(ids) < 2 {
		t.Fatalf("200 requests reached %d of 2 replicas", len(ids))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dep.Scale(ctx, 1); err != nil {
		t.Fatal(err)
	}
	kept := dep.Replicas()[0].ID()
	var gone string
	for id := range ids {
		if id != kept {
			gone = id
		}
	}
	series := func(id string) string {
		return `serve_deployment_processing_latency_ms_count{application="a",deployment="a-dep",replica="` + id + `",route="/a"}`
	}
	requests := func(id string) string {
		return `serve_deployment_request_counter_total{application="a",deployment="a-dep",replica="` + id + `",route="/a"} `
	}
	for i := range 3 {
		_, m := get(t, tp.adminURL+"/metrics")
		if !strings.Contains(m, series(gone)) {
			t.Fatalf("scrape %d within the grace lacks the gone replica's final counts", i)
		}
		if !strings.Contains(m, requests(gone)) || strings.Contains(m, requests(gone)+"0\n") {
			t.Fatalf("scrape %d within the grace lacks the gone replica's final request count", i)
		}
	}
	// Past the grace, and once its drain is done (a loaded machine may
	// take a while), the next scrapes delete them. Bounded: 50 scrapes.
	waitFor(t, "the gone replica drained", func() bool { return len(dep.Stats(ctx)) == 1 })
	setGrace(0)
	// Deleted at the start of a scrape, never during one: each scrape
	// shows all of the gone replica's series, or none (the scrape that
	// dooms them shows them, the next one none).
	var m string
	for range 50 {
		_, m = get(t, tp.adminURL+"/metrics")
		if strings.Contains(m, series(gone)) != strings.Contains(m, requests(gone)) {
			t.Fatalf("a scrape shows some of the gone replica's series, not all:\n%s", m)
		}
		if !strings.Contains(m, `replica="`+gone+`"`) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(m, series(gone)) || strings.Contains(m, requests(gone)) {
		t.Errorf("50 scrapes past the grace, the metrics still have the series of replica %s, which left", gone)
	}
	if !strings.Contains(m, series(kept)) {
		t.Errorf("the series of replica %s, still serving, went too", kept)
	}
}

// TestShutdownWithAStuckRequest: a request stuck past the graceful
// shutdown timeout has its connection cut, and Serve's error names the
// deployment it is stuck on, not every deployment: the others still get a
// drain of their own.
func TestShutdownWithAStuckRequest(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	arrived := make(chan struct{}, 1)
	tp := startProxy(t, Options{},
		testDeployment{app: "stuck", prefix: "/stuck", grace: 200 * time.Millisecond, factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			<-release // ignores its context, as a hung handler does
		})},
		testDeployment{app: "fine", prefix: "/fine", grace: 200 * time.Millisecond, factory: static("fine")})
	go func() {
		resp, err := http.Get(tp.url + "/stuck")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	err := tp.stop()
	if err == nil || !strings.Contains(err.Error(), `"stuck"`) {
		t.Fatalf("Serve after a stuck request = %v, want an error naming the stuck deployment", err)
	}
	if strings.Contains(err.Error(), `deployment "fine-dep"`) {
		t.Fatalf("Serve's error blames a deployment with nothing in flight: %v", err)
	}
	tp.stop = func() error { return nil } // the error was the point
}

// A request still running when the graceful shutdown timeout ends is cut by
// the proxy: it is recorded as the proxy's failure (503), not as a client
// that left (499), and recorded before the access log closes.
func TestShutdownCutIs503(t *testing.T) {
	arrived := make(chan struct{}, 1)
	tp := startProxy(t, Options{},
		testDeployment{app: "slow", prefix: "/", grace: 200 * time.Millisecond, factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			<-r.Context().Done() // ends only when its connection is cut
		})})
	clientErr := make(chan error, 1)
	go func() {
		resp, err := http.Get(tp.url + "/")
		if err == nil {
			resp.Body.Close()
		}
		clientErr <- err
	}()
	<-arrived
	if err := tp.stop(); err == nil || !strings.Contains(err.Error(), "graceful shutdown") {
		t.Fatalf("Serve after a request outlived the grace period = %v, want a graceful shutdown error", err)
	}
	tp.stop = func() error { return nil }
	if err := <-clientErr; err == nil {
		t.Fatal("the cut request got an answer")
	}
	log := tp.access.String()
	if !strings.Contains(log, `"status":503`) || strings.Contains(log, `"status":499`) || !strings.Contains(log, "cut at the graceful shutdown timeout") {
		t.Fatalf("access log after the cut, want status 503 and no 499, with the cut's error:\n%s", log)
	}
	mfs, err := tp.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, mf := range mfs {
		if mf.GetName() != "serve_num_http_error_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "error_code" && l.GetValue() == "503" && m.GetCounter().GetValue() == 1 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Fatal("serve_num_http_error_requests_total has no error_code=503 for the cut request")
	}
}

// A replica that dies of a request it read, on a kept-alive connection,
// and then refuses the new connection the request is sent again on, leaves
// routing, though the request may not go elsewhere (it gets 502): it had
// stayed in routing for its other stale connections to fail (found by
// review).
func TestDeadReplicaLeavesRoutingAfterA502(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/x" && n.Add(1) == 2 {
			_ = l.Close() // new connections are refused from now on
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = c.Close() // and the kept-alive one breaks before an answer
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)}, testDeployment{app: "up", prefix: "/", targets: []string{"http://" + l.Addr().String()}})
	if res, _ := get(t, tp.url+"/x"); res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	if res, _ := get(t, tp.url+"/x"); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("the request the replica died of: %d, want 502", res.StatusCode)
	}
	if !strings.Contains(logs.String(), "out of routing") {
		t.Errorf("the dead replica was not taken out of routing:\n%s", logs.String())
	}
}

// A replica whose series were doomed by one scrape, and which is back by
// the next (a host back in DNS), keeps them (found by review).
func TestDoomedReplicaBackKeepsItsSeries(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/a", factory: static("hi")})
	get(t, tp.url+"/a")
	rm := tp.Deployments()[0].replicaMetrics
	id := tp.Deployments()[0].Replicas()[0].ID()
	rm.pruneMu.Lock()
	rm.pruneGrace = 0
	rm.pruneMu.Unlock()
	gone := func(string) bool { return false }
	rm.pruneReplicas(gone, time.Now()) // found gone
	rm.pruneReplicas(gone, time.Now()) // doomed
	rm.pruneReplicas(func(string) bool { return true }, time.Now())
	rm.deletePruned()
	if len(rm.replicas.keys()) != 1 {
		t.Fatalf("replica %s, back, lost its series", id)
	}
}

// New refuses applications it cannot serve with an error, rather than
// crash on a nil deployment (found by a tester using the Go API).
func TestNewRefusesMissingParts(t *testing.T) {
	for _, c := range []struct {
		apps []*Application
		want string
	}{
		{[]*Application{nil}, "an application is nil"},
		{[]*Application{{Name: "a", RoutePrefix: "/"}}, `application "a" has no deployments`},
		{[]*Application{{Name: "a", RoutePrefix: "/", Deployments: []*Deployment{nil}}}, `application "a": deployment 0 is nil`},
	} {
		if _, err := New(Options{Applications: c.apps}); err == nil || err.Error() != c.want {
			t.Errorf("New: %v, want %q", err, c.want)
		}
	}
}

// The public listener served by net/http's server alone
// (PROXY_LEAN_FRONT=false) answers as the lean front does, a request with
// a body and one without.
func TestNetHTTPFrontServes(t *testing.T) {
	tp := startProxyWith(t, Options{}, ServerOptions{NetHTTPFront: true, ReadHeaderTimeout: 5 * time.Second, KeepAliveTimeout: 90 * time.Second},
		testDeployment{app: "a", prefix: "/", factory: static("hi")})
	if resp, b := get(t, tp.url+"/"); resp.StatusCode != 200 || b != "hi" {
		t.Fatalf("GET: %d %q, want 200 hi", resp.StatusCode, b)
	}
	resp, err := http.Post(tp.url+"/", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST: %d, want 200", resp.StatusCode)
	}
}
