package proxy

import (
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// A multipart form's temporary files are removed when the proxy ends the
// request by panicking with http.ErrAbortHandler (a 499 whose handler wrote
// nothing, an abort): net/http's finishRequest, which removes them, does
// not run after a panic.
func TestMultipartFilesRemovedOn499(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	for _, opts := range []Options{{ClientBodyTimeout: time.Second}, {RequestTimeout: 5 * time.Second}} {
		parsed := make(chan struct{}, 1)
		tp := startProxy(t, opts,
			testDeployment{app: "mp", prefix: "/mp", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if err := r.ParseMultipartForm(0); err != nil {
					http.Error(w, err.Error(), 400)
					return
				}
				parsed <- struct{}{}
				<-r.Context().Done() // the client left: nothing to answer
			})})
		buf, contentType := fileForm()
		c := dialProxy(t, tp)
		fmt.Fprintf(c, "POST /mp HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", contentType, buf.Len())
		_, _ = c.Write(buf.Bytes())
		select {
		case <-parsed:
		case <-time.After(5 * time.Second):
			t.Fatal("the handler did not parse the form")
		}
		_ = c.Close()
		waitFor(t, "the request logged", func() bool { return bytes.Contains([]byte(tp.access.String()), []byte(`"status":499`)) })
		time.Sleep(100 * time.Millisecond)
		ents, _ := os.ReadDir(dir)
		t.Logf("%v: %d files; log %s", opts.RequestTimeout, len(ents), tp.access.String())
		if len(ents) > 0 {
			t.Errorf("%+v: %d temporary files left after a 499", opts, len(ents))
			for _, e := range ents {
				os.Remove(dir + "/" + e.Name())
			}
		}
		_ = tp.stop()
	}
	_ = net.IPv4len
	_ = io.EOF
}

// The files of a multipart form parsed by a handler the proxy gave up on
// (408 at the request timeout) are removed once it returns.
func TestMultipartAbandoned(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	for _, flush := range []bool{false, true} {
		returned := make(chan struct{})
		tp := startProxy(t, Options{RequestTimeout: 200 * time.Millisecond, ClientBodyTimeout: time.Second},
			testDeployment{app: "mp", prefix: "/mp", factory: handlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(returned)
				if err := r.ParseMultipartForm(0); err != nil {
					http.Error(w, err.Error(), 400)
					return
				}
				if flush {
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
				}
				time.Sleep(500 * time.Millisecond) // ignores its context
				_ = r.MultipartForm.File["f"][0].Filename
			})})
		buf, contentType := fileForm()
		res, err := http.Post(tp.url+"/mp", contentType, buf)
		if err == nil {
			_, _ = io.ReadAll(res.Body)
			res.Body.Close()
			t.Logf("flush=%v: %d", flush, res.StatusCode)
		} else {
			t.Logf("flush=%v: %v", flush, err)
		}
		<-returned
		time.Sleep(100 * time.Millisecond)
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			t.Errorf("flush=%v: %d files left", flush, len(ents))
		}
		_ = tp.stop()
	}
}

// fileForm is a multipart form with one 10,000-byte file, "f", enough for
// net/http to spool it to a temp file; and its Content-Type.
func fileForm() (*bytes.Buffer, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("f", "f.bin")
	_, _ = fw.Write(bytes.Repeat([]byte("x"), 10000))
	_ = mw.Close()
	return &buf, mw.FormDataContentType()
}
