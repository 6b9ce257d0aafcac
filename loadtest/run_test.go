package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hiServer starts a loopback server answering "hi" and counting requests.
func hiServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte("hi"))
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// run calls Run with a bounded context and fails the test on error.
func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// sleep waits d or until r's context ends, so a server can always close.
func sleep(r *http.Request, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}

func TestClosedLoopExactCount(t *testing.T) {
	for _, keepAlive := range []bool{true, false} {
		t.Run(map[bool]string{true: "keep-alive", false: "no-keep-alive"}[keepAlive], func(t *testing.T) {
			srv, hits := hiServer(t)
			res := run(t, Config{URL: srv.URL, Requests: 300, Concurrency: 7, DisableKeepAlives: !keepAlive})
			if res.Completed != 300 || res.Total != 300 || res.Failed != 0 || res.Cancelled != 0 {
				t.Errorf("completed %d total %d failed %d cancelled %d, want 300 300 0 0 (errors %v)",
					res.Completed, res.Total, res.Failed, res.Cancelled, res.Errors)
			}
			if got := hits.Load(); got != 300 {
				t.Errorf("server saw %d requests, want 300", got)
			}
			if res.StatusCodes[200] != 300 || res.Bytes != 600 {
				t.Errorf("status codes %v, bytes %d; want 300 x 200, 600 bytes", res.StatusCodes, res.Bytes)
			}
			if res.Latency(50) <= 0 || res.Min <= 0 || res.Max < res.Min || res.Mean < res.Min || res.Mean > res.Max {
				t.Errorf("latencies min %v mean %v max %v p50 %v: not ordered", res.Min, res.Mean, res.Max, res.Latency(50))
			}
			if res.RequestsPerSec <= 0 || res.Elapsed <= 0 {
				t.Errorf("requests/s %v over %v, want > 0", res.RequestsPerSec, res.Elapsed)
			}
		})
	}
}

func TestConcurrencyRespected(t *testing.T) {
	var cur, peak atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cur.Add(1)
		defer cur.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		sleep(r, 2*time.Millisecond)
	}))
	t.Cleanup(srv.Close)
	const c = 5
	res := run(t, Config{URL: srv.URL, Requests: 100, Concurrency: c})
	if res.Completed != 100 {
		t.Fatalf("completed %d, want 100 (errors %v)", res.Completed, res.Errors)
	}
	if p := peak.Load(); p > c || p < 1 {
		t.Errorf("server-side peak concurrency %d, want 1..%d", p, c)
	}
}

func TestKeepAliveConnections(t *testing.T) {
	for _, tc := range []struct {
		name        string
		disable     bool
		wantAtMost  int64
		wantAtLeast int64
	}{
		// The transport may dial a spare connection when a finished one is
		// not back in its idle pool yet; twice the workers is generous.
		{"on", false, 2 * 4, 1},
		{"off", true, 200, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var conns atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte("hi"))
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			t.Cleanup(srv.Close)
			res := run(t, Config{URL: srv.URL, Requests: 200, Concurrency: 4, DisableKeepAlives: tc.disable})
			if res.Completed != 200 {
				t.Fatalf("completed %d, want 200 (errors %v)", res.Completed, res.Errors)
			}
			if n := conns.Load(); n < tc.wantAtLeast || n > tc.wantAtMost {
				t.Errorf("server saw %d connections, want %d..%d", n, tc.wantAtLeast, tc.wantAtMost)
			}
		})
	}
}

func TestRequestShape(t *testing.T) {
	type seen struct{ method, host, header, body string }
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.Host, r.Header.Get("X-Test"), string(b)})
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h := http.Header{}
	h.Set("X-Test", "yes")
	h.Set("Host", "example.test")
	res := run(t, Config{URL: srv.URL, Method: "PUT", Header: h, Body: []byte("payload"), Requests: 10, Concurrency: 2})
	if res.Completed != 10 {
		t.Fatalf("completed %d, want 10 (errors %v)", res.Completed, res.Errors)
	}
	want := seen{"PUT", "example.test", "yes", "payload"}
	for i, s := range got {
		if s != want {
			t.Errorf("request %d: %+v, want %+v", i, s, want)
		}
	}
	if h.Get("Host") != "example.test" {
		t.Errorf("Run changed the caller's header: %v", h)
	}
}

