package replica

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A host's graceful shutdown under load loses nothing: every request its
// handlers ran is answered, and every other one is refused as full or not
// sent at all, so that the proxy can send it to another replica; none is
// left "sent, no answer" (a 502). The proxy closes its connection on the
// host's goaway. Found by review: requests arriving at the end were
// dropped, and answers queued after the drain saw the actors idle.
func TestHostShutdownUnderLoadLosesNothing(t *testing.T) {
	var ran atomic.Int64
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		time.Sleep(200 * time.Microsecond)
		_, _ = w.Write([]byte("ok"))
	}), Replicas: 2, MaxOngoing: 1000})
	c := connect(t, addr, HostOptions{})
	rs := c.Replicas()
	var ok, full, unsent atomic.Int64
	var lost []error
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := 0; i < 50000; i++ { // bounded; stopped after Shutdown
				select {
				case <-stop:
					return
				default:
				}
				err := rs[(g+i)%len(rs)].Serve(newWriteRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
				var ue *UnreachableError
				var fe *FullError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &fe):
					full.Add(1)
				case errors.As(err, &ue) && !ue.Sent:
					unsent.Add(1)
					time.Sleep(time.Millisecond)
				default:
					mu.Lock()
					lost = append(lost, err)
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := h.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	took := time.Since(start)
	close(stop)
	wg.Wait()
	t.Logf("ok=%d full=%d not sent=%d lost=%d ran=%d; Shutdown took %v", ok.Load(), full.Load(), unsent.Load(), len(lost), ran.Load(), took)
	if len(lost) > 0 {
		t.Errorf("%d requests lost during a graceful shutdown (the first: %v)", len(lost), lost[0])
	}
	if ok.Load() != ran.Load() {
		t.Errorf("handlers ran %d requests, %d were answered", ran.Load(), ok.Load())
	}
	if took >= goAwayLinger {
		t.Errorf("Shutdown took %v: the proxy did not close its connection on goaway", took)
	}
	if c.Connected() {
		t.Error("the proxy still counts the host as connected after its shutdown")
	}
	if err := c.LastError(); !errors.Is(err, errHostGoingAway) {
		t.Errorf("the connection's last error is %v, want the goaway", err)
	}
}

// A proxy whose hello does not say it takes goaway (one built before it)
// gets none at a host's shutdown, only the close: it would take an
// unknown frame for a broken protocol and drop what it has in flight
// (found by review).
func TestHostShutdownNoGoAwayForOldProxies(t *testing.T) {
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {}), Replicas: 1, MaxOngoing: 1})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write(proxyHelloFrame()); err != nil {
		t.Fatal(err)
	}
	fr := newFrameReader(nc, DefaultMaxFrameSize)
	if typ, _, _, _, err := fr.next(); err != nil || typ != frameHello {
		t.Fatalf("the host's hello: type %d, %v", typ, err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- h.Shutdown(ctx)
	}()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		typ, _, _, _, err := fr.next()
		if err != nil {
			break // closed by the host
		}
		if typ == frameGoAway {
			t.Fatal("a proxy that did not ask for goaway got one")
		}
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Once a host has sent goaway, its actors stay out of routing while a
// slow request keeps the connection open: a health check must not go over
// that connection, pass, and put back actors nothing can reach (found by
// review).
func TestGoAwayKeepsActorsOutOfRouting(t *testing.T) {
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second)
		_, _ = w.Write([]byte("ok"))
	}), Replicas: 1, MaxOngoing: 10})
	var mu sync.Mutex
	var routable []Handle
	var dp atomic.Pointer[Deployment]
	spec := DeploymentSpec{App: "a", Name: "d", MaxOngoingRequests: 10,
		HealthCheckPeriod: 50 * time.Millisecond, HealthCheckTimeout: time.Second, GracefulShutdownTimeout: time.Second,
		Targets: []string{addr},
		Connect: func(ctx context.Context, _, target string, onRelease func()) ([]Replica, error) {
			hc, err := ConnectHost(ctx, target, HostOptions{OnRelease: onRelease, OnReachability: func(hc *HostConn, up bool) {
				switch d := dp.Load(); {
				case d == nil:
				case up:
					d.CheckHealthNow()
				default:
					for _, r := range hc.Replicas() {
						d.ReportUnreachable(r, nil)
					}
				}
			}})
			if err != nil {
				return nil, err
			}
			return hc.Replicas(), nil
		}}
	d, err := NewDeployment(context.Background(), spec, Hooks{OnChange: func(hs []Handle) { mu.Lock(); routable = hs; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	dp.Store(d)
	d.Start()
	defer d.Stop(context.Background())
	r := d.Replicas()[0]
	done := make(chan error, 1)
	go func() { done <- r.Serve(newWriteRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)) }()
	eventually(t, "the request running", func() bool { return h.Actors()[0].Ongoing() == 1 })
	go func() { _ = h.Shutdown(context.Background()) }()
	eventually(t, "out of routing", func() bool { mu.Lock(); defer mu.Unlock(); return len(routable) == 0 })
	for range 10 { // 10 health periods while the request runs
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		n := len(routable)
		mu.Unlock()
		if n > 0 {
			t.Fatal("a host's actor came back into routing after its goaway")
		}
	}
	if err := <-done; err != nil {
		t.Errorf("the request in flight at the goaway: %v", err)
	}
}
