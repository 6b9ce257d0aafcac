package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// The defaults of DiscoveryOptions.
const (
	DefaultDiscoveryInterval = 10 * time.Second
	DefaultDiscoveryTimeout  = 5 * time.Second
)

// DiscoveryOptions configure a Discovery.
type DiscoveryOptions struct {
	// Interval is how often the name is resolved again. If 0,
	// DefaultDiscoveryInterval is used.
	Interval time.Duration
	// Timeout bounds one resolution, every lookup it makes included. If 0,
	// DefaultDiscoveryTimeout is used.
	Timeout time.Duration
	// Server is the DNS server to ask, as host:port (":53" if the port is
	// left out). If empty, the servers of /etc/resolv.conf are asked, with
	// its search domains: write names in full, with a final dot, to skip
	// them.
	Server string
	// Scheme is the scheme of the replica URLs, "http" or "https". If
	// empty, "http".
	Scheme string
	// HostPort makes the answers host:port addresses instead of URLs:
	// replica hosts, which are dialled, not fetched. Scheme is unused
	// then.
	HostPort bool
	// OnChange is given the replicas' base URLs (or addresses), sorted,
	// after the first resolution that succeeds and after each one whose
	// answer differs from the last. An empty set is an answer: every
	// replica is gone. The slice is the callee's. It runs on Run's
	// goroutine, so the next resolution waits for it. If it returns an
	// error (a replica it could not connect to), it is given the next
	// answer too, the same or not, to try again. It is required.
	OnChange func(urls []string) error
	// OnError is told of each failed resolution (the last set stays in
	// force), and told nil at the first answer after failures. If nil,
	// failures are only logged.
	OnError func(error)
	// Log receives failed resolutions. The zero Logger logs nothing.
	Log zerolog.Logger
}

// Discovery finds a deployment's replicas in DNS, so that a Kubernetes
// headless Service or Consul gives the replica set (issue 5). Two forms of
// target are understood:
//
//	dns://name:port          the A and AAAA records of name, each at port
//	dns+srv://_svc._tcp.name the SRV records of the name, each target's
//	                         A and AAAA records at the record's port
//
// The name is asked again every Interval, whatever the records' TTLs (Go's
// resolver keeps no cache, so each round reaches the server). SRV
// priorities and weights are ignored: every target is a replica, and the
// router balances by load. A name with A records gives those alone, and
// one with AAAA records only gives those: in a dual-stack cluster both
// families name the same pods. A name that does not exist or has no
// records (NXDOMAIN, or no data) is an answer, the empty set, which the
// deployment serves as 503 "No replicas are available"; any other failure
// (timeout, refused, SERVFAIL) keeps the last set, since a DNS outage is no
// reason to drop healthy replicas.
type Discovery struct {
	target   string
	srv      bool
	name     string
	port     uint16
	scheme   string
	interval time.Duration
	timeout  time.Duration
	resolver *net.Resolver
	server   string // the DNS server asked, for errors; "" for the system's
	opts     DiscoveryOptions
}

// NewDiscovery checks target and returns a Discovery for it; Run starts it.
func NewDiscovery(target string, o DiscoveryOptions) (*Discovery, error) {
	d := &Discovery{target: target, scheme: o.Scheme, interval: o.Interval, timeout: o.Timeout, opts: o}
	if err := d.parse(target); err != nil {
		return nil, err
	}
	switch {
	case o.OnChange == nil:
		return nil, fmt.Errorf("discovery %q: no OnChange", target)
	case d.scheme == "":
		d.scheme = "http"
	case d.scheme != "http" && d.scheme != "https":
		return nil, fmt.Errorf("discovery %q: the scheme must be http or https, not %q", target, d.scheme)
	}
	if d.interval <= 0 {
		d.interval = DefaultDiscoveryInterval
	}
	if d.timeout <= 0 {
		d.timeout = DefaultDiscoveryTimeout
	}
	// The Go resolver in both cases, so that "no such name" reads the same
	// whichever answers.
	//
	// Each exchange is bounded by the timeout: the resolver keeps a lookup
	// whose caller gave up running until the system's own timeout (5 s,
	// twice), goroutines and sockets that a slow DNS server would pile up
	// at every interval.
	server := ""
	if o.Server != "" {
		server = o.Server
		if _, _, err := net.SplitHostPort(server); err != nil {
			server = net.JoinHostPort(server, "53")
		}
		if _, port, err := net.SplitHostPort(server); err != nil || port == "" {
			return nil, fmt.Errorf("discovery %q: bad DNS server %q", target, o.Server)
		}
		d.server = server
	}
	timeout := d.timeout
	d.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if server != "" {
			addr = server
		}
		var dialer net.Dialer
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// The resolver sets its own deadline (the system's 5 s) after
		// dialing: the bound must hold over it. Nor does it watch ctx
		// while it waits for the answer: a lookup cancelled (Run's end)
		// ends at once only if the deadline comes then.
		b := &dnsBound{limit: time.Now().Add(timeout)}
		b.stop = context.AfterFunc(ctx, func() {
			b.cancelled.Store(true)
			_ = c.SetDeadline(time.Now())
		})
		if u, ok := c.(*net.UDPConn); ok {
			return &boundedUDPConn{u, b}, nil // still a PacketConn: the resolver frames by that
		}
		return &boundedConn{c, b}, nil
	}}
	return d, nil
}

