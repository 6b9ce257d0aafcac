package proxy

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// returns to nothing: its request is still answered (500) and recorded, and
// its replica's slot freed. Before, the client's connection was closed with
// no answer, nothing was logged, and the slot was lost for good: with
// max_ongoing_requests 1 every later request queued forever. With a request
// timeout the handler runs in a goroutine of its own, and the request waited
// out the timeout for a 408.
func TestHandlerGoexitAnswered(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		t.Run("timeout="+timeout.String(), func(t *testing.T) {
			tp := startProxy(t, Options{RequestTimeout: timeout}, testDeployment{app: "a", prefix: "/", maxOngoing: 1,
				factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch r.URL.Query().Get("goexit") {
					case "before":
						runtime.Goexit()
					case "after":
						w.Header().Set("Content-Length", "10")
						_, _ = io.WriteString(w, "half")
						w.(http.Flusher).Flush()
						runtime.Goexit()
					}
					_, _ = io.WriteString(w, "fine")
				})})
			c := &http.Client{Timeout: 10 * time.Second}
			start := time.Now()
			resp, err := c.Get(tp.url + "/?goexit=before")
			if err != nil {
				t.Fatalf("a handler that ended its goroutine: %v, want a 500", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 500 || !strings.Contains(string(body), "Internal Server Error") {
				t.Fatalf("a handler that ended its goroutine: %d %q after %v, want 500", resp.StatusCode, body, time.Since(start))
			}
			// An answer begun is cut, not passed off as whole.
			resp, err = c.Get(tp.url + "/?goexit=after")
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Fatalf("an answer begun, then the handler ended its goroutine: read whole, want it cut")
			}
			for i := range 3 {
				resp, err := c.Get(tp.url + "/")
				if err != nil {
					t.Fatalf("request %d after: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != "fine" {
					t.Fatalf("request %d after: %d %q, want the replica (max_ongoing_requests 1) serving", i, resp.StatusCode, b)
				}
			}
			var lines []string
			waitFor(t, "five access-log lines", func() bool {
				lines = strings.Split(strings.TrimSpace(tp.access.String()), "\n")
				return len(lines) == 5
			})
			for i, want := range []string{`"status":500`, `"status":500`} {
				if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "runtime.Goexit") {
					t.Errorf("access-log line %d = %s, want %s and the error", i, lines[i], want)
				}
			}
		})
	}
}

// A panic after the answer began is logged as what it did: the answer cut,
// not a 500 (a tester read "answered 500" beside the 200's head its client
// got).
func TestPanicAfterAnswerBeganLogLine(t *testing.T) {
	logs := &syncBuffer{}
	tp := startProxy(t, Options{Log: zerolog.New(logs)}, testDeployment{app: "a", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		panic("late")
	})})
	resp, err := http.Get(tp.url + "/")
	if err == nil {
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	waitFor(t, "the panic's line", func() bool { return strings.Contains(logs.String(), `"panic":"late"`) })
	if !strings.Contains(logs.String(), "handler panicked after its answer began; connection cut") {
		t.Errorf("the panic's line: %s", logs.String())
	}
}
