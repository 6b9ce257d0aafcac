package loadtest

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DrainTimeout is how long requests still in flight when Config.Duration
// ends are given to finish (Config.Timeout if that is shorter). Those still
// running then are cancelled and counted in Result.Cancelled. Waiting a
// little keeps the slowest requests of an open-loop run in its latencies
// instead of silently losing them; bounding the wait keeps a hung server
// from stretching the run.
const DrainTimeout = 2 * time.Second

// dropKey is the Errors key of open-loop requests not sent on time.
const dropKey = "dropped: max in flight reached"

// Run sends cfg's load and returns what it measured. It returns an error
// without sending anything if cfg is invalid (see Config.Validate). If ctx
// ends first, requests in flight are cancelled, and Run returns promptly
// with what was measured so far and ctx's error. Every goroutine it starts
// has ended when it returns.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()

	l := &loop{cfg: cfg, header: cfg.Header.Clone()}
	if l.header == nil {
		l.header = http.Header{}
	}
	if h := l.header.Get("Host"); h != "" {
		l.host = h
		l.header.Del("Host")
	}
	tr := newTransport(cfg)
	defer tr.CloseIdleConnections()
	l.client = &http.Client{
		Transport: tr,
		Timeout:   cfg.Timeout,
		// Like ab and wrk: a redirect is a response, not a new request.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	workers := cfg.Concurrency
	if cfg.Rate > 0 {
		workers = cfg.MaxInFlight
	}
	l.stats = newStats(workers)

	// sendCtx ends sending (Duration or ctx); reqCtx ends the requests in
	// flight: with ctx at once, or DrainTimeout after Duration.
	sendCtx, cancelSend := context.WithCancel(ctx)
	if cfg.Duration > 0 {
		sendCtx, cancelSend = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancelSend()
	reqCtx, cancelReqs := context.WithCancel(ctx)
	defer cancelReqs()
	l.send, l.reqs = sendCtx, reqCtx

	finished := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { l.drain(ctx, finished, cancelReqs) })

	l.start = time.Now()
	if cfg.Progress != nil {
		bg.Go(func() { l.progress(finished) })
	}
	if cfg.Rate > 0 {
		l.openLoop()
	} else {
		l.closedLoop()
	}
	end := time.Now()
	close(finished)
	bg.Wait()

	res := &Result{
		URL: cfg.URL, Method: cfg.Method, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		KeepAlive: !cfg.DisableKeepAlives,
		Dropped:   l.dropped.Load(), Cancelled: l.cancelled.Load(),
		Elapsed: end.Sub(l.start),
	}
	l.stats.merge(res)
	res.finish()
	return res, ctx.Err()
}

// loop is one run's state, shared by its workers.
type loop struct {
	cfg    Config
	client *http.Client
	header http.Header // without Host
	host   string      // the Host header's value, if set
	stats  *stats

	start      time.Time
	send, reqs context.Context // see Run

	next      atomic.Int64 // closed loop: requests claimed
	done      atomic.Int64 // requests with an outcome, for the progress bar
	dropped   atomic.Int64
	cancelled atomic.Int64
}

// newTransport returns a transport for cfg: keep-alive unless disabled,
// idle connections enough for every worker, no proxy from the environment
// (the load goes exactly where the URL says), no compression (like ab).
func newTransport(cfg Config) *http.Transport {
	idle := cfg.Concurrency
	if cfg.Rate > 0 {
		idle = cfg.MaxInFlight
	}
	d := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		DisableKeepAlives:   cfg.DisableKeepAlives,
		DisableCompression:  true,
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
	}
}

// drain cancels the requests in flight once sending has stopped: at once if
// ctx is done, else after DrainTimeout (or Timeout) unless the run finishes
// first. It returns when the run finishes.
func (l *loop) drain(ctx context.Context, finished <-chan struct{}, cancel context.CancelFunc) {
	defer cancel()
	select {
	case <-finished:
		return
	case <-l.send.Done():
	}
	if ctx.Err() != nil {
		return
	}
	t := time.NewTimer(min(DrainTimeout, l.cfg.Timeout))
	defer t.Stop()
	select {
	case <-finished:
	case <-t.C:
	}
}

// closedLoop runs Concurrency workers until Requests are claimed or
// sending stops.
func (l *loop) closedLoop() {
	var wg sync.WaitGroup
	for w := range l.cfg.Concurrency {
		tally := l.stats.shard(int64(w))
		wg.Go(func() {
			for l.send.Err() == nil {
				if l.cfg.Requests > 0 && l.next.Add(1) > l.cfg.Requests {
					return
				}
				l.do(tally, time.Now())
			}
		})
	}
	wg.Wait()
}

// openLoop sends request i at start + i/Rate, each on its own goroutine,
// until Requests are sent or sending stops, then waits for those in flight.
func (l *loop) openLoop() {
	interval := float64(time.Second) / l.cfg.Rate
	slots := make(chan struct{}, l.cfg.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := int64(0); l.cfg.Requests == 0 || i < l.cfg.Requests; i++ {
		due := l.start.Add(time.Duration(float64(i) * interval))
		if l.cfg.Duration > 0 && due.Sub(l.start) >= l.cfg.Duration {
			return
		}
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-l.send.Done():
				return
			case <-timer.C:
			}
		} else if l.send.Err() != nil {
			return
		}
		tally := l.stats.shard(i)
		select {
		case slots <- struct{}{}:
			wg.Go(func() {
				defer func() { <-slots }()
				l.do(tally, due)
			})
		default:
			// Waiting for a slot would send late and measure from the
			// late send: the very skew the open loop exists to avoid.
			l.dropped.Add(1)
			tally.failure(dropKey)
			l.done.Add(1)
		}
	}
}

// do sends one request and records its outcome in t, its latency counted
// from from.
func (l *loop) do(t *tally, from time.Time) {
	defer l.done.Add(1)
	var body io.Reader
	if l.cfg.Body != nil {
		body = bytes.NewReader(l.cfg.Body)
	}
	req, err := http.NewRequestWithContext(l.reqs, l.cfg.Method, l.cfg.URL, body)
	if err != nil {
		t.failure(errorKey(err))
		return
	}
	// Shared read-only: the client never writes a non-nil request header.
	req.Header = l.header
	if l.host != "" {
		req.Host = l.host
	}
	resp, err := l.client.Do(req)
	if err != nil {
		l.failed(t, err, from)
		return
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		l.failed(t, err, from)
		return
	}
	t.response(resp.StatusCode, time.Since(from), n)
}

// failed records err in t, or, if the run cancelled the request, counts
// it as cancelled and records its age (see tally.unfinished).
func (l *loop) failed(t *tally, err error, from time.Time) {
	if l.reqs.Err() != nil {
		l.cancelled.Add(1)
		t.unfinished(time.Since(from))
		return
	}
	t.failure(errorKey(err))
}
