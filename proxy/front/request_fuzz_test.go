package front

import (
	"bufio"
	"bytes"
	"net/http"
	"reflect"
	"testing"
)

// FuzzParseHead holds the lean path's parser to net/http's: a head it
// takes, net/http reads too, into the same request (method, target, URL,
// Host, header, Close); anything else it leaves to net/http.
func FuzzParseHead(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a?b=c HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n",
		"HEAD /%41 HTTP/1.1\r\nhost: x\r\nX-A: 1\r\nx-a: 2\r\nConnection: close\r\n\r\n",
		"DELETE /x HTTP/1.1\r\nHost: [::1]:80\r\nPragma: no-cache\r\nConnection: keep-alive, close\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX:  padded\t \r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
		"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\nHost: x\n\n",
		"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		req, ok := parseHead(head)
		if !ok {
			return
		}
		std, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			t.Fatalf("parseHead took %q, net/http refuses it: %v", head, err)
		}
		if hosts := std.Header["Host"]; len(hosts) > 0 {
			t.Fatalf("parseHead took %q with a Host net/http left in the header", head)
		}
		got := []any{req.Method, req.RequestURI, req.URL.String(), req.Host, req.Close, req.Proto, req.ContentLength}
		want := []any{std.Method, std.RequestURI, std.URL.String(), std.Host, std.Close, std.Proto, std.ContentLength}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: parseHead %v, net/http %v", head, got, want)
		}
		if !reflect.DeepEqual(req.Header, std.Header) {
			t.Fatalf("%q: header %v, net/http %v", head, req.Header, std.Header)
		}
	})
}
