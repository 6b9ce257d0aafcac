package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
)

// HostConfig configures a Host.
type HostConfig struct {
	// Name begins the actors' ids, "<Name>#<i>". If empty, "replica".
	Name string
	// Factory builds each actor's handler from UserConfig.
	Factory    Factory
	UserConfig json.RawMessage
	// Replicas is how many actors the host runs, 1 to 65535.
	Replicas int
	// MaxOngoing is each actor's max_ongoing_requests, at least 1. The
	// actor enforces it: a request over it is refused (a full frame, which
	// the proxy returns as a *FullError and sends elsewhere).
	MaxOngoing int
	// GC holds the process's garbage-collector settings, which set_gc
	// retunes. If nil, the host keeps its own record of the settings in
	// force when it was built.
	GC *gctune.Tuner
	// MaxFrameSize is the largest frame body the host takes, at least
	// MinMaxFrameSize. If 0, DefaultMaxFrameSize.
	MaxFrameSize int
	// Log receives connection events, protocol errors and handler panics.
	// The zero Logger logs nothing.
	Log zerolog.Logger
}

// ErrHostClosed is what Host.Serve returns once Shutdown or Close has
// begun.
var ErrHostClosed = errors.New("replica: host closed")

// hostHandshakeTimeout bounds the wait for a new connection's hello.
const hostHandshakeTimeout = 10 * time.Second

// Limits on the payloads a connection keeps under refs: past them the
// proxy is misbehaving, and the connection is closed.
const (
	maxHostRefs     = 4096
	maxHostRefBytes = 256 << 20
)

// Host is a replica host: K in-process actors of one handler, served to
// proxies over the replica-host protocol (see host_wire.go) on any number
// of listeners. Each actor is a Local that enforces its own
// max_ongoing_requests against every proxy at once. Control calls reach
// the actors through the host's own Pool.
type Host struct {
	actors   []*Local
	ids      []string
	pool     *Pool
	gc       *gctune.Tuner
	maxFrame int
	hello    []byte // the host's hello frame, whole
	log      zerolog.Logger

	// mu guards the fields below.
	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*hostSession]struct{}
	closed    bool
	stop      chan struct{} // closed when closed is set

	wg sync.WaitGroup // the connections' goroutines
	// unanswered counts the requests an actor took whose answer is not
	// queued yet: Shutdown waits for it after the actors are idle, as a
	// handler frees its slot before it queues its answer.
	unanswered atomic.Int64
}

// goAwayLinger bounds how long Shutdown waits, once every request is
// answered, for the proxies to close their connections after its goaway.
const goAwayLinger = 2 * time.Second

// NewHost builds the host's actors, running. It fails if a setting is out
// of range or the factory fails (or panics).
func NewHost(cfg HostConfig) (h *Host, err error) {
	name := cfg.Name
	if name == "" {
		name = "replica"
	}
	switch {
	case cfg.Factory == nil:
		return nil, errors.New("replica host: no handler factory")
	case cfg.Replicas < 1 || cfg.Replicas > 0xffff:
		return nil, fmt.Errorf("replica host: replicas must be 1 to 65535, got %d", cfg.Replicas)
	case cfg.MaxOngoing < 1 || int64(cfg.MaxOngoing) > 0xffffffff:
		return nil, fmt.Errorf("replica host: max_ongoing_requests must be at least 1, got %d", cfg.MaxOngoing)
	case len(name) > 200:
		return nil, fmt.Errorf("replica host: the name %q is over 200 bytes", name[:20]+"...")
	case cfg.MaxFrameSize != 0 && cfg.MaxFrameSize < MinMaxFrameSize:
		return nil, fmt.Errorf("replica host: max frame size must be at least %d, got %d", MinMaxFrameSize, cfg.MaxFrameSize)
	}
	h = &Host{
		maxFrame:  cfg.MaxFrameSize,
		gc:        cfg.GC,
		log:       cfg.Log,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*hostSession]struct{}),
		stop:      make(chan struct{}),
	}
	if h.maxFrame == 0 {
		h.maxFrame = DefaultMaxFrameSize
	}
	if h.gc == nil {
		// With tuning off, Apply changes nothing: it records what is in
		// force, for set_gc to change.
		if h.gc, err = gctune.Apply(config.Env{}, nil); err != nil {
			return nil, err
		}
	}
	defer func() {
		if v := recover(); v != nil {
			h, err = nil, fmt.Errorf("replica host: the handler factory panicked: %v", v)
		}
	}()
	actors := make([]Actor, cfg.Replicas)
	for i := range cfg.Replicas {
		hd, err := cfg.Factory.build(cfg.UserConfig)
		if err != nil {
			return nil, fmt.Errorf("replica host: %w", err)
		}
		l := NewLocal(fmt.Sprintf("%s#%d", name, i), hd, cfg.MaxOngoing, nil)
		l.builtWith = cfg.UserConfig
		l.SetState(StateRunning)
		h.actors = append(h.actors, l)
		h.ids = append(h.ids, l.ID())
		actors[i] = l
	}
	h.pool = NewPool(actors...)

	b, at := startFrame(nil, frameHello, 0, 0)
	b = append(b, hostMagic...)
	b = binary.BigEndian.AppendUint16(b, hostProtocolVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(h.maxFrame))
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.actors)))
	for _, l := range h.actors {
		b = appendStr8(b, l.ID())
		b = binary.BigEndian.AppendUint32(b, uint32(l.MaxOngoing()))
	}
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-frameHeaderLen))
	h.hello = b
	return h, nil
}

