package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// HostOptions configure a HostConn.
type HostOptions struct {
	// Conns is how many TCP connections to open to the host, 1 to 64;
	// requests are spread over them. If 0, 1: one connection carries
	// many requests at once, and fewer connections coalesce better.
	Conns int
	// OnRelease is called each time a slot of one of the host's replicas
	// is freed (the router uses it to wake a waiting request). If nil,
	// nothing is notified.
	OnRelease func()
	// Dial opens a connection. If nil, a net.Dialer's DialContext, with a
	// 5-second timeout for the dial and the handshake together.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxFrameSize is the largest frame body taken from the host, at least
	// MinMaxFrameSize. If 0, DefaultMaxFrameSize.
	MaxFrameSize int
	// ResponseHeaderTimeout, if not 0, is how long a request waits for the
	// host to begin its answer before it fails with a *TimeoutError (504).
	ResponseHeaderTimeout time.Duration
	// TrustedProxies and Via are as in UpstreamOptions: the peers whose
	// X-Forwarded-* headers are kept, and this proxy's Via pseudonym.
	TrustedProxies []netip.Prefix
	Via            string
	// Log receives connection losses and reconnections. The zero Logger
	// logs nothing.
	Log zerolog.Logger
	// OnReachability, if not nil, is called when the last connection to
	// the host is lost (up false) and when one is made again (up true),
	// from the goroutine that redials. The deployment takes the host's
	// actors out of routing at once, so that no request waits in the
	// queue for a host that is gone (503 when no replica is left), and
	// checks their health as soon as the host is back.
	OnReachability func(c *HostConn, up bool)
}

// Reconnection backoff, and the dial and handshake's default timeout.
const (
	reconnectMin    = 100 * time.Millisecond
	reconnectMax    = 2 * time.Second
	hostDialTimeout = 5 * time.Second
)

// HostConn is the proxy's connection to one replica host: a few TCP
// connections over which the requests of all the host's actors travel, and
// one Replica per actor. It is the host's HostBatcher: a Broadcast gives
// it one call for all of its actors, which it sends as one frame. When a
// connection is lost it is dialled again in the background, with backoff,
// until Close.
type HostConn struct {
	addr     string
	o        HostOptions
	maxFrame int
	via      viaEntries // PROXY_VIA's entries; the zero value for none

	replicas []*hostReplica // in the order of the first hello
	byID     map[string]*hostReplica
	links    []atomic.Pointer[hostLink] // nil or dead while down
	rr       atomic.Uint32              // round robin over links

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	maintain  sync.WaitGroup // the reconnecting goroutines
	wg        sync.WaitGroup // the connections' readers and writers
	closeOnce sync.Once
	stopped   atomic.Int32 // replicas stopped; the last one closes the HostConn
	// reachMu orders the OnReachability reports of several links; down
	// is what the last one said.
	reachMu sync.Mutex
	down    bool

	// changed is set once a reconnection's hello announced other actors.
	changed atomic.Bool

	// mu guards lastErr.
	mu      sync.Mutex
	lastErr error
}

var (
	_ HostBatcher = (*HostConn)(nil)
	_ refFreer    = (*HostConn)(nil)
)

// hostHello is what a host's hello says.
type hostHello struct {
	maxFrame int
	ids      []string
	limits   []int
}

// ConnectHost connects to the replica host at addr (host:port) and returns
// once every connection has said hello, with one replica per actor the
// host announced, in StateStarting. It fails if the host cannot be reached
// within ctx (and the dial timeout) or does not speak the protocol.
func ConnectHost(ctx context.Context, addr string, o HostOptions) (*HostConn, error) {
	switch {
	case o.Conns < 0 || o.Conns > 64:
		return nil, fmt.Errorf("replica host %s: conns must be 1 to 64, got %d", addr, o.Conns)
	case o.MaxFrameSize != 0 && o.MaxFrameSize < MinMaxFrameSize:
		return nil, fmt.Errorf("replica host %s: max frame size must be at least %d, got %d", addr, MinMaxFrameSize, o.MaxFrameSize)
	}
	for _, p := range o.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("replica host %s: an invalid trusted proxy prefix", addr)
		}
	}
	c := &HostConn{addr: addr, o: o, maxFrame: o.MaxFrameSize}
	if c.maxFrame == 0 {
		c.maxFrame = DefaultMaxFrameSize
	}
	if o.Via != "" {
		c.via = newViaEntries(o.Via)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.links = make([]atomic.Pointer[hostLink], max(o.Conns, 1))
	for i := range c.links {
		cc, hl, err := c.dial(ctx)
		if err != nil {
			c.Close()
			return nil, err
		}
		if i == 0 {
			c.byID = make(map[string]*hostReplica, len(hl.ids))
			for k, id := range hl.ids {
				r := &hostReplica{hc: c, k: k, hostID: id, id: addr + "/" + id}
				r.init(0, o.OnRelease) // the limit is the host's hello's, stored below
				c.replicas = append(c.replicas, r)
				c.byID[r.id] = r
			}
		}
		c.bind(cc, hl)
		c.links[i].Store(cc)
		c.start(cc)
	}
	for i := range c.links {
		c.maintain.Add(1)
		go c.reconnect(i)
	}
	return c, nil
}