func TestPercentilesKnownDelays(t *testing.T) {
	// Three in five requests take 1ms, two in five 20ms: p50 is a fast one
	// with room to spare, p99 a slow one.
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := time.Millisecond
		if n.Add(1)%5 >= 3 {
			d = 20 * time.Millisecond
		}
		sleep(r, d)
	}))
	t.Cleanup(srv.Close)
	res := run(t, Config{URL: srv.URL, Requests: 100, Concurrency: 4})
	if res.Completed != 100 {
		t.Fatalf("completed %d, want 100 (errors %v)", res.Completed, res.Errors)
	}
	if p50 := res.Latency(50); p50 >= 15*time.Millisecond {
		t.Errorf("p50 %v, want < 15ms", p50)
	}
	if p99 := res.Latency(99); p99 < 20*time.Millisecond {
		t.Errorf("p99 %v, want >= 20ms", p99)
	}
	if res.Min < time.Millisecond || res.Max < 20*time.Millisecond {
		t.Errorf("min %v max %v, want >= 1ms and >= 20ms", res.Min, res.Max)
	}
	var last time.Duration
	for i, p := range res.Percentiles {
		if p.Quantile != Quantiles[i] || p.Latency < last {
			t.Errorf("percentiles not in order at %d: %+v", i, res.Percentiles)
		}
		last = p.Latency
	}
	if res.Percentiles[len(res.Percentiles)-1].Latency != res.Max {
		t.Errorf("p100 %v, want max %v", res.Percentiles[len(res.Percentiles)-1].Latency, res.Max)
	}
}

func TestOpenLoopPacing(t *testing.T) {
	srv, hits := hiServer(t)
	res := run(t, Config{URL: srv.URL, Rate: 200, Duration: time.Second})
	if res.Total < 150 || res.Total > 250 {
		t.Errorf("rate 200/s for 1s sent %d requests, want about 200 (150..250)", res.Total)
	}
	if res.Failed != 0 || res.Completed != hits.Load() {
		t.Errorf("failed %d (errors %v), completed %d, server saw %d", res.Failed, res.Errors, res.Completed, hits.Load())
	}
	if res.Elapsed < 900*time.Millisecond || res.Elapsed > 5*time.Second {
		t.Errorf("elapsed %v, want about 1s", res.Elapsed)
	}
}

func TestOpenLoopRequestCount(t *testing.T) {
	srv, hits := hiServer(t)
	res := run(t, Config{URL: srv.URL, Rate: 1000, Requests: 50})
	if res.Completed != 50 || hits.Load() != 50 {
		t.Errorf("completed %d, server saw %d, want 50 and 50 (errors %v)", res.Completed, hits.Load(), res.Errors)
	}
}

func TestOpenLoopLatencyFromIntendedTime(t *testing.T) {
	// Two requests at a time, 100ms each: capacity 20/s. At 100/s the
	// queue grows, and latency from the intended send time grows with it,
	// far past the 100ms of service that a closed loop would report.
	const service = 100 * time.Millisecond
	slots := make(chan struct{}, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		defer func() { <-slots }()
		sleep(r, service)
	}))
	t.Cleanup(srv.Close)
	res := run(t, Config{URL: srv.URL, Rate: 100, Requests: 20})
	if res.Completed != 20 {
		t.Fatalf("completed %d, want 20 (errors %v)", res.Completed, res.Errors)
	}
	if res.Max < 4*service || res.Latency(99) < 4*service {
		t.Errorf("max %v p99 %v, want both >= %v: latency must count the wait behind the queue", res.Max, res.Latency(99), 4*service)
	}
	if res.Min < service {
		t.Errorf("min %v, want >= the service time %v", res.Min, service)
	}
}

func TestOpenLoopDropsPastMaxInFlight(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sleep(r, 300*time.Millisecond)
	}))
	t.Cleanup(srv.Close)
	res := run(t, Config{URL: srv.URL, Rate: 100, Requests: 20, MaxInFlight: 2})
	if res.Total != 20 || res.Completed+res.Failed != 20 {
		t.Errorf("total %d = completed %d + failed %d, want 20", res.Total, res.Completed, res.Failed)
	}
	if res.Dropped < 10 || res.Failed < res.Dropped || res.Errors[dropKey] != res.Dropped {
		t.Errorf("dropped %d, failed %d, errors %v: want most of 20 dropped and counted as failed", res.Dropped, res.Failed, res.Errors)
	}
	if res.Completed < 2 {
		t.Errorf("completed %d, want at least the first two", res.Completed)
	}
	// The rate is of requests sent: the dropped ones were not.
	if want := float64(res.Total-res.Dropped) / res.Elapsed.Seconds(); res.RequestsPerSec != want {
		t.Errorf("%.2f requests per second, want %.2f (the %d dropped left out)", res.RequestsPerSec, want, res.Dropped)
	}
}

