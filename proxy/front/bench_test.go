package front

import (
	"bufio"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
)

// wrkHead is the request wrk sends.
var wrkHead = []byte("GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n")

// BenchmarkParseHead measures the lean path's parse of wrk's request.
func BenchmarkParseHead(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseHead(wrkHead); !ok {
			b.Fatal("not taken")
		}
	}
}

// BenchmarkServe measures a keep-alive request and its answer over
// loopback, one at a time on one connection, with the lean front and with
// net/http's server side by side: a handler that sets X-Request-Id and
// writes "hi", as the proxy's default app answers.
func BenchmarkServe(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "id")
		_, _ = io.WriteString(w, "hi")
	})
	quiet := log.New(io.Discard, "", 0)
	type server interface {
		Serve(net.Listener) error
		Close() error
	}
	for _, tc := range []struct {
		name string
		srv  func() server
	}{
		{"front", func() server { return &Server{Handler: h, ErrorLog: quiet} }},
		{"net_http", func() server { return &http.Server{Handler: h, ErrorLog: quiet} }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := tc.srv()
			go func() { _ = srv.Serve(ln) }()
			defer func() { _ = srv.Close() }()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(wrkHead); err != nil {
					b.Fatal(err)
				}
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
			}
		})
	}
}
