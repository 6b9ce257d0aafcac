package replica

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

// A request refused as full round after round (the proxy backs off and
// tries again without bound) keeps one copy of its body, not one more per
// refusal (found by review: 300 refusals of 32 KiB had held 9.7 MiB).
func TestReplayBodyDoesNotGrowPerRefusal(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(FullHeader, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer backend.Close()
	c := newClient(t, TransportOptions{})
	u, err := NewUpstream("u1", backend.URL, UpstreamOptions{MaxOngoing: 4, Transport: c})
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 32<<10)
	req := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	const rounds = 300
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := range rounds {
		err := u.Serve(httptest.NewRecorder(), req)
		var fe *FullError
		if !errors.As(err, &fe) || !fe.Retryable() {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	t.Logf("live heap grew by %d KiB over %d refusals of a %d KiB body", (int64(m1.HeapAlloc)-int64(m0.HeapAlloc))>>10, rounds, len(body)>>10)
	depth, retained := 0, 0
	for b := req.Body; ; {
		rb, ok := b.(*replayBody)
		if !ok {
			break
		}
		depth++
		retained += cap(rb.kept)
		b = rb.rest
	}
	t.Logf("after %d refusals: replayBody chain depth %d, %d KiB of body copies retained", rounds, depth, retained>>10)
	if depth > 1 {
		t.Errorf("replayBody chain grows with each refusal: depth %d after %d refusals", depth, rounds)
	}
	got, _ := io.ReadAll(req.Body)
	if !bytes.Equal(got, body) {
		t.Errorf("body changed: %d bytes", len(got))
	}
}
