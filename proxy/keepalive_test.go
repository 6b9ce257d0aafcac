package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// rawGet sends one keep-alive GET on c and reads its answer.
func rawGet(t *testing.T, c net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read answer to %s: %v", path, err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("read body of %s: %v", path, err)
	}
	resp.Body.Close()
	return resp
}

// dialRaw opens a connection to addr for raw HTTP/1.1, closed when the
// test ends.
func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// waitClosed reads c until the server closes it (at most 10 s) and returns
// when that was.
func waitClosed(t *testing.T, c net.Conn, br *bufio.Reader) time.Time {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := br.ReadByte()
	closed := time.Now()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the idle connection was still open after 10 s")
	}
	if err == nil {
		t.Fatal("the server sent a byte on an idle connection")
	}
	return closed
}

// TestKeepAliveTimeout checks that a keep-alive connection is closed once
// it has idled for the keep-alive timeout, and never while a request on it
// is running or being read, however long that takes.
func TestKeepAliveTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tp := startProxyWith(t, Options{}, ServerOptions{ReadHeaderTimeout: 5 * time.Second, KeepAliveTimeout: timeout},
		testDeployment{app: "hi", prefix: "/", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(3 * timeout)
			}
			_, _ = io.WriteString(w, "hi")
		})})
	addr := strings.TrimPrefix(tp.url, "http://")

	t.Run("idle", func(t *testing.T) {
		c, br := dialRaw(t, addr)
		rawGet(t, c, br, "/")
		idle := time.Now()
		// The server's clock starts a little before the client's: half the
		// timeout is the bound that cannot flake.
		if d := waitClosed(t, c, br).Sub(idle); d < timeout/2 {
			t.Errorf("closed after %v idle, long before the timeout %v", d, timeout)
		}
	})

	t.Run("busy", func(t *testing.T) {
		c, br := dialRaw(t, addr)
		opened := time.Now()
		// Requests closer together than the timeout keep the connection,
		// and so does one that runs for three times the timeout.
		for range 6 {
			rawGet(t, c, br, "/")
			time.Sleep(timeout / 3)
		}
		if resp := rawGet(t, c, br, "/slow"); resp.StatusCode != http.StatusOK {
			t.Fatalf("slow request: %s", resp.Status)
		}
		if resp := rawGet(t, c, br, "/"); resp.StatusCode != http.StatusOK {
			t.Fatalf("request after the slow one: %s", resp.Status)
		}
		if d := time.Since(opened); d < 2*timeout {
			t.Fatalf("the test's requests took %v, not past the timeout", d)
		}
		waitClosed(t, c, br)
	})

	t.Run("slow body", func(t *testing.T) {
		// A request whose body takes longer than the timeout to arrive is
		// active, not idle: it is answered.
		c, br := dialRaw(t, addr)
		if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 4\r\n\r\nab"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * timeout)
		if _, err := io.WriteString(c, "cd"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer to a slow body: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("slow body: %s", resp.Status)
		}
	})
}