func (d *Discovery) parse(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("discovery %q: %w", target, err)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return fmt.Errorf("discovery %q: only a name (and a port for dns://) may be given", target)
	}
	d.name = u.Hostname()
	if d.name == "" {
		return fmt.Errorf("discovery %q: no name", target)
	}
	switch u.Scheme {
	case "dns":
		p := u.Port()
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("discovery %q: dns:// needs a port from 1 to 65535 (dns://name:port)", target)
		}
		d.port = uint16(n)
	case "dns+srv":
		if u.Port() != "" {
			return fmt.Errorf("discovery %q: the SRV records give the ports; leave the port out", target)
		}
		d.srv = true
	default:
		return fmt.Errorf("discovery %q: the scheme must be dns:// (A/AAAA) or dns+srv:// (SRV)", target)
	}
	return nil
}

// Target returns the discovery target as given.
func (d *Discovery) Target() string { return d.target }

// Resolve looks the target up once and returns the replicas' base URLs
// (or addresses, with HostPort), sorted and without duplicates; an empty set means the name has no
// replicas. ctx bounds it.
func (d *Discovery) Resolve(ctx context.Context) ([]string, error) {
	urls, _, err := d.resolve(ctx)
	return urls, err
}

// resolve is Resolve, with the SRV answer's targets that have no address
// (a name that does not exist, or has no A or AAAA records).
func (d *Discovery) resolve(ctx context.Context) (urls, unresolved []string, err error) {
	urls = []string{}
	if !d.srv {
		ips, err := d.lookupIP(ctx, d.name)
		if err != nil {
			return nil, nil, d.error(err)
		}
		for _, ip := range ips {
			urls = append(urls, d.url(ip, d.port))
		}
	} else {
		_, records, err := d.resolver.LookupSRV(ctx, "", "", d.name)
		err = d.ownServer(err)
		if err != nil && !isNotFound(err) {
			return nil, nil, d.error(err)
		}
		for _, rec := range records {
			if rec.Port == 0 || rec.Target == "." {
				continue // "no service here"
			}
			ips, err := d.lookupIP(ctx, rec.Target)
			if err != nil {
				return nil, nil, d.error(fmt.Errorf("SRV target %s: %w", rec.Target, err))
			}
			if len(ips) == 0 {
				unresolved = append(unresolved, rec.Target)
			}
			for _, ip := range ips {
				urls = append(urls, d.url(ip, rec.Port))
			}
		}
	}
	slices.Sort(urls)
	return slices.Compact(urls), unresolved, nil
}

// lookupIP returns host's addresses of one family: the IPv4 ones if it has
// any, else the IPv6 ones. In a dual-stack cluster a name's A and AAAA
// records are the same pods, which must not count twice (each would be
// given its own max_ongoing_requests). None, without error, when the name
// does not exist or has no address records.
func (d *Discovery) lookupIP(ctx context.Context, host string) ([]netip.Addr, error) {
	ips, err := d.resolver.LookupNetIP(ctx, "ip", host)
	err = d.ownServer(err)
	if isNotFound(err) {
		return nil, nil
	}
	for i, ip := range ips {
		ips[i] = ip.Unmap()
	}
	if slices.ContainsFunc(ips, netip.Addr.Is4) {
		ips = slices.DeleteFunc(ips, netip.Addr.Is6)
	}
	return ips, err
}

// url is the replica at ip and port, as OnChange is given it.
func (d *Discovery) url(ip netip.Addr, port uint16) string {
	if d.opts.HostPort {
		return netip.AddrPortFrom(ip, port).String()
	}
	return d.scheme + "://" + netip.AddrPortFrom(ip, port).String()
}

// ownServer takes the system's DNS server out of a lookup's error, as it
// comes and before anything wraps it (a wrapping keeps the text it had):
// with a server of its own, Go's resolver still names the system's (a
// tester read "on 10.255.255.53:53" and looked there). error names the
// server asked.
func (d *Discovery) ownServer(err error) error {
	if de, ok := errors.AsType[*net.DNSError](err); ok && d.server != "" {
		de.Server = ""
	}
	return err
}

