package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// flushAtDeadline writes its whole answer before the deadline, then
// flushes just after it (as copyBody's stream flush does after its last
// write) and returns nil: nothing it wrote went nowhere.
type flushAtDeadline struct{}

func (flushAtDeadline) ID() string                 { return "r" }
func (flushAtDeadline) TryAcquire() (func(), bool) { return func() {}, true }
func (flushAtDeadline) Ongoing() int               { return 0 }
func (flushAtDeadline) MaxOngoing() int            { return 1 }
func (flushAtDeadline) Serve(w http.ResponseWriter, _ *http.Request) error {
	_, _ = w.Write([]byte("the whole answer"))
	dw := w.(*deadlineWriter)
	for !dw.expired.Load() {
	}
	w.(http.Flusher).Flush()
	return nil
}

// A handler whose complete answer was written before the deadline, and
// whose last Flush came just after it, stands: a refused Flush is no
// refused write (a review found a few in three hundred cut, 408).
func TestFlushAfterDeadlineKeepsACompleteAnswer(t *testing.T) {
	p := &Proxy{}
	cut := 0
	for range 300 {
		rec := httptest.NewRecorder()
		sw := &statusWriter{w: rec}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		abandoned, err := p.serveWithDeadline(ctx, flushAtDeadline{}, func() {}, sw, r)
		cancel()
		if !abandoned && errors.Is(err, context.DeadlineExceeded) && rec.Body.String() == "the whole answer" {
			cut++
		}
		time.Sleep(time.Millisecond)
	}
	if cut > 0 {
		t.Errorf("%d of 300 complete answers (handler returned nil, every byte written before the deadline) taken for cut at the deadline", cut)
	}
}
