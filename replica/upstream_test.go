package replica

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakCheck registers the goroutine-leak check first, so that it runs after
// every other cleanup of the test (servers closed, connections dropped).
func leakCheck(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// newBackend starts an HTTP server for the test's lifetime.
func newBackend(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

// newUpstream returns a running Upstream to base, closed at cleanup.
func newUpstream(t *testing.T, base string, o UpstreamOptions) *Upstream {
	t.Helper()
	if o.MaxOngoing == 0 {
		o.MaxOngoing = 10
	}
	u, err := NewUpstream("up#"+t.Name(), base, o)
	if err != nil {
		t.Fatal(err)
	}
	u.SetState(StateRunning)
	t.Cleanup(u.Close)
	return u
}

// newTransport returns a transport closed at cleanup.
func newTransport(t *testing.T, o TransportOptions) *http.Transport {
	t.Helper()
	tr := NewTransport(o)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// serveOnce runs one request through u with a slot held, as the router
// does.
func serveOnce(t *testing.T, u *Upstream, w http.ResponseWriter, r *http.Request) error {
	t.Helper()
	release, ok := u.TryAcquire()
	if !ok {
		t.Fatal("no free slot")
	}
	defer release()
	return u.Serve(w, r)
}

// frontend is a proxy in front of u, for tests that need a real client
// connection (streaming, trailers). Serve's errors go to errs.
func frontend(t *testing.T, u *Upstream) (front *httptest.Server, client *http.Client, errs chan error) {
	t.Helper()
	errs = make(chan error, 16)
	front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, ok := u.TryAcquire()
		if !ok {
			http.Error(w, "full", http.StatusServiceUnavailable)
			return
		}
		defer release()
		if err := u.Serve(w, r); err != nil {
			select {
			case errs <- err:
			default:
			}
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(front.Close)
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return front, &http.Client{Transport: tr, Timeout: 10 * time.Second}, errs
}

// spyWriter is a ResponseWriter that records whether anything was written.
type spyWriter struct {
	h      http.Header
	code   int
	wrote  bool
	body   bytes.Buffer
	flushN int
}

func newSpy() *spyWriter { return &spyWriter{h: make(http.Header)} }

func (s *spyWriter) Header() http.Header { return s.h }
func (s *spyWriter) WriteHeader(code int) {
	if !s.wrote {
		s.code, s.wrote = code, true
	}
}
func (s *spyWriter) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.body.Write(b)
}
func (s *spyWriter) Flush() { s.WriteHeader(http.StatusOK); s.flushN++ }

// untouched fails the test if anything reached w.
func (s *spyWriter) untouched(t *testing.T) {
	t.Helper()
	if s.wrote || len(s.h) != 0 || s.body.Len() != 0 {
		t.Fatalf("something was written: wrote=%v header=%v body=%q", s.wrote, s.h, s.body.String())
	}
}

// echoed is what the echo backend saw.
type echoed struct {
	Method  string
	Path    string
	Query   string
	Host    string
	Body    string
	Header  http.Header
	Trailer http.Header
}

func echoBackend(t *testing.T) *httptest.Server {
	return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		e := echoed{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host, Body: string(body), Header: r.Header, Trailer: r.Trailer}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Backend", "yes")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(e)
	})
}

func decodeEcho(t *testing.T, b []byte) echoed {
	t.Helper()
	var e echoed
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("backend answer %q: %v", b, err)
	}
	return e
}

func TestUpstreamForwards(t *testing.T) {
	leakCheck(t)
	backend := echoBackend(t)
	for _, tc := range []struct {
		name, base, wantPath string
	}{
		{"root", backend.URL, "/a/b c"},
		{"base path", backend.URL + "/base/", "/base/a/b c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream(t, tc.base, UpstreamOptions{})
			r := httptest.NewRequest(http.MethodPost, "http://front.test/a/b%20c?x=1&y=%2F", strings.NewReader("hello body"))
			r.Header.Set("X-Custom", "v1")
			r.Header.Add("X-Multi", "a")
			r.Header.Add("X-Multi", "b")
			w := newSpy()
			if err := serveOnce(t, u, w, r); err != nil {
				t.Fatal(err)
			}
			if w.code != http.StatusCreated || w.h.Get("X-Backend") != "yes" {
				t.Fatalf("status %d header %v", w.code, w.h)
			}
			e := decodeEcho(t, w.body.Bytes())
			if e.Method != http.MethodPost || e.Path != tc.wantPath || e.Query != "x=1&y=%2F" || e.Body != "hello body" {
				t.Fatalf("backend saw %+v", e)
			}
			if e.Host != "front.test" {
				t.Errorf("Host = %q, want the client's front.test", e.Host)
			}
			if got := e.Header["X-Multi"]; len(got) != 2 || got[0] != "a" || got[1] != "b" {
				t.Errorf("X-Multi = %q", got)
			}
			if e.Header.Get("X-Custom") != "v1" {
				t.Errorf("X-Custom = %q", e.Header.Get("X-Custom"))
			}
			if ua, ok := e.Header["User-Agent"]; ok {
				t.Errorf("User-Agent %q invented", ua)
			}
			if u.Ongoing() != 0 || u.Served() != 1 {
				t.Errorf("ongoing %d served %d", u.Ongoing(), u.Served())
			}
		})
	}
}