// error names the target and the server asked.
func (d *Discovery) error(err error) error {
	if d.server != "" {
		return fmt.Errorf("discovery %s (DNS server %s): %w", d.target, d.server, err)
	}
	return fmt.Errorf("discovery %s: %w", d.target, err)
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// SetOnError sets DiscoveryOptions.OnError: for a caller that has what
// it reports to only once the discovery is built. Call it before Run.
func (d *Discovery) SetOnError(f func(error)) { d.opts.OnError = f }

// Run resolves the target at once and then every Interval, telling
// OnChange of each new set, until ctx is done; it returns then, having
// started nothing that outlives it. A failed resolution is logged and
// given to OnError, and changes nothing; so does an answer like the last,
// unless OnChange failed on that one.
func (d *Discovery) Run(ctx context.Context) {
	t := time.NewTicker(d.interval)
	defer t.Stop()
	var last []string
	known, retry := false, false
	// Failures are logged when they begin, and then once a
	// failureLogEvery with their count, not at every try.
	var failures int
	var failLoggedAt time.Time
	for {
		rctx, cancel := context.WithTimeout(ctx, d.timeout)
		urls, unresolved, err := d.resolve(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil && failures > 0 {
			d.opts.Log.Info().Str("discovery", d.target).Int("failures", failures).Msg("DNS discovery answers again")
			failures = 0
			if d.opts.OnError != nil {
				d.opts.OnError(nil)
			}
		}
		switch {
		case err != nil:
			failures++
			if failures == 1 || time.Since(failLoggedAt) >= failureLogEvery {
				d.opts.Log.Warn().Err(err).Str("discovery", d.target).Int("targets_kept", len(last)).
					Int("failures", failures).Msg("DNS discovery failed; keeping the last known replicas")
				failLoggedAt = time.Now()
			}
			if d.opts.OnError != nil {
				d.opts.OnError(err)
			}
		case !known || retry || !slices.Equal(urls, last):
			switch {
			case len(urls) == 0 && len(unresolved) > 0 && (!known || len(last) > 0):
				// The name answers, its targets do not (a tester was
				// told the name had no records).
				d.opts.Log.Warn().Str("discovery", d.target).Strs("unresolved_targets", unresolved).
					Msg("DNS discovery: the SRV records name targets with no address; no replicas until they have")
			case len(urls) == 0 && (!known || len(last) > 0):
				// An answer, but a typo in the name looks the same: say so.
				d.opts.Log.Warn().Str("discovery", d.target).
					Msg("DNS discovery: the name has no records, or does not exist; no replicas until it has")
			case len(unresolved) > 0:
				d.opts.Log.Warn().Str("discovery", d.target).Strs("unresolved_targets", unresolved).
					Msg("DNS discovery: some SRV targets have no address; serving the others")
			}
			known, last = true, urls
			retry = d.opts.OnChange(slices.Clone(urls)) != nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// failureLogEvery is how often a discovery that keeps failing says so
// again (with the count of its failures): at a short interval, a line per
// try would flood the log.
const failureLogEvery = time.Minute

// dnsBound is what bounds a DNS connection: its deadlines are never past
// limit, nor past now once the dial's context is cancelled (stop ends
// that watch).
type dnsBound struct {
	limit     time.Time
	cancelled atomic.Bool
	stop      func() bool
}

// deadline is t as the bound allows it.
func (b *dnsBound) deadline(t time.Time) time.Time {
	if b.cancelled.Load() {
		return time.Now() // a deadline the resolver sets after the cancel cannot undo it
	}
	return earliest(t, b.limit)
}

// boundedConn is a DNS connection under a dnsBound.
type boundedConn struct {
	net.Conn
	b *dnsBound
}

func (c *boundedConn) Close() error {
	c.b.stop()
	return c.Conn.Close()
}
func (c *boundedConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.b.deadline(t)) }
func (c *boundedConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.b.deadline(t))
}
func (c *boundedConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.b.deadline(t))
}

// boundedUDPConn is boundedConn for UDP, which stays a net.PacketConn.
type boundedUDPConn struct {
	*net.UDPConn
	b *dnsBound
}

func (c *boundedUDPConn) Close() error {
	c.b.stop()
	return c.UDPConn.Close()
}
func (c *boundedUDPConn) SetDeadline(t time.Time) error {
	return c.UDPConn.SetDeadline(c.b.deadline(t))
}
func (c *boundedUDPConn) SetReadDeadline(t time.Time) error {
	return c.UDPConn.SetReadDeadline(c.b.deadline(t))
}
func (c *boundedUDPConn) SetWriteDeadline(t time.Time) error {
	return c.UDPConn.SetWriteDeadline(c.b.deadline(t))
}

// earliest is t, or limit if t is later or zero (no deadline).
func earliest(t, limit time.Time) time.Time {
	if t.IsZero() || t.After(limit) {
		return limit
	}
	return t
}
