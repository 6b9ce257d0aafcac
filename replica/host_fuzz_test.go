package replica

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// requestFrameBody encodes a request frame's body as the proxy does.
func requestFrameBody(t testing.TB, req *http.Request, body []byte) []byte {
	t.Helper()
	c := &HostConn{}
	b := []byte{0, 0}
	b = appendStr8(b, req.Method)
	b, err := appendTarget(b, req.URL)
	if err != nil {
		t.Fatal(err)
	}
	b = appendStr16(b, req.Host)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, byte(len(body)))
	if b, err = c.appendRequestHeaders(b, req); err != nil {
		t.Fatal(err)
	}
	return append(b, body...)
}

// FuzzHostFrames feeds arbitrary bytes to every parser of the protocol:
// the frame reader, and the request, response, control, result and error
// bodies. None may panic or read out of bounds; a body either parses or is
// refused.
func FuzzHostFrames(f *testing.F) {
	req := httptest.NewRequest(http.MethodPost, "http://x.test/a/b?q=1", nil)
	req.Header.Set("X-A", "1")
	req.Header.Add("X-A", "2")
	f.Add(requestFrameBody(f, req, []byte("body")))
	resp := []byte{0, 200}
	resp, _ = appendHeaders(resp, http.Header{"Content-Type": {"text/plain"}, "Connection": {"X-B"}, "X-B": {"1"}}, nil)
	f.Add(append(resp, "hi"...))
	f.Add([]byte{0, 0, 0, 10, 4, 'c', 'h', 'e', 'c', 'k', 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1})
	f.Add([]byte{0, 0, 0, 4, byte(frameData), flagEnd, 0, 0, 0, 1, 'a', 'b', 'c', 'd'})
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, p []byte) {
		s := &hostStream{id: 1, ctx: context.Background(), cancel: func() {}}
		_, _ = new(hostRequest).parse(&hostSession{remote: "127.0.0.1:1"}, s, p, true)
		_, _ = new(hostRequest).parse(&hostSession{remote: "127.0.0.1:1"}, s, p, false)
		_, _, _ = (&HostConn{}).readResponseHead(make(http.Header), p)
		_, _, _, _, _, _ = parseControl(p)
		_ = decodeErrorFrame(p)
		r := newWireReader(p)
		for range int(r.u16()) {
			r.u8()
			r.bytes32()
		}
		fr := &frameReader{br: bufio.NewReaderSize(bytes.NewReader(p), 64), max: 128}
		for range 10 {
			if _, _, _, _, err := fr.next(); err != nil {
				break
			}
		}
	})
}
