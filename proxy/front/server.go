// Package front is the proxy's lean HTTP/1.1 server: what net/http's
// server does for a plain request, at less of its cost per request.
//
// Every request costs net/http's server a goroutine and a read in the
// background (to notice a client leaving), a cancellable context per
// connection and per request, and its general machinery; on a fast path
// (a replica answering "hi" in process, or over a kept-alive upstream
// connection) that is most of what the proxy spends. The lean path reads
// a plain request (HTTP/1.1, no body; see parseHead) into a buffer of its
// own, runs the handler on the connection's goroutine, watches for the
// client leaving only once the handler has run a while (watchAfter), and
// sends the answer in one write, framed as net/http frames it.
//
// Everything else goes to net/http: a connection whose request is not
// plain (a body, HTTP/1.0, Expect, Upgrade, a head over 4 KiB, anything
// malformed) is handed, with the bytes already read, to a net/http
// server with the same settings for the rest of its life. So the lean
// path never has to judge a request it does not fully understand.
package front

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves HTTP/1.1 on listeners, as an http.Server with the same
// fields would; the zero value serves nothing (set Handler).
type Server struct {
	// Handler answers every request.
	Handler http.Handler
	// ReadHeaderTimeout bounds the read of a request's head, from its
	// first byte.
	ReadHeaderTimeout time.Duration
	// IdleTimeout is how long a connection waits for its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's head (net/http answers 431 past
	// it); 0 is http.DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// ErrorLog, if not nil, gets what net/http's server would log
	// (handler panics, superfluous WriteHeader calls); else the log
	// package's standard logger.
	ErrorLog *log.Logger

	initOnce   sync.Once
	fallback   *http.Server
	handoff    *handoffListener
	inShutdown atomic.Bool

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.handoff = newHandoffListener()
		s.fallback = &http.Server{
			Handler:           s.Handler,
			ReadHeaderTimeout: s.ReadHeaderTimeout,
			IdleTimeout:       s.IdleTimeout,
			MaxHeaderBytes:    s.MaxHeaderBytes,
			ErrorLog:          s.ErrorLog,
			ConnState:         s.handoff.connState,
		}
		s.listeners = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
		go func() { _ = s.fallback.Serve(s.handoff) }()
	})
}

// Serve accepts connections on ln and serves them until Shutdown or
// Close, after which it returns http.ErrServerClosed; otherwise it
// returns the listener's error. It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	s.mu.Lock()
	if s.inShutdown.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return http.ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()
	ctx := context.WithValue(context.Background(), http.ServerContextKey, s.fallback)
	var tempDelay time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.shuttingDown() {
				return http.ErrServerClosed
			}
			//lint:ignore SA1019 as net/http's Serve: EMFILE and the like pass
			if ne, ok := err.(net.Error); ok && ne.Temporary() {
				tempDelay = min(max(2*tempDelay, 5*time.Millisecond), time.Second)
				s.logf("http: Accept error: %v; retrying in %v", err, tempDelay)
				time.Sleep(tempDelay)
				continue
			}
			return err
		}
		tempDelay = 0
		c := &conn{
			fresh:      true,
			s:          s,
			rwc:        rwc,
			remoteAddr: rwc.RemoteAddr().String(),
			baseCtx:    context.WithValue(ctx, http.LocalAddrContextKey, rwc.LocalAddr()),
		}
		c.since.Store(time.Now().Unix())
		if !s.track(c) {
			_ = rwc.Close()
			return http.ErrServerClosed
		}
		go c.serve()
	}
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inShutdown.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *conn) {
	c.state.Store(stateGone)
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) shuttingDown() bool { return s.inShutdown.Load() }

// Shutdown stops the server gracefully, as http.Server.Shutdown does: the
// listeners close, idle connections close, and it waits for the requests
// in flight to be answered (their connections then close), or for ctx.
// Connections handed to net/http are shut down after the server's own,
// which may still hand some over. Hijacked connections are not tracked.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	s.inShutdown.Store(true)
	lnErr := s.closeListeners()
	const maxPoll = 500 * time.Millisecond
	poll := time.Millisecond
	t := time.NewTimer(poll)
	defer t.Stop()
	for !s.closeIdleConns() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			poll = min(2*poll, maxPoll)
			t.Reset(poll)
		}
	}
	s.handoff.closeKeptAlive()
	if err := s.fallback.Shutdown(ctx); err != nil {
		return err
	}
	return lnErr
}

