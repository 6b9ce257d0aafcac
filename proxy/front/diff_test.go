package front_test

// Differential tests: every case runs one handler under a front.Server and
// under a net/http *http.Server (both on 127.0.0.1:0), sends both the same
// raw request bytes over a raw TCP connection, and compares the raw answers
// byte for byte (the Date header's value aside), the end state of the
// connection (closed by the server, or left open), and what the handler
// observed (notes it records: the request as it saw it, the errors its
// calls returned).
//
// The behavioural tests after them check what a byte comparison cannot:
// context cancellation when the client leaves, aborting panics, Hijack,
// Flush streaming, 1xx sent at once, deadlines, Shutdown and Close. They run
// against both servers too: net/http's run checks the test itself.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/serveproxy/serveproxy/proxy/front"
)

// ---------------------------------------------------------------------------
// Servers under test

const (
	dialTimeout     = 3 * time.Second
	exchangeTimeout = 5 * time.Second        // bounds a whole raw exchange
	shortProbe      = 150 * time.Millisecond // how long an open connection is watched for stray bytes
	closeWait       = 3 * time.Second        // how long a connection expected to close is given
	handlerWait     = 5 * time.Second        // how long handlers are given to return
)

// serverConfig is the settings both servers of a case get.
type serverConfig struct {
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
}

// running is a server serving on a listener of its own.
type running struct {
	addr     string
	shutdown func(context.Context) error
	close    func() error
	log      *syncBuffer

	served   chan error // gets Serve's result
	serveErr error
	serveOK  bool
}

// serveResult waits up to d for Serve to return; ok is false if it did not.
func (rs *running) serveResult(d time.Duration) (err error, ok bool) {
	if rs.serveOK {
		return rs.serveErr, true
	}
	select {
	case err := <-rs.served:
		rs.serveErr, rs.serveOK = err, true
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

type impl struct {
	name  string
	start func(t *testing.T, h http.Handler, cfg serverConfig) *running
}

// impls are the servers the behavioural tests run against: the one under
// test, and net/http's as the reference that checks the test.
var impls = []impl{{"front", startFront}, {"net_http", startStd}}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return ln
}

func startFront(t *testing.T, h http.Handler, cfg serverConfig) *running {
	t.Helper()
	ln := listen(t)
	lb := &syncBuffer{}
	s := &front.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          log.New(lb, "", 0),
	}
	return serve(t, ln, s.Serve, s.Shutdown, s.Close, lb)
}

func startStd(t *testing.T, h http.Handler, cfg serverConfig) *running {
	t.Helper()
	ln := listen(t)
	lb := &syncBuffer{}
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          log.New(lb, "", 0),
	}
	return serve(t, ln, s.Serve, s.Shutdown, s.Close, lb)
}

func serve(t *testing.T, ln net.Listener, serveFn func(net.Listener) error,
	shutdown func(context.Context) error, closeFn func() error, lb *syncBuffer) *running {
	rs := &running{addr: ln.Addr().String(), shutdown: shutdown, close: closeFn, log: lb, served: make(chan error, 1)}
	go func() { rs.served <- serveFn(ln) }()
	t.Cleanup(func() {
		closeFn()
		err, ok := rs.serveResult(5 * time.Second)
		if !ok {
			t.Errorf("Serve did not return within 5s of Close")
		} else if !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v after Close, want http.ErrServerClosed", err)
		}
	})
	return rs
}

// syncBuffer is a bytes.Buffer safe for concurrent use (a server's log).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// ---------------------------------------------------------------------------
// Handlers and what they observe

// notes is what a case's handler records (errors its calls returned, what
// it saw), compared between the two servers; it also counts the handler's
// runs.
type notes struct {
	mu       sync.Mutex
	lines    []string
	started  atomic.Int32
	finished atomic.Int32
}

func (n *notes) add(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lines = append(n.lines, fmt.Sprintf(format, args...))
}

func (n *notes) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("handler runs: %d\n", n.started.Load()) + strings.Join(n.lines, "\n")
}

// wait waits (bounded) until every handler run that started has returned.
func (n *notes) wait() bool {
	deadline := time.Now().Add(handlerWait)
	for n.finished.Load() != n.started.Load() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// caseHandler is a case's handler; it records what it observes in n.
type caseHandler func(w http.ResponseWriter, r *http.Request, n *notes)

func instrument(h caseHandler, n *notes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.started.Add(1)
		defer n.finished.Add(1)
		h(w, r, n)
	})
}

// echo answers with what the handler sees of the request, so the request
// side is compared too.
func echo(w http.ResponseWriter, r *http.Request, _ *notes) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, describeRequest(r))
}

func describeRequest(r *http.Request) string {
	var b strings.Builder
	body, err := io.ReadAll(r.Body)
	fmt.Fprintf(&b, "Method=%q RequestURI=%q Proto=%q %d.%d\n", r.Method, r.RequestURI, r.Proto, r.ProtoMajor, r.ProtoMinor)
	fmt.Fprintf(&b, "URL=%q Path=%q RawPath=%q RawQuery=%q ForceQuery=%v Scheme=%q URLHost=%q Opaque=%q\n",
		r.URL.String(), r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.URL.ForceQuery, r.URL.Scheme, r.URL.Host, r.URL.Opaque)
	fmt.Fprintf(&b, "Host=%q ContentLength=%d Close=%v TransferEncoding=%q\n", r.Host, r.ContentLength, r.Close, r.TransferEncoding)
	fmt.Fprintf(&b, "Body=%q BodyErr=%v BodyIsNoBody=%v GetBodyNil=%v TLSNil=%v FormNil=%v Pattern=%q\n",
		body, err, r.Body == http.NoBody, r.GetBody == nil, r.TLS == nil, r.Form == nil, r.Pattern)
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	fmt.Fprintf(&b, "RemoteHost=%q\n", host)
	la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	laHost := ""
	if la != nil {
		laHost, _, _ = net.SplitHostPort(la.String())
	}
	fmt.Fprintf(&b, "LocalAddrContextKey=%T %q ServerContextKey=%T CtxErr=%v\n",
		r.Context().Value(http.LocalAddrContextKey), laHost, r.Context().Value(http.ServerContextKey), r.Context().Err())
	writeHeader(&b, "H", r.Header)
	writeHeader(&b, "T", r.Trailer)
	return b.String()
}

func writeHeader(b *strings.Builder, prefix string, h http.Header) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "%s %q=%q\n", prefix, k, h[k])
	}
}

// slowFor is echo, after a pause of d for path.
func slowFor(path string, d time.Duration) caseHandler {
	return func(w http.ResponseWriter, r *http.Request, n *notes) {
		if r.URL.Path == path {
			time.Sleep(d)
		}
		echo(w, r, n)
	}
}

// text answers with a fixed body and Content-Type.
func text(body string) caseHandler {
	return func(w http.ResponseWriter, r *http.Request, _ *notes) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, body)
	}
}

// writes writes each of parts with a separate Write, leaving Content-Type
// to sniffing, and records the results of the Writes that failed.
func writes(parts ...string) caseHandler {
	return func(w http.ResponseWriter, r *http.Request, n *notes) {
		for i, p := range parts {
			if k, err := w.Write([]byte(p)); err != nil || k != len(p) {
				n.add("write %d: n=%d err=%v", i, k, err)
			}
		}
	}
}

