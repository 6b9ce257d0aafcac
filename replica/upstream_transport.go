package replica

import (
	"net"
	"net/http"
	"time"
)

// The defaults of TransportOptions.
const (
	DefaultDialTimeout     = 5 * time.Second
	DefaultIdleConnTimeout = 90 * time.Second
	// tcpKeepAlive finds a replica's machine gone while its connection idles.
	tcpKeepAlive = 30 * time.Second
)

// TransportOptions tune the connection pool that the upstream replicas of
// one deployment share.
type TransportOptions struct {
	// MaxConnsPerReplica bounds the connections to each replica, busy and
	// idle: its max_ongoing_requests, since the proxy never has more
	// requests than that in flight to one replica. If 0, there is no bound.
	MaxConnsPerReplica int
	// DialTimeout bounds connecting to a replica; a replica that does not
	// accept in time is unreachable (502, tried elsewhere). If 0,
	// DefaultDialTimeout is used.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a replica's response
	// headers once the request is written; a replica that takes longer
	// fails the request with a *TimeoutError (504). If 0, there is no
	// bound, as Serve has no default request timeout: the proxy's own
	// request timeout (408) and the client's patience apply.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout is how long an idle keep-alive connection is kept. If
	// 0, DefaultIdleConnTimeout is used.
	IdleConnTimeout time.Duration
}

// NewTransport returns a net/http HTTP/1.1 transport for Upstream replicas
// (the health checks' transport, and forwarding where net/http's own is
// wanted; NewUpstreamClient is the cheaper default for forwarding):
// keep-alive connections sized to the replicas' limits, no proxy from the
// environment, no transparent compression (the proxy passes bytes through
// as the replica sent them), and the dial and response-header timeouts of
// o. Close its idle connections (CloseIdleConnections) when the deployment
// stops.
func NewTransport(o TransportOptions) *http.Transport {
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = DefaultIdleConnTimeout
	}
	d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: tcpKeepAlive}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	idle := o.MaxConnsPerReplica
	if idle <= 0 {
		idle = 64
	}
	return &http.Transport{
		Proxy:       nil, // never HTTP_PROXY: replicas are reached directly
		DialContext: d.DialContext,
		Protocols:   protocols,
		// A replica's connections are its own: the total is bounded per
		// replica, not across them, so that many replicas do not evict one
		// another's idle connections.
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   idle,
		MaxConnsPerHost:       o.MaxConnsPerReplica,
		IdleConnTimeout:       o.IdleConnTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		TLSHandshakeTimeout:   o.DialTimeout,
	}
}