func TestFailuresCounted(t *testing.T) {
	t.Run("server closes connections", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		res := run(t, Config{URL: srv.URL, Requests: 20, Concurrency: 2})
		if res.Failed != 20 || res.Completed != 0 || len(res.Errors) == 0 {
			t.Errorf("failed %d completed %d errors %v, want 20 failed", res.Failed, res.Completed, res.Errors)
		}
	})
	t.Run("no listener", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		res := run(t, Config{URL: "http://" + addr + "/", Requests: 10, Concurrency: 2})
		if res.Failed != 10 || res.Completed != 0 || res.Errors["connection refused"] != 10 {
			t.Errorf("failed %d completed %d errors %v, want 10 connection refused", res.Failed, res.Completed, res.Errors)
		}
		if res.Min != 0 || res.Latency(99) != 0 {
			t.Errorf("latencies %v %v for no responses, want 0", res.Min, res.Latency(99))
		}
	})
}

func TestNon2xxCounted(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	res := run(t, Config{URL: srv.URL, Requests: 40, Concurrency: 3})
	if res.Non2xx != 20 || res.StatusCodes[503] != 20 || res.StatusCodes[200] != 20 || res.Failed != 0 {
		t.Errorf("non-2xx %d, codes %v, failed %d; want 20 x 503, 20 x 200, 0 failed", res.Non2xx, res.StatusCodes, res.Failed)
	}
}

func TestCancelStopsPromptly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sleep(r, 10*time.Second)
	}))
	t.Cleanup(srv.Close)
	for _, rate := range []float64{0, 50} {
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(200*time.Millisecond, cancel)
		start := time.Now()
		res, err := Run(ctx, Config{URL: srv.URL, Requests: 1000, Concurrency: 3, Rate: rate})
		timer.Stop()
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("rate %v: err %v, want context.Canceled", rate, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("rate %v: Run took %v after a cancel at 200ms", rate, d)
		}
		if res == nil || res.Cancelled == 0 || res.Failed != 0 {
			t.Errorf("rate %v: result %+v, want the in-flight requests cancelled, none failed", rate, res)
			continue
		}
		// Their ages are in the latencies: the first was sent at the
		// start and cancelled at 200 ms (a stall at a run's end showed a
		// p99 of 1.5 ms, found by a tester).
		if res.Max < 150*time.Millisecond || res.Latency(99) < 150*time.Millisecond {
			t.Errorf("rate %v: max %v, p99 %v; want the cancelled requests' ages, 200 ms and more", rate, res.Max, res.Latency(99))
		}
	}
}

func TestDurationBoundsRun(t *testing.T) {
	var hung atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.Add(1) > 5 {
			sleep(r, time.Minute)
		}
	}))
	t.Cleanup(srv.Close)
	start := time.Now()
	res := run(t, Config{URL: srv.URL, Duration: 300 * time.Millisecond, Concurrency: 2, Timeout: 500 * time.Millisecond})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a 300ms run against a hung server took %v", d)
	}
	// The two hung requests time out (500ms) before the drain would end.
	if res.Completed != 5 || res.Failed+res.Cancelled != 2 {
		t.Errorf("completed %d failed %d cancelled %d, want 5 and 2 unfinished", res.Completed, res.Failed, res.Cancelled)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"valid", Config{URL: "http://127.0.0.1:1/", Requests: 1}, ""},
		{"localhost", Config{URL: "http://localhost:8000/x", Duration: time.Second}, ""},
		{"ipv6 loopback", Config{URL: "http://[::1]:8000/", Requests: 1}, ""},
		{"no url", Config{Requests: 1}, "URL: required"},
		{"bad scheme", Config{URL: "ftp://127.0.0.1/", Requests: 1}, "URL: scheme"},
		{"no host", Config{URL: "http:///x", Requests: 1}, "URL: no host"},
		{"remote", Config{URL: "http://192.0.2.1/", Requests: 1}, "not loopback"},
		{"remote name", Config{URL: "http://example.com/", Requests: 1}, "not loopback"},
		{"remote allowed", Config{URL: "http://192.0.2.1/", Requests: 1, AllowRemote: true}, ""},
		{"neither limit", Config{URL: "http://127.0.0.1/"}, "at least one"},
		{"negative requests", Config{URL: "http://127.0.0.1/", Requests: -1}, "Requests: must be >= 0"},
		{"negative concurrency", Config{URL: "http://127.0.0.1/", Requests: 1, Concurrency: -1}, "Concurrency"},
		{"negative rate", Config{URL: "http://127.0.0.1/", Requests: 1, Rate: -1}, "Rate"},
		{"bad method", Config{URL: "http://127.0.0.1/", Requests: 1, Method: "GE T"}, "Method"},
		{"negative timeout", Config{URL: "http://127.0.0.1/", Requests: 1, Timeout: -1}, "Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRunRefusesRemote(t *testing.T) {
	res, err := Run(context.Background(), Config{URL: "http://192.0.2.1/", Requests: 1})
	if err == nil || res != nil || !strings.Contains(err.Error(), "not loopback") {
		t.Errorf("Run against a remote host: %v, %v; want a loopback error and no result", res, err)
	}
}