func flush(w http.ResponseWriter, n *notes) {
	if err := http.NewResponseController(w).Flush(); err != nil {
		n.add("flush: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Raw requests

// get is a GET request for target with Host example.com and extra header
// lines.
func get(target string, headers ...string) string { return reqOf("GET", target, headers...) }

func reqOf(method, target string, headers ...string) string {
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: example.com\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

func repeated(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func manyHeaders(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("X-H%03d: value %d", i, i)
	}
	return out
}

// paddedGet is a GET of / whose head is exactly n bytes long.
func paddedGet(n int) string {
	base := get("/", "X-Pad: ")
	pad := n - len(base)
	if pad < 0 {
		panic("paddedGet: too short")
	}
	return get("/", "X-Pad: "+strings.Repeat("p", pad))
}

// ---------------------------------------------------------------------------
// Raw exchange

// exchangeResult is what a client saw of a raw exchange: the bytes
// received, and how it ended.
type exchangeResult struct {
	raw []byte
	end string
}

type recordingReader struct {
	r   io.Reader
	buf bytes.Buffer
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	rr.buf.Write(p[:n])
	return n, err
}

// exchangeSpec is what a raw exchange sends and expects.
type exchangeSpec struct {
	parts     []string      // written one after the other, with a short pause between
	methods   []string      // the request method of each response expected
	waitClose bool          // the server is expected to close the connection
	probe     time.Duration // if not 0, how long an open connection is watched after the responses
	halfClose bool          // the client shuts its side down (CloseWrite) after writing
}

// exchange sends spec's request bytes to addr and reads the responses,
// bounded by exchangeTimeout: each response until its framing ends (or the
// connection ends), then what else comes within a short probe (or, if the
// connection is expected to close, until it closes).
func exchange(addr string, spec exchangeSpec) exchangeResult {
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return exchangeResult{end: "dial: " + err.Error()}
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(exchangeTimeout))
	rec := &recordingReader{r: conn}
	br := bufio.NewReaderSize(rec, 64<<10)
	result := func(end string) exchangeResult {
		return exchangeResult{raw: bytes.Clone(rec.buf.Bytes()), end: end}
	}
	for i, p := range spec.parts {
		if i > 0 {
			time.Sleep(30 * time.Millisecond) // lets the server see the parts apart
		}
		if _, err := io.WriteString(conn, p); err != nil {
			return result(fmt.Sprintf("writing part %d: %s", i, errClass(err)))
		}
	}
	if spec.halfClose {
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			return result("CloseWrite: " + errClass(err))
		}
	}
	closing := spec.waitClose
	for i, m := range spec.methods {
		info, err := readResponse(br, m, io.Discard)
		if err != nil {
			return result(fmt.Sprintf("response %d: %s", i+1, errClass(err)))
		}
		closing = closing || info.close
		if info.untilEOF {
			closing = true
			break
		}
	}
	probe := shortProbe
	if spec.probe != 0 {
		probe = spec.probe
	}
	if closing {
		probe = closeWait
	}
	conn.SetReadDeadline(time.Now().Add(probe))
	_, err = io.Copy(io.Discard, br)
	if err == nil {
		return result("closed by server")
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return result(fmt.Sprintf("open (no close within %v)", probe))
	}
	return result("after the responses: " + errClass(err))
}

// errClass describes err without the addresses in it.
func errClass(err error) string {
	var ne net.Error
	switch {
	case err == io.EOF:
		return "EOF"
	case err == io.ErrUnexpectedEOF:
		return "unexpected EOF"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	var pe *parseError
	if errors.As(err, &pe) {
		return pe.msg + ": " + errClass(pe.err)
	}
	return err.Error()
}

type parseError struct {
	msg string
	err error
}

func (e *parseError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *parseError) Unwrap() error { return e.err }

type respInfo struct {
	close    bool // Connection: close
	untilEOF bool // body delimited by the connection's end
}

// readResponse reads one response (and the 1xx before it) to a request of
// method from br, by its framing, writing a form of it without chunk sizes
// to canon. A body delimited by the connection's end is left to the caller.
func readResponse(br *bufio.Reader, method string, canon io.Writer) (respInfo, error) {
	var info respInfo
	readLine := func(what string) (string, error) {
		line, err := br.ReadString('\n')
		io.WriteString(canon, line)
		if err != nil {
			if err == io.EOF && line != "" {
				err = io.ErrUnexpectedEOF
			}
			return line, &parseError{what, err}
		}
		return line, nil
	}
	for {
		line, err := readLine("status line")
		if err != nil {
			return info, err
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return info, &parseError{"status line", fmt.Errorf("malformed %q", line)}
		}
		code, err := strconv.Atoi(f[1])
		if err != nil {
			return info, &parseError{"status line", fmt.Errorf("malformed %q", line)}
		}
		cl, chunked := int64(-1), false
		for {
			line, err := readLine("header")
			if err != nil {
				return info, err
			}
			if line == "\r\n" || line == "\n" {
				break
			}
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(k)) {
			case "Content-Length":
				cl, _ = strconv.ParseInt(v, 10, 64)
			case "Transfer-Encoding":
				chunked = strings.Contains(strings.ToLower(v), "chunked")
			case "Connection":
				for _, tok := range strings.Split(v, ",") {
					if strings.EqualFold(strings.TrimSpace(tok), "close") {
						info.close = true
					}
				}
			}
		}
		if code >= 100 && code < 200 && code != 101 {
			continue // informational; the response follows
		}
		if method == "HEAD" || code == 204 || code == 304 || code == 101 {
			return info, nil
		}
		switch {
		case chunked:
			io.WriteString(canon, "[chunked body]\n")
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return info, &parseError{"chunk size", err}
				}
				sz, _, _ := strings.Cut(strings.TrimSpace(line), ";")
				size, err := strconv.ParseInt(sz, 16, 64)
				if err != nil {
					return info, &parseError{"chunk size", fmt.Errorf("malformed %q", line)}
				}
				if size == 0 {
					io.WriteString(canon, "\n[trailer]\n")
					for {
						line, err := readLine("trailer")
						if err != nil {
							return info, err
						}
						if line == "\r\n" || line == "\n" {
							return info, nil
						}
					}
				}
				if _, err := io.CopyN(canon, br, size); err != nil {
					return info, &parseError{"chunk data", err}
				}
				crlf, err := br.ReadString('\n')
				if err != nil {
					return info, &parseError{"chunk end", err}
				}
				if crlf != "\r\n" {
					return info, &parseError{"chunk end", fmt.Errorf("malformed %q", crlf)}
				}
			}
		case cl >= 0:
			if _, err := io.CopyN(canon, br, cl); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return info, &parseError{"body", err}
			}
			return info, nil
		default:
			info.untilEOF = true
			return info, nil
		}
	}
}

// canonical is raw without chunk sizes, if it parses as responses to
// methods; else raw.
func canonical(raw string, methods []string) string {
	br := bufio.NewReader(strings.NewReader(raw))
	var b strings.Builder
	for _, m := range methods {
		info, err := readResponse(br, m, &b)
		if err != nil || info.untilEOF {
			break
		}
	}
	io.Copy(&b, br)
	return b.String()
}

// Set FRONT_DIFF_SHOW=1 to log every differential exchange, not only the
// failed ones.

var dateRE = regexp.MustCompile(`(?mi)^Date: [^\r\n]*`)

// normalize replaces the Date headers' values.
func normalize(raw []byte) string {
	return dateRE.ReplaceAllString(string(raw), "Date: <DATE>")
}

// diffReport shows where want and got first differ, line by line.
func diffReport(wantName, want, gotName, got string) string {
	wl, gl := splitLines(want), splitLines(got)
	i := 0
	for i < len(wl) && i < len(gl) && wl[i] == gl[i] {
		i++
	}
	byteAt := 0
	for _, l := range wl[:i] {
		byteAt += len(l)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "first difference at line %d (byte %d); %s sent %d bytes, %s sent %d\n",
		i+1, byteAt, wantName, len(want), gotName, len(got))
	show := func(name string, lines []string) {
		fmt.Fprintf(&b, "  %s:\n", name)
		from, to := max(i-4, 0), min(i+8, len(lines))
		if from > 0 {
			fmt.Fprintf(&b, "        ... (%d lines)\n", from)
		}
		for j := from; j < to; j++ {
			mark := " "
			if j == i {
				mark = ">"
			}
			fmt.Fprintf(&b, "    %s%3d %s\n", mark, j+1, quoteTrunc(lines[j]))
		}
		if to < len(lines) {
			fmt.Fprintf(&b, "        ... (%d more lines)\n", len(lines)-to)
		}
		if i >= len(lines) {
			fmt.Fprintf(&b, "    >    (end)\n")
		}
	}
	show(wantName, wl)
	show(gotName, gl)
	return b.String()
}

