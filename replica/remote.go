package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Stopper is a replica with something to free once it is drained: a
// connection pool, a process. The controller calls Stop after the drain.
type Stopper interface {
	// Stop frees the replica's resources, within ctx.
	Stop(ctx context.Context) error
}

// exiter is a replica that can end on its own (a process): the controller
// replaces it as soon as Exited is closed, without waiting for health
// checks.
type exiter interface {
	Exited() <-chan struct{}
}

// upstreamReplica is an Upstream as a deployment controller manages it:
// it answers the control calls for the HTTP server behind it.
type upstreamReplica struct{ *Upstream }

var (
	_ Replica       = (*upstreamReplica)(nil)
	_ Stopper       = (*upstreamReplica)(nil)
	_ AnswerBatcher = (*upstreamReplica)(nil)
)

// NewUpstreamReplica returns a replica, in StateStarting, that forwards to
// the HTTP server at baseURL (handler upstream).
func NewUpstreamReplica(id, baseURL string, o UpstreamOptions) (Replica, error) {
	u, err := NewUpstream(id, baseURL, o)
	if err != nil {
		return nil, err
	}
	return &upstreamReplica{u}, nil
}

// Host implements Actor: "", since an HTTP server takes no batched control
// calls; each is called on its own.
func (u *upstreamReplica) Host() string { return "" }

// Call implements Actor: check_health GETs the health path; stats and
// drain are answered by the proxy, which holds the replica's slots; an
// HTTP server has no reconfigure call, and tunes its own GC.
func (u *upstreamReplica) Call(ctx context.Context, method string, _ []byte) ([]byte, error) {
	switch method {
	case MethodCheckHealth:
		return nil, u.CheckHealth(ctx)
	case MethodReconfigure:
		return nil, ErrNotReconfigurable
	case MethodStats:
		return json.Marshal(statsOf(u))
	case MethodDrain:
		return nil, drain(ctx, u)
	case MethodSetGC:
		return nil, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownMethod, method)
}

// Stop implements Stopper: it closes the idle connections.
func (u *upstreamReplica) Stop(context.Context) error {
	u.Close()
	return nil
}

// commandReplica is a process the proxy started and forwards to.
type commandReplica struct {
	upstreamReplica
	proc      *Process
	grace     atomic.Int64 // between SIGTERM and SIGKILL; see SetGrace
	healthyAt time.Time    // when its first health check passed
}

// SetGrace implements graceSetter: the wait between SIGTERM and SIGKILL
// when it is stopped.
func (c *commandReplica) SetGrace(grace time.Duration) { c.grace.Store(int64(grace)) }

var (
	_ Replica       = (*commandReplica)(nil)
	_ Stopper       = (*commandReplica)(nil)
	_ exiter        = (*commandReplica)(nil)
	_ AnswerBatcher = (*commandReplica)(nil)
)

// healthPoll is how often a starting process is asked whether it serves.
const healthPoll = 50 * time.Millisecond

// StartCommandReplica starts a replica process (handler command) and
// returns once it answers its health check, as a replica in StateStarting.
// It fails, leaving no process behind, if the process exits first or ctx
// ends first. Stopping the replica sends SIGTERM, and SIGKILL after grace.
func StartCommandReplica(ctx context.Context, id string, po ProcessOptions, uo UpstreamOptions, grace time.Duration) (Replica, error) {
	p, err := StartProcess(id, po)
	if err != nil {
		return nil, err
	}
	u, err := NewUpstream(id, p.URL(), uo)
	if err != nil {
		_ = p.Stop(context.Background(), 0)
		return nil, err
	}
	r := &commandReplica{upstreamReplica: upstreamReplica{u}, proc: p}
	r.grace.Store(int64(grace))
	t := time.NewTicker(healthPoll)
	defer t.Stop()
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := u.CheckHealth(cctx)
		cancel()
		if err == nil {
			r.healthyAt = time.Now()
			return r, nil
		}
		// A check the start's own deadline cut short says less than the
		// one before it (a 500, say): that one is kept for the error.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-p.Done():
			u.Close()
			return nil, fmt.Errorf("replica process %s (pid %d) exited before it was healthy: %v", id, p.Pid(), exitText(p.ExitError()))
		case <-ctx.Done():
			_ = r.Stop(context.Background())
			return nil, fmt.Errorf("replica process %s (pid %d) not healthy in time: %w (last check: %v)", id, p.Pid(), ctx.Err(), last)
		case <-t.C:
		}
	}
}

// exitText says how a process exited.
func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Exited implements exiter.
func (c *commandReplica) Exited() <-chan struct{} { return c.proc.Done() }

// Stop implements Stopper: SIGTERM, then SIGKILL after the grace period.
func (c *commandReplica) Stop(ctx context.Context) error {
	c.Close()
	select {
	case <-c.proc.Done():
		return nil // it exited on its own, which was logged then
	default:
	}
	err := c.proc.Stop(ctx, time.Duration(c.grace.Load()))
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// exitError returns how the replica's process exited, once it has.
func (c *commandReplica) exitError() error { return c.proc.ExitError() }