// Actors returns the host's actors, in the order of its hello.
func (h *Host) Actors() []*Local { return h.actors }

// Serve accepts proxies' connections on l and serves them until l fails,
// or Shutdown or Close is called; it returns ErrHostClosed then. A host may
// serve several listeners at once.
func (h *Host) Serve(l net.Listener) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrHostClosed
	}
	h.listeners[l] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.listeners, l)
		h.mu.Unlock()
	}()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			h.mu.Lock()
			closed := h.closed
			h.mu.Unlock()
			if closed {
				return ErrHostClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors, say: wait, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			h.log.Warn().Err(err).Stringer("retry_in", delay).Msg("replica host: accept failed")
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-h.stop:
				t.Stop()
				return ErrHostClosed
			}
			continue
		}
		delay = 0
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			_ = nc.Close()
			return ErrHostClosed
		}
		h.wg.Add(1)
		h.mu.Unlock()
		go h.serveConn(nc)
	}
}

// Shutdown stops accepting connections, refuses new requests (as full: the
// proxies send them elsewhere), and sends each proxy a goaway, so that it
// sends nothing more and closes its connection once its requests are
// answered. It waits until the actors have finished the requests they
// hold and their answers are queued, and until the proxies have closed
// (for up to goAwayLinger; then it closes their connections once their
// last frames are written). If ctx ends first, it closes everything at
// once (see Close) and returns ctx's error.
func (h *Host) Shutdown(ctx context.Context) error {
	h.closeListeners()
	for _, l := range h.actors {
		l.SetState(StateDraining)
	}
	h.mu.Lock()
	for c := range h.conns {
		if c.goAway { // a proxy from before goaway would take it for a broken protocol
			_ = c.w.send(frameGoAway, 0, 0)
		}
	}
	h.mu.Unlock()
	var err error
	for _, r := range h.pool.Broadcast(ctx, Call{Method: MethodDrain}) {
		if r.Err != nil && err == nil {
			err = r.Err
		}
	}
	if werr := waitIdle(ctx, unansweredCount{h}); werr != nil && err == nil {
		err = werr
	}
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	linger := time.NewTimer(goAwayLinger)
	defer linger.Stop()
	select {
	case <-done:
		h.closeHandlers()
		return err
	case <-linger.C:
	case <-ctx.Done():
	}
	h.mu.Lock()
	for c := range h.conns {
		c.w.closeGracefully()
	}
	h.mu.Unlock()
	select {
	case <-done:
		h.closeHandlers()
		return err
	case <-ctx.Done():
	}
	h.Close()
	<-done
	return ctx.Err()
}

// unansweredCount is Host.unanswered as waitIdle reads it.
type unansweredCount struct{ h *Host }

func (u unansweredCount) Ongoing() int { return int(u.h.unanswered.Load()) }

// Close closes the listeners and every connection at once: requests in
// flight are cut (their handlers' contexts are cancelled) and the proxies
// see the host gone. It waits for the handlers to return.
func (h *Host) Close() error {
	h.closeListeners()
	for _, l := range h.actors {
		l.SetState(StateStopped)
	}
	h.mu.Lock()
	for c := range h.conns {
		c.w.fail(errConnClosed)
	}
	h.mu.Unlock()
	h.wg.Wait()
	h.closeHandlers()
	return nil
}