// Addr returns the host's address.
func (c *HostConn) Addr() string { return c.addr }

// Host implements HostBatcher: the host's address, as its replicas' Host.
func (c *HostConn) Host() string { return c.addr }

// Replicas returns one replica per actor of the host, in the order of its
// hello.
func (c *HostConn) Replicas() []Replica {
	rs := make([]Replica, len(c.replicas))
	for i, r := range c.replicas {
		rs[i] = r
	}
	return rs
}

// Connected reports whether a connection to the host is up.
func (c *HostConn) Connected() bool {
	for i := range c.links {
		if cc := c.links[i].Load(); cc != nil && !cc.dead.Load() && !cc.away.Load() {
			return true
		}
	}
	return false
}

// LastError returns why the last connection to the host ended or could not
// be made, or nil.
func (c *HostConn) LastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

func (c *HostConn) setErr(err error) {
	c.mu.Lock()
	c.lastErr = err
	c.mu.Unlock()
}

// Close closes the connections and stops reconnecting: requests in flight
// fail with a *UnreachableError, and so do later ones. It waits for the
// connections' goroutines.
func (c *HostConn) Close() {
	c.closeOnce.Do(func() {
		c.cancel()
		c.maintain.Wait()
		for i := range c.links {
			if cc := c.links[i].Load(); cc != nil {
				cc.w.fail(errConnClosed)
			}
		}
		c.wg.Wait()
	})
}

// dial opens one connection and says hello.
func (c *HostConn) dial(ctx context.Context) (*hostLink, *hostHello, error) {
	ctx, cancel := context.WithTimeout(ctx, hostDialTimeout)
	defer cancel()
	dial := c.o.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", c.addr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// A bare "context deadline exceeded" would not say what
			// waited: a TLS dialer's handshake is part of the dial.
			return nil, nil, fmt.Errorf("replica host %s: no connection before the deadline (the TCP connect, and with TLS its handshake): %w", c.addr, err)
		}
		return nil, nil, fmt.Errorf("replica host %s: %w", c.addr, err)
	}
	// The handshake ends with ctx: a host that accepts and says nothing
	// cannot hold it.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	hl, fr, err := c.handshake(nc)
	if !stop() || err != nil {
		_ = nc.Close()
		if err == nil || ctx.Err() != nil {
			err = fmt.Errorf("replica host %s: handshake: %w", c.addr, context.Cause(ctx))
		}
		return nil, nil, err
	}
	cc := &hostLink{
		hc:      c,
		nc:      nc,
		fr:      fr,
		w:       newFrameWriter(nc, hl.maxFrame),
		streams: make(map[uint32]*linkStream),
		refs:    make(map[Ref]uint64),
		done:    make(chan struct{}),
	}
	return cc, hl, nil
}