func TestUpstreamLargeBodiesBothWays(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		_, _ = io.Copy(w, r.Body) // streams back as it reads: chunked
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	front, client, _ := frontend(t, u)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16) // 4 MiB
	pr, pw := io.Pipe()
	go func() {
		for off := 0; off < len(payload); off += 64 << 10 {
			if _, err := pw.Write(payload[off : off+64<<10]); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	res, err := client.Post(front.URL+"/upload", "application/octet-stream", pr) // chunked: unknown length
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("got %d bytes back, want %d identical", len(got), len(payload))
	}
}

func TestUpstreamHopByHop(t *testing.T) {
	leakCheck(t)
	var seen http.Header
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		h := w.Header()
		h.Set("Connection", "X-Resp-Hop")
		h.Set("X-Resp-Hop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", "Basic")
		h.Set(FullHeader, "1") // meaningful only on a 503
		h.Set("X-Kept", "1")
		_, _ = io.WriteString(w, "ok")
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil)
	r.Header.Set("Connection", "keep-alive, X-Named, X-Request-Id")
	r.Header.Set("X-Named", "secret")
	r.Header.Set("X-Request-Id", "abc") // the proxy's: named in Connection, kept
	r.Header.Set("Keep-Alive", "timeout=5")
	r.Header.Set("Proxy-Authorization", "Basic Zm9v")
	r.Header.Set("Proxy-Connection", "keep-alive")
	r.Header.Set("Proxy", "http://evil.test") // httpoxy
	r.Header.Set("Upgrade", "h2c")
	r.Header.Set("Te", "trailers, deflate")
	r.Header.Set("Trailer", "X-T")
	r.Header.Set("X-Kept", "1")
	w := newSpy()
	if err := serveOnce(t, u, w, r); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Connection", "X-Named", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Proxy", "Upgrade", "Trailer"} {
		if v, ok := seen[k]; ok {
			t.Errorf("request header %s: %q reached the replica", k, v)
		}
	}
	if got := seen.Get("Te"); got != "trailers" {
		t.Errorf("Te = %q, want trailers (the only TE token passed on)", got)
	}
	if seen.Get("X-Kept") != "1" {
		t.Error("an end-to-end request header was dropped")
	}
	if got := seen.Get("X-Request-Id"); got != "abc" {
		t.Errorf("X-Request-Id at the replica = %q, want abc: a client's Connection header cannot take it away", got)
	}
	for _, k := range []string{"Connection", "X-Resp-Hop", "Keep-Alive", "Proxy-Authenticate", FullHeader} {
		if v, ok := w.h[k]; ok {
			t.Errorf("response header %s: %q reached the client", k, v)
		}
	}
	if w.h.Get("X-Kept") != "1" || w.body.String() != "ok" {
		t.Errorf("response: header %v body %q", w.h, w.body.String())
	}
}