func splitLines(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

func quoteTrunc(s string) string {
	const max = 160
	if len(s) > max {
		return strconv.Quote(s[:max]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
}

// ---------------------------------------------------------------------------
// Differential cases

// diffCase is one differential case.
type diffCase struct {
	name      string
	req       string      // raw request bytes, written at once
	parts     []string    // or: written one after another, with a short pause
	methods   []string    // method of each response expected; default: req's first word
	handler   caseHandler // default: echo
	cfg       serverConfig
	waitClose bool          // the server is expected to close the connection (without saying so)
	probe     time.Duration // if not 0, how long an open connection is watched after the responses
	halfClose bool          // the client shuts its side down (CloseWrite) after writing
	// chunksMayDiffer accepts answers that differ only in chunk sizes:
	// the lean path has no io.ReaderFrom, with which net/http copies in
	// chunks of its own sizes.
	chunksMayDiffer bool
}

func (c diffCase) spec() exchangeSpec {
	s := exchangeSpec{parts: c.parts, methods: c.methods, waitClose: c.waitClose, probe: c.probe, halfClose: c.halfClose}
	if s.parts == nil {
		s.parts = []string{c.req}
	}
	all := strings.Join(s.parts, "")
	if s.methods == nil {
		m, _, _ := strings.Cut(all, " ")
		s.methods = []string{m}
	}
	// An HTTP/1.0 request without keep-alive is answered and closed with
	// no Connection header.
	if strings.Contains(all, "HTTP/1.0\r\n") && !strings.Contains(strings.ToLower(all), "keep-alive") {
		s.waitClose = true
	}
	return s
}

// runDiff runs c against both servers and reports differences.
func runDiff(t *testing.T, c diffCase) {
	t.Helper()
	h := c.handler
	if h == nil {
		h = echo
	}
	var fn, sn notes
	fs := startFront(t, instrument(h, &fn), c.cfg)
	ss := startStd(t, instrument(h, &sn), c.cfg)
	spec := c.spec()
	var fr, sr exchangeResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); fr = exchange(fs.addr, spec) }()
	go func() { defer wg.Done(); sr = exchange(ss.addr, spec) }()
	wg.Wait()
	if !fn.wait() {
		t.Errorf("front: a handler did not return within %v", handlerWait)
	}
	if !sn.wait() {
		t.Errorf("net/http: a handler did not return within %v", handlerWait)
	}

	failed := false
	want, got := normalize(sr.raw), normalize(fr.raw)
	if want != got {
		failed = true
		msg := diffReport("net/http", want, "front", got)
		if canonical(want, spec.methods) == canonical(got, spec.methods) {
			failed = !c.chunksMayDiffer
			msg = "(they differ only in chunk sizes)\n" + msg
		}
		if failed {
			t.Errorf("responses differ:\n%s", msg)
		}
	}
	if sr.end != fr.end {
		failed = true
		t.Errorf("connection end differs:\n  net/http: %s\n  front:    %s", sr.end, fr.end)
	}
	if wn, gn := sn.String(), fn.String(); wn != gn {
		failed = true
		t.Errorf("handler observations differ:\n%s", diffReport("net/http", wn, "front", gn))
	}
	if failed || os.Getenv("FRONT_DIFF_SHOW") != "" {
		t.Logf("request: %q", strings.Join(spec.parts, ""))
		t.Logf("net/http sent (%s):\n%s", sr.end, quoteTrunc(want))
		t.Logf("front sent (%s):\n%s", fr.end, quoteTrunc(got))
		if l := ss.log.String(); l != "" {
			t.Logf("net/http log:\n%s", l)
		}
		if l := fs.log.String(); l != "" {
			t.Logf("front log:\n%s", l)
		}
	}
}

func runDiffCases(t *testing.T, cases []diffCase) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cases {
		if seen[c.name] {
			t.Fatalf("duplicate case name %q", c.name)
		}
		seen[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runDiff(t, c)
		})
	}
}