// handshake sends the proxy's hello and reads the host's.
func (c *HostConn) handshake(nc net.Conn) (*hostHello, *frameReader, error) {
	b, at := startFrame(nil, frameHello, 0, 0)
	b = append(b, hostMagic...)
	b = binary.BigEndian.AppendUint16(b, hostProtocolVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(c.maxFrame))
	b = append(b, capGoAway) // hosts before it ignore the byte
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeaderLen))
	if _, err := nc.Write(b); err != nil {
		return nil, nil, fmt.Errorf("replica host %s: sending hello: %w", c.addr, err)
	}
	fr := newFrameReader(nc, c.maxFrame)
	typ, _, _, body, err := fr.next()
	if err != nil {
		return nil, nil, fmt.Errorf("replica host %s: reading its hello: %w", c.addr, err)
	}
	r := newWireReader(body)
	magic := r.take(len(hostMagic))
	version := r.u16()
	hl := &hostHello{maxFrame: int(r.u32())}
	n := int(r.u16())
	seen := make(map[string]bool, n)
	for range n {
		id := string(r.str8())
		limit := int(r.u32())
		if id == "" || seen[id] || limit < 1 {
			r.ok = false
		}
		seen[id] = true
		hl.ids = append(hl.ids, id)
		hl.limits = append(hl.limits, limit)
	}
	switch {
	case typ != frameHello || string(magic) != hostMagic:
		return nil, nil, fmt.Errorf("replica host %s: %w: the answer is not a serveproxy host's hello (is it a replica host?)", c.addr, ErrBadFrame)
	case version != hostProtocolVersion:
		return nil, nil, fmt.Errorf("replica host %s speaks protocol version %d, this proxy %d", c.addr, version, hostProtocolVersion)
	case !r.ok || r.off != len(body) || n == 0:
		return nil, nil, fmt.Errorf("replica host %s: %w: a hello that does not parse, or with no actors", c.addr, ErrBadFrame)
	case hl.maxFrame < MinMaxFrameSize:
		return nil, nil, fmt.Errorf("replica host %s: %w: its max frame size %d is below %d", c.addr, ErrBadFrame, hl.maxFrame, MinMaxFrameSize)
	}
	_ = nc.SetDeadline(time.Time{})
	return hl, fr, nil
}

// bind maps each replica to its actor's index in cc's hello, by id, and
// takes the limits the hello gives. An actor the host no longer has is
// unreachable on cc; one it has newly is not served (it has no replica).
func (c *HostConn) bind(cc *hostLink, hl *hostHello) {
	index := make(map[string]int, len(hl.ids))
	for i, id := range hl.ids {
		index[id] = i
	}
	cc.actors = make([]int32, len(c.replicas))
	missing := 0
	for k, r := range c.replicas {
		i, ok := index[r.hostID]
		if !ok {
			cc.actors[k] = -1
			missing++
			continue
		}
		cc.actors[k] = int32(i)
		r.max.Store(int64(hl.limits[i]))
	}
	if missing > 0 || len(hl.ids) > len(c.replicas) {
		// Restarted with another number of actors, say: the deployment
		// connects it anew (see ActorsChanged).
		c.changed.Store(true)
		c.o.Log.Warn().Str("host", c.addr).Int("actors", len(hl.ids)).Int("replicas", len(c.replicas)).Int("missing", missing).
			Msg("replica host has other actors than when first connected; it is to be connected anew")
	}
}

// ActorsChanged reports whether the host, reconnected, announced other
// actors than at the first connection: its replicas are to be replaced by
// those of a new connection.
func (c *HostConn) ActorsChanged() bool { return c.changed.Load() }

// start runs cc's reader and writer.
func (c *HostConn) start(cc *hostLink) {
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		cc.w.run()
	}()
	go func() {
		defer c.wg.Done()
		err := cc.readLoop()
		cc.shut(err)
	}()
}

// reconnect keeps link i up: when its connection ends, it dials again with
// backoff until it succeeds or Close is called.
func (c *HostConn) reconnect(i int) {
	defer c.maintain.Done()
	for {
		cc := c.links[i].Load()
		select {
		case <-cc.done:
		case <-c.ctx.Done():
			return
		}
		if c.ctx.Err() != nil {
			return // closed: no outage to report
		}
		err := cc.cause()
		msg := "replica host connection lost; reconnecting"
		lost := cc.lostInFlight()
		if lost > 0 {
			msg += " (what was in flight on it failed: a request not yet answered with 502, one being answered cut short)"
		}
		c.o.Log.Warn().Str("host", c.addr).Err(err).Int("in_flight", lost).Msg(msg)
		c.reportReachability()
		backoff := reconnectMin
		var told string // the redial error last logged at Warn
		for {
			t := time.NewTimer(backoff)
			select {
			case <-c.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, reconnectMax)
			ncc, hl, err := c.dial(c.ctx)
			if err != nil {
				c.setErr(err)
				// A new reason (a certificate refused after a renewal,
				// say, rather than the host still down) is worth a Warn;
				// the same one again, every retry, is not.
				ev := c.o.Log.Debug()
				if msg := err.Error(); msg != told {
					ev, told = c.o.Log.Warn(), msg
				}
				ev.Str("host", c.addr).Err(err).Stringer("retry_in", backoff).Msg("replica host still unreachable")
				continue
			}
			c.bind(ncc, hl)
			c.links[i].Store(ncc)
			c.start(ncc)
			c.o.Log.Info().Str("host", c.addr).Msg("replica host reconnected")
			c.reportReachability()
			break
		}
	}
}

