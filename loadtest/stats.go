package loadtest

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram geometry: microseconds, 3 significant digits, up to an hour.
const (
	histMinUS   = 1
	histMaxUS   = int64(time.Hour / time.Microsecond)
	histSigFigs = 3
)

// maxErrorKinds bounds the distinct error messages kept; the rest are
// counted under otherErrors so a flood of unique messages cannot grow memory.
const maxErrorKinds = 32

// otherErrors is the Errors key that counts errors past maxErrorKinds.
const otherErrors = "(other errors)"

// newHistogram returns an empty latency histogram of the package geometry.
func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMinUS, histMaxUS, histSigFigs)
}

// tally is one shard of a run's counts. Workers record into shard
// i % len(shards) so that no single lock is shared by every request.
type tally struct {
	// mu guards every field below.
	mu        sync.Mutex
	hist      *hdrhistogram.Histogram
	completed int64
	failed    int64
	non2xx    int64
	bytes     int64
	sum       time.Duration
	min, max  time.Duration
	status    map[int]int64
	errors    map[string]int64
}

// stats is a run's tallies.
type stats struct {
	shards []tally
}

// newStats returns stats with shards sized for concurrency callers.
func newStats(concurrency int) *stats {
	n := max(1, min(concurrency, 4*runtime.GOMAXPROCS(0)))
	s := &stats{shards: make([]tally, n)}
	for i := range s.shards {
		s.shards[i].hist = newHistogram()
		s.shards[i].status = make(map[int]int64)
		s.shards[i].errors = make(map[string]int64)
	}
	return s
}

// shard returns the tally for caller i.
func (s *stats) shard(i int64) *tally {
	return &s.shards[uint64(i)%uint64(len(s.shards))]
}

// response records a request answered with status after latency, with
// n body bytes read.
func (t *tally) response(status int, latency time.Duration, n int64) {
	us := min(max(int64(latency/time.Microsecond), 0), histMaxUS)
	t.mu.Lock()
	_ = t.hist.RecordValue(us) // in range by the clamp above
	t.completed++
	t.bytes += n
	t.sum += latency
	if t.completed == 1 || latency < t.min {
		t.min = latency
	}
	t.max = max(t.max, latency)
	t.status[status]++
	if status < 200 || status > 299 {
		t.non2xx++
	}
	t.mu.Unlock()
}

// unfinished records a request cancelled at the run's end at its age
// then, a lower bound of its latency, in the percentiles and the maximum
// (not in the mean, which is the responses'): a server that stalls at the
// end of a run must not have its stall left out (found by a tester: a
// stall past the drain showed a p99 of 1.5 ms).
func (t *tally) unfinished(age time.Duration) {
	us := min(max(int64(age/time.Microsecond), 0), histMaxUS)
	t.mu.Lock()
	_ = t.hist.RecordValue(us) // in range by the clamp above
	t.max = max(t.max, age)
	t.mu.Unlock()
}

// failure records a request that got no whole response.
func (t *tally) failure(key string) {
	t.mu.Lock()
	t.failed++
	addError(t.errors, key, 1)
	t.mu.Unlock()
}

// addError adds n to errs[key], or to errs[otherErrors] once errs holds
// maxErrorKinds other keys.
func addError(errs map[string]int64, key string, n int64) {
	if _, ok := errs[key]; !ok && len(errs) >= maxErrorKinds {
		key = otherErrors
	}
	errs[key] += n
}

// errorKey turns a request error into a short message that is the same for
// every occurrence of the same failure: without the URL, which every
// request shares, and without addresses and ports, which differ per
// connection and would make each error unique.
func errorKey(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by peer"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return "timeout"
	}
	var oerr *net.OpError
	if errors.As(err, &oerr) {
		return oerr.Op + " " + oerr.Net + ": " + innermost(oerr.Err).Error()
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err.Error()
	}
	return err.Error()
}

// innermost unwraps err to its last single-wrapped cause.
func innermost(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// merge folds every shard into r.
func (s *stats) merge(r *Result) {
	r.hist = newHistogram()
	r.StatusCodes = make(map[int]int64)
	r.Errors = make(map[string]int64)
	var sum time.Duration
	for i := range s.shards {
		t := &s.shards[i]
		t.mu.Lock()
		r.hist.Merge(t.hist)
		if t.completed > 0 && (r.Completed == 0 || t.min < r.Min) {
			r.Min = t.min
		}
		r.Completed += t.completed
		r.Failed += t.failed
		r.Non2xx += t.non2xx
		r.Bytes += t.bytes
		r.Max = max(r.Max, t.max)
		sum += t.sum
		for code, n := range t.status {
			r.StatusCodes[code] += n
		}
		for k, n := range t.errors {
			addError(r.Errors, k, n)
		}
		t.mu.Unlock()
	}
	if r.Completed > 0 {
		r.Mean = sum / time.Duration(r.Completed)
	}
}
