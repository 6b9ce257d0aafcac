package proxy

import (
	"bufio"
	"io"
	"testing"
	"time"
)

// An unread body sent steadily over about 800 ms (each part well within
// the body timeout) to a static handler keeps the connection, over
// HTTP/1.1 and HTTP/1.0 keep-alive alike: net/http frames a small HTTP/1.0
// answer itself, and the body is drained under the body timeout, not the
// 500 ms linger (found by review).
func TestHTTP10KeepAliveSlowSteadyBody(t *testing.T) {
	tp := unreadBodyProxy(t, 2*time.Second)
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		c := dialProxy(t, tp)
		br := bufio.NewReader(c)
		start := time.Now()
		_, _ = io.WriteString(c, "POST /static "+proto+"\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 10\r\n\r\n")
		go func() {
			for range 10 {
				time.Sleep(80 * time.Millisecond)
				_, _ = io.WriteString(c, "x")
			}
		}()
		res, _, _ := readAnswer(t, c, br, proto)
		t.Logf("%s: answer after %v, Connection %q", proto, time.Since(start).Round(time.Millisecond), res.Header.Get("Connection"))
		time.Sleep(900 * time.Millisecond)
		_, _ = io.WriteString(c, "GET /static "+proto+"\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := br.Peek(1)
		if err != nil {
			t.Errorf("%s: the connection did not serve a second request: %v", proto, err)
		}
	}
}
