package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that leaves while an in-process handler's answer is under way is
// a 499, however the handler takes it: a stream that ends at its context's
// end, or an answer written after the client had gone. Both were recorded
// as 200s (a tester), where an upstream's were 499s. An answer whose whole
// declared length was written keeps its status.
func TestClientLeftDuringInProcessAnswer(t *testing.T) {
	started := make(chan struct{}, 1)
	write := make(chan struct{})
	h := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			for {
				_, _ = io.WriteString(w, "chunk\n")
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		case "/late":
			started <- struct{}{}
			<-write
			<-r.Context().Done() // the client has gone: net/http noticed
			_, _ = io.WriteString(w, "late")
		case "/whole":
			w.Header().Set("Content-Length", "6")
			_, _ = io.WriteString(w, "whole\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	tp := startProxy(t, Options{}, testDeployment{app: "a", prefix: "/", factory: h})

	for _, path := range []string{"/stream", "/whole"} {
		c := dialProxy(t, tp)
		_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\nX-Request-Id: "+path+"\r\n\r\n")
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		c.Close()
	}
	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "GET /late HTTP/1.1\r\nHost: x\r\nX-Request-Id: /late\r\n\r\n")
	<-started
	c.Close()
	close(write)

	var lines map[string]map[string]any
	waitFor(t, "three access-log lines", func() bool { lines = accessLines(tp); return len(lines) == 3 })
	for path, want := range map[string]float64{"/stream": 499, "/late": 499, "/whole": 200} {
		if e, _ := lines[path]["error"].(string); (want == 499) != (e == "the client left before the end of its answer") {
			t.Errorf("%s: logged error %q", path, e)
		}
		if got := lines[path]["status"]; got != want {
			t.Errorf("%s: logged %v, want %v (%s)", path, got, want, strings.TrimSpace(tp.access.String()))
		}
	}
}

// Not a 499 (a review): a whole answer to a HEAD, flushed, whose client
// then closes while the handler waits; nor a streamed answer to a client
// that stalled its upload, whose context the proxy's own drain of the body
// ended.
func TestWholeAnswersAreNot499(t *testing.T) {
	big := strings.Repeat("b", 5000)
	h := handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Second):
			}
			return
		}
		_, _ = io.WriteString(w, big) // past 2 KiB: the header goes out, the body drained under the timeout
		_, _ = io.WriteString(w, "done")
	})
	tp := startProxy(t, Options{ClientBodyTimeout: 200 * time.Millisecond}, testDeployment{app: "a", prefix: "/", factory: h})

	c := dialProxy(t, tp)
	_, _ = io.WriteString(c, "HEAD / HTTP/1.1\r\nHost: x\r\nX-Request-Id: head\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodHead}); err != nil {
		t.Fatal(err)
	}
	c.Close()

	c = dialProxy(t, tp)
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nX-Request-Id: stall\r\nContent-Length: 100\r\n\r\n0123456789")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.HasSuffix(string(b), "done") {
		t.Fatalf("the stalled upload's answer: %d bytes, want it whole", len(b))
	}

	var lines map[string]map[string]any
	waitFor(t, "two access-log lines", func() bool { lines = accessLines(tp); return len(lines) == 2 })
	for _, id := range []string{"head", "stall"} {
		if lines[id]["status"] != float64(200) {
			t.Errorf("%s: logged %v (%v), want 200: its client got the whole answer", id, lines[id]["status"], lines[id]["error"])
		}
	}
}