// Close closes the listeners and every connection at once, as
// http.Server.Close does.
func (s *Server) Close() error {
	s.init()
	s.inShutdown.Store(true)
	err := s.closeListeners()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.rwc.Close()
		delete(s.conns, c)
	}
	s.mu.Unlock()
	return errors.Join(err, s.fallback.Close())
}

func (s *Server) closeListeners() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for ln := range s.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closeIdleConns closes the connections waiting for a request (and new
// ones silent for 5 s, as net/http does), and reports whether none are
// left.
func (s *Server) closeIdleConns() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	quiescent := true
	old := time.Now().Unix() - 5
	for c := range s.conns {
		st := c.state.Load()
		if st == stateNew && c.since.Load() < old {
			st = stateIdle
		}
		if st != stateIdle {
			quiescent = false
			continue
		}
		_ = c.rwc.Close()
		delete(s.conns, c)
	}
	return quiescent
}

func (s *Server) logf(format string, args ...any) {
	if s.ErrorLog != nil {
		s.ErrorLog.Printf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// handoffListener is the net/http server's listener: the connections the
// lean path hands over.
type handoffListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	// keptAlive are the connections handed over after serving requests
	// that net/http has not begun a request on: net/http takes them for
	// new ones (which Shutdown closes only after 5 s), where they are
	// between requests, idle (see closeKeptAlive).
	mu        sync.Mutex
	given     map[net.Conn]bool // handed over, not yet seen by ConnState
	keptAlive map[net.Conn]struct{}
}

func newHandoffListener() *handoffListener {
	return &handoffListener{
		conns: make(chan net.Conn), done: make(chan struct{}),
		given: map[net.Conn]bool{}, keptAlive: map[net.Conn]struct{}{},
	}
}

// give hands c to net/http's server (kept says it served requests
// before); false if that server is closed (c is closed then).
func (h *handoffListener) give(c net.Conn, kept bool) bool {
	h.mu.Lock()
	h.given[c] = kept
	h.mu.Unlock()
	select {
	case h.conns <- c:
		return true
	case <-h.done:
		h.mu.Lock()
		delete(h.given, c)
		h.mu.Unlock()
		_ = c.Close()
		return false
	}
}

// connState is the net/http server's ConnState hook.
func (h *handoffListener) connState(c net.Conn, st http.ConnState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st == http.StateNew {
		if kept := h.given[c]; kept {
			h.keptAlive[c] = struct{}{}
		}
		delete(h.given, c)
		return
	}
	delete(h.keptAlive, c)
}

// closeKeptAlive closes the connections handed over between requests on
// which net/http has not begun one: idle, as net/http alone would have
// taken them (a head cut short, or a long one, at the shutdown).
func (h *handoffListener) closeKeptAlive() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.keptAlive {
		_ = c.Close()
		delete(h.keptAlive, c)
	}
}

// Accept implements net.Listener.
func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (h *handoffListener) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

// Addr implements net.Listener.
func (h *handoffListener) Addr() net.Addr { return handoffAddr{} }

type handoffAddr struct{}

func (handoffAddr) Network() string { return "handoff" }
func (handoffAddr) String() string  { return "handoff" }

// date caches the Date header's value, which changes once a second.
var date struct {
	mu   sync.Mutex
	unix int64
	val  []byte
}

// appendDate appends the current time in http.TimeFormat.
func appendDate(b []byte) []byte {
	now := time.Now()
	sec := now.Unix()
	date.mu.Lock()
	if date.unix != sec || date.val == nil {
		date.unix = sec
		date.val = now.UTC().AppendFormat(date.val[:0], http.TimeFormat)
	}
	b = append(b, date.val...)
	date.mu.Unlock()
	return b
}