// closeHandlers closes the actors' handlers (see Local.Stop), once the
// requests are done or cut.
func (h *Host) closeHandlers() {
	for _, l := range h.actors {
		if err := l.Stop(context.Background()); err != nil {
			h.log.Warn().Str("replica", l.ID()).Err(err).Msg("replica host: closing a handler")
		}
	}
}

func (h *Host) closeListeners() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.stop)
	}
	for l := range h.listeners {
		_ = l.Close()
	}
}

// serveConn runs one proxy's connection until it ends.
func (h *Host) serveConn(nc net.Conn) {
	defer h.wg.Done()
	c, err := h.handshake(nc)
	switch {
	case errors.Is(err, io.EOF):
		// Closed before a byte was sent: a TCP health check (a
		// Kubernetes tcpSocket probe, a load balancer's), not a proxy.
		h.log.Debug().Str("peer", nc.RemoteAddr().String()).Msg("replica host: connection closed before its hello")
		_ = nc.Close()
		return
	case err != nil:
		h.log.Warn().Err(err).Str("peer", nc.RemoteAddr().String()).Msg("replica host: handshake failed; connection closed")
		_ = nc.Close()
		return
	}
	h.mu.Lock()
	if h.closed {
		// Shutdown or Close began during the handshake.
		h.mu.Unlock()
		_ = nc.Close()
		return
	}
	h.conns[c] = struct{}{}
	n := len(h.conns)
	h.mu.Unlock()
	go c.w.run()
	// At Info: an operator wants to see which proxies reach the host,
	// and when they leave (found by a tester: Debug only).
	h.log.Info().Str("peer", c.remote).Int("connections", n).Msg("replica host: proxy connected")

	err = c.readLoop()
	c.shut(err)
	c.handlers.Wait()
	<-c.w.done
	h.mu.Lock()
	delete(h.conns, c)
	n = len(h.conns)
	h.mu.Unlock()
	if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBadFrame) {
		h.log.Warn().Err(err).Str("peer", c.remote).Int("connections", n).Msg("replica host: protocol error; connection closed")
	} else {
		h.log.Info().Err(err).Str("peer", c.remote).Int("connections", n).Msg("replica host: proxy disconnected")
	}
}

// handshake reads the proxy's hello and answers with the host's.
func (h *Host) handshake(nc net.Conn) (*hostSession, error) {
	_ = nc.SetDeadline(time.Now().Add(hostHandshakeTimeout))
	fr := newFrameReader(nc, h.maxFrame)
	typ, _, _, body, err := fr.next()
	if err != nil {
		return nil, fmt.Errorf("reading the proxy's hello: %w", err)
	}
	r := newWireReader(body)
	magic := r.take(len(hostMagic))
	version := r.u16()
	peerMax := int(r.u32())
	var caps byte
	if r.ok && r.off < len(body) {
		caps = r.u8()
	}
	switch {
	case typ != frameHello || !r.ok || string(magic) != hostMagic:
		return nil, fmt.Errorf("%w: the first frame is not a serveproxy hello", ErrBadFrame)
	case version != hostProtocolVersion:
		return nil, fmt.Errorf("the proxy speaks replica host protocol version %d, this host %d", version, hostProtocolVersion)
	case peerMax < MinMaxFrameSize:
		return nil, fmt.Errorf("%w: the proxy's max frame size %d is below %d", ErrBadFrame, peerMax, MinMaxFrameSize)
	case len(h.hello)-frameHeaderLen > peerMax:
		return nil, fmt.Errorf("the host's hello (%d bytes) is over the proxy's max frame size %d", len(h.hello)-frameHeaderLen, peerMax)
	}
	if _, err := nc.Write(h.hello); err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return &hostSession{
		h:       h,
		nc:      nc,
		fr:      fr,
		w:       newFrameWriter(nc, peerMax),
		remote:  nc.RemoteAddr().String(),
		goAway:  caps&capGoAway != 0,
		streams: make(map[uint32]*hostStream),
		refs:    make(map[uint64][]byte),
	}, nil
}