// TestDiffResponses compares what a handler's calls on the ResponseWriter
// put on the wire: status lines, headers (sniffed Content-Type, framing
// headers, suppressed headers), Content-Length versus chunked framing
// around the 2048-byte buffer, Flush, HEAD, 204/304/1xx, http.Error,
// superfluous WriteHeader, Write errors (recorded by the handler),
// trailers, 103 Early Hints, io.Copy/ReadFrom, and header sanitising.
func TestDiffResponses(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 100000/16)
	file := filepath.Join(t.TempDir(), "body.txt")
	if err := os.WriteFile(file, []byte(strings.Repeat("file body ", 3000)), 0o644); err != nil {
		t.Fatal(err)
	}
	root := get("/")
	cases := []diffCase{
		{name: "plain_200_hi", req: root, handler: text("hi")},
		{name: "sniff_html", req: root, handler: writes("<html><body>hi</body></html>")},
		{name: "sniff_text", req: root, handler: writes("hello, world")},
		{name: "sniff_binary", req: root, handler: writes("\x00\x01\x02\x03")},
		{name: "sniff_across_writes", req: root, handler: writes("<ht", "ml><body>x</body></html>")},
		{name: "content_type_nil_not_sniffed", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header()["Content-Type"] = nil
			io.WriteString(w, "<html>no type</html>")
		}},
		{name: "empty_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {}},
		{name: "writeheader_200_empty", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(200)
		}},
		{name: "write_nil", req: root, handler: writes("")},
		{name: "handler_content_length", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		}},
		{name: "handler_content_length_big", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			io.WriteString(w, big)
		}},
		{name: "body_2048", req: root, handler: writes(big[:2048])},
		{name: "body_2049", req: root, handler: writes(big[:2049])},
		{name: "body_2048_then_1", req: root, handler: writes(big[:2048], "x")},
		{name: "body_100000", req: root, handler: writes(big)},
		{name: "body_100000_in_1000_writes", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			for i := 0; i < 1000; i++ {
				io.WriteString(w, big[i*100:(i+1)*100])
			}
		}},
		{name: "io_copy_string_reader", req: root, chunksMayDiffer: true, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			k, err := io.Copy(w, strings.NewReader(big[:10000]))
			n.add("io.Copy: %d %v", k, err)
		}},
		{name: "io_copy_file_with_content_length", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			f, err := os.Open(file)
			if err != nil {
				n.add("open: %v", err)
				return
			}
			defer f.Close()
			w.Header().Set("Content-Length", "30000")
			k, err := io.Copy(w, f)
			n.add("io.Copy: %d %v", k, err)
		}},
		{name: "io_copy_file_chunked", req: root, chunksMayDiffer: true, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			f, err := os.Open(file)
			if err != nil {
				n.add("open: %v", err)
				return
			}
			defer f.Close()
			k, err := io.Copy(w, f)
			n.add("io.Copy: %d %v", k, err)
		}},
		{name: "io_writestring", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			k, err := io.WriteString(w, "via WriteString")
			n.add("WriteString: %d %v", k, err)
		}},
		{name: "flush_mid_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "part one;")
			flush(w, n)
			io.WriteString(w, "part two")
		}},
		{name: "flush_no_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			flush(w, n)
		}},
		{name: "flush_then_html_not_sniffed", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			flush(w, n)
			io.WriteString(w, "<html></html>")
		}},
		{name: "flush_with_content_length", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "01234")
			flush(w, n)
			io.WriteString(w, "56789")
		}},
		{name: "flusher_interface", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			io.WriteString(w, "b")
		}},
		{name: "head_no_body", req: reqOf("HEAD", "/"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Type", "text/plain")
		}},
		{name: "head_with_body", req: reqOf("HEAD", "/"), handler: writes("hello")},
		{name: "head_with_big_body", req: reqOf("HEAD", "/"), handler: writes(big[:5000])},
		{name: "head_with_content_length", req: reqOf("HEAD", "/"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "1234")
		}},
		{name: "head_flush", req: reqOf("HEAD", "/"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "x")
			flush(w, n)
			io.WriteString(w, "y")
		}},
		{name: "status_204", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Length", "10")
			w.Header().Set("X-Kept", "yes")
			w.WriteHeader(204)
		}},
		{name: "status_204_write_error", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(http.StatusNoContent)
			k, err := io.WriteString(w, "not allowed")
			n.add("write after 204: n=%d err=%v is ErrBodyNotAllowed=%v", k, err, errors.Is(err, http.ErrBodyNotAllowed))
		}},
		{name: "status_304_suppressed_headers", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Length", "10")
			w.Header().Set("Transfer-Encoding", "chunked")
			w.Header().Set("Etag", `"abc"`)
			w.Header().Set("Cache-Control", "max-age=60")
			w.WriteHeader(http.StatusNotModified)
			k, err := io.WriteString(w, "x")
			n.add("write after 304: n=%d err=%v", k, err)
		}},
		{name: "status_404_http_error", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			http.Error(w, "no such thing", http.StatusNotFound)
		}},
		{name: "http_error_clears_headers", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "100")
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Type", "image/png")
			w.Header().Set("X-Other", "kept")
			http.Error(w, "failed", http.StatusInternalServerError)
		}},
		{name: "status_201_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "created")
		}},
		{name: "status_599_unknown_text", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(599)
		}},
		{name: "status_500_empty", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(500)
		}},
		{name: "writeheader_twice", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(http.StatusAccepted)
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "accepted")
		}},
		{name: "write_then_writeheader", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "body first")
			w.WriteHeader(http.StatusTeapot)
		}},
		{name: "headers_after_writeheader_ignored", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(200)
			w.Header().Set("X-After", "ignored")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "{}")
		}},
		{name: "content_length_exceeded", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "3")
			k, err := io.WriteString(w, "hello")
			n.add("write: n=%d err=%v is ErrContentLength=%v", k, err, errors.Is(err, http.ErrContentLength))
		}},
		{name: "content_length_exceeded_second_write", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "3")
			k, err := io.WriteString(w, "he")
			n.add("write 1: n=%d err=%v", k, err)
			k, err = io.WriteString(w, "llo")
			n.add("write 2: n=%d err=%v is ErrContentLength=%v", k, err, errors.Is(err, http.ErrContentLength))
		}},
		{name: "content_length_short_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "12345")
		}},
		{name: "content_length_invalid", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "abc")
			io.WriteString(w, "hello")
		}},
		{name: "handler_transfer_encoding_chunked", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Transfer-Encoding", "chunked")
			io.WriteString(w, "hello")
		}},
		{name: "multi_valued_header", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Add("X-Multi", "a")
			w.Header().Add("X-Multi", "b")
			w.Header().Add("Set-Cookie", "a=1")
			w.Header().Add("Set-Cookie", "b=2")
			w.Header()["x-raw-lower"] = []string{"kept as is"}
			w.Header().Set("X-Empty", "")
			io.WriteString(w, "ok")
		}},
		{name: "header_value_with_newlines", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("X-Bad", "a\r\nInjected: b")
			w.Header().Set("X-Lf", "c\nd")
			io.WriteString(w, "ok")
		}},
		{name: "header_values_padded", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header()["X-Pad"] = []string{" \t padded \t ", "\tb", "c ", " "}
			w.Header()["X-Cr"] = []string{"\r lead", "trail \n"}
			io.WriteString(w, "ok")
		}},
		{name: "invalid_header_name", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header()["X Bad Name"] = []string{"v"}
			w.Header()["X-Colon:"] = []string{"v"}
			io.WriteString(w, "ok")
		}},
		{name: "date_removed", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header()["Date"] = nil
			io.WriteString(w, "no date")
		}},
		{name: "date_set_by_handler", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
			io.WriteString(w, "own date")
		}},
		{name: "trailer_declared", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Trailer", "X-T1, X-T2")
			w.Header().Add("Trailer", "X-T3")
			io.WriteString(w, "body")
			w.Header().Set("X-T1", "v1")
			w.Header().Set("X-T2", "v2")
			// X-T3 left unset.
		}},
		{name: "trailer_declared_no_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Trailer", "X-T")
			w.Header().Set("X-T", "v")
		}},
		{name: "trailer_declared_with_content_length", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Trailer", "X-T")
			w.Header().Set("Content-Length", "4")
			io.WriteString(w, "body")
			w.Header().Set("X-T", "v")
		}},
		{name: "trailer_prefix", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "body")
			w.Header().Set(http.TrailerPrefix+"X-Late", "late")
			w.Header().Set(http.TrailerPrefix+"x-lower", "lower")
		}},
		{name: "trailer_prefix_after_flush", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			io.WriteString(w, "body")
			flush(w, n)
			w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		}},
		{name: "trailer_prefix_no_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		}},
		{name: "trailer_declared_and_prefix", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Trailer", "X-Declared")
			io.WriteString(w, "body")
			w.Header().Set("X-Declared", "d")
			w.Header().Set(http.TrailerPrefix+"X-Prefixed", "p")
		}},
		{name: "early_hints_103", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Link", "</style.css>; rel=preload; as=style")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "final")
		}},
		{name: "early_hints_twice_then_204", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Link", "</a.js>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Add("Link", "</b.js>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusNoContent)
		}},
		{name: "response_controller_calls", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			rc := http.NewResponseController(w)
			n.add("SetReadDeadline: %v", rc.SetReadDeadline(time.Now().Add(time.Minute)))
			n.add("SetWriteDeadline: %v", rc.SetWriteDeadline(time.Now().Add(time.Minute)))
			n.add("EnableFullDuplex: %v", rc.EnableFullDuplex())
			io.WriteString(w, "rc")
			n.add("Flush: %v", rc.Flush())
			n.add("SetReadDeadline zero: %v", rc.SetReadDeadline(time.Time{}))
			n.add("SetWriteDeadline zero: %v", rc.SetWriteDeadline(time.Time{}))
		}},
		{name: "writer_interfaces", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			_, fl := w.(http.Flusher)
			_, hj := w.(http.Hijacker)
			// Not io.ReaderFrom: net/http's is its sendfile path for
			// files, which the lean path leaves out (io.Copy works the
			// same without it, in other chunk sizes).
			_, sw := w.(io.StringWriter)
			//lint:ignore SA1019 net/http's writer has it, so handlers may look for it
			_, cn := w.(http.CloseNotifier)
			n.add("Flusher=%v Hijacker=%v StringWriter=%v CloseNotifier=%v", fl, hj, sw, cn)
		}},
		// From a review: a Content-Length beside Transfer-Encoding still
		// bounds the writes; an invalid one is sent on a HEAD; "close"
		// found among spaces; a large WriteString cut as bufio cuts it.
		{name: "content_length_and_te_chunked_overflow", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "5")
			w.Header().Set("Transfer-Encoding", "chunked")
			k, err := io.WriteString(w, "0123456789")
			n.add("write: n=%d err=%v", k, err)
		}},
		{name: "head_invalid_content_length", req: reqOf("HEAD", "/"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Content-Length", "abc")
			_, _ = io.WriteString(w, "hello")
		}},
		{name: "connection_close_among_spaces", req: get("/", "Connection: close"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Connection", "foo close")
			_, _ = io.WriteString(w, "x")
		}},
		{name: "write_string_large_then_flush", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			_, _ = io.WriteString(w, strings.Repeat("s", 5000))
			w.(http.Flusher).Flush()
		}},
		{name: "status_100_explicit", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.WriteHeader(http.StatusContinue)
			io.WriteString(w, "after 100")
		}},
		{name: "status_101_without_hijack", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Upgrade", "nothing")
			w.WriteHeader(http.StatusSwitchingProtocols)
			k, err := io.WriteString(w, "x")
			n.add("write after 101: n=%d err=%v", k, err)
		}},
		{name: "big_response_headers", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			for i := 0; i < 60; i++ {
				w.Header().Set(fmt.Sprintf("X-Big-%02d", i), strings.Repeat("v", 200))
			}
			io.WriteString(w, "big head")
		}},
		{name: "connection_close_from_handler_big_body", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, big[:5000])
		}},
		{name: "read_body_of_get", req: root, handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			b := make([]byte, 10)
			k, err := r.Body.Read(b)
			n.add("read: n=%d err=%v", k, err)
			n.add("close: %v", r.Body.Close())
		}},
	}
	runDiffCases(t, cases)
}