func TestUpstreamForwardedHeaders(t *testing.T) {
	leakCheck(t)
	backend := echoBackend(t)
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	for _, tc := range []struct {
		name       string
		remote     string
		tls        bool
		xff        []string
		xfp, xfh   string
		via        []string
		wantXFF    string
		wantProto  string
		wantHost   string
		wantVia    []string
		optVia     string
		noTrustSet bool
		http10     bool // the client's request is HTTP/1.0
	}{
		{name: "untrusted, no XFF", remote: "192.0.2.7:1234", wantXFF: "192.0.2.7", wantProto: "http", wantHost: "front.test"},
		{name: "untrusted XFF replaced", remote: "192.0.2.7:1234", xff: []string{"6.6.6.6"}, xfp: "https", xfh: "forged.test",
			wantXFF: "192.0.2.7", wantProto: "http", wantHost: "front.test"},
		{name: "nothing trusted", noTrustSet: true, remote: "10.1.2.3:1234", xff: []string{"6.6.6.6"}, wantXFF: "10.1.2.3", wantProto: "http", wantHost: "front.test"},
		{name: "trusted XFF appended", remote: "10.1.2.3:1234", xff: []string{"203.0.113.9"}, xfp: "https", xfh: "public.test",
			wantXFF: "203.0.113.9, 10.1.2.3", wantProto: "https", wantHost: "public.test"},
		{name: "trusted, several XFF lines", remote: "10.1.2.3:1234", xff: []string{"203.0.113.9", "198.51.100.1, 10.9.9.9"},
			wantXFF: "203.0.113.9, 198.51.100.1, 10.9.9.9, 10.1.2.3", wantProto: "http", wantHost: "front.test"},
		{name: "trusted IPv6 peer", remote: "[2001:db8::5]:443", xff: []string{"203.0.113.9"}, wantXFF: "203.0.113.9, 2001:db8::5", wantProto: "http", wantHost: "front.test"},
		{name: "untrusted IPv6 peer", remote: "[2001:dead::5]:443", xff: []string{"203.0.113.9"}, wantXFF: "2001:dead::5", wantProto: "http", wantHost: "front.test"},
		{name: "TLS seen", remote: "192.0.2.7:1234", tls: true, wantXFF: "192.0.2.7", wantProto: "https", wantHost: "front.test"},
		{name: "via", remote: "192.0.2.7:1234", via: []string{"1.0 fred"}, optVia: "serveproxy", wantXFF: "192.0.2.7", wantProto: "http", wantHost: "front.test",
			wantVia: []string{"1.0 fred, 1.1 serveproxy"}},
		// The entry names the protocol received (RFC 9110 7.6.3; found
		// by a tester).
		{name: "via from HTTP/1.0", remote: "192.0.2.7:1234", optVia: "serveproxy", http10: true, wantXFF: "192.0.2.7", wantProto: "http", wantHost: "front.test",
			wantVia: []string{"1.0 serveproxy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := UpstreamOptions{TrustedProxies: trusted, Via: tc.optVia}
			if tc.noTrustSet {
				o.TrustedProxies = nil
			}
			u := newUpstream(t, backend.URL, o)
			target := "http://front.test/"
			if tc.tls {
				target = "https://front.test/"
			}
			r := httptest.NewRequest(http.MethodGet, target, nil)
			r.RemoteAddr = tc.remote
			if tc.http10 {
				r.Proto, r.ProtoMinor = "HTTP/1.0", 0
			}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if tc.xfp != "" {
				r.Header.Set("X-Forwarded-Proto", tc.xfp)
			}
			if tc.xfh != "" {
				r.Header.Set("X-Forwarded-Host", tc.xfh)
			}
			for _, v := range tc.via {
				r.Header.Add("Via", v)
			}
			r.Header.Set("Forwarded", "for=6.6.6.6")
			r.Header.Set("X-Real-Ip", "6.6.6.6")
			// As frameworks honour them (a tester).
			r.Header.Set("X-Forwarded-Port", "443")
			r.Header.Set("X-Forwarded-Prefix", "/admin")
			r.Header.Set("X-Original-Url", "/admin")
			w := newSpy()
			if err := serveOnce(t, u, w, r); err != nil {
				t.Fatal(err)
			}
			e := decodeEcho(t, w.body.Bytes())
			// A proxy's word on the client is kept from a trusted peer
			// only (the cases named so).
			trusted := strings.HasPrefix(tc.name, "trusted")
			for _, k := range []string{"Forwarded", "X-Real-Ip", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Original-Url"} {
				if _, kept := e.Header[k]; kept != trusted {
					t.Errorf("%s kept: %v, want %v", k, kept, trusted)
				}
			}
			if got := e.Header["X-Forwarded-For"]; len(got) != 1 || got[0] != tc.wantXFF {
				t.Errorf("X-Forwarded-For = %q, want %q", got, tc.wantXFF)
			}
			if got := e.Header.Get("X-Forwarded-Proto"); got != tc.wantProto {
				t.Errorf("X-Forwarded-Proto = %q, want %q", got, tc.wantProto)
			}
			if got := e.Header.Get("X-Forwarded-Host"); got != tc.wantHost {
				t.Errorf("X-Forwarded-Host = %q, want %q", got, tc.wantHost)
			}
			if tc.wantVia != nil {
				if got := e.Header["Via"]; strings.Join(got, "|") != strings.Join(tc.wantVia, "|") {
					t.Errorf("request Via = %q, want %q", got, tc.wantVia)
				}
				if got := w.h["Via"]; len(got) != 1 || got[0] != "1.1 serveproxy" {
					t.Errorf("response Via = %q", got)
				}
			}
			if len(tc.xff) > 0 && r.Header["X-Forwarded-For"][0] != tc.xff[0] {
				t.Error("the client's request header was changed")
			}
		})
	}
}

// With Host set, the replica and its health checks get that Host (a
// virtual-hosting server's name), and X-Forwarded-Host the client's.
func TestUpstreamHost(t *testing.T) {
	leakCheck(t)
	var hosts sync.Map // path -> Host seen
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		hosts.Store(r.URL.Path, r.Host+" "+r.Header.Get("X-Forwarded-Host"))
	})
	for _, tc := range []struct{ host, wantServe, wantHealth string }{
		{"api.internal:8443", "api.internal:8443 front.test", "api.internal:8443 "},
		{"", "front.test front.test", strings.TrimPrefix(backend.URL, "http://") + " "},
	} {
		u := newUpstream(t, backend.URL, UpstreamOptions{Host: tc.host})
		if err := serveOnce(t, u, newSpy(), httptest.NewRequest(http.MethodGet, "http://front.test/x", nil)); err != nil {
			t.Fatal(err)
		}
		if err := u.CheckHealth(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, _ := hosts.Load("/x"); got != tc.wantServe {
			t.Errorf("Host %q: the request's Host and X-Forwarded-Host = %q, want %q", tc.host, got, tc.wantServe)
		}
		if got, _ := hosts.Load(DefaultHealthPath); got != tc.wantHealth {
			t.Errorf("Host %q: the health check's = %q, want %q", tc.host, got, tc.wantHealth)
		}
	}
}

// TestUpstreamStreaming checks that a chunked response reaches the client
// as it is written: the client reads the first chunk while the replica's
// handler still waits to write the second.
func TestUpstreamStreaming(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name   string
		header func(h http.Header)
	}{
		{"chunked", func(h http.Header) {}},
		// With a length the body would not stream but for its type.
		{"text/event-stream", func(h http.Header) {
			h.Set("Content-Type", "text/event-stream; charset=utf-8")
			h.Set("Content-Length", fmt.Sprint(len("data: one\n\n")+len("data: two\n\n")))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proceed := make(chan struct{})
			backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				tc.header(w.Header())
				_, _ = io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-proceed:
				case <-time.After(10 * time.Second):
				}
				_, _ = io.WriteString(w, "data: two\n\n")
			})
			u := newUpstream(t, backend.URL, UpstreamOptions{})
			front, client, _ := frontend(t, u)
			res, err := client.Get(front.URL + "/events")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			br := bufio.NewReader(res.Body)
			first := make(chan string, 1)
			go func() {
				line, _ := br.ReadString('\n')
				first <- line
			}()
			select {
			case line := <-first:
				if line != "data: one\n" {
					t.Fatalf("first line %q", line)
				}
			case <-time.After(5 * time.Second):
				close(proceed)
				t.Fatal("the first event did not arrive while the replica was still writing")
			}
			close(proceed)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "\ndata: two\n\n" {
				t.Fatalf("rest %q, %v", rest, err)
			}
		})
	}
}

