package replica

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// An upstream that stays down is kept out of routing, not replaced, so its
// health checks fail for as long as it is down: past the failures that
// take it out, they are logged once a failureLogEvery, not each period
// (found by exploratory test: 138k lines a day for one dead host). The
// line that it passed again still comes when it does.
func TestHealthFailuresLogBounded(t *testing.T) {
	leakCheck(t)
	var status atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	var checks atomic.Int32
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		checks.Add(1)
		w.WriteHeader(int(status.Load()))
	})
	logs := &syncBuffer{}
	d := upstreamDeployment(t, []string{backend.URL}, 10*time.Millisecond, time.Second, logs)

	eventually(t, "100 failed health checks", func() bool { return checks.Load() >= 100 })
	failed := func() int { return strings.Count(logs.String(), "replica failed its health check") }
	if n := failed(); n != unhealthyAfter {
		t.Errorf("%d failure lines for %d failed checks within a minute, want %d (those that took it out)",
			n, checks.Load(), unhealthyAfter)
	}
	if !strings.Contains(logs.String(), "replica unhealthy: out of routing") || d.Running() != 0 {
		t.Errorf("not out of routing (%d running): %s", d.Running(), logs.String())
	}
	// A minute on (the last line's time moved back), the next failure is
	// logged, with the count since the last line.
	d.mu.Lock()
	for r, l := range d.failLogged {
		l.at = l.at.Add(-failureLogEvery)
		d.failLogged[r] = l
	}
	d.mu.Unlock()
	eventually(t, "the failure line a minute on", func() bool { return failed() == unhealthyAfter+1 })
	var since struct {
		N int `json:"failures_since_last_log"`
	}
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "failures_since_last_log") {
			if err := json.Unmarshal([]byte(line), &since); err != nil {
				t.Fatal(err)
			}
		}
	}
	if since.N < 2 {
		t.Errorf("failures_since_last_log %d a minute on, want the count of the failures unlogged: %s", since.N, logs.String())
	}
	status.Store(http.StatusOK)
	eventually(t, "the line that it passed again", func() bool {
		return strings.Contains(logs.String(), "replica passed its health check again")
	})
	eventually(t, "the replica back in routing", func() bool { return d.Running() == 1 })
}

// SetHealthChecks changes the period and the timeout live, as Serve's
// light updates do: a deployment checked once an hour is checked at once
// every 20 ms, and Spec says so.
func TestSetHealthChecks(t *testing.T) {
	leakCheck(t)
	var checks atomic.Int32
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) { checks.Add(1) })
	d := upstreamDeployment(t, []string{backend.URL}, time.Hour, time.Second, nil)
	if err := d.SetHealthChecks(0, time.Second); err == nil {
		t.Error("SetHealthChecks took a period of 0")
	}
	before := checks.Load()
	if err := d.SetHealthChecks(20*time.Millisecond, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "checks every 20 ms", func() bool { return checks.Load() >= before+5 })
	if s := d.Spec(); s.HealthCheckPeriod != 20*time.Millisecond || s.HealthCheckTimeout != 2*time.Second {
		t.Errorf("Spec: period %v, timeout %v", s.HealthCheckPeriod, s.HealthCheckTimeout)
	}
}

// A target that fails its health check as it joins starts out of routing
// (an upstream is not dialled to join: it was healthy and routed until
// the first round, a period later), and comes in at the first check that
// passes; one that answers is in routing at once. Both at the start and
// for a target added later (a reload, DNS).
func TestJoiningTargetCheckedFirst(t *testing.T) {
	leakCheck(t)
	var downStatus atomic.Int32
	downStatus.Store(http.StatusServiceUnavailable)
	up := newBackend(t, func(w http.ResponseWriter, r *http.Request) {})
	down := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(downStatus.Load())) })
	logs := &syncBuffer{}
	d := upstreamDeployment(t, []string{up.URL, down.URL}, time.Hour, 5*time.Second, logs)
	if n := d.Running(); n != 1 {
		t.Fatalf("%d replicas in routing at the start, want 1 (the one that answered its check): %s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "replica failed its health check on joining") {
		t.Errorf("no line for the target that failed on joining: %s", logs.String())
	}

	// Added later, failing too.
	late := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(downStatus.Load())) })
	if err := d.SetTargets([]string{up.URL, down.URL, late.URL}); err != nil {
		t.Fatal(err)
	}
	if n := d.Running(); n != 1 {
		t.Fatalf("%d replicas in routing after a failing target joined, want 1", n)
	}

	downStatus.Store(http.StatusOK)
	d.CheckHealthNow()
	eventually(t, "both in routing once their check passes", func() bool { return d.Running() == 3 })
}