// reportReachability tells OnReachability when the host went from some
// connection up to none, or back. The check and the report are one step
// under reachMu, so that links losing and regaining their connections at
// once cannot report out of order.
func (c *HostConn) reportReachability() {
	if c.o.OnReachability == nil {
		return
	}
	c.reachMu.Lock()
	defer c.reachMu.Unlock()
	up := c.Connected()
	if up != c.down {
		return // no change
	}
	c.down = !up
	c.o.OnReachability(c, up)
}

// pick returns a live connection on which the host has replica k's actor,
// and the actor's index there.
func (c *HostConn) pick(k int) (*hostLink, uint16, error) {
	n := len(c.links)
	i := 0
	if n > 1 {
		i = int(c.rr.Add(1))
	}
	gone := false
	for j := range n {
		cc := c.links[(i+j)%n].Load()
		if cc == nil || cc.dead.Load() || cc.away.Load() {
			continue
		}
		if x := cc.actors[k]; x >= 0 {
			return cc, uint16(x), nil
		}
		gone = true
	}
	if gone {
		return nil, 0, fmt.Errorf("the host %s no longer has actor %s", c.addr, c.replicas[k].hostID)
	}
	if err := c.LastError(); err != nil {
		return nil, 0, fmt.Errorf("no connection to the host %s: %w", c.addr, err)
	}
	return nil, 0, fmt.Errorf("no connection to the host %s", c.addr)
}

// BatchCall implements HostBatcher: one control frame for all the named
// replicas, answered by the host in one frame. MethodDrain is answered
// here, as for an Upstream: it drains this proxy's requests to the actors,
// not the actors themselves, which other proxies may use.
func (c *HostConn) BatchCall(ctx context.Context, method string, payload []byte, ref Ref, ids []string) []Result {
	out := make([]Result, len(ids))
	reps := make([]*hostReplica, 0, len(ids))
	at := make([]int, 0, len(ids))
	for i, id := range ids {
		out[i].Actor = id
		r := c.byID[id]
		if r == nil {
			out[i].Err = fmt.Errorf("%w: %q is not an actor of the host %s", ErrUnknownActor, id, c.addr)
			continue
		}
		reps = append(reps, r)
		at = append(at, i)
	}
	for k, r := range c.call(ctx, method, payload, ref, reps) {
		out[at[k]] = r
	}
	return out
}

// call runs one control call on reps, all of them c's.
func (c *HostConn) call(ctx context.Context, method string, payload []byte, ref Ref, reps []*hostReplica) []Result {
	out := make([]Result, len(reps))
	for k, r := range reps {
		out[k].Actor = r.id
	}
	if method == MethodDrain {
		for _, r := range reps {
			if r.State() != StateStopped {
				r.SetState(StateDraining)
			}
		}
		for k, r := range reps {
			out[k].Err = drain(ctx, r)
		}
		return out
	}
	cc, _, err := c.pick(reps[0].k)
	if cc == nil {
		// Any live connection will do for the others; not one whose host
		// sent goaway (a health check passed there would put actors that
		// cannot be reached back in routing).
		for i := range c.links {
			if l := c.links[i].Load(); l != nil && !l.dead.Load() && !l.away.Load() {
				cc = l
				break
			}
		}
	}
	if cc == nil {
		for k, r := range reps {
			out[k].Err = &UnreachableError{Replica: r.id, Err: err}
		}
		return out
	}
	idxs := make([]uint16, 0, len(reps))
	pos := make([]int, 0, len(reps))
	for k, r := range reps {
		x := cc.actors[r.k]
		if x < 0 {
			out[k].Err = &UnreachableError{Replica: r.id, Err: fmt.Errorf("the host %s no longer has actor %s", c.addr, r.hostID)}
			continue
		}
		idxs = append(idxs, uint16(x))
		pos = append(pos, k)
	}
	if len(idxs) == 0 {
		return out
	}
	answers, sent, err := cc.control(ctx, method, payload, ref, idxs)
	for j, k := range pos {
		r := reps[k]
		switch {
		case err == nil:
			out[k].Value, out[k].Err = answers[j].Value, answers[j].Err
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			out[k].Err = err
		case errors.Is(err, ErrFrameTooLarge) || errors.Is(err, errTooLong):
			out[k].Err = fmt.Errorf("replica %s: %w", r.id, err)
		default:
			out[k].Err = &UnreachableError{Replica: r.id, Sent: sent, Err: err}
		}
		if method == MethodStats && out[k].Err == nil {
			out[k].Value, out[k].Err = r.patchStats(out[k].Value)
		}
	}
	return out
}