func TestUpstreamTrailers(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", "X-Sum")
		_, _ = fmt.Fprintf(w, "got %s", body)
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		w.Header().Set(http.TrailerPrefix+"Content-Length", "99") // frames nothing here
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	front, client, _ := frontend(t, u)
	res, err := client.Post(front.URL, "text/plain", strings.NewReader("abc"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || string(body) != "got abc" {
		t.Fatalf("body %q, %v", body, err)
	}
	if got := res.Trailer.Get("X-Sum"); got != "42" {
		t.Errorf("announced trailer X-Sum = %q, want 42 (trailers %v)", got, res.Trailer)
	}
	if got := res.Trailer.Get("X-Late"); got != "late" {
		t.Errorf("unannounced trailer X-Late = %q, want late", got)
	}
	if _, ok := res.Trailer["Content-Length"]; ok {
		t.Errorf("a Content-Length trailer reached the client: %v", res.Trailer)
	}

	// An HTTP/1.0 client's body ends with the connection: no trailer can
	// follow, and none is announced (a tester saw "Trailer: X-Sum").
	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	head, body10, _ := strings.Cut(string(raw), "\r\n\r\n")
	if strings.Contains(strings.ToLower(head), "\r\ntrailer:") || body10 != "got " {
		t.Errorf("HTTP/1.0 response %q, want no Trailer header and the body", raw)
	}
}

// trailerBody sets the request's trailer as its body ends, as a streaming
// client does.
type trailerBody struct {
	r   io.Reader
	set func()
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.set()
	}
	return n, err
}
func (b *trailerBody) Close() error { return nil }

func TestUpstreamRequestTrailers(t *testing.T) {
	leakCheck(t)
	got := make(chan http.Header, 1)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.Trailer
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	front, client, _ := frontend(t, u)
	req, _ := http.NewRequest(http.MethodPost, front.URL, nil)
	req.ContentLength = -1
	// A trailer must not get around the header's rules (found by a
	// tester: X-Forwarded-For from an untrusted client reached the
	// replica as a trailer).
	req.Trailer = http.Header{"X-Client-Sum": nil, "X-Forwarded-For": nil, "X-Request-Id": nil, "Authorization": nil}
	req.Body = &trailerBody{r: strings.NewReader("abc"), set: func() {
		req.Trailer.Set("X-Client-Sum", "7")
		req.Trailer.Set("X-Forwarded-For", "1.1.1.1")
		req.Trailer.Set("X-Request-Id", "forged")
		req.Trailer.Set("Authorization", "Bearer late")
	}}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if tr := <-got; len(tr) != 1 || tr.Get("X-Client-Sum") != "7" {
		t.Fatalf("the replica saw request trailers %v, want X-Client-Sum: 7 alone", tr)
	}
}

// TestUpstreamLimitNeverExceeded sends many concurrent requests through a
// replica of limit 3 and counts, at the backend, the most that were ever in
// flight at once, and the connections it was opened.
func TestUpstreamLimitNeverExceeded(t *testing.T) {
	leakCheck(t)
	const limit, workers, perWorker = 3, 16, 15
	var inFlight, peak, conns atomic.Int64
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		inFlight.Add(-1)
		_, _ = io.WriteString(w, "hi")
	}))
	backend.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	backend.Start()
	t.Cleanup(backend.Close)
	wake := make(chan struct{}, workers)
	tr := newTransport(t, TransportOptions{MaxConnsPerReplica: limit})
	u := newUpstream(t, backend.URL, UpstreamOptions{MaxOngoing: limit, Transport: tr, OnRelease: func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}})
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range workers {
		wg.Go(func() {
			for range perWorker {
				var release func()
				for {
					var ok bool
					if release, ok = u.TryAcquire(); ok {
						break
					}
					select {
					case <-wake:
					case <-time.After(10 * time.Millisecond):
					}
				}
				r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil)
				w := newSpy()
				err := u.Serve(w, r)
				if u.Ongoing() > limit {
					failures.Add(1)
				}
				release()
				if err != nil || w.body.String() != "hi" {
					failures.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d failed requests or limit breaches", failures.Load())
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("the backend saw %d requests at once; the limit is %d", p, limit)
	}
	if u.Peak() > limit || u.Ongoing() != 0 {
		t.Fatalf("upstream peak %d, ongoing %d", u.Peak(), u.Ongoing())
	}
	if c := conns.Load(); c > limit {
		t.Errorf("the backend was opened %d connections; at most %d are needed", c, limit)
	}
	t.Logf("%d requests, backend peak %d of limit %d, %d connections", workers*perWorker, peak.Load(), limit, conns.Load())
}

func TestUpstreamTryAcquire(t *testing.T) {
	leakCheck(t)
	u, err := NewUpstream("u", "http://127.0.0.1:1", UpstreamOptions{MaxOngoing: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, ok := u.TryAcquire(); ok {
		t.Fatal("a starting replica took a request")
	}
	u.SetState(StateRunning)
	r1, ok1 := u.TryAcquire()
	r2, ok2 := u.TryAcquire()
	_, ok3 := u.TryAcquire()
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("acquires = %v %v %v, want true true false", ok1, ok2, ok3)
	}
	r1()
	r2()
	u.SetState(StateDraining)
	if _, ok := u.TryAcquire(); ok {
		t.Fatal("a draining replica took a request")
	}
	if u.Ongoing() != 0 || u.Peak() != 2 || u.MaxOngoing() != 2 {
		t.Fatalf("ongoing %d peak %d max %d", u.Ongoing(), u.Peak(), u.MaxOngoing())
	}
}

// rawServer accepts TCP connections and hands each to handle; every
// connection is closed at cleanup.
func rawServer(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// readRequestHead reads one request's header block.
func readRequestHead(c net.Conn) error {
	_, err := http.ReadRequest(bufio.NewReader(c))
	return err
}

// closedPort returns an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func TestUpstreamErrors(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name      string
		base      func(t *testing.T) string
		body      string
		timeout   time.Duration
		check     func(t *testing.T, err error)
		retryable bool
		written   bool // the response had begun
	}{
		{
			name:      "closed port",
			base:      closedPort,
			retryable: true,
			check: func(t *testing.T, err error) {
				var ue *UnreachableError
				if !errors.As(err, &ue) || ue.Sent {
					t.Fatalf("err = %#v, want an unsent *UnreachableError", err)
				}
			},
		},
		{
			name:      "closed port, with a body",
			base:      closedPort,
			body:      "payload",
			retryable: true,
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*UnreachableError](err); !ok {
					t.Fatalf("err = %#v, want *UnreachableError", err)
				}
			},
		},
		{
			name: "hangs",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) { _ = readRequestHead(c); _, _ = io.Copy(io.Discard, c) })
			},
			timeout: 200 * time.Millisecond,
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*TimeoutError](err); !ok {
					t.Fatalf("err = %#v, want *TimeoutError", err)
				}
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatal("a replica timeout reads as the proxy's own deadline")
				}
			},
		},
		{
			name: "closes before answering",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) { _ = readRequestHead(c); _ = c.Close() })
			},
			check: func(t *testing.T, err error) {
				var ue *UnreachableError
				if !errors.As(err, &ue) || !ue.Sent {
					t.Fatalf("err = %#v, want a sent *UnreachableError", err)
				}
			},
		},
		{
			name: "malformed answer",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) {
					_ = readRequestHead(c)
					_, _ = io.WriteString(c, "NOT HTTP AT ALL\r\n\r\n")
					_ = c.Close()
				})
			},
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*ReplicaError](err); !ok {
					t.Fatalf("err = %#v, want *ReplicaError", err)
				}
			},
		},
		{
			// 100 to 599 only (RFC 9110, 15): net/http would write a 999
			// on to the client as it came (found by a tester).
			name: "status out of range",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) {
					_ = readRequestHead(c)
					_, _ = io.WriteString(c, "HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nhi")
					_ = c.Close()
				})
			},
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*InvalidResponseError](err); !ok || !strings.Contains(err.Error(), "999") {
					t.Fatalf("err = %#v, want *InvalidResponseError naming the status", err)
				}
			},
		},
		{
			// A small body is read whole before anything is written: the
			// proxy can still answer for the replica.
			name: "closes mid-response, small body",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) {
					_ = readRequestHead(c)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
					_ = c.Close()
				})
			},
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*ReplicaError](err); !ok {
					t.Fatalf("err = %#v, want *ReplicaError", err)
				}
			},
		},
		{
			name: "closes mid-response, large body",
			base: func(t *testing.T) string {
				return rawServer(t, func(c net.Conn) {
					_ = readRequestHead(c)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nonly ten b")
					_ = c.Close()
				})
			},
			written: true,
			check: func(t *testing.T, err error) {
				if _, ok := errors.AsType[*ReplicaError](err); !ok {
					t.Fatalf("err = %#v, want *ReplicaError", err)
				}
			},
		},
		{
			name: "marked 503",
			base: func(t *testing.T) string {
				return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set(FullHeader, "1")
					http.Error(w, "full", http.StatusServiceUnavailable)
				}).URL
			},
			body:      "not read by the replica",
			retryable: true,
			check: func(t *testing.T, err error) {
				var fe *FullError
				if !errors.As(err, &fe) || fe.BodyLost {
					t.Fatalf("err = %#v, want a *FullError with its body kept", err)
				}
			},
		},
		{
			name: "marked 503, body over the retry limit",
			base: func(t *testing.T) string {
				return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.ReadAll(r.Body)
					w.Header().Set(FullHeader, "1")
					w.WriteHeader(http.StatusServiceUnavailable)
				}).URL
			},
			body: strings.Repeat("x", DefaultRetryBodyLimit+1),
			check: func(t *testing.T, err error) {
				var fe *FullError
				if !errors.As(err, &fe) || !fe.BodyLost {
					t.Fatalf("err = %#v, want a *FullError whose body is lost", err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTransport(t, TransportOptions{ResponseHeaderTimeout: tc.timeout, DialTimeout: 2 * time.Second})
			u := newUpstream(t, tc.base(t), UpstreamOptions{Transport: tr})
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			r := httptest.NewRequest(http.MethodPost, "http://front.test/x", body)
			w := newSpy()
			start := time.Now()
			err := serveOnce(t, u, w, r)
			if err == nil {
				t.Fatal("no error")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
			tc.check(t, err)
			if got := Retryable(err); got != tc.retryable {
				t.Errorf("Retryable(%v) = %v, want %v", err, got, tc.retryable)
			}
			if tc.written {
				if !w.wrote {
					t.Error("the response had begun but nothing was written")
				}
			} else {
				w.untouched(t)
			}
			if u.Ongoing() != 0 {
				t.Errorf("ongoing = %d after the request", u.Ongoing())
			}
		})
	}
}

