package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/serveproxy/serveproxy/replica"
)

// gated is a handler whose requests each wait for a token of their own.
type gated struct {
	entered atomic.Int64
	gate    chan struct{}
}

func (g *gated) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.entered.Add(1)
	select {
	case <-g.gate:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// answeringHealth answers the proxy's health checks (a target's first,
// as it joins, among them) with 200, and passes the rest to h: a test
// upstream whose handler holds or refuses every request.
func answeringHealth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("User-Agent") == "serveproxy-health-check" {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// serveOnLoopback serves h on a loopback port until the test ends, and
// returns its URL.
func serveOnLoopback(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestMaxOngoingChangedLive raises and lowers a deployment's
// max_ongoing_requests while requests run, for a replica in process and
// for an HTTP server (whose connections are bounded by the limit too), as
// Serve's light updates change it: raised, the queued requests start at
// once; lowered, no new request starts until those over the new limit are
// done.
func TestMaxOngoingChangedLive(t *testing.T) {
	for _, kind := range []string{"in-process", "upstream"} {
		t.Run(kind, func(t *testing.T) {
			g := &gated{gate: make(chan struct{})}
			td := testDeployment{app: "a", prefix: "/", maxOngoing: 1}
			if kind == "upstream" {
				td.targets = []string{serveOnLoopback(t, answeringHealth(g))}
			} else {
				td.factory = func(json.RawMessage) (replica.Handler, error) { return g, nil }
			}
			tp := startProxy(t, Options{}, td)
			d := tp.Deployments()[0]
			rep := d.Scheduler.Replicas()[0]
			answers := make(chan string, 4)
			send := func() {
				go func() {
					resp, err := http.Get(tp.url + "/")
					if err != nil {
						answers <- err.Error()
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					answers <- fmt.Sprint(resp.StatusCode, " ", string(body))
				}()
			}
			answered := func() {
				t.Helper()
				select {
				case a := <-answers:
					if a != "200 ok" {
						t.Fatalf("answer %q, want 200 ok", a)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no answer in 10 s")
				}
			}

			for range 3 {
				send()
			}
			waitFor(t, "1 running and 2 queued", func() bool { return g.entered.Load() == 1 && d.Scheduler.Queued() == 2 })
			if err := d.SetMaxOngoing(3); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the 2 queued started once the limit rose to 3", func() bool { return g.entered.Load() == 3 })
			if n := rep.MaxOngoing(); n != 3 {
				t.Fatalf("replica's MaxOngoing = %d after SetMaxOngoing(3)", n)
			}

			// Lowered under 3 running: the next request waits until all
			// but none of them are done.
			if err := d.SetMaxOngoing(1); err != nil {
				t.Fatal(err)
			}
			send()
			waitFor(t, "the 4th queued", func() bool { return d.Scheduler.Queued() == 1 })
			for i := range 2 {
				g.gate <- struct{}{}
				answered()
				// Its slot was freed before its answer was sent.
				if q, in := d.Scheduler.Queued(), g.entered.Load(); q != 1 || in != 3 {
					t.Fatalf("after %d of 3 done under a limit of 1: %d queued, %d entered; want 1 and 3", i+1, q, in)
				}
			}
			g.gate <- struct{}{}
			answered()
			waitFor(t, "the 4th started once the others were done", func() bool { return g.entered.Load() == 4 })
			g.gate <- struct{}{}
			answered()
			if peak := rep.(interface{ Peak() int }).Peak(); peak != 3 {
				t.Errorf("peak %d, want 3", peak)
			}
			// A replica that joins later gets the limit in force, not the
			// one the deployment began with.
			if err := d.SetMaxOngoing(4); err != nil {
				t.Fatal(err)
			}
			if kind == "upstream" {
				if err := d.SetTargets(append(td.targets, serveOnLoopback(t, answeringHealth(g)))); err != nil {
					t.Fatal(err)
				}
			} else if err := d.Scale(context.Background(), 2); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a second replica", func() bool { return len(d.Scheduler.Replicas()) == 2 })
			for _, r := range d.Scheduler.Replicas() {
				if n := r.MaxOngoing(); n != 4 {
					t.Errorf("replica %s: MaxOngoing %d, want the 4 in force", r.ID(), n)
				}
			}
			if err := d.SetMaxOngoing(0); err == nil {
				t.Error("SetMaxOngoing(0) did not fail")
			}
			if got := d.Spec().MaxOngoingRequests; got != 4 {
				t.Errorf("Spec().MaxOngoingRequests = %d, want 4", got)
			}
		})
	}
}
