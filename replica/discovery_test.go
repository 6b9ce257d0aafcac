package replica

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"
)

// testZone is a DNS server on loopback whose records a test changes as it
// runs.
type testZone struct {
	// mu guards addrs, srv and fail.
	mu    sync.Mutex
	addrs map[string][]string // name (lower case, final dot) -> IPv4 and IPv6 addresses
	srv   map[string][]dns.SRV
	fail  bool // answer SERVFAIL
	// failAddrs answers SERVFAIL to A and AAAA queries alone (an SRV
	// answer's targets that do not resolve).
	failAddrs bool

	addr    string
	servers []*dns.Server
}

// startZone starts the server on an ephemeral UDP port of 127.0.0.1 (and
// TCP on the same port when it is free, for a resolver that falls back to
// it); it stops at cleanup.
func startZone(t *testing.T) *testZone {
	t.Helper()
	z := &testZone{addrs: make(map[string][]string), srv: make(map[string][]dns.SRV)}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z.addr = pc.LocalAddr().String()
	z.start(t, &dns.Server{PacketConn: pc, Handler: z})
	if ln, err := net.Listen("tcp", z.addr); err == nil {
		z.start(t, &dns.Server{Listener: ln, Handler: z})
	}
	t.Cleanup(z.stop)
	return z
}

func (z *testZone) start(t *testing.T, s *dns.Server) {
	t.Helper()
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	errc := make(chan error, 1)
	go func() { errc <- s.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("DNS server: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the DNS server did not start")
	}
	z.servers = append(z.servers, s)
}

// stop shuts the servers down; queries are refused from then on.
func (z *testZone) stop() {
	for _, s := range z.servers {
		_ = s.Shutdown()
	}
	z.servers = nil
}

func (z *testZone) setAddrs(name string, ips ...string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.addrs[name] = ips
}

func (z *testZone) remove(name string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.addrs, name)
	delete(z.srv, name)
}

func (z *testZone) setSRV(name string, recs ...dns.SRV) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.srv[name] = recs
}

func (z *testZone) setFail(fail bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.fail = fail
}

// ServeDNS implements dns.Handler: NXDOMAIN for names it does not hold,
// no data for a type a name lacks.
func (z *testZone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	// As an authoritative server answers: a no-data answer without these
	// reads as a lame referral to Go's resolver.
	m.Authoritative, m.RecursionAvailable = true, true
	z.mu.Lock()
	defer z.mu.Unlock()
	defer func() { _ = w.WriteMsg(m) }()
	if z.fail {
		m.Rcode = dns.RcodeServerFailure
		return
	}
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return
	}
	q := req.Question[0]
	if z.failAddrs && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
		m.Rcode = dns.RcodeServerFailure
		return
	}
	name := strings.ToLower(q.Name)
	ips, hasAddrs := z.addrs[name]
	recs, hasSRV := z.srv[name]
	if !hasAddrs && !hasSRV {
		m.Rcode = dns.RcodeNameError
		return
	}
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 1}
	switch q.Qtype {
	case dns.TypeA, dns.TypeAAAA:
		for _, s := range ips {
			ip := net.ParseIP(s)
			if v4 := ip.To4(); v4 != nil && q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: v4})
			} else if v4 == nil && q.Qtype == dns.TypeAAAA {
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip})
			}
		}
	case dns.TypeSRV:
		for _, r := range recs {
			r.Hdr = hdr
			m.Answer = append(m.Answer, &r)
		}
	}
}

// watchDiscovery runs a Discovery of target until the test ends and returns what it reports.
func watchDiscovery(t *testing.T, target string, server string) (changes chan []string, errs chan error) {
	return watchDiscoveryLog(t, target, server, zerolog.Nop())
}