// TestUpstreamUnmarked503 checks that an ordinary 503 is the replica's
// answer, passed on, not a refusal.
func TestUpstreamUnmarked503(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "my own 503", http.StatusServiceUnavailable)
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	w := newSpy()
	if err := serveOnce(t, u, w, httptest.NewRequest(http.MethodGet, "http://front.test/", nil)); err != nil {
		t.Fatal(err)
	}
	if w.code != http.StatusServiceUnavailable || w.body.String() != "my own 503\n" {
		t.Fatalf("code %d body %q", w.code, w.body.String())
	}
}

// TestUpstreamRetryAfterRefusal sends a request with a body to a refusing
// replica and then, as the router would, the same request to another: the
// body arrives whole.
func TestUpstreamRetryAfterRefusal(t *testing.T) {
	leakCheck(t)
	for _, tc := range []struct {
		name  string
		first func(t *testing.T) string
	}{
		{"connection refused", closedPort},
		{"marked 503", func(t *testing.T) string {
			return newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(FullHeader, "1")
				w.WriteHeader(http.StatusServiceUnavailable)
			}).URL
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full := newUpstream(t, tc.first(t), UpstreamOptions{})
			good := newUpstream(t, echoBackend(t).URL, UpstreamOptions{})
			r := httptest.NewRequest(http.MethodPut, "http://front.test/doc", strings.NewReader("the whole body"))
			r.ContentLength = -1 // chunked, as a streaming client sends it
			w := newSpy()
			err := serveOnce(t, full, w, r)
			if !Retryable(err) {
				t.Fatalf("first replica: %v, want a retryable error", err)
			}
			w.untouched(t)
			if err := serveOnce(t, good, w, r); err != nil {
				t.Fatal(err)
			}
			if e := decodeEcho(t, w.body.Bytes()); e.Body != "the whole body" || e.Method != http.MethodPut {
				t.Fatalf("the second replica saw %+v", e)
			}
		})
	}
}