// TestDiffRequests compares what the handler sees of plain requests the
// front serves itself (method, target forms, Host, duplicate and oddly
// cased headers, Pragma, Connection), and the answers to them.
func TestDiffRequests(t *testing.T) {
	cases := []diffCase{
		{name: "root", req: get("/")},
		{name: "query", req: get("/a/b?x=1&y=%20z&x=2")},
		{name: "escaped_path", req: get("/a%20b/%7Euser/c%2Fd")},
		{name: "double_slash", req: get("//double/slash")},
		{name: "dot_segments", req: get("/a/../b/./c")},
		{name: "force_query", req: get("/a?")},
		{name: "fragment", req: get("/a#frag")},
		{name: "bad_escape", req: get("/bad%zz")},
		{name: "utf8_path", req: get("/caf\xc3\xa9")},
		{name: "lowercase_method", req: reqOf("get", "/")},
		{name: "delete", req: reqOf("DELETE", "/thing/1")},
		{name: "custom_method", req: reqOf("PURGE", "/cache")},
		{name: "head", req: reqOf("HEAD", "/x")},
		{name: "pragma_no_cache", req: get("/", "Pragma: no-cache")},
		{name: "pragma_with_cache_control", req: get("/", "Pragma: no-cache", "Cache-Control: max-age=5")},
		{name: "duplicate_and_odd_case_headers", req: get("/",
			"X-Dup: a", "x-dup: b", "X-DUP: c",
			"x-custom-HEADER: v", "ACCEPT: */*", "x_under_score: u", "X-Empty:",
			"X-Spaces:    padded value  \t", "X-Tab:\ttabbed", "X-Utf8: caf\xc3\xa9",
			"Cookie: a=1", "Cookie: b=2", "User-Agent: test/1.0", "Accept-Encoding: gzip, br")},
		{name: "connection_keep_alive", req: get("/", "Connection: keep-alive")},
		{name: "connection_close_request", req: get("/", "Connection: close")},
		{name: "connection_close_mixed_case_tokens", req: get("/", "Connection: Keep-Alive, CLOSE")},
		{name: "connection_close_request_big_body", req: get("/", "Connection: close"),
			handler: writes(strings.Repeat("z", 5000))},
		{name: "connection_close_from_handler", req: get("/"), handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		}},
		{name: "connection_keep_alive_from_handler_on_close_request", req: get("/", "Connection: close"),
			handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
				w.Header().Set("Connection", "keep-alive")
				io.WriteString(w, "bye")
			}},
		{name: "host_with_port", req: "GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"},
		{name: "host_ipv6", req: "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"},
		{name: "host_not_first", req: "GET / HTTP/1.1\r\nAccept: */*\r\nhost: Example.COM\r\n\r\n"},
		{name: "long_target_handoff", req: get("/" + strings.Repeat("a", 5000))},
		{name: "pipelined_two", req: get("/1") + get("/2"), methods: []string{"GET", "GET"}},
		{name: "pipelined_head_in_middle", req: get("/1") + reqOf("HEAD", "/2") + get("/3"),
			methods: []string{"GET", "HEAD", "GET"}, handler: writes("same body")},
		{name: "pipelined_close_in_middle", req: get("/1") + get("/2", "Connection: close") + get("/3"),
			methods: []string{"GET", "GET"}},
		{name: "pipelined_slow_first", req: get("/slow") + get("/fast"), methods: []string{"GET", "GET"},
			handler: func(w http.ResponseWriter, r *http.Request, n *notes) {
				if r.URL.Path == "/slow" {
					time.Sleep(50 * time.Millisecond)
				}
				io.WriteString(w, r.URL.Path)
			}},
		{name: "pipelined_during_slow_handler", parts: []string{get("/slow"), get("/fast")}, methods: []string{"GET", "GET"},
			handler: slowFor("/slow", 150*time.Millisecond)},
		{name: "pipelined_post_during_slow_handler", methods: []string{"GET", "POST"}, handler: slowFor("/slow", 150*time.Millisecond),
			parts: []string{get("/slow"), "POST /2 HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n\r\nbody"}},
		{name: "pipelined_big_head_during_slow_handler", methods: []string{"GET", "GET"}, handler: slowFor("/slow", 150*time.Millisecond),
			parts: []string{get("/slow"), get("/big", "X-Big: "+strings.Repeat("b", 6000))}},
		{name: "pipelined_close_during_slow_handler", methods: []string{"GET", "GET"}, handler: slowFor("/slow", 150*time.Millisecond),
			parts: []string{get("/slow"), get("/2", "Connection: close")}},
		{name: "half_close_fast_handler", req: get("/"), handler: text("hi"), halfClose: true, waitClose: true},
		{name: "half_close_slow_handler", req: get("/slow"), handler: slowFor("/slow", 150*time.Millisecond), halfClose: true, waitClose: true},
		{name: "half_close_pipelined", req: get("/1") + get("/2"), methods: []string{"GET", "GET"}, handler: text("hi"), halfClose: true, waitClose: true},
		{name: "pipelined_then_post_handoff", req: get("/1") + "POST /2 HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n\r\nbody" + get("/3"),
			methods: []string{"GET", "POST", "GET"}},
		{name: "pipelined_post_then_get", req: "POST /1 HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n\r\nbody" + get("/2"),
			methods: []string{"POST", "GET"}},
		{name: "pipelined_then_bad", req: get("/1") + "GET /2 HTTP/1.1\r\nBad header\r\n\r\n",
			methods: []string{"GET", "GET"}},
		{name: "pipelined_100_over_4k", req: strings.Repeat(get("/p", "X-Pad: "+strings.Repeat("x", 100)), 100),
			methods: repeated("GET", 100), handler: text("p")},
		{name: "pipelined_straddling_4k", req: paddedGet(4000) + get("/second", "X-Pad: "+strings.Repeat("y", 150)),
			methods: []string{"GET", "GET"}, handler: text("s")},
		{name: "pipelined_then_big_head", req: get("/1") + get("/2", "X-Big: "+strings.Repeat("b", 6000)),
			methods: []string{"GET", "GET"}, handler: text("b")},
		{name: "many_headers", req: get("/", manyHeaders(100)...)},
		{name: "header_no_space", req: get("/", "X-NoSpace:v", "X-Trailing-Colon::")},
		{name: "non_token_header_name", req: get("/", "X-\xc3\x9cnicode: v")},
		{name: "question_mark_target", req: get("?a=1")},
		{name: "split_in_header_line", parts: []string{"GET /split HTTP/1.1\r\nHo", "st: example.com\r\nX-A: 1\r\n\r\n"}},
		{name: "split_between_cr_lf", parts: []string{"GET /split HTTP/1.1\r\nHost: example.com\r\n\r", "\n"}},
		{name: "split_pipelined", parts: []string{get("/1") + "GET /2 HT", "TP/1.1\r\nHost: example.com\r\n\r\n"},
			methods: []string{"GET", "GET"}},
		{name: "split_three_ways", parts: []string{"G", "ET / HTTP/1.1\r\n", "Host: example.com\r\n\r\n"}},
	}
	runDiffCases(t, cases)
}

