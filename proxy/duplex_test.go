package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A handler that reads the request body full duplex and answers before
// the client sent all of it (a replica that answered early, or broke off)
// gets its answer to the client on a connection that then closes: net/http
// starts its background read when the rest of the body arrives after the
// handler returned, which made the next request on the connection panic
// with "invalid concurrent Body.Read call" and reset it (golang/go#68560).
func TestFullDuplexEarlyAnswerClosesTheConnection(t *testing.T) {
	// An upstream that reads the request head and closes: the proxy
	// answers 502 with the client's body still coming.
	rude, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rude.Close()
	go func() {
		for {
			c, err := rude.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
					if strings.HasPrefix(line, "GET / ") { // the health check
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
						return
					}
				}
			}()
		}
	}()
	early := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		buf := make([]byte, 4)
		_, _ = io.ReadFull(r.Body, buf) // some of it, then answer
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "early")
	})
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)},
		testDeployment{app: "early", prefix: "/early", factory: early},
		testDeployment{app: "rude", prefix: "/rude", targets: []string{"http://" + rude.Addr().String()}})

	for _, tc := range []struct{ path, want string }{{"/early", "200"}, {"/rude", "502"}} {
		t.Run(tc.path, func(t *testing.T) {
			c := dialProxy(t, tp)
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, "POST "+tc.path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"+strings.Repeat("a", 10))
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("first answer: %v", err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if got := res.Status[:3]; got != tc.want {
				t.Fatalf("first answer %s, want %s", res.Status, tc.want)
			}
			// The rest of the body, then a second request on the same
			// connection.
			_, _ = io.WriteString(c, strings.Repeat("b", 990))
			_, _ = io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			if !res.Close {
				t.Fatal("the answer to a request whose body is left does not close the connection")
			}
			if res, err := http.ReadResponse(br, nil); err == nil {
				t.Fatalf("the connection was to close after the first answer, but it answered %s", res.Status)
			}
			if strings.Contains(logs.String(), "panic") {
				t.Fatalf("the server panicked:\n%s", logs.String())
			}
		})
	}
}

// A request body left unread by a replica that answered early must never
// be read as requests of its own (smuggling): past the 256 KiB net/http
// reads after a handler, it had been, when the body was read full duplex
// (found by an exploratory run). Here the body is made of requests.
func TestUnreadBodyIsNotSmuggled(t *testing.T) {
	var smuggled atomic.Int64
	early := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/smuggled") {
			smuggled.Add(1)
		}
		_ = http.NewResponseController(w).EnableFullDuplex()
		buf := make([]byte, 4)
		_, _ = io.ReadFull(r.Body, buf)
		w.Header().Set("Content-Length", "7")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "go away")
	})
	tp := startProxy(t, Options{MaxBodyBytes: 100 << 20}, testDeployment{app: "a", prefix: "/", factory: early})
	inner := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, size := range []int{100 << 10, 400 << 10, 2 << 20} {
		for _, expect := range []bool{false, true} {
			body := strings.Repeat(inner, size/len(inner))
			c := dialProxy(t, tp)
			head := "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
			if expect {
				head += "Expect: 100-continue\r\n"
			}
			go func() { _, _ = io.WriteString(c, head+"\r\n"+body) }()
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%d bytes, expect %v: %v", len(body), expect, err)
			}
			if res.StatusCode == http.StatusContinue {
				res, err = http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
			}
			_, _ = io.Copy(io.Discard, res.Body)
			// Then whatever else comes, for a second: an answer to a
			// smuggled request would.
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if n, _ := io.Copy(io.Discard, br); n > 0 {
				t.Errorf("%d bytes, expect %v: %d more bytes after the answer", len(body), expect, n)
			}
			c.Close()
		}
	}
	if n := smuggled.Load(); n != 0 {
		t.Fatalf("%d requests smuggled in unread bodies reached the replica", n)
	}
}

// A handler that closes the body without reading it, not full duplex, has
// its answer close the connection too: with the body behind the proxy's
// wrapper, net/http had taken it for read and parsed what followed as
// requests; and one that writes its header, then reads full duplex,
// leaves no body to be read as requests either (found by review).
func TestClosedBodyIsNotSmuggled(t *testing.T) {
	var smuggled atomic.Int64
	count := func(r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/smuggled") {
			smuggled.Add(1)
		}
	}
	closer := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r)
		r.Body.Close()
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "no")
	})
	late := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r)
		w.WriteHeader(http.StatusAccepted)
		_ = http.NewResponseController(w).EnableFullDuplex()
		_, _ = io.ReadFull(r.Body, make([]byte, 4))
	})
	inner := "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	body := "AAAA" + strings.Repeat(inner, (1<<20)/len(inner))
	for _, limit := range []int64{0, 100 << 20} {
		tp := startProxy(t, Options{MaxBodyBytes: limit},
			testDeployment{app: "closer", prefix: "/", factory: closer},
			testDeployment{app: "late", prefix: "/late", factory: late})
		for _, path := range []string{"/x", "/late/x"} {
			c := dialProxy(t, tp)
			go func() {
				_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
			}()
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s, body limit %d: %v", path, limit, err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if n, _ := io.Copy(io.Discard, br); n > 0 {
				t.Errorf("%s, body limit %d: %d more bytes after the answer", path, limit, n)
			}
			c.Close()
		}
	}
	if n := smuggled.Load(); n != 0 {
		t.Fatalf("%d requests smuggled in unread bodies reached the replica", n)
	}
}