// freeRef drops r's bytes at the host, on every connection that sent
// them.
func (c *HostConn) freeRef(r Ref) {
	for i := range c.links {
		if cc := c.links[i].Load(); cc != nil {
			cc.freeRef(r)
		}
	}
}

// hostLink is one TCP connection to a host.
type hostLink struct {
	hc     *HostConn
	nc     net.Conn
	fr     *frameReader
	w      *frameWriter
	actors []int32     // replica k's actor is actors[k] in this connection's hello; -1 if absent
	dead   atomic.Bool // set when the connection ends
	// away is set when the host sent goaway: nothing new goes on the
	// connection, which is closed once what is in flight is answered.
	away atomic.Bool

	// mu guards the fields below.
	mu      sync.Mutex
	streams map[uint32]*linkStream // requests and calls in flight
	nextID  uint32
	err     error // why the connection ended
	lost    int   // the streams in flight when it ended, failed with it

	done chan struct{} // closed when the connection has ended

	// refs are the Refs whose bytes this connection has carried, with
	// their ids here. They are guarded by w.mu, so that the frame that
	// carries a Ref's bytes is queued before any frame that names it.
	refs    map[Ref]uint64
	nextRef uint64
}

// linkStream is one request or control call in flight.
type linkStream struct {
	id   uint32
	gen  uint64        // the write its request frame went out in
	wake chan struct{} // head, err or bodyErr was set; capacity 1
	win  *window       // credit for a streamed request body; nil when it goes whole

	// mu guards the fields below.
	mu        sync.Mutex
	head      *[]byte   // the answer frame's body: response, full, error or result
	headType  frameType // 0 until it comes
	headFlags byte
	in        *inbox // a streamed response's data; set with head
	err       error  // the connection ended
	bodyErr   error  // reading the client's body failed
}

func (s *linkStream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// cause returns why the connection ended.
func (cc *hostLink) cause() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err
}

// lostInFlight returns how many requests and calls failed with the
// connection's end.
func (cc *hostLink) lostInFlight() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.lost
}

// register gives s an id and adds it, unless the connection has ended.
func (cc *hostLink) register(s *linkStream) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return false
	}
	for {
		cc.nextID++
		if cc.nextID != 0 && cc.streams[cc.nextID] == nil {
			break // 0 is the connection's; a wrapped id may be in use still
		}
	}
	s.id = cc.nextID
	cc.streams[s.id] = s
	return true
}

// unregister removes s: frames that come for it later are dropped.
func (cc *hostLink) unregister(s *linkStream) {
	cc.mu.Lock()
	delete(cc.streams, s.id)
	cc.mu.Unlock()
	if cc.away.Load() {
		cc.closeIfIdle()
	}
	if s.win != nil {
		s.win.close(context.Canceled)
	}
	s.mu.Lock()
	if s.head != nil {
		putBuf(s.head)
		s.head = nil
	}
	s.mu.Unlock()
}

func (cc *hostLink) stream(id uint32) *linkStream {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.streams[id]
}

// goAway takes the host's goaway: the host's actors leave routing (unless
// another connection serves them), and the connection closes once nothing
// is in flight on it.
func (cc *hostLink) goAway() {
	cc.away.Store(true)
	cc.hc.reportReachability()
	cc.closeIfIdle()
}

// closeIfIdle closes a connection the host sent goaway on once no request
// or call is in flight: register refuses new ones from then on.
func (cc *hostLink) closeIfIdle() {
	cc.mu.Lock()
	idle := len(cc.streams) == 0 && cc.err == nil
	if idle {
		cc.err = errHostGoingAway
	}
	cc.mu.Unlock()
	if idle {
		_ = cc.nc.Close() // readLoop ends, and shut gives errHostGoingAway as the cause
	}
}

