package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A handler that writes its header, then hijacks, with a stalled upload,
// gets its connection within the body timeout: net/http's Hijack flushes
// the header, and would read the rest of the body with no deadline (found
// by review).
func TestHijackAfterWriteHeaderStalledBody(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "hj", prefix: "/hj", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Upgrade", "x")
			w.Header().Set("Connection", "Upgrade")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("switched")
			_ = brw.Flush()
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /hj HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	line, err := br.ReadString('\n')
	t.Logf("%q %v after %v", line, err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("no 101 within 5 s (body timeout %v): %v", timeout, err)
	}
}

// A handler that sets Connection: close after WriteHeader (net/http
// ignores it: its header is a snapshot) and streams, with a stalled
// upload, is answered within the body timeout: the proxy reads the header
// as net/http took it (found by review).
func TestConnectionCloseAfterWriteHeader(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "late", prefix: "/late", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Header().Set("Connection", "close") // no effect in net/http
			_, _ = io.WriteString(w, big)
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 5 s (body timeout %v): %v", timeout, err)
	}
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, time.Since(start).Round(time.Millisecond))
}

// A handler's read after net/http read the body to its end and closed it
// (ErrBodyReadAfterClose) leaves no deadline to fire in net/http's
// background read, which would cancel the request's context and the
// connection's (found by review).
func TestReadAfterNetHTTPClosedTheBody(t *testing.T) {
	const timeout = 200 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "late", prefix: "/late", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Header().Set("Connection", "close")
			_, _ = io.WriteString(w, big)
			_, err := r.Body.Read(make([]byte, 1))
			t.Logf("read after the header: %v", err)
			time.Sleep(3 * timeout)
			if err := r.Context().Err(); err != nil {
				t.Errorf("the request's context ended while its handler ran: %v", err)
			}
			_, _ = io.WriteString(w, "done")
		})},
		ctxProbe)
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, body, _ := readAnswer(t, c, br, "/late")
	t.Logf("/late: %d close=%v %d bytes", res.StatusCode, res.Close, len(body))
	if res.Close {
		return
	}
	_, _ = io.WriteString(c, "GET /ctx HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body, _ := readAnswer(t, c, br, "/ctx"); body != "live" {
		t.Errorf("the next request on the kept connection: %q, want \"live\"", body)
	}
}

// EnableFullDuplex after WriteHeader, with the body unread, is refused:
// the Connection: close that full duplex needs cannot be added then, and
// net/http's read of the rest after the handler would outlive the request
// (golang/go#68560) or leave its bytes to be read as the next request
// (found by review).
func TestFullDuplexAfterWriteHeader(t *testing.T) {
	logs := &syncBuffer{}
	defer func() {
		time.Sleep(200 * time.Millisecond)
		t.Logf("server log (%d): %.1500s", len(logs.String()), logs.String())
	}()
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second, Log: zerolog.New(logs)},
		testDeployment{app: "fd", prefix: "/fd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).EnableFullDuplex()
			_, _ = io.WriteString(w, "ok")
		})},
		testDeployment{app: "s", prefix: "/s", factory: static("hi")})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /fd HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, _, _ := readAnswer(t, c, br, "/fd")
	t.Logf("/fd: %d close=%v", res.StatusCode, res.Close)
	if res.Close {
		return
	}
	_, _ = io.WriteString(c, "GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	res2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the next request on the kept connection: %v", err)
	}
	t.Logf("/s: %d", res2.StatusCode)
}

// A handler that closes the body (sent whole) before it writes keeps the
// connection: net/http's Close read it to its end.
func TestClosedWholeBodyKeepsConnection(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second},
		testDeployment{app: "cl", prefix: "/cl", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body.Close()
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /cl HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
	res, _, _ := readAnswer(t, c, br, "/cl")
	if res.Close {
		t.Errorf("closes the connection; the whole body had come and was read by Close")
	}
}

// Expect: 100-continue and a handler that closes the body it never read
// (defer r.Body.Close()) is answered at once: net/http's Close would wait
// for a body it never asked for, up to the body timeout, on a connection
// that closes anyway (found by review).
func TestExpectAndDeferredClose(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "cl", prefix: "/cl", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer r.Body.Close()
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /cl HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
	res, _, took := readAnswer(t, c, br, "/cl")
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the answer waited %v for a body the client was never asked for", took.Round(time.Millisecond))
	}
}