func TestUpstreamClientGone(t *testing.T) {
	leakCheck(t)
	entered := make(chan struct{})
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // the proxy's cancel closes the connection
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil).WithContext(ctx)
	go func() {
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
		}
		cancel()
	}()
	w := newSpy()
	err := serveOnce(t, u, w, r)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if Retryable(err) {
		t.Fatal("a client gone is not retryable")
	}
	w.untouched(t)
}

// TestUpstreamClientGoneMidBody cancels while the response streams.
func TestUpstreamClientGoneMidBody(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil).WithContext(ctx)
	w := &cancelOnWrite{spyWriter: newSpy(), cancel: cancel}
	err := serveOnce(t, u, w, r)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

type cancelOnWrite struct {
	*spyWriter
	cancel func()
}

func (c *cancelOnWrite) Write(b []byte) (int, error) {
	defer c.cancel()
	return c.spyWriter.Write(b)
}

// TestUpstreamIdleConnClosedByServer reuses a keep-alive connection that
// the server closed while it idled: requests, with a body or without, must
// not fail.
func TestUpstreamIdleConnClosedByServer(t *testing.T) {
	leakCheck(t)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}))
	backend.Config.IdleTimeout = 50 * time.Millisecond
	backend.Start()
	t.Cleanup(backend.Close)
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	for i := range 4 {
		method, body := http.MethodGet, ""
		if i%2 == 1 {
			method, body = http.MethodPost, "body"
		}
		w := newSpy()
		r := httptest.NewRequest(method, "http://front.test/", strings.NewReader(body))
		if err := serveOnce(t, u, w, r); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if w.body.String() != body {
			t.Fatalf("request %d: body %q", i, w.body.String())
		}
		time.Sleep(120 * time.Millisecond)
	}
}

// TestUpstreamRequestBodyError checks that a client's body that fails to
// read is the client's error, not the replica's.
func TestUpstreamRequestBodyError(t *testing.T) {
	leakCheck(t)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	w := newSpy()
	r := httptest.NewRequest(http.MethodPost, "http://front.test/", nil)
	r.Body = http.MaxBytesReader(w, io.NopCloser(strings.NewReader(strings.Repeat("x", 100))), 10)
	r.ContentLength = -1
	err := serveOnce(t, u, w, r)
	var mbe *http.MaxBytesError
	if _, ok := errors.AsType[*RequestBodyError](err); !ok || !errors.As(err, &mbe) {
		t.Fatalf("err = %#v, want a *RequestBodyError unwrapping to *http.MaxBytesError", err)
	}
	if Retryable(err) {
		t.Fatal("retryable")
	}
}