// shut ends the connection with err and fails everything in flight on it.
func (cc *hostLink) shut(err error) {
	if err == nil || errors.Is(err, io.EOF) {
		err = errors.New("the host closed the connection")
	}
	if errors.Is(err, net.ErrClosed) {
		err = errConnClosed
	}
	cc.mu.Lock()
	if cc.err != nil {
		err = cc.err // closed on purpose (goAway): that is why
	}
	cc.err = err
	cc.mu.Unlock()
	cc.dead.Store(true)
	cc.w.fail(err)
	cc.hc.setErr(err)
	cc.mu.Lock()
	streams := cc.streams
	cc.streams = nil
	cc.lost = len(streams)
	cc.mu.Unlock()
	for _, s := range streams {
		s.mu.Lock()
		s.err = err
		in := s.in
		s.mu.Unlock()
		s.signal()
		if in != nil {
			in.fail(err)
		}
		if s.win != nil {
			s.win.close(err)
		}
	}
	if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBadFrame) {
		cc.hc.o.Log.Warn().Str("host", cc.hc.addr).Err(err).Msg("replica host protocol error; connection closed")
	}
	close(cc.done)
}

// readLoop reads the host's frames until the connection ends.
func (cc *hostLink) readLoop() error {
	for {
		typ, flags, id, body, err := cc.fr.next()
		if err != nil {
			return err
		}
		switch typ {
		case frameResponse, frameFull, frameError, frameResult:
			s := cc.stream(id)
			if s == nil {
				continue // given up on
			}
			if err := cc.setHead(s, typ, flags, body); err != nil {
				return err
			}
		case frameData:
			s := cc.stream(id)
			if s == nil {
				continue
			}
			s.mu.Lock()
			in := s.in
			s.mu.Unlock()
			if in == nil {
				return fmt.Errorf("%w: data for stream %d, which has no streamed response", ErrBadFrame, id)
			}
			if err := in.put(body, flags&flagEnd != 0); err != nil {
				return err
			}
		case frameCredit:
			if len(body) != 4 {
				return fmt.Errorf("%w: a credit frame of %d bytes", ErrBadFrame, len(body))
			}
			if s := cc.stream(id); s != nil && s.win != nil {
				if err := s.win.add(int(binary.BigEndian.Uint32(body))); err != nil {
					return err
				}
			}
		case frameGoAway:
			cc.goAway()
		default:
			return fmt.Errorf("%w: a frame of type %d from a host", ErrBadFrame, typ)
		}
	}
}

// setHead takes the first answer frame of s (a copy of its body). An error
// frame after a streamed response breaks the response off.
func (cc *hostLink) setHead(s *linkStream, typ frameType, flags byte, body []byte) error {
	s.mu.Lock()
	if s.headType != 0 {
		in := s.in
		s.mu.Unlock()
		if typ != frameError || in == nil {
			return fmt.Errorf("%w: a second answer for stream %d", ErrBadFrame, s.id)
		}
		in.fail(decodeErrorFrame(body))
		return nil
	}
	s.head, s.headType, s.headFlags = copyBuf(body), typ, flags
	if typ == frameResponse && flags&flagEnd == 0 {
		id := s.id
		s.in = newInbox(streamWindow, func(n int) { cc.w.sendCredit(id, n) })
		if s.bodyErr != nil {
			s.in.fail(s.bodyErr)
		}
	}
	s.mu.Unlock()
	s.signal()
	return nil
}

// decodeErrorFrame returns the error an error frame's body carries.
func decodeErrorFrame(body []byte) error {
	r := newWireReader(body)
	code := r.u8()
	msg := string(r.str16())
	if !r.ok {
		return fmt.Errorf("%w: an error frame that does not parse", ErrBadFrame)
	}
	return decodeError(code, msg)
}

// cancel tells the host that s is given up on.
func (cc *hostLink) cancel(s *linkStream) {
	_ = cc.w.send(frameCancel, 0, s.id)
}