// Full duplex enabled after WriteHeader, the body stalled: refused, so
// that the rest of the body is never read as the next request (found by
// review).
func TestFullDuplexAfterWriteHeaderStalled(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 300 * time.Millisecond},
		testDeployment{app: "fd", prefix: "/fd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).EnableFullDuplex()
			_, _ = io.WriteString(w, "ok")
		})},
		testDeployment{app: "s", prefix: "/s", factory: static("smuggled")})
	rest := "GET /s HTTP/1.1\r\nHost: x\r\n\r\n"
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /fd HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(10+len(rest))+"\r\n\r\n0123456789")
	res, _, took := readAnswer(t, c, br, "/fd")
	t.Logf("/fd: %d close=%v after %v", res.StatusCode, res.Close, took.Round(time.Millisecond))
	time.Sleep(700 * time.Millisecond)
	_, _ = io.WriteString(c, rest) // the body's last bytes
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	res2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Logf("after the body's rest: %v (connection closed: fine)", err)
		return
	}
	b, _ := io.ReadAll(res2.Body)
	if strings.Contains(string(b), "smuggled") {
		t.Errorf("the body's rest was served as a request: %d %q", res2.StatusCode, b)
	}
}

// The handler's own read deadline (http.ResponseController) applies when
// it is earlier than the body timeout's (found by review: each read
// replaced it).
func TestHandlersOwnReadDeadline(t *testing.T) {
	got := make(chan time.Duration, 1)
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			start := time.Now()
			_, _ = io.ReadAll(r.Body)
			got <- time.Since(start)
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_, _, _ = readAnswer(t, c, br, "/rd")
	if d := <-got; d > time.Second {
		t.Errorf("the handler's 200 ms read deadline failed its read after %v", d.Round(time.Millisecond))
	}
}

// A chunked body over PROXY_MAX_BODY_BYTES is answered 413 at once,
// closing the connection: net/http's own limit, which would, cannot be
// told through the proxy's writer, and the answer waited for a drain of
// the rest (found by review).
func TestOverLimitChunked413(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second, MaxBodyBytes: 5},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
	res, _, took := readAnswer(t, c, br, "/rd")
	t.Logf("%d close=%v after %v", res.StatusCode, res.Close, took.Round(time.Millisecond))
}

// A handler's Connection header that says close in other words than
// net/http's exact "close" (all its writeHeader checks) is answered within
// the body timeout, with a stalled upload: net/http keeps such a
// connection, and would read the body's rest with no deadline (found by
// review).
func TestConnectionCloseSpelling(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "cc", prefix: "/cc", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Connection"] = []string{r.URL.Query().Get("v")}
			_, _ = io.WriteString(w, big) // the header goes out while it runs
		})})
	for _, v := range []string{"close", "Close", "keep-alive,%20close"} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "POST /cc?v="+v+" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
		_, _ = c.(interface{ SetReadDeadline(time.Time) error }), 0
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("Connection: %s: no answer within 3 s (body timeout %v): %v", v, timeout, err)
			continue
		}
		res.Body.Close()
	}
}

// An unread body sent steadily over about 800 ms (each part well within
// the body timeout) to a static handler keeps the connection: the body is
// drained under the body timeout, not the 500 ms linger (found by review).
// (An HTTP/1.0 request with a body closes its connection: see
// TestHTTP10RequestWithBodyClosesItsConnection.)
func TestKeepAliveSlowSteadyBody(t *testing.T) {
	tp := unreadBodyProxy(t, 2*time.Second)
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	start := time.Now()
	_, _ = io.WriteString(c, "POST /static HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
	go func() {
		for range 10 {
			time.Sleep(80 * time.Millisecond)
			_, _ = io.WriteString(c, "x")
		}
	}()
	res, _, _ := readAnswer(t, c, br, "/static")
	t.Logf("answer after %v, Connection %q", time.Since(start).Round(time.Millisecond), res.Header.Get("Connection"))
	time.Sleep(900 * time.Millisecond)
	_, _ = io.WriteString(c, "GET /static HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := br.Peek(1); err != nil {
		t.Errorf("the connection did not serve a second request: %v", err)
	}
}

// A handler that reads a chunked body to its end sees the client's
// trailers in r.Trailer, declared in a Trailer header or not, as under
// bare net/http (which fills in its own request's Trailer at the body's end).
func TestRequestTrailersSeenByHandler(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "t="+r.Trailer.Get("X-T"))
	}
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second},
		testDeployment{app: "tr", prefix: "/tr", factory: handlerFunc(h)})
	bare := &http.Server{Handler: http.HandlerFunc(h)}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = bare.Serve(l) }()
	t.Cleanup(func() { _ = bare.Close() })

	for _, declared := range []bool{true, false} {
		hdr := ""
		if declared {
			hdr = "Trailer: X-T\r\n"
		}
		req := "POST /tr HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + hdr + "\r\n3\r\nabc\r\n0\r\nX-T: yes\r\n\r\n"
		for _, target := range []string{"bare", "proxy"} {
			var c net.Conn
			if target == "proxy" {
				c = dialProxy(t, tp)
			} else {
				var err error
				if c, err = net.Dial("tcp", l.Addr().String()); err != nil {
					t.Fatal(err)
				}
				defer c.Close()
			}
			_, _ = io.WriteString(c, req)
			_, body, _ := readAnswer(t, c, bufio.NewReader(c), target)
			t.Logf("declared=%v %s: %q", declared, target, body)
			if !strings.Contains(body, "t=yes") {
				t.Errorf("declared=%v %s: the handler did not see the trailer: %q", declared, target, body)
			}
		}
	}
}