// TestDiffHandoff compares requests the front hands to net/http (HTTP/1.0,
// bodies, Expect, Upgrade, malformed or oversized heads, ...): the answers
// must be net/http's to the byte.
func TestDiffHandoff(t *testing.T) {
	hdr10k := "X-Big: " + strings.Repeat("b", 10<<10)
	cases := []diffCase{
		{name: "http10", req: "GET /old HTTP/1.0\r\nHost: example.com\r\n\r\n"},
		{name: "http10_no_host", req: "GET /old HTTP/1.0\r\n\r\n"},
		{name: "http10_keep_alive", req: "GET /old HTTP/1.0\r\nHost: example.com\r\nConnection: keep-alive\r\n\r\n"},
		{name: "http10_big_body", req: "GET /old HTTP/1.0\r\nHost: example.com\r\n\r\n", handler: writes(strings.Repeat("y", 5000))},
		{name: "http12", req: "GET / HTTP/1.2\r\nHost: example.com\r\n\r\n"},
		{name: "http20", req: "GET / HTTP/2.0\r\nHost: example.com\r\n\r\n", waitClose: true},
		{name: "h2_preface", req: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", waitClose: true},
		{name: "post_with_body", req: "POST /submit HTTP/1.1\r\nHost: example.com\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world"},
		{name: "post_chunked", req: "POST /submit HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"},
		{name: "post_body_not_read", req: "POST /submit HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\nhello", handler: text("ignored")},
		{name: "expect_100_continue", req: "PUT /up HTTP/1.1\r\nHost: example.com\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\ndata"},
		{name: "expect_unknown", req: get("/", "Expect: something-else"), waitClose: true},
		{name: "get_content_length_0", req: get("/", "Content-Length: 0")},
		{name: "get_chunked_empty", req: get("/", "Transfer-Encoding: chunked") + "0\r\n\r\n"},
		{name: "te_and_cl", req: "POST / HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"},
		{name: "te_identity", req: get("/", "Transfer-Encoding: identity"), waitClose: true},
		{name: "upgrade_websocket_not_taken", req: get("/ws", "Connection: Upgrade", "Upgrade: websocket",
			"Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")},
		{name: "upgrade_h2c", req: get("/", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA")},
		{name: "missing_host", req: "GET / HTTP/1.1\r\n\r\n"},
		{name: "empty_host", req: "GET / HTTP/1.1\r\nHost:\r\n\r\n"},
		{name: "two_hosts", req: "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n"},
		{name: "bad_host", req: "GET / HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{name: "bad_header_line", req: get("/", "This is not a header")},
		{name: "space_before_colon", req: get("/", "X-Name : v")},
		{name: "space_in_header_name", req: get("/", "X Name: v")},
		{name: "obs_fold", req: get("/", "X-Folded: a", " b")},
		{name: "leading_space_first_header", req: "GET / HTTP/1.1\r\n Host: example.com\r\n\r\n"},
		{name: "nul_in_header_value", req: get("/", "X-Nul: a\x00b")},
		{name: "ctl_in_header_value", req: get("/", "X-Ctl: a\x01b")},
		{name: "header_10k", req: get("/", hdr10k)},
		{name: "absolute_form", req: get("http://other.example/abs?q=1")},
		{name: "absolute_form_https", req: get("https://other.example:8443/abs")},
		{name: "authority_form_get", req: get("example.com:443")},
		{name: "connect", req: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"},
		{name: "options_star", req: reqOf("OPTIONS", "*")},
		{name: "get_star", req: get("*")},
		{name: "bare_lf", req: "GET /lf HTTP/1.1\nHost: example.com\n\n"},
		{name: "bare_lf_final", req: "GET /lf HTTP/1.1\r\nHost: example.com\r\n\n"},
		{name: "invalid_method", req: reqOf("G(T", "/")},
		{name: "double_space_request_line", req: "GET  / HTTP/1.1\r\nHost: example.com\r\n\r\n"},
		{name: "trailing_space_request_line", req: "GET / HTTP/1.1 \r\nHost: example.com\r\n\r\n"},
		{name: "lowercase_proto", req: "GET / http/1.1\r\nHost: example.com\r\n\r\n"},
		{name: "leading_empty_line", req: "\r\n" + get("/")},
		{name: "no_proto", req: "GET /\r\nHost: example.com\r\n\r\n"},
		{name: "tab_in_request_line", req: "GET\t/ HTTP/1.1\r\nHost: example.com\r\n\r\n"},
		{name: "control_in_target", req: "GET /a\x7fb HTTP/1.1\r\nHost: example.com\r\n\r\n"},
		{name: "max_header_bytes_1_head_4096", req: paddedGet(4096), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1}},
		{name: "max_header_bytes_1_head_4097", req: paddedGet(4097), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1}},
		{name: "max_header_bytes_1_head_4098", req: paddedGet(4098), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1}},
		{name: "max_header_bytes_1_head_4200", req: paddedGet(4200), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1}},
		{name: "max_header_bytes_1024_head_6k", req: paddedGet(6 << 10), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1024}},
		{name: "max_header_bytes_1024_head_4000", req: paddedGet(4000), handler: text("ok"), cfg: serverConfig{MaxHeaderBytes: 1024}},
		{name: "read_header_timeout_partial_head", req: "GET / HTTP/1.1\r\nHost: example.com\r\n",
			cfg: serverConfig{ReadHeaderTimeout: 300 * time.Millisecond}, waitClose: true},
		{name: "read_header_timeout_after_request", req: get("/"),
			cfg: serverConfig{ReadHeaderTimeout: 300 * time.Millisecond}},
		{name: "read_header_timeout_not_idle_timeout", req: get("/"), handler: text("kept"),
			cfg: serverConfig{ReadHeaderTimeout: 200 * time.Millisecond}, probe: 700 * time.Millisecond},
		{name: "read_header_timeout_partial_second_head", req: get("/") + "GET /2 HTTP/1.1\r\n", handler: text("first"),
			cfg: serverConfig{ReadHeaderTimeout: 300 * time.Millisecond}, waitClose: true},
		{name: "idle_timeout_closes", req: get("/"), handler: text("idle"),
			cfg: serverConfig{IdleTimeout: 300 * time.Millisecond}, waitClose: true},
		{name: "garbage", req: "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", waitClose: true},
	}
	runDiffCases(t, cases)
}

// ---------------------------------------------------------------------------
// Behavioural tests

// rawClient is a raw TCP client with a deadline on everything it does.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawClient{t: t, conn: conn, br: bufio.NewReader(conn)}
}

func (c *rawClient) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// response reads one response to a request of method; it returns its raw
// bytes (as read by the framing) and the error that cut it short.
func (c *rawClient) response(method string) (string, respInfo, error) {
	var b strings.Builder
	c.conn.SetReadDeadline(time.Now().Add(closeWait))
	info, err := readResponse(c.br, method, &b)
	return b.String(), info, err
}

// closed reports whether the server closes the connection (EOF or reset,
// with no more bytes) within closeWait, and what else arrived.
func (c *rawClient) closed() (bool, string) {
	c.conn.SetReadDeadline(time.Now().Add(closeWait))
	extra, err := io.ReadAll(c.br)
	if err == nil || errors.Is(err, syscall.ECONNRESET) {
		return true, string(extra)
	}
	return false, fmt.Sprintf("%q then %s", extra, errClass(err))
}

func waitFor[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		panic("unreachable")
	}
}

