package replica

import (
	"context"
	"errors"
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
