package proxy

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// fakeConnWriter stands for net/http's response: its Write ends when the
// test lets it, and it records the connection's write deadline, which
// Hijack clears as net/http's does.
type fakeConnWriter struct {
	h        http.Header
	release  chan struct{}
	hijacked chan struct{}
	mu       sync.Mutex
	isHij    bool
	deadline time.Time
}

func (f *fakeConnWriter) Header() http.Header { return f.h }
func (f *fakeConnWriter) WriteHeader(int)     {}
func (f *fakeConnWriter) Write(b []byte) (int, error) {
	<-f.release
	return len(b), nil
}
func (f *fakeConnWriter) SetWriteDeadline(t time.Time) error {
	// close() got here after seeing a write in progress; the write ends
	// on its own meanwhile, and the handler hijacks, before this lands.
	close(f.release)
	select {
	case <-f.hijacked:
	case <-time.After(time.Second): // the hijack refused
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deadline = t
	return nil
}
func (f *fakeConnWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	f.mu.Lock()
	f.isHij, f.deadline = true, time.Time{} // net/http: rwc.SetDeadline(time.Time{})
	f.mu.Unlock()
	close(f.hijacked)
	c, _ := net.Pipe()
	return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
}

// The timeout's cut of a write in progress never lands on a connection
// the handler took over right after that write: a WebSocket whose every
// write then failed (a review; the fake writer makes the interleaving
// certain).
func TestTimeoutCutNeverLandsOnAHijackedConn(t *testing.T) {
	f := &fakeConnWriter{h: http.Header{}, release: make(chan struct{}), hijacked: make(chan struct{})}
	hc := &hijackedConns{}
	sw := getStatusWriter(f, hc)
	dw := newDeadlineWriter(sw)
	handlerDone := make(chan error, 1)
	go func() {
		// Past what the deadline writer holds: the write reaches the
		// connection.
		if _, err := dw.Write(make([]byte, bufferedBody+1)); err != nil {
			handlerDone <- err
			return
		}
		c, _, err := dw.Hijack() // a handler that flushed something, then takes the connection
		if c != nil {
			defer c.Close()
		}
		handlerDone <- err
	}()
	for start := time.Now(); dw.writing.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the handler's write never began")
		}
	}
	hijacked, cut := dw.close()
	err := <-handlerDone
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("close() = hijacked %v, cut %v; handler's Hijack err %v; hijacked conn's write deadline %v", hijacked, cut, err, f.deadline)
	if f.isHij && !f.deadline.IsZero() {
		t.Errorf("the hijacked connection keeps the cut's write deadline (%v, in the past): every write of the WebSocket fails", f.deadline)
	}
}