// TestContextCancelledOnClientGone checks that a handler waiting on
// r.Context().Done() sees it cancelled within 2s of the client closing its
// connection, and that a client merely sending more (a pipelined request,
// at once or once the server watches the client) does not cancel it, and
// that request is then served.
func TestContextCancelledOnClientGone(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			type outcome struct {
				err   error
				cause error
				at    time.Time
			}
			started := make(chan string, 4)
			done := make(chan outcome, 4)
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- r.URL.RequestURI()
				wait := 5 * time.Second
				if r.URL.Path == "/pipelined" {
					wait = 400 * time.Millisecond
				}
				select {
				case <-r.Context().Done():
					done <- outcome{r.Context().Err(), context.Cause(r.Context()), time.Now()}
				case <-time.After(wait):
					done <- outcome{at: time.Now()}
				}
				io.WriteString(w, "late")
			}), serverConfig{})

			t.Run("client_closes", func(t *testing.T) {
				c := dialRaw(t, srv.addr)
				c.send(get("/wait"))
				waitFor(t, started, 5*time.Second, "the handler to start")
				closedAt := time.Now()
				c.conn.Close()
				o := waitFor(t, done, 6*time.Second, "the handler to return")
				if o.err == nil {
					t.Fatalf("request context not cancelled within %v of the client closing", o.at.Sub(closedAt))
				}
				if d := o.at.Sub(closedAt); d > 2*time.Second {
					t.Errorf("request context cancelled %v after the client closed, want within 2s", d)
				}
				if !errors.Is(o.err, context.Canceled) {
					t.Errorf("ctx.Err() = %v, want context.Canceled", o.err)
				}
				t.Logf("cancelled %v after close; cause: %v", o.at.Sub(closedAt), o.cause)
			})

			// A request pipelined while the handler runs, at once or once
			// the server watches the client, neither cancels the context
			// nor is lost.
			for _, delay := range []time.Duration{0, 100 * time.Millisecond} {
				t.Run(fmt.Sprintf("pipelined_after_%v_does_not_cancel", delay), func(t *testing.T) {
					c := dialRaw(t, srv.addr)
					c.send(get("/pipelined"))
					waitFor(t, started, 5*time.Second, "the handler to start")
					time.Sleep(delay) // lets the server start watching the client
					c.send(get("/pipelined?second"))
					o := waitFor(t, done, 6*time.Second, "the handler to return")
					if o.err != nil {
						t.Errorf("request context cancelled (%v) by a pipelined request", o.err)
					}
					raw, _, err := c.response("GET")
					if err != nil || !strings.HasSuffix(raw, "late") {
						t.Errorf("first response %q, %v", raw, err)
					}
					if p := waitFor(t, started, 5*time.Second, "the second handler to start"); p != "/pipelined?second" {
						t.Errorf("second request's target %q, want %q", p, "/pipelined?second")
					}
					if o := waitFor(t, done, 6*time.Second, "the second handler to return"); o.err != nil {
						t.Errorf("second request's context cancelled: %v", o.err)
					}
					raw, _, err = c.response("GET")
					if err != nil || !strings.HasSuffix(raw, "late") {
						t.Errorf("second response %q, %v", raw, err)
					}
				})
			}
		})
	}
}

// TestAbortHandler checks that panic(http.ErrAbortHandler) closes the
// connection without completing the response (before any write, after a
// flushed partial body, with a body still buffered), logs nothing, and that
// another panic is logged; the server serves on.
func TestAbortHandler(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/ok":
					io.WriteString(w, "ok")
					return
				case "/abort_before_write":
				case "/abort_after_flush_cl":
					w.Header().Set("Content-Length", "10")
					io.WriteString(w, "hello")
					http.NewResponseController(w).Flush()
				case "/abort_after_flush_chunked":
					io.WriteString(w, "hello")
					http.NewResponseController(w).Flush()
				case "/abort_buffered":
					io.WriteString(w, "hello")
				case "/other_panic":
					io.WriteString(w, "hello")
					panic("boom")
				}
				panic(http.ErrAbortHandler)
			}), serverConfig{})

			for _, path := range []string{"/abort_before_write", "/abort_after_flush_cl", "/abort_after_flush_chunked", "/abort_buffered", "/other_panic"} {
				t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
					c := dialRaw(t, srv.addr)
					c.send(get(path))
					raw, _, err := c.response("GET")
					if err == nil {
						t.Errorf("got a complete response: %q", raw)
					} else {
						t.Logf("got %q, then %s", raw, errClass(err))
					}
					if path == "/abort_before_write" && raw != "" {
						t.Errorf("got bytes %q, want none", raw)
					}
					if ok, extra := c.closed(); !ok {
						t.Errorf("connection not closed: %s", extra)
					}
				})
			}
			// Logs: only the non-abort panic.
			deadline := time.Now().Add(2 * time.Second)
			for !strings.Contains(srv.log.String(), "boom") && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			logged := srv.log.String()
			if !strings.Contains(logged, "panic") || !strings.Contains(logged, "boom") {
				t.Errorf("panic(\"boom\") not logged; log: %q", logged)
			}
			if strings.Contains(logged, http.ErrAbortHandler.Error()) {
				t.Errorf("panic(http.ErrAbortHandler) logged: %q", logged)
			}
			c := dialRaw(t, srv.addr)
			c.send(get("/ok"))
			if raw, _, err := c.response("GET"); err != nil || !strings.HasSuffix(raw, "\r\n\r\nok") {
				t.Errorf("after the panics: %q, %v", raw, err)
			}
		})
	}
}

// TestHijack checks that http.NewResponseController(w).Hijack returns a
// working connection: the bytes the client sent after the request are in
// the returned reader, raw writes reach the client, the client's later
// writes reach the handler, Write on the hijacked ResponseWriter fails with
// http.ErrHijacked, and closing the conn closes the client's connection.
func TestHijack(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			errs := make(chan string, 8)
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				conn, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					errs <- fmt.Sprintf("Hijack: %v", err)
					return
				}
				defer conn.Close()
				if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
					errs <- fmt.Sprintf("SetDeadline: %v", err)
				}
				if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrHijacked) {
					errs <- fmt.Sprintf("Write after Hijack: %v, want http.ErrHijacked", err)
				}
				early, err := brw.ReadString('\n')
				if err != nil {
					errs <- fmt.Sprintf("reading the early bytes: %v", err)
					return
				}
				brw.WriteString("HIJACKED " + early)
				if err := brw.Flush(); err != nil {
					errs <- fmt.Sprintf("Flush: %v", err)
				}
				line, err := brw.ReadString('\n')
				if err != nil {
					errs <- fmt.Sprintf("reading ping: %v", err)
					return
				}
				if _, err := conn.Write([]byte("pong " + line)); err != nil {
					errs <- fmt.Sprintf("conn.Write: %v", err)
				}
				errs <- ""
			}), serverConfig{})

			c := dialRaw(t, srv.addr)
			c.send(get("/hijack") + "early\n")
			c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if line, err := c.br.ReadString('\n'); line != "HIJACKED early\n" {
				t.Fatalf("first line %q, %v; want %q", line, err, "HIJACKED early\n")
			}
			c.send("ping\n")
			if line, err := c.br.ReadString('\n'); line != "pong ping\n" {
				t.Errorf("second line %q, %v; want %q", line, err, "pong ping\n")
			}
			for {
				e := waitFor(t, errs, 5*time.Second, "the handler")
				if e == "" {
					break
				}
				t.Error(e)
			}
			if ok, extra := c.closed(); !ok {
				t.Errorf("connection not closed after the handler closed the hijacked conn: %s", extra)
			}
		})
	}
}