// watchDiscoveryLog is watchDiscovery logging to log.
func watchDiscoveryLog(t *testing.T, target string, server string, log zerolog.Logger) (changes chan []string, errs chan error) {
	t.Helper()
	changes = make(chan []string, 64)
	errs = make(chan error, 64)
	ctx, cancel := context.WithCancel(context.Background())
	d, err := NewDiscovery(target, DiscoveryOptions{
		Log:      log,
		Server:   server,
		Interval: 40 * time.Millisecond,
		Timeout:  500 * time.Millisecond, // so that a lookup cut off by the test's end ends within goleak's retries
		OnChange: func(urls []string) error {
			select {
			case changes <- urls:
			case <-ctx.Done():
			}
			return nil
		},
		OnError: func(err error) {
			select {
			case errs <- err:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return changes, errs
}

// nextSet waits for the next reported set.
func nextSet(t *testing.T, changes chan []string) []string {
	t.Helper()
	select {
	case s := <-changes:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no change reported")
		return nil
	}
}

func wantSet(t *testing.T, got []string, want ...string) {
	t.Helper()
	if got == nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("replicas = %q, want %q", got, want)
	}
}

// quiet checks that nothing is reported for a few intervals.
func quiet(t *testing.T, changes chan []string) {
	t.Helper()
	select {
	case s := <-changes:
		t.Fatalf("reported %q, though nothing changed", s)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestDiscoveryA(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const name = "web.test."
	z.setAddrs(name, "127.0.0.1", "127.0.0.2")
	changes, _ := watchDiscovery(t, "dns://web.test.:8000", z.addr)

	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8000", "http://127.0.0.2:8000")
	quiet(t, changes)

	z.setAddrs(name, "127.0.0.1", "127.0.0.2", "127.0.0.3") // one added
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8000", "http://127.0.0.2:8000", "http://127.0.0.3:8000")

	z.setAddrs(name, "127.0.0.3", "127.0.0.2") // one removed
	wantSet(t, nextSet(t, changes), "http://127.0.0.2:8000", "http://127.0.0.3:8000")

	z.setAddrs(name, "127.0.0.2", "::1") // dual stack: the same pods twice
	wantSet(t, nextSet(t, changes), "http://127.0.0.2:8000")

	z.setAddrs(name, "::1", "::2") // IPv6 only
	wantSet(t, nextSet(t, changes), "http://[::1]:8000", "http://[::2]:8000")

	z.setAddrs(name) // all gone: the name, without addresses
	wantSet(t, nextSet(t, changes))

	z.remove(name) // NXDOMAIN: still none, nothing new to say
	quiet(t, changes)

	z.setAddrs(name, "127.0.0.9") // back
	wantSet(t, nextSet(t, changes), "http://127.0.0.9:8000")
}

func TestDiscoveryFirstAnswerEmpty(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	logs := &processLog{}
	changes, _ := watchDiscoveryLog(t, "dns://nothing.test.:80", z.addr, zerolog.New(logs))
	wantSet(t, nextSet(t, changes)) // reported: "none" is an answer
	// But not in silence: a typo in the name looks the same (found by an
	// exploratory run). Said once, not at every resolution.
	quiet(t, changes)
	if n := strings.Count(logs.String(), "the name has no records, or does not exist"); n != 1 {
		t.Errorf("the empty answer was logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestDiscoveryKeepsLastSetOnFailure(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const name = "web.test."
	z.setAddrs(name, "127.0.0.1")
	changes, errs := watchDiscovery(t, "dns://web.test.:8000", z.addr)
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8000")

	drain := func() {
		for {
			select {
			case <-errs:
			default:
				return
			}
		}
	}
	waitErr := func(what string) {
		t.Helper()
		select {
		case err := <-errs:
			t.Logf("%s: %v", what, err)
			// The server asked, not the system's that Go's resolver
			// names (a tester looked there).
			if msg := err.Error(); !strings.Contains(msg, "(DNS server "+z.addr+")") || strings.Contains(msg, " on ") {
				t.Errorf("%s: %q names another DNS server than %s", what, msg, z.addr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no error reported", what)
		}
	}

	z.setFail(true) // SERVFAIL
	drain()
	waitErr("SERVFAIL")
	quiet(t, changes)
	z.setFail(false)

	z.setAddrs(name, "127.0.0.2")
	wantSet(t, nextSet(t, changes), "http://127.0.0.2:8000")

	z.stop() // the resolver is down
	drain()
	waitErr("resolver down")
	quiet(t, changes)
}

// A discovery that keeps failing says so once, then once a minute with
// the count, not at every try; and says when it answers again.
func TestDiscoveryFailuresLoggedOnce(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const name = "web.test."
	z.setAddrs(name, "127.0.0.1")
	logs := &syncBuffer{}
	changes, errs := watchDiscoveryLog(t, "dns://web.test.:8000", z.addr, zerolog.New(logs))
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8000")
	z.setFail(true)
	for range 5 { // five failed tries, at 40 ms
		select {
		case <-errs:
		case <-time.After(5 * time.Second):
			t.Fatal("no error reported")
		}
	}
	z.setFail(false)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "answers again") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := strings.Count(logs.String(), "DNS discovery failed"); n != 1 {
		t.Errorf("%d failure lines for one outage, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "answers again") {
		t.Errorf("no line when it answered again:\n%s", logs.String())
	}
}

func TestDiscoverySRV(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const svc = "_http._tcp.web.test."
	z.setAddrs("a.web.test.", "127.0.0.1")
	z.setAddrs("b.web.test.", "127.0.0.2", "::1") // dual stack: one host
	z.setSRV(svc,
		dns.SRV{Priority: 1, Weight: 10, Port: 8001, Target: "a.web.test."},
		dns.SRV{Priority: 1, Weight: 10, Port: 8002, Target: "b.web.test."},
		dns.SRV{Priority: 1, Weight: 10, Port: 8003, Target: "gone.web.test."}, // no such target: skipped
	)
	changes, _ := watchDiscovery(t, "dns+srv://"+svc, z.addr)
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8001", "http://127.0.0.2:8002")

	z.setSRV(svc, dns.SRV{Priority: 1, Weight: 10, Port: 9000, Target: "a.web.test."}) // moved
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:9000")

	z.remove(svc) // all gone
	wantSet(t, nextSet(t, changes))
}

// An SRV target that does not resolve is an error naming the DNS server
// asked alone, as a name's own lookup is (a tester: it named the system's,
// from /etc/resolv.conf, where discovery_server was another).
func TestDiscoverySRVTargetErrorNamesTheServer(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const svc = "_http._tcp.web.test."
	z.setSRV(svc, dns.SRV{Priority: 1, Weight: 10, Port: 8001, Target: "a.web.test."})
	z.mu.Lock()
	z.failAddrs = true
	z.mu.Unlock()
	_, errs := watchDiscovery(t, "dns+srv://"+svc, z.addr)
	select {
	case err := <-errs:
		if msg := err.Error(); !strings.Contains(msg, "SRV target a.web.test.") || !strings.Contains(msg, "(DNS server "+z.addr+")") || strings.Contains(msg, " on ") {
			t.Errorf("%q: want the SRV target's failure, naming the DNS server %s alone", msg, z.addr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no error reported")
	}
}

func TestDiscoveryResolveOnce(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	z.setAddrs("web.test.", "127.0.0.1", "127.0.0.1")
	d, err := NewDiscovery("dns://web.test.:443", DiscoveryOptions{Server: z.addr, Scheme: "https", OnChange: func([]string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	urls, err := d.Resolve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSet(t, urls, "https://127.0.0.1:443")
}

func TestDiscoveryHostPort(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	z.setAddrs("a.hosts.test.", "127.0.0.1", "::1")
	z.setAddrs("b.hosts.test.", "::1")
	z.setSRV("_replica._tcp.hosts.test.",
		dns.SRV{Priority: 1, Weight: 10, Port: 9001, Target: "a.hosts.test."},
		dns.SRV{Priority: 1, Weight: 10, Port: 9003, Target: "b.hosts.test."})
	for target, want := range map[string][]string{
		"dns://a.hosts.test.:9002":            {"127.0.0.1:9002"},
		"dns+srv://_replica._tcp.hosts.test.": {"127.0.0.1:9001", "[::1]:9003"},
	} {
		d, err := NewDiscovery(target, DiscoveryOptions{Server: z.addr, HostPort: true, OnChange: func([]string) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := d.Resolve(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		wantSet(t, addrs, want...)
	}
}

func TestNewDiscoveryErrors(t *testing.T) {
	onChange := func([]string) error { return nil }
	for _, tc := range []struct {
		target string
		o      DiscoveryOptions
		ok     bool
	}{
		{"dns://svc.ns.svc.cluster.local:8000", DiscoveryOptions{OnChange: onChange}, true},
		{"dns+srv://_http._tcp.svc.ns.svc.cluster.local", DiscoveryOptions{OnChange: onChange}, true},
		{"dns://svc:8000", DiscoveryOptions{OnChange: onChange, Server: "10.0.0.10"}, true},
		{"dns://svc", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://svc:0", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://svc:70000", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://:8000", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://svc:8000/path", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://svc:8000?x=1", DiscoveryOptions{OnChange: onChange}, false},
		{"dns+srv://_http._tcp.svc:80", DiscoveryOptions{OnChange: onChange}, false},
		{"http://svc:8000", DiscoveryOptions{OnChange: onChange}, false},
		{"svc:8000", DiscoveryOptions{OnChange: onChange}, false},
		{"dns://svc:8000", DiscoveryOptions{}, false},
		{"dns://svc:8000", DiscoveryOptions{OnChange: onChange, Scheme: "ftp"}, false},
		{"dns://svc:8000", DiscoveryOptions{OnChange: onChange, Server: "[::1"}, false},
	} {
		_, err := NewDiscovery(tc.target, tc.o)
		if (err == nil) != tc.ok {
			t.Errorf("NewDiscovery(%q, %+v) = %v, want ok=%v", tc.target, tc.o, err, tc.ok)
		}
	}
}

// A lookup cancelled while its DNS server says nothing ends at once, its
// exchange too: the resolver does not watch the context while it waits,
// and would have waited for its deadline (the goroutines left then made
// the leak checks of other tests flake).
func TestDiscoveryCancelEndsTheExchange(t *testing.T) {
	leakCheck(t)
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() { // reads every query, answers none
		buf := make([]byte, 512)
		for {
			if _, _, err := silent.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	d, err := NewDiscovery("dns://web.test.:80", DiscoveryOptions{Server: silent.LocalAddr().String(), Timeout: time.Minute, OnChange: func([]string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := d.Resolve(ctx); err == nil {
		t.Fatal("a lookup nobody answered succeeded")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Resolve took %v after its context ended", took)
	}
}

// SRV records whose targets have no address are said to be so, not "the
// name has no records" (a tester), and one of several, once.
func TestDiscoverySRVTargetsWithoutAddress(t *testing.T) {
	leakCheck(t)
	z := startZone(t)
	const svc = "_http._tcp.web.test."
	z.setSRV(svc, dns.SRV{Priority: 1, Weight: 10, Port: 8001, Target: "gone1.web.test."}, dns.SRV{Priority: 1, Weight: 10, Port: 8002, Target: "gone2.web.test."})
	logs := &syncBuffer{}
	changes, _ := watchDiscoveryLog(t, "dns+srv://"+svc, z.addr, zerolog.New(logs))
	wantSet(t, nextSet(t, changes))
	if s := logs.String(); !strings.Contains(s, "the SRV records name targets with no address") || !strings.Contains(s, "gone1.web.test.") || strings.Contains(s, "has no records") {
		t.Errorf("log: %s\nwant the targets with no address named", s)
	}
	z.setAddrs("gone1.web.test.", "127.0.0.1")
	wantSet(t, nextSet(t, changes), "http://127.0.0.1:8001")
	if s := logs.String(); strings.Count(s, "some SRV targets have no address") != 1 {
		t.Errorf("log: %s\nwant one line for the target still without an address", s)
	}
}
