package proxy

import (
	"bufio"
	"bytes"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

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
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		fw, _ := mw.CreateFormFile("f", "f.bin")
		_, _ = fw.Write(bytes.Repeat([]byte("x"), 10000))
		_ = mw.Close()
		res, err := http.Post(tp.url+"/mp", mw.FormDataContentType(), &buf)
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