func TestClassifyWriteFailure(t *testing.T) {
	u := &Upstream{id: "u"}
	r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil)
	write := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("connection reset by peer")}
	if err := u.roundTripError(r, write, true); !Retryable(err) {
		t.Errorf("a failed header write: %v, want retryable", err)
	}
	if err := u.roundTripError(r, write, false); Retryable(err) {
		t.Errorf("a failed write after the body was read: %v, want final", err)
	}
	read := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	if err := u.roundTripError(r, read, true); Retryable(err) {
		t.Errorf("a failed read: %v, want final (the replica may have run it)", err)
	}
}

// TestUpstreamTLSFailure points an https upstream at a server whose
// certificate the transport does not trust: unreachable, nothing sent.
func TestUpstreamTLSFailure(t *testing.T) {
	leakCheck(t)
	backend := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	backend.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake error is expected
	t.Cleanup(backend.Close)
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	w := newSpy()
	err := serveOnce(t, u, w, httptest.NewRequest(http.MethodGet, "http://front.test/", nil))
	var ue *UnreachableError
	if !errors.As(err, &ue) || !Retryable(err) {
		t.Fatalf("err = %#v, want a retryable *UnreachableError", err)
	}
	w.untouched(t)
}

func TestUpstreamHealth(t *testing.T) {
	leakCheck(t)
	var status atomic.Int32
	status.Store(http.StatusOK)
	var paths sync.Map
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.Path, true)
		w.WriteHeader(int(status.Load()))
	})
	hang := rawServer(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })

	ctx := context.Background()
	def := newUpstream(t, backend.URL, UpstreamOptions{})
	if err := def.CheckHealth(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := paths.Load(DefaultHealthPath); !ok {
		t.Errorf("the default check did not GET %s", DefaultHealthPath)
	}
	custom := newUpstream(t, backend.URL+"/app", UpstreamOptions{HealthPath: "/ready"})
	if err := custom.CheckHealth(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := paths.Load("/app/ready"); !ok {
		t.Error("the custom check did not GET /app/ready")
	}
	status.Store(http.StatusInternalServerError)
	if err := def.CheckHealth(ctx); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("a 500 check: %v", err)
	}
	status.Store(http.StatusNoContent)
	if err := def.CheckHealth(ctx); err != nil {
		t.Errorf("a 204 check: %v", err)
	}
	if err := newUpstream(t, closedPort(t), UpstreamOptions{}).CheckHealth(ctx); err == nil {
		t.Error("a closed port passed its check")
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := newUpstream(t, hang, UpstreamOptions{}).CheckHealth(tctx); err == nil {
		t.Error("a hung replica passed its check")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the hung check took %v", d)
	}
}

// TestUpstreamHealthWhileFull checks that a replica busy with every slot
// (and every connection) still answers its health check.
func TestUpstreamHealthWhileFull(t *testing.T) {
	leakCheck(t)
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == DefaultHealthPath {
			return
		}
		entered <- struct{}{}
		<-block
	})
	tr := newTransport(t, TransportOptions{MaxConnsPerReplica: 1})
	u := newUpstream(t, backend.URL, UpstreamOptions{MaxOngoing: 1, Transport: tr})
	done := make(chan error, 1)
	go func() {
		done <- serveOnce(t, u, newSpy(), httptest.NewRequest(http.MethodGet, "http://front.test/slow", nil))
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := u.CheckHealth(ctx)
	close(block)
	if err != nil {
		t.Fatalf("health check of a full replica: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestParseUpstreamURL(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"http://10.0.0.5:8000", true},
		{"https://svc.example.com", true},
		{"http://[::1]:9000/base", true},
		{"10.0.0.5:8000", false},
		{"ftp://host", false},
		{"http://", false},
		{"http://:80", false},
		{"http://user:pw@host", false},
		{"http://host/?q=1", false},
		{"http://host/#frag", false},
		{"http://host:99999", false},
		{"http://host:0", false},
		{"http://host:%zz", false},
		{"://bad", false},
	} {
		_, err := ParseUpstreamURL(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseUpstreamURL(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
	if _, err := NewUpstream("u", "http://host", UpstreamOptions{MaxOngoing: 0}); err == nil {
		t.Error("max 0 accepted")
	}
	if _, err := NewUpstream("u", "http://host", UpstreamOptions{MaxOngoing: 1, HealthPath: "healthz"}); err == nil {
		t.Error("a relative health path accepted")
	}
}

func FuzzHasToken(f *testing.F) {
	f.Add("keep-alive, X-Foo", "x-foo")
	f.Add("trailers", "trailers")
	f.Add(" ,,", "")
	f.Fuzz(func(t *testing.T, list, token string) {
		if strings.Trim(token, " \t") == "" {
			t.Skip("empty tokens are never looked for")
		}
		got := hasToken([]string{list}, token)
		want := false
		for _, p := range strings.Split(list, ",") {
			if strings.EqualFold(strings.Trim(p, " \t"), token) {
				want = true
			}
		}
		if got != want {
			t.Fatalf("hasToken(%q, %q) = %v, want %v", list, token, got, want)
		}
	})
}

// lateContext is a context whose deadline has passed before its Done is
// closed, as a timer's context is for a moment.
type lateContext struct{ context.Context }

func (lateContext) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A dial cut by the proxy's own deadline, its context not yet told, is the
// deadline's (408), not the replica's: it was reported unreachable and
// left routing, every request a 503 until a health check passed (a
// tester, at a queue's end as the held slots freed at the deadline).
func TestDialCutAtTheDeadlineIsNoReplicasFault(t *testing.T) {
	u, err := NewUpstream("r", "http://127.0.0.1:1", UpstreamOptions{MaxOngoing: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(lateContext{context.Background()})
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}
	if err := u.roundTripError(r, dialErr, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("roundTripError = %v, want the proxy's deadline", err)
	}
}

// A request trailer whose name is no token (net/http leaves one with a
// space before its colon as it came, not canonical) does not get around
// the trailers' rules, nor a declared trailer name that is no token cost
// the replica a 500 (found by a tester: "x-forwarded-for : 8.8.8.8" and
// "Host : evil" reached the replica; "Trailer: X A" was a replica
// failure).
func TestUpstreamRequestTrailersNotTokens(t *testing.T) {
	leakCheck(t)
	got := make(chan http.Header, 1)
	backend := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.Trailer
	})
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	front, _, _ := frontend(t, u)
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nTrailer: X-T, X A\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"5\r\nhello\r\n0\r\nX-T: ok\r\nx-forwarded-for : 8.8.8.8\r\nHost : evil\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", res.StatusCode)
	}
	if tr := <-got; len(tr) != 1 || tr.Get("X-T") != "ok" {
		t.Fatalf("the replica saw request trailers %q, want X-T: ok alone", tr)
	}
}

// A header value's Unicode spaces reach the replica: only spaces and tabs
// are trimmed, as net/http trims (a tester's no-break spaces were cut).
func TestUpstreamKeepsUnicodeSpacesInValues(t *testing.T) {
	leakCheck(t)
	u := newUpstream(t, echoBackend(t).URL, UpstreamOptions{})
	r := httptest.NewRequest(http.MethodGet, "http://front.test/", nil)
	r.RemoteAddr = "192.0.2.7:1234"
	r.Header.Set("X-A", "\u00a0foo\u00a0")
	r.Header.Set("X-C", "\u3000v")
	w := newSpy()
	if err := serveOnce(t, u, w, r); err != nil {
		t.Fatal(err)
	}
	e := decodeEcho(t, w.body.Bytes())
	if got := e.Header["X-A"]; len(got) != 1 || got[0] != "\u00a0foo\u00a0" {
		t.Errorf("X-A = %q, want it as sent", got)
	}
	if got := e.Header["X-C"]; len(got) != 1 || got[0] != "\u3000v" {
		t.Errorf("X-C = %q, want it as sent", got)
	}
}

// A request whose body comes late has its head sent on at once, not held
// for the body's first part: a replica's header timeout (Go's
// ReadHeaderTimeout) must not run out on a request it was never sent. A
// tester's POST whose body came 3 s after its head was a 502 ("broke before
// it answered") from a server with a 2 s ReadHeaderTimeout.
func TestUpstreamHeadGoesOnBeforeALateBody(t *testing.T) {
	leakCheck(t)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	}))
	backend.Config.ReadHeaderTimeout = 300 * time.Millisecond
	backend.Start()
	t.Cleanup(backend.Close)
	u := newUpstream(t, backend.URL, UpstreamOptions{})
	front, _, _ := frontend(t, u)
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
	time.Sleep(800 * time.Millisecond)
	_, _ = io.WriteString(c, "hello")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(body) != "hello" {
		t.Fatalf("a body 800 ms after its head, to a replica with a 300 ms header timeout: %d %q, want 200 \"hello\"", res.StatusCode, body)
	}
}