// The same through an upstream replica.
func TestRequestTrailersForwarded(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, "t="+r.Trailer.Get("X-T"))
	})}
	go func() { _ = up.Serve(l) }()
	t.Cleanup(func() { _ = up.Close() })
	tp := startProxy(t, Options{ClientBodyTimeout: time.Second},
		testDeployment{app: "up", prefix: "/up", targets: []string{"http://" + l.Addr().String()}})
	for _, declared := range []bool{true, false} {
		hdr := ""
		if declared {
			hdr = "Trailer: X-T\r\n"
		}
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"+hdr+"\r\n3\r\nabc\r\n0\r\nX-T: yes\r\n\r\n")
		_, body, _ := readAnswer(t, c, bufio.NewReader(c), "up")
		if body != "t=yes" {
			t.Errorf("declared=%v: the upstream got no trailer: %q", declared, body)
		}
	}
}

// A handler whose write past 2048 bytes sends nothing (a 204's body, more
// than its Content-Length) and that then flushes is answered at once, with
// a stalled upload: the header goes out with the flush, and net/http finds
// its own body there (found by review).
func TestFlushAfterAWriteThatSentNothing(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "nc", prefix: "/nc", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			_, _ = io.WriteString(w, big) // ErrBodyNotAllowed
			w.(http.Flusher).Flush()
		})},
		testDeployment{app: "cl", prefix: "/cl", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "10")
			_, _ = io.WriteString(w, big) // ErrContentLength
			w.(http.Flusher).Flush()
		})})
	for _, path := range []string{"/nc", "/cl"} {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n0123456789")
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("%s: no answer after %v: %v", path, time.Since(start).Round(time.Millisecond), err)
			continue
		}
		t.Logf("%s: %d after %v", path, res.StatusCode, time.Since(start).Round(time.Millisecond))
	}
}

// An HTTP/1.0 keep-alive request whose answer has a length (here the
// handler's Content-Length) keeps its connection in net/http, which reads
// the body's rest when the header goes out while the handler runs: within
// the body timeout, from a client that stalls (found by review).
func TestHTTP10KeepAliveAnswerWithALengthWhileTheHandlerRuns(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout},
		testDeployment{app: "len", prefix: "/len", factory: handlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "5000")
			_, _ = io.WriteString(w, big)
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /len HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 100\r\n\r\n0123456789")
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	t.Logf("%d after %v, close %v", res.StatusCode, time.Since(start).Round(time.Millisecond), res.Close)
}

// A goroutine of the handler that reads r.Body while the handler writes
// its answer races with nothing, and always finds the handler's own body
// (bounded by PROXY_MAX_BODY_BYTES and the body timeout): the handler's
// request is a copy of net/http's (found by review, -race).
func TestHandlersGoroutineReadsItsOwnBody(t *testing.T) {
	const timeout = 300 * time.Millisecond
	big := strings.Repeat("b", 5000)
	tp := startProxy(t, Options{ClientBodyTimeout: timeout, MaxBodyBytes: 2 << 20},
		testDeployment{app: "g", prefix: "/g", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range 50 {
					_ = r.Body // what io.Copy(dst, r.Body) in a goroutine does
					time.Sleep(time.Millisecond)
				}
			}()
			time.Sleep(5 * time.Millisecond)
			_, _ = io.WriteString(w, big)
			<-done
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n0123456789")
	res, _, _ := readAnswer(t, c, br, "/g")
	t.Logf("%d close %v", res.StatusCode, res.Close)
}

// The temporary files of a multipart form the handler parses are removed
// after the request, with a request timeout or not: the handler's request
// is a copy, and net/http removes only the files of its own's form (found
// by review).
func TestMultipartTempFilesRemoved(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	for _, opts := range []Options{{RequestTimeout: 5 * time.Second}, {ClientBodyTimeout: time.Second}} {
		tp := startProxy(t, opts,
			testDeployment{app: "mp", prefix: "/mp", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := r.ParseMultipartForm(0); err != nil {
					http.Error(w, err.Error(), 400)
					return
				}
				_, _ = io.WriteString(w, "ok")
			})})
		buf, contentType := fileForm()
		res, err := http.Post(tp.url+"/mp", contentType, buf)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		time.Sleep(100 * time.Millisecond)
		ents, _ := os.ReadDir(dir)
		t.Logf("%+v: %d %q; temp files left: %d", opts.RequestTimeout, res.StatusCode, b, len(ents))
		if len(ents) > 0 {
			t.Errorf("request timeout %v: %d temporary files left", opts.RequestTimeout, len(ents))
			for _, e := range ents {
				os.Remove(dir + "/" + e.Name())
			}
		}
	}
}