// A request with Expect: 100-continue whose answer comes before its body
// (a 404, an early 401) gets it at once: net/http had read the body, which
// the client sends only once it has an answer, before answering (found by
// review).
func TestExpectContinueEarlyAnswer(t *testing.T) {
	early := handlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) })
	for _, limit := range []int64{0, 100 << 20} {
		tp := startProxy(t, Options{MaxBodyBytes: limit}, testDeployment{app: "a", prefix: "/a", factory: early})
		for path, want := range map[string]int{"/nope": 404, "/a": 401} {
			c := dialProxy(t, tp)
			_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n")
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			c.Close()
			if err != nil || res.StatusCode != want {
				t.Fatalf("%s, body limit %d: %v, %v; want %d before any body", path, limit, res, err, want)
			}
		}
	}
}

// The proxy's own answer to a request whose body is still coming (a 408 at
// the request timeout, a 404 to a body over 64 KiB) goes out at once, on a
// connection that then closes: net/http had first read up to 256 KiB of
// the body from a client sending it slowly (found by an exploratory run).
// A small body's connection stays, as a POST shed under load wants.
func TestOwnAnswerDoesNotWaitForTheUpload(t *testing.T) {
	reader := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body) // as the echo handler does
		_, _ = w.Write(b)
	})
	tp := startProxy(t, Options{RequestTimeout: 200 * time.Millisecond}, testDeployment{app: "a", prefix: "/a", factory: reader})
	for path, want := range map[string]int{"/a/x": http.StatusRequestTimeout, "/nope": http.StatusNotFound} {
		c := dialProxy(t, tp)
		// 10 bytes of 200000, then nothing: a stalled upload.
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"+strings.Repeat("a", 10))
		start := time.Now()
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || res.StatusCode != want || !res.Close {
			t.Fatalf("%s with a stalled upload: %v, %v after %v; want %d at once, closing the connection", path, res, err, time.Since(start), want)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s: the answer took %v", path, took)
		}
	}
}

func TestOwnAnswerToASmallBodyKeepsTheConnection(t *testing.T) {
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/a", factory: static("hi")})
	c := dialProxy(t, tp)
	br := bufio.NewReader(c)
	for i := range 2 {
		_, _ = io.WriteString(c, "POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusNotFound || res.Close {
			t.Fatalf("request %d: %v, %v; want a 404 keeping the connection", i+1, res, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
	}
}

// An answer to an upload the client is still sending after 100 Continue
// ends in a half-close (FIN), the connection closed only later: net/http
// closed it at once, not half-closing and waiting as it does for a body
// it gave up on, and the reset failed the client's send before it read
// its answer (found by a tester: curl's 50 MB upload to a replica
// answering 401 early lost it 3 times in 20).
func TestExpectContinueEarlyAnswerNotReset(t *testing.T) {
	early := func(w http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 1)) // asks for the body: 100 Continue
		w.WriteHeader(http.StatusUnauthorized)
	}
	upstream := httptest.NewServer(answeringHealth(http.HandlerFunc(early)))
	t.Cleanup(upstream.Close)
	for _, timeout := range []time.Duration{0, time.Minute} { // PROXY_CLIENT_BODY_TIMEOUT off, and its default
		tp := startProxy(t, Options{ClientBodyTimeout: timeout},
			testDeployment{app: "a", prefix: "/a", factory: handlerFunc(early)},
			testDeployment{app: "up", prefix: "/up", targets: []string{upstream.URL}})
		expectEarlyAnswerNotReset(t, tp)
	}
}

func expectEarlyAnswerNotReset(t *testing.T, tp *testProxy) {
	t.Helper()
	// Without the wait, one round in seven or so was reset (its answer
	// came while the rest of the body was still unread): 20 rounds catch
	// it nearly always (found by review: 6 let 4 runs in 10 pass).
	for i := range 20 {
		path := []string{"/a", "/up"}[i%2]
		c := dialProxy(t, tp)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\nExpect: 100-continue\r\n\r\n")
		br := bufio.NewReader(c)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("%q, %v; want 100 Continue", line, err)
		}
		_, _ = br.ReadString('\n') // the 100's blank line
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			chunk := make([]byte, 64<<10)
			for range 1000000000 / len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					return // closed under it, at last
				}
			}
		}()
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s, round %d: %v, %v; want the 401", path, i+1, res, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%s, round %d: after the answer, %v; want EOF, the proxy's half-close, not a reset", path, i+1, err)
		}
		c.Close()
		<-sent
	}
}
