package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startBodyReader is an upstream replica that reads the whole body and
// answers its length.
func startBodyReader(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		_, _ = io.WriteString(w, "got "+strconv.Itoa(len(b)))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// A client that stalls its upload is answered 408 once no part of the body
// has come for the timeout, its connection closed, and its replica's slot
// freed: before, it held the slot for as long as it liked.
func TestClientBodyTimeout408(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 300 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", targets: []string{startBodyReader(t)}})
	c := dialProxy(t, tp)
	defer c.Close()
	start := time.Now()
	_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusRequestTimeout || !res.Close {
		t.Fatalf("stalled upload: %v, %v; want 408 closing the connection", res, err)
	}
	b, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(b), "PROXY_CLIENT_BODY_TIMEOUT") {
		t.Fatalf("408 body %q does not say which timeout", b)
	}
	t.Logf("408 after %v", time.Since(start).Round(time.Millisecond))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after the 408: %v, want the connection closed", err)
	}
	for _, r := range tp.Deployments()[0].Replicas() {
		waitFor(t, "the replica's slot free", func() bool { return r.Ongoing() == 0 })
	}
	waitFor(t, "408 logged", func() bool { return strings.Contains(tp.access.String(), `"status":408`) })
}

// A body that comes slowly, but each part within the timeout, is taken
// whole; and the connection serves the next request after it (the
// deadline does not outlive the body).
func TestClientBodyTimeoutIsBetweenParts(t *testing.T) {
	tp := startProxy(t, Options{ClientBodyTimeout: 400 * time.Millisecond},
		testDeployment{app: "a", prefix: "/", targets: []string{startBodyReader(t)}})
	c := dialProxy(t, tp)
	defer c.Close()
	_, _ = io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
	for range 5 { // 5 × 150 ms: longer than the timeout in all
		time.Sleep(150 * time.Millisecond)
		_, _ = io.WriteString(c, "x")
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("slow upload within the timeout: %v, %v; want 200", res, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	time.Sleep(600 * time.Millisecond) // idle past the body timeout: the keep-alive's, not the body's
	_, _ = io.WriteString(c, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err = http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("next request on the connection: %v, %v; want 200", res, err)
	}
}