// A client that half-closes mid-body is its leaving (499), never a 408.
func TestHalfCloseMidBodyIsNot408(t *testing.T) {
	tp := unreadBodyProxy(t, 200*time.Millisecond)
	tp2 := startProxy(t, Options{ClientBodyTimeout: 200 * time.Millisecond},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				return
			}
			_, _ = io.WriteString(w, "ok")
		})})
	for _, x := range []struct {
		tp   *testProxy
		path string
	}{{tp, "/up"}, {tp2, "/rd"}} {
		for range 5 {
			c := dialProxy(t, x.tp)
			_, _ = io.WriteString(c, "POST "+x.path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
			time.Sleep(20 * time.Millisecond)
			_ = c.(*net.TCPConn).CloseWrite()
			b, _ := io.ReadAll(c)
			c.Close()
			if strings.Contains(string(b), " 408 ") {
				t.Errorf("%s: 408 to a client that half-closed: %q", x.path, b)
			}
		}
		time.Sleep(300 * time.Millisecond)
		if s := x.tp.access.String(); strings.Contains(s, `"status":408`) {
			t.Errorf("%s: 408 logged:\n%s", x.path, s)
		}
	}
}

// A handler's own read deadline fires (net/http's connReader cancels the
// connection's context); the rest of the body comes; the next request on
// the same connection must not start with a cancelled context.
func TestHandlerDeadlineThenNextRequest(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ContentLength > 0 {
				_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				_, err := io.ReadAll(r.Body)
				_, _ = io.WriteString(w, "first:"+errString(err))
				return
			}
			if err := r.Context().Err(); err != nil {
				_, _ = io.WriteString(w, "second: ctx "+err.Error())
				return
			}
			_, _ = io.WriteString(w, "second: ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(c, "0123456789")
	}()
	res, body, _ := readAnswer(t, c, br, "first")
	t.Logf("first: %d close=%v %q", res.StatusCode, res.Close, body)
	if res.Close {
		return
	}
	_, _ = io.WriteString(c, "GET /rd HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("second request on the kept connection: %v", err)
	}
	b, _ := io.ReadAll(res2.Body)
	t.Logf("second: %d %q", res2.StatusCode, b)
	if res2.StatusCode != 200 || !strings.Contains(string(b), "ok") {
		t.Errorf("second request on the kept connection: %d %q", res2.StatusCode, b)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// A handler that unblocks a read in progress with a past read deadline
// (the usual idiom) is not answered 408 for the client's stall, nor cut as
// its client's leaving: the deadline is its own (found by review).
func TestPastReadDeadlineDuringARead(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 2 * time.Second},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			done := make(chan struct{})
			go func() { _, _ = io.ReadAll(r.Body); close(done) }()
			time.Sleep(100 * time.Millisecond)
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			<-done
			// returns without writing: net/http would send an empty 200
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
	res, body, took := readAnswer(t, c, br, "/rd")
	t.Logf("%d after %v: %q", res.StatusCode, took.Round(time.Millisecond), body)
	if res.StatusCode == http.StatusRequestTimeout {
		t.Errorf("the handler's own deadline reported as the client's stall: %d %q", res.StatusCode, body)
	}
}

// 1xx, then Connection: close set, then the final WriteHeader: the
// snapshot must include it.
func TestEarlyHintsThenClose(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 300 * time.Millisecond},
		testDeployment{app: "rd", prefix: "/rd", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusOK)
			w.Header().Del("Connection")
			_, _ = io.WriteString(w, "ok")
		})})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	_, _ = io.WriteString(c, "POST /rd HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	r1, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("interim %d", r1.StatusCode)
	res, body, _ := readAnswer(t, c, br, "/rd")
	t.Logf("%d close=%v %q after %v", res.StatusCode, res.Close, body, time.Since(start).Round(time.Millisecond))
	if !res.Close {
		t.Errorf("Connection: close set before the final WriteHeader was lost")
	}
}