// A target that accepts and never answers its check holds a reload or a
// DNS refresh (the deployment's control lock) for joinCheckTimeout, not
// for a longer health_check_timeout_s, and joins out of routing.
func TestJoiningTargetThatHangsIsBounded(t *testing.T) {
	leakCheck(t)
	release := make(chan struct{})
	hang := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	logs := &syncBuffer{}
	d := upstreamDeployment(t, nil, time.Hour, time.Minute, logs)
	start := time.Now()
	if err := d.SetTargets([]string{hang.URL}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*joinCheckTimeout {
		t.Errorf("SetTargets took %v with a target that hangs, want about joinCheckTimeout (%v)", took, joinCheckTimeout)
	}
	if n := d.Running(); n != 0 {
		t.Errorf("%d in routing, want the target that did not answer out", n)
	}
	if !strings.Contains(logs.String(), "no answer to its health check on joining within 5s") {
		t.Errorf("the log does not say the check went unanswered: %s", logs.String())
	}
}

// A list replaced whole by one whose target fails its first check keeps
// the old replica serving, make before break, until the new one passes
// (a tester: the last working upstream was drained for one that refused
// connections, and every request got 503). An empty list still empties.
func TestReplacedListKeepsTheOldUntilTheNewServes(t *testing.T) {
	leakCheck(t)
	var newStatus atomic.Int32
	newStatus.Store(http.StatusServiceUnavailable)
	old := newBackend(t, func(w http.ResponseWriter, r *http.Request) {})
	dead := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	next := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(newStatus.Load())) })
	logs := &syncBuffer{}
	d := upstreamDeployment(t, []string{old.URL, dead.URL}, time.Hour, 5*time.Second, logs)
	if err := d.SetTargets([]string{next.URL}); err != nil {
		t.Fatal(err)
	}
	if got := routedTargets(d); !slices.Equal(got, []string{old.URL}) {
		t.Fatalf("in routing %v after the list was replaced by a target failing its check, want the old one kept", got)
	}
	if err := d.SetTargets([]string{next.URL}); err != nil { // a refresh, the new one still failing
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "kept serving until one of the list's is in routing"); n != 1 {
		t.Errorf("%d warnings for the replica kept over two lists, want 1 (the one out of routing is not kept)", n)
	}
	d.mu.Lock()
	n := len(d.replicas)
	d.mu.Unlock()
	if n != 2 { // old, kept; next, joining; not dead
		t.Errorf("%d replicas, want the old one kept and the new one, the one out of routing gone", n)
	}
	if n := d.Running(); n != 1 {
		t.Fatalf("%d in routing after a refresh, want the old one still", n)
	}
	newStatus.Store(http.StatusOK)
	d.CheckHealthNow()
	eventually(t, "the new one in, the old one out", func() bool { return slices.Equal(routedTargets(d), []string{next.URL}) })
	if err := d.SetTargets(nil); err != nil {
		t.Fatal(err)
	}
	if n := d.Running(); n != 0 {
		t.Errorf("%d in routing after an empty list, want none", n)
	}
}

// A replica whose check hangs until health_check_timeout_s holds up no
// other's checks: the others are counted as they answer, each period (a
// tester: one back from a restart waited 57 s, with a period of 3 s and
// a timeout of 30, beside one that hung).
func TestHungCheckHoldsUpNoOther(t *testing.T) {
	leakCheck(t)
	var hang atomic.Bool
	var bStatus atomic.Int32
	bStatus.Store(http.StatusOK)
	release := make(chan struct{})
	a := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	b := newBackend(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(bStatus.Load())) })
	t.Cleanup(func() { close(release) })
	d := upstreamDeployment(t, []string{a.URL, b.URL}, 50*time.Millisecond, time.Minute, nil)
	hang.Store(true)
	bStatus.Store(http.StatusServiceUnavailable)
	eventually(t, "b out of routing, its checks failing beside a's hung one", func() bool { return d.Running() == 1 })
	bStatus.Store(http.StatusOK)
	eventually(t, "b back in routing", func() bool { return d.Running() == 2 })
}

// upstreamDeployment starts a deployment of upstream replicas (one
// request at a time each) following targets, health-checked each period
// within timeout, logging to log if not nil, and stops it when the test
// ends.
func upstreamDeployment(t *testing.T, targets []string, period, timeout time.Duration, log io.Writer) *Deployment {
	t.Helper()
	hooks := Hooks{}
	if log != nil {
		hooks.Log = zerolog.New(log)
	}
	spec := DeploymentSpec{App: "app", Name: "dep", Targets: targets, MaxOngoingRequests: 1,
		HealthCheckPeriod: period, HealthCheckTimeout: timeout, GracefulShutdownTimeout: time.Second,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			r, err := NewUpstreamReplica(id, target, UpstreamOptions{MaxOngoing: 1, OnRelease: onRelease})
			return []Replica{r}, err
		}}
	d, err := NewDeployment(context.Background(), spec, hooks)
	if err != nil {
		t.Fatal(err)
	}
	d.Start()
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	return d
}

// The old replica kept while a replaced list's target could not be
// connected leaves once that target is connected by the health loop's
// retries, not only at a later list (found by review: a static list that
// never changed again kept it for good).
func TestKeptReplicaLeavesWhenTheNewTargetConnectsLater(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	d := startDeployment(t, DeploymentSpec{Targets: []string{"old"}, HealthCheckPeriod: 20 * time.Millisecond,
		Connect: func(_ context.Context, id, target string, onRelease func()) ([]Replica, error) {
			if target == "next" && refuse.Load() {
				return nil, errors.New("connection refused")
			}
			return []Replica{NewLocal(id, handlerFunc(func(http.ResponseWriter, *http.Request) {}), 1, onRelease)}, nil
		}})
	if err := d.SetTargets([]string{"next"}); err == nil {
		t.Fatal("SetTargets: no error for a target that refused")
	}
	if got := routedTargets(d); !slices.Equal(got, []string{"old"}) {
		t.Fatalf("in routing %v, want the old one kept", got)
	}
	refuse.Store(false)
	eventually(t, "the new target in, the old one out", func() bool { return slices.Equal(routedTargets(d), []string{"next"}) })
}

// routedTargets returns the targets of d's replicas in routing.
func routedTargets(d *Deployment) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ts []string
	for _, r := range d.replicas {
		if d.routableLocked(r) {
			ts = append(ts, d.targets[r])
		}
	}
	return ts
}