// TestFlushStreams checks that Flush sends what was written at once: the
// client gets the first part while the handler waits for it to arrive.
func TestFlushStreams(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			got := make(chan struct{})
			waited := make(chan bool, 1)
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "first|")
				http.NewResponseController(w).Flush()
				select {
				case <-got:
					waited <- true
				case <-time.After(5 * time.Second):
					waited <- false
				}
				io.WriteString(w, "second")
			}), serverConfig{})
			c := dialRaw(t, srv.addr)
			c.send(get("/"))
			c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			var seen strings.Builder
			for !strings.Contains(seen.String(), "first|") {
				b, err := c.br.ReadByte()
				if err != nil {
					t.Fatalf("first part not received (got %q): %v", seen.String(), err)
				}
				seen.WriteByte(b)
			}
			close(got)
			if !waitFor(t, waited, 6*time.Second, "the handler") {
				t.Fatal("handler was not told the first part arrived")
			}
			c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			rest, err := c.br.ReadString('0') // the last chunk's size
			if err != nil || !strings.Contains(rest, "second") {
				t.Errorf("rest %q, %v", rest, err)
			}
		})
	}
}

// TestEarlyHintsSentAtOnce checks that WriteHeader(103) sends the 103 head
// at once, before the handler goes on.
func TestEarlyHintsSentAtOnce(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			got := make(chan struct{})
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "</a.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				select {
				case <-got:
				case <-time.After(5 * time.Second):
				}
				io.WriteString(w, "final")
			}), serverConfig{})
			c := dialRaw(t, srv.addr)
			c.send(get("/"))
			c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			var head strings.Builder
			for !strings.HasSuffix(head.String(), "\r\n\r\n") {
				b, err := c.br.ReadByte()
				if err != nil {
					t.Fatalf("103 not received at once (got %q): %v", head.String(), err)
				}
				head.WriteByte(b)
			}
			close(got)
			if !strings.HasPrefix(head.String(), "HTTP/1.1 103 Early Hints\r\n") || !strings.Contains(head.String(), "Link: </a.css>; rel=preload\r\n") {
				t.Errorf("103 head %q", head.String())
			}
			raw, _, err := c.response("GET")
			if err != nil || !strings.HasPrefix(raw, "HTTP/1.1 200 OK\r\n") || !strings.HasSuffix(raw, "final") {
				t.Errorf("final response %q, %v", raw, err)
			}
		})
	}
}

// TestWriteDeadline checks that a write deadline set through
// http.ResponseController applies: one in the past makes the handler's
// flush of a large body fail.
func TestWriteDeadline(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			res := make(chan error, 1)
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				if err := rc.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
					res <- fmt.Errorf("SetWriteDeadline: %w", err)
					return
				}
				chunk := bytes.Repeat([]byte("w"), 64<<10)
				var err error
				for i := 0; i < 64 && err == nil; i++ { // up to 4 MiB, past any socket buffer
					if _, err = w.Write(chunk); err == nil {
						err = rc.Flush()
					}
				}
				if err == nil {
					res <- errors.New("writes past the write deadline all succeeded")
					return
				}
				res <- nil
			}), serverConfig{})
			c := dialRaw(t, srv.addr)
			c.send(get("/"))
			if err := waitFor(t, res, 8*time.Second, "the handler"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestShutdownWaitsForInFlight checks that Shutdown with a request in
// flight closes the listener (Serve returns http.ErrServerClosed at once),
// waits for the handler, lets the client get its whole answer, then closes
// the connection and returns nil. The answers from both servers are
// compared too.
func TestShutdownWaitsForInFlight(t *testing.T) {
	answers := map[string]string{}
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			started := make(chan struct{}, 1)
			release := make(chan struct{})
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- struct{}{}
				select {
				case <-release:
				case <-time.After(5 * time.Second):
				}
				io.WriteString(w, "finished")
			}), serverConfig{})
			c := dialRaw(t, srv.addr)
			c.send(get("/"))
			waitFor(t, started, 5*time.Second, "the handler to start")

			shutdownErr := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer cancel()
				shutdownErr <- srv.shutdown(ctx)
			}()
			err, ok := srv.serveResult(2 * time.Second)
			if !ok {
				t.Errorf("Serve did not return within 2s of Shutdown")
			} else if !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
			}
			if conn, err := net.DialTimeout("tcp", srv.addr, time.Second); err == nil {
				conn.Close()
				t.Errorf("dial after Shutdown began succeeded")
			}
			select {
			case err := <-shutdownErr:
				t.Fatalf("Shutdown returned (%v) with a request in flight", err)
			case <-time.After(100 * time.Millisecond):
			}
			close(release)
			raw, _, err := c.response("GET")
			if err != nil || !strings.HasSuffix(raw, "finished") {
				t.Errorf("in-flight answer %q, %v", raw, err)
			}
			answers[im.name] = dateRE.ReplaceAllString(raw, "Date: <DATE>")
			if err := waitFor(t, shutdownErr, 6*time.Second, "Shutdown to return"); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if ok, extra := c.closed(); !ok {
				t.Errorf("connection not closed after Shutdown: %s", extra)
			}
		})
	}
	if f, s := answers["front"], answers["net_http"]; f != "" && s != "" && f != s {
		t.Errorf("in-flight answers during Shutdown differ:\n%s", diffReport("net/http", s, "front", f))
	}
}

// TestShutdownClosesIdle checks that Shutdown closes an idle keep-alive
// connection at once and returns nil, and Serve returns
// http.ErrServerClosed; a Serve after it returns http.ErrServerClosed too.
func TestShutdownClosesIdle(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "hi")
			}), serverConfig{})
			c := dialRaw(t, srv.addr)
			c.send(get("/"))
			if raw, _, err := c.response("GET"); err != nil {
				t.Fatalf("response %q: %v", raw, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			if err := srv.shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Shutdown took %v with only an idle connection", d)
			}
			if ok, extra := c.closed(); !ok {
				t.Errorf("idle connection not closed by Shutdown: %s", extra)
			}
			if err, ok := srv.serveResult(2 * time.Second); !ok || !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v (returned: %v), want http.ErrServerClosed", err, ok)
			}
		})
	}
}

// TestServeAfterShutdown checks that Serve on a server already shut down
// returns http.ErrServerClosed.
func TestServeAfterShutdown(t *testing.T) {
	s := &front.Server{Handler: http.NotFoundHandler()}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown of a server never started: %v", err)
	}
	ln := listen(t)
	defer ln.Close()
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	if err := waitFor(t, errc, 3*time.Second, "Serve to return"); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Shutdown: %v, want http.ErrServerClosed", err)
	}
}

// TestCloseClosesConnections checks that Close closes idle and active
// connections at once (the active handler's context is cancelled) and
// Serve returns http.ErrServerClosed.
func TestCloseClosesConnections(t *testing.T) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			started := make(chan struct{}, 1)
			ctxDone := make(chan bool, 1)
			srv := im.start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/block" {
					started <- struct{}{}
					select {
					case <-r.Context().Done():
						ctxDone <- true
					case <-time.After(5 * time.Second):
						ctxDone <- false
					}
				}
				io.WriteString(w, "hi")
			}), serverConfig{})
			idle := dialRaw(t, srv.addr)
			idle.send(get("/"))
			if raw, _, err := idle.response("GET"); err != nil {
				t.Fatalf("response %q: %v", raw, err)
			}
			active := dialRaw(t, srv.addr)
			active.send(get("/block"))
			waitFor(t, started, 5*time.Second, "the handler to start")
			if err := srv.close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if ok, extra := idle.closed(); !ok {
				t.Errorf("idle connection not closed by Close: %s", extra)
			}
			if ok, extra := active.closed(); !ok {
				t.Errorf("active connection not closed by Close: %s", extra)
			}
			if !waitFor(t, ctxDone, 6*time.Second, "the handler") {
				t.Errorf("active request's context not cancelled by Close within 5s")
			}
			if err, ok := srv.serveResult(2 * time.Second); !ok || !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v (returned: %v), want http.ErrServerClosed", err, ok)
			}
		})
	}
}
