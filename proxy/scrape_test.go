package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A scrape whose collection stalls (its stats wait up to statsTimeout on a
// stalled replica host) does not hold up another one beside it (two
// Prometheus servers): each scrape had taken the lock that deletes gone
// replicas' series before collecting, and queued behind the one before, a
// tester's three scrapes at once taking 5, 10 and 15 s.
func TestScrapesDoNotQueueBehindAStalledOne(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: static("hi")})
	release := make(chan struct{})
	var calls atomic.Int32
	stalling := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		if calls.Add(1) == 1 {
			<-release // the first scrape stalls until the test ends
		}
		return nil, nil
	})
	srv := httptest.NewServer(tp.AdminHandler(stalling))
	defer srv.Close()
	defer close(release)
	go func() {
		if resp, err := http.Get(srv.URL + "/metrics"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	waitFor(t, "the first scrape collecting", func() bool { return calls.Load() == 1 })
	c := &http.Client{Timeout: 5 * time.Second}
	for i := range 2 {
		resp, err := c.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatalf("scrape %d beside a stalled one: %v", i+2, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("scrape %d beside a stalled one: %d", i+2, resp.StatusCode)
		}
	}
}
