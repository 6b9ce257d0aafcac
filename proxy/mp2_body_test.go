package proxy

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"testing"
	"time"
)

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
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		fw, _ := mw.CreateFormFile("f", "f.bin")
		_, _ = fw.Write(bytes.Repeat([]byte("x"), 10000))
		_ = mw.Close()
		res, err := http.Post(tp.url+"/mp", mw.FormDataContentType(), &buf)
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