// setGC applies a set_gc payload, the proxy's gctune.State as JSON, to
// this process. A limit the proxy resolved from a ratio is resolved again
// here, against this machine's memory: the proxy's bytes could be more
// than this host has, and a high GOGC would then have no bound.
func (h *Host) setGC(payload []byte) error {
	var st gctune.State
	if err := json.Unmarshal(payload, &st); err != nil {
		return fmt.Errorf("set_gc: %w", err)
	}
	percent := config.GCPercent(st.Percent)
	limit := config.MemoryLimit{Bytes: config.ByteSize(max(st.MemoryLimitBytes, 0))}
	switch r := st.MemoryLimitRatio; {
	case r > 0 && r <= 1:
		limit = config.MemoryLimit{Ratio: r}
	case r != 0:
		return fmt.Errorf("set_gc: memory_limit_ratio must be in (0, 1], got %v", r)
	}
	s, err := h.gc.Set(gctune.Update{Percent: &percent, MemoryLimit: &limit})
	if err != nil {
		return fmt.Errorf("set_gc: %w", err)
	}
	h.log.Info().Int("percent", s.Percent).Str("memory_limit", s.MemoryLimit).Msg("replica host: GC retuned by set_gc")
	return nil
}

// hostSession is one proxy's connection to the host.
type hostSession struct {
	h      *Host
	nc     net.Conn
	fr     *frameReader
	w      *frameWriter
	remote string
	goAway bool // the proxy takes goaway frames (its hello says so)

	// mu guards streams and closed.
	mu      sync.Mutex
	streams map[uint32]*hostStream // requests and calls running
	closed  bool

	// refs are the payloads kept for the proxy's Refs, by the
	// connection's ref id, and refBytes their size. Only the reader
	// goroutine uses them.
	refs     map[uint64][]byte
	refBytes int

	handlers sync.WaitGroup // request and control goroutines
}

// hostStream is a request or control call running on the host.
type hostStream struct {
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	body   *inbox  // a streamed request body; nil when it came whole
	win    *window // credit for the response's data, once it streams; set under hostSession.mu
}

// readLoop reads the proxy's frames until the connection ends.
func (c *hostSession) readLoop() error {
	for {
		typ, flags, id, body, err := c.fr.next()
		if err != nil {
			return err
		}
		switch typ {
		case frameRequest:
			err = c.onRequest(id, flags, body)
		case frameData:
			if s := c.stream(id); s != nil {
				if s.body == nil {
					return fmt.Errorf("%w: data for a request whose body came whole", ErrBadFrame)
				}
				err = s.body.put(body, flags&flagEnd != 0)
			}
		case frameCredit:
			if len(body) != 4 {
				return fmt.Errorf("%w: a credit frame of %d bytes", ErrBadFrame, len(body))
			}
			if s := c.stream(id); s != nil {
				c.mu.Lock()
				win := s.win
				c.mu.Unlock()
				if win != nil {
					err = win.add(int(binary.BigEndian.Uint32(body)))
				}
			}
		case frameCancel:
			if s := c.stream(id); s != nil {
				s.cancel()
			}
		case frameControl:
			err = c.onControl(id, flags, body)
		case frameFree:
			if len(body) != 8 {
				return fmt.Errorf("%w: a free frame of %d bytes", ErrBadFrame, len(body))
			}
			ref := binary.BigEndian.Uint64(body)
			c.refBytes -= len(c.refs[ref])
			delete(c.refs, ref)
		default:
			return fmt.Errorf("%w: a frame of type %d from a proxy", ErrBadFrame, typ)
		}
		if err != nil {
			return err
		}
	}
}

func (c *hostSession) stream(id uint32) *hostStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

// register adds s, unless the connection is over.
func (c *hostSession) register(s *hostStream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || s.id == 0 || c.streams[s.id] != nil {
		return false
	}
	c.streams[s.id] = s
	return true
}

// endStream removes s once it is done.
func (c *hostSession) endStream(s *hostStream) {
	c.mu.Lock()
	delete(c.streams, s.id)
	win := s.win
	c.mu.Unlock()
	s.cancel()
	if win != nil {
		win.close(context.Canceled)
	}
}

// shut ends every stream of a connection that is over.
func (c *hostSession) shut(err error) {
	if err == nil || errors.Is(err, io.EOF) {
		err = errConnClosed
	}
	c.w.fail(err)
	c.mu.Lock()
	c.closed = true
	streams := make([]*hostStream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		s.cancel()
		if s.body != nil {
			s.body.fail(err)
		}
		c.mu.Lock()
		win := s.win
		c.mu.Unlock()
		if win != nil {
			win.close(err)
		}
	}
}