func TestTextRoundTrip(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%4 == 0 {
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	res := run(t, Config{URL: srv.URL, Requests: 200, Concurrency: 4})
	var buf bytes.Buffer
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	s, err := ParseText(strings.NewReader(text))
	if err != nil {
		t.Fatalf("ParseText: %v\n%s", err, text)
	}
	if s.Complete != res.Completed || s.Failed != res.Failed || s.Non2xx != 50 || res.Non2xx != 50 {
		t.Errorf("parsed complete %d failed %d non-2xx %d, want %d %d 50", s.Complete, s.Failed, s.Non2xx, res.Completed, res.Failed)
	}
	if math.Abs(s.RequestsPerSec-res.RequestsPerSec) > 0.01 {
		t.Errorf("parsed requests/s %v, want %v", s.RequestsPerSec, res.RequestsPerSec)
	}
	if math.Abs(s.MeanMs-ms(res.Mean)) > 0.001 {
		t.Errorf("parsed mean %vms, want %vms", s.MeanMs, ms(res.Mean))
	}
	if len(s.Percentiles) != len(Quantiles) {
		t.Fatalf("parsed %d percentiles, want %d: %v", len(s.Percentiles), len(Quantiles), s.Percentiles)
	}
	for _, p := range res.Percentiles {
		if got, ok := s.Percentiles[p.Quantile]; !ok || math.Abs(got-ms(p.Latency)) > 0.001 {
			t.Errorf("parsed p%v = %v, want %v", p.Quantile, got, ms(p.Latency))
		}
	}
	if !strings.Contains(text, "Non-2xx responses:") {
		t.Error("no Non-2xx line with 404s")
	}

	// Without non-2xx responses, there is no Non-2xx line (as in ab).
	srv2, _ := hiServer(t)
	res2 := run(t, Config{URL: srv2.URL, Requests: 5})
	buf.Reset()
	_ = res2.WriteText(&buf)
	if strings.Contains(buf.String(), "Non-2xx") {
		t.Errorf("a Non-2xx line without any:\n%s", buf.String())
	}
}

func TestJSON(t *testing.T) {
	srv, _ := hiServer(t)
	res := run(t, Config{URL: srv.URL, Requests: 30, Concurrency: 3})
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var rep Report
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if rep.Completed != 30 || rep.Total != 30 || rep.StatusCodes["200"] != 30 || rep.Concurrency != 3 || !rep.KeepAlive {
		t.Errorf("report %+v", rep)
	}
	if rep.Latency.Percentiles["p99.9"] <= 0 || rep.Latency.Percentiles["p100"] != ms(res.Max) || rep.Latency.Mean == nil || *rep.Latency.Mean <= 0 {
		t.Errorf("latencies %+v", rep.Latency)
	}
	var raw map[string]any
	_ = json.Unmarshal([]byte(mustJSON(t, res)), &raw)
	for _, k := range []string{"requests_per_sec", "non_2xx", "latency_ms", "elapsed_s", "status_codes", "errors"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON has no %q: %v", k, raw)
		}
	}
}

// mustJSON returns res's JSON.
func mustJSON(t *testing.T, res *Result) string {
	t.Helper()
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// A run with no response has no min or mean: the text says "-" and the
// JSON null, where both said 0, which read as a latency (a tester).
func TestNoResponseHasNoMinOrMean(t *testing.T) {
	r := &Result{URL: "http://127.0.0.1:1/", Cancelled: 10, Max: 3 * time.Second,
		Percentiles: []Percentile{{Quantile: 50, Latency: 3 * time.Second}}}
	var text, js strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Total:         -       - 3000.000") || strings.Contains(text.String(), "Time per request") {
		t.Errorf("text:\n%s\nwant min and mean as -, no mean time per request", text.String())
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"mean": null`) || !strings.Contains(js.String(), `"min": null`) {
		t.Errorf("JSON %s, want null mean and min", js.String())
	}
}

// A run with neither a response nor a cancelled request measured no
// latency at all: its max and percentiles are "-" in the text, null and
// empty in the JSON, where they said 0 (a tester, with nothing listening).
func TestNothingMeasuredHasNoLatencies(t *testing.T) {
	r := &Result{URL: "http://127.0.0.1:1/", Failed: 20, Total: 20, Elapsed: time.Millisecond, RequestsPerSec: 20000}
	r.Percentiles = []Percentile{{Quantile: 50}, {Quantile: 100}}
	var text, js strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Total:         -       -       -") || strings.Contains(text.String(), "Time per request") || strings.Contains(text.String(), "0.000") {
		t.Errorf("text:\n%s\nwant min, mean and max as -, no percentiles, no time per request", text.String())
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"max": null`) || !strings.Contains(js.String(), `"percentiles": {}`) {
		t.Errorf("JSON %s, want a null max and no percentiles", js.String())
	}
}
