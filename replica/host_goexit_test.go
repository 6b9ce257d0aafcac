package replica

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A handler on a replica host that ends its goroutine (runtime.Goexit)
// still has its request answered with an error and its actor's slot freed.
// Before, the request waited for its context (forever, with no
// replica_timeout_s) and the actor stayed a slot short for good: with
// max_ongoing_requests 1, every later request was refused as full.
func TestHostHandlerGoexitAnswered(t *testing.T) {
	h, addr := startHost(t, HostConfig{Factory: factoryOf(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/goexit" {
			runtime.Goexit()
		}
		_, _ = w.Write([]byte("ok"))
	}), Replicas: 1, MaxOngoing: 1})
	r := connect(t, addr, HostOptions{}).Replicas()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/goexit", nil).WithContext(ctx))
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "runtime.Goexit") {
		t.Fatalf("a handler that ended its goroutine: %v (context: %v), want the host's error naming it", err, ctx.Err())
	}
	eventually(t, "the actor's slot free", func() bool { return h.Actors()[0].Ongoing() == 0 })
	for i := range 3 {
		w, err := serveOn(t, r, httptest.NewRequest(http.MethodGet, "/", nil))
		if err != nil || w.status != http.StatusOK {
			t.Fatalf("request %d after: %d %v, want the actor (max_ongoing_requests 1) serving", i, w.status, err)
		}
	}
}