// onControl takes a control frame: the call runs on its actors in a
// goroutine of its own.
func (c *hostSession) onControl(id uint32, flags byte, body []byte) error {
	timeout, method, ref, idx, payload, ok := parseControl(body)
	if !ok || id == 0 {
		return fmt.Errorf("%w: a control frame that does not parse", ErrBadFrame)
	}
	unknownRef := false
	switch {
	case ref == 0:
		payload = bytes.Clone(payload) // out of the read buffer
	case flags&flagPayload != 0:
		old := c.refs[ref]
		if len(c.refs) >= maxHostRefs && old == nil || c.refBytes-len(old)+len(payload) > maxHostRefBytes {
			return fmt.Errorf("%w: over %d payload refs or %d bytes kept; the proxy frees none", ErrBadFrame, maxHostRefs, maxHostRefBytes)
		}
		payload = bytes.Clone(payload)
		c.refs[ref] = payload
		c.refBytes += len(payload) - len(old)
	default:
		if len(payload) > 0 {
			return fmt.Errorf("%w: a control frame with a ref and bytes but no payload flag", ErrBadFrame)
		}
		var ok bool
		payload, ok = c.refs[ref]
		unknownRef = !ok
	}
	s := &hostStream{id: id}
	if timeout > 0 {
		s.ctx, s.cancel = context.WithTimeout(context.Background(), timeout)
	} else {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
	if !c.register(s) {
		s.cancel()
		return fmt.Errorf("%w: call id %d is in use", ErrBadFrame, id)
	}
	c.handlers.Add(1)
	go c.control(s, method, payload, idx, unknownRef)
	return nil
}

// parseControl reads a control frame's body; payload is in body.
func parseControl(body []byte) (timeout time.Duration, method string, ref uint64, idx []uint16, payload []byte, ok bool) {
	r := newWireReader(body)
	timeout = time.Duration(r.u32()) * time.Millisecond
	method = string(r.str8())
	ref = r.u64()
	n := int(r.u16())
	if !r.ok || len(body)-r.off < 2*n {
		return 0, "", 0, nil, nil, false
	}
	idx = make([]uint16, n)
	for i := range idx {
		idx[i] = r.u16()
	}
	payload = r.rest()
	return timeout, method, ref, idx, payload, r.ok
}

// control runs one control call on its actors and sends the result frame.
func (c *hostSession) control(s *hostStream, method string, payload []byte, idx []uint16, unknownRef bool) {
	defer c.handlers.Done()
	defer c.endStream(s)
	h := c.h
	results := make([]Result, len(idx))
	switch {
	case unknownRef:
		for i := range results {
			results[i].Err = fmt.Errorf("%w: the host has none under that id", ErrUnknownRef)
		}
	case method == MethodSetGC:
		err := h.setGC(payload) // once: it tunes the process, not an actor
		for i := range results {
			results[i].Err = err
		}
	default:
		ids := make([]string, 0, len(idx))
		at := make([]int, 0, len(idx))
		for i, x := range idx {
			if int(x) >= len(h.actors) {
				results[i].Err = fmt.Errorf("%w: the host has no actor %d", ErrUnknownActor, x)
				continue
			}
			ids = append(ids, h.ids[x])
			at = append(at, i)
		}
		if len(ids) > 0 {
			for k, r := range h.pool.Broadcast(s.ctx, Call{Method: method, Payload: payload}, ids...) {
				results[at[k]] = r
			}
		}
	}
	fw := c.w
	b, err := fw.lock()
	if err != nil {
		return
	}
	b, at := startFrame(b, frameResult, 0, s.id)
	b = binary.BigEndian.AppendUint16(b, uint16(len(results)))
	for _, r := range results {
		code := errorCode(r.Err)
		b = append(b, code)
		if code == codeOK {
			b = appendBytes32(b, r.Value)
		} else {
			b = appendBytes32(b, []byte(errorMessage(r.Err)))
		}
	}
	b, err = fw.finishFrame(b, at)
	fw.unlock(b)
	if err != nil {
		_ = c.sendError(s.id, fmt.Errorf("replica host: the answers to %s: %w", method, err))
	}
}
