package proxycmd

import (
	"context"
	"errors"
	stdlog "log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// startingServer answers on the proxy's listeners while its deployments
// make their first starts, which can take as long as a replica process
// takes to be healthy: every request gets a 503 with Retry-After (a probe
// of /-/healthz a 503 saying why, as once serving), on a connection it
// closes after, so that the proxy proper takes the client's next one. The
// ports are bound before anything starts (a port in use fails the proxy
// before any replica process runs), and a client never waits on a port
// that does not answer.
type startingServer struct {
	lent    []*lentListener
	servers []*http.Server
	wg      sync.WaitGroup
	// answered counts the 503s, for a log line at handBack: the access
	// log and metrics begin with the proxy proper.
	answered atomic.Int64
}

// errHandedBack ends a startingServer's Serve once its listener is taken
// back.
var errHandedBack = errors.New("listener handed back to the proxy")

// lentListener is a listener a startingServer serves on and gives back
// open: Close does nothing, and Accept fails once it is taken back.
type lentListener struct {
	*net.TCPListener
	back atomic.Bool
}

func (l *lentListener) Accept() (net.Conn, error) {
	c, err := l.TCPListener.Accept()
	if err != nil && l.back.Load() {
		return nil, errHandedBack
	}
	return c, err
}

func (l *lentListener) Close() error { return nil } // the proxy's, and still open

// serveStarting answers the starting 503s on listeners (net.Listen's TCP
// listeners; any other is left alone) until handBack.
func serveStarting(log zerolog.Logger, readHeaderTimeout time.Duration, maxHeaderBytes int, listeners ...net.Listener) *startingServer {
	s := &startingServer{}
	errLog := stdlog.New(log.With().Str("component", "http").Logger(), "", 0)
	for i, l := range listeners {
		tl, ok := l.(*net.TCPListener)
		if !ok {
			continue
		}
		admin := i > 0 // the public listener first
		ll := &lentListener{TCPListener: tl}
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s.answered.Add(1)
				answerStarting(w, r, admin)
			}),
			ReadHeaderTimeout: readHeaderTimeout,
			MaxHeaderBytes:    maxHeaderBytes,
			ErrorLog:          errLog,
		}
		srv.SetKeepAlivesEnabled(false)
		s.lent, s.servers = append(s.lent, ll), append(s.servers, srv)
		s.wg.Go(func() { _ = srv.Serve(ll) })
	}
	return s
}

// answerStarting is every answer during the start: on the admin listener
// in JSON, as the admin API's errors are, but for /-/healthz.
func answerStarting(w http.ResponseWriter, r *http.Request, admin bool) {
	w.Header().Set("Retry-After", "1")
	if admin && r.URL.Path != "/-/healthz" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(startingJSON))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	msg := "The proxy is starting: its deployments are not running yet.\n"
	if r.URL.Path == "/-/healthz" {
		msg = "Replicas are not running yet.\n"
	}
	_, _ = w.Write([]byte(msg))
}

// startingJSON is the admin API's answer during the start.
const startingJSON = `{"error": "the proxy is starting: its deployments are not running yet; nothing was changed (try again once /-/healthz answers 200)"}` + "\n"

// handBack stops accepting and returns once the answers in flight are
// written (for up to a second; a connection that has not sent its request
// by then is closed, unanswered as it asked nothing), leaving the
// listeners open for the proxy proper. It returns how many requests were
// answered 503.
func (s *startingServer) handBack() int64 {
	for _, l := range s.lent {
		l.back.Store(true)
		_ = l.SetDeadline(time.Now()) // wakes the Accept
	}
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Go(func() {
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close()
			}
		})
	}
	wg.Wait()
	for _, l := range s.lent {
		_ = l.SetDeadline(time.Time{})
	}
	return s.answered.Load()
}
