package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

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
