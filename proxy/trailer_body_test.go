package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

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