// A small answer (read whole before it goes on) that its replica stops
// sending partway is a 504 at the replica timeout, as a late head is:
// nothing had gone to the client. A tester's request held its slot, and
// its client, 30 s and more with replica_timeout_s 3. A whole one leaves
// its connection to be used again, with no deadline left on it.
func TestUpstreamSmallAnswerStalledIs504(t *testing.T) {
	leakCheck(t)
	const timeout = 300 * time.Millisecond
	stalled, _ := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
	u := newUpstream(t, stalled, UpstreamOptions{Transport: newClient(t, TransportOptions{ResponseHeaderTimeout: timeout})})
	w := newSpy()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds the test, not the proxy
	defer cancel()
	err := serveOnce(t, u, w, httptest.NewRequest(http.MethodGet, "http://front.test/", nil).WithContext(ctx))
	if _, ok := errors.AsType[*TimeoutError](err); !ok || w.code != 0 {
		t.Fatalf("an answer stalled partway: %v after %v (status written %d), want a TimeoutError with nothing written", err, time.Since(start), w.code)
	}

	whole, conns := countingServer(t, false, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
	u = newUpstream(t, whole, UpstreamOptions{Transport: newClient(t, TransportOptions{ResponseHeaderTimeout: timeout})})
	for i := range 2 {
		if i == 1 {
			time.Sleep(2 * timeout) // past a deadline left on the connection
		}
		w := newSpy()
		if err := serveOnce(t, u, w, httptest.NewRequest(http.MethodGet, "http://front.test/", nil)); err != nil || w.body.String() != "hi" {
			t.Fatalf("request %d: %v %q, want hi", i+1, err, w.body.String())
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for two requests, want the first one used again", n)
	}
}
