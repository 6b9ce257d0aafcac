package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