// waitHead waits for s's answer frame, the connection's end, a body error,
// ctx's end or timeout, whichever is first.
func (s *linkStream) waitHead(ctx context.Context, timeout <-chan time.Time) (typ frameType, err error) {
	for {
		s.mu.Lock()
		typ, err, bodyErr := s.headType, s.err, s.bodyErr
		s.mu.Unlock()
		switch {
		case typ != 0:
			return typ, nil
		case bodyErr != nil:
			return 0, bodyErr
		case err != nil:
			return 0, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-timeout:
			return 0, errHeadTimeout
		}
	}
}

// controlTimeoutMS is the time a host is given for a control call whose
// caller waits left: less, by a tenth (at most a second), so that the
// answers of the actors that did answer (one hung actor among a host's
// healthy ones, in a health check) arrive before the caller gives up on
// them all. The host's answer is one frame, sent once every actor answered
// or its time is up.
func controlTimeoutMS(left time.Duration) uint32 {
	left -= min(left/10, time.Second)
	return uint32(max(min((left+time.Millisecond-1)/time.Millisecond, 1<<31), 1))
}

var errHeadTimeout = errors.New("the host did not begin its answer within ResponseHeaderTimeout (the config file's replica_timeout_s)")

// control sends one control call for the actors idxs and waits for its
// answers. sent reports, on error, whether the call may have reached the
// host.
func (cc *hostLink) control(ctx context.Context, method string, payload []byte, ref Ref, idxs []uint16) (_ []Result, sent bool, _ error) {
	if len(method) > 0xff {
		return nil, false, errTooLong
	}
	s := &linkStream{wake: make(chan struct{}, 1)}
	if !cc.register(s) {
		return nil, false, cc.cause()
	}
	defer cc.unregister(s)
	var timeoutMS uint32
	if dl, ok := ctx.Deadline(); ok {
		timeoutMS = controlTimeoutMS(time.Until(dl))
	}

	b, err := cc.w.lock()
	if err != nil {
		return nil, false, err
	}
	var refID uint64
	var flags byte
	carry := true
	if ref != (Ref{}) {
		id, ok := cc.refs[ref]
		if ok {
			refID, carry = id, false
		} else {
			cc.nextRef++
			refID = cc.nextRef
			flags = flagPayload
		}
	}
	b, at := startFrame(b, frameControl, flags, s.id)
	b = binary.BigEndian.AppendUint32(b, timeoutMS)
	b = appendStr8(b, method)
	b = binary.BigEndian.AppendUint64(b, refID)
	b = binary.BigEndian.AppendUint16(b, uint16(len(idxs)))
	for _, x := range idxs {
		b = binary.BigEndian.AppendUint16(b, x)
	}
	if carry {
		b = append(b, payload...)
	}
	b, err = cc.w.finishFrame(b, at)
	if err == nil && flags == flagPayload {
		cc.refs[ref] = refID
	}
	s.gen = cc.w.unlock(b)
	if err != nil {
		return nil, false, err
	}

	typ, err := s.waitHead(ctx, nil)
	if err != nil {
		if ctx.Err() != nil {
			cc.cancel(s)
		}
		return nil, cc.w.sent(s.gen), err
	}
	s.mu.Lock()
	head := *s.head
	s.mu.Unlock()
	switch typ {
	case frameResult:
	case frameError:
		return nil, true, decodeErrorFrame(head)
	default:
		return nil, true, fmt.Errorf("%w: a frame of type %d answering a control call", ErrBadFrame, typ)
	}
	r := newWireReader(head)
	n := int(r.u16())
	if n != len(idxs) {
		return nil, true, fmt.Errorf("%w: %d answers to a call for %d actors", ErrBadFrame, n, len(idxs))
	}
	out := make([]Result, n)
	for i := range out {
		code := r.u8()
		v := r.bytes32()
		if code == codeOK {
			out[i].Value = bytes.Clone(v)
		} else {
			out[i].Err = decodeError(code, string(v))
		}
	}
	if !r.ok {
		return nil, true, fmt.Errorf("%w: a result frame that does not parse", ErrBadFrame)
	}
	return out, true, nil
}

// freeRef sends a free frame for r if this connection carried it.
func (cc *hostLink) freeRef(r Ref) {
	b, err := cc.w.lock()
	if err != nil {
		return
	}
	if id, ok := cc.refs[r]; ok {
		delete(cc.refs, r)
		var at int
		b, at = startFrame(b, frameFree, 0, 0)
		b = binary.BigEndian.AppendUint64(b, id)
		b, _ = cc.w.finishFrame(b, at)
	}
	cc.w.unlock(b)
}
