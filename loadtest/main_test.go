package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// fakeProxyEnv, set to 1, makes the test binary act as the proxy binary
// (see fakeProxy), so GCCompare's process handling is tested in seconds.
const fakeProxyEnv = "LOADTEST_FAKE_PROXY"

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	if os.Getenv(fakeProxyEnv) == "1" {
		os.Exit(fakeProxy())
	}
	goleak.VerifyTestMain(m)
}

// fakeDieAfterEnv, set to N in the fake proxy's environment, makes it
// exit with status 3 at its Nth request.
const fakeDieAfterEnv = "LOADTEST_FAKE_DIE_AFTER"

// fakeProxy is the smallest stand-in for cmd/proxy that GCCompare and Soak
// can drive: it listens on PROXY_HTTP_ADDR and PROXY_ADMIN_ADDR, logs the
// "serving" line as JSON on stderr (and the GC variables it was given),
// answers "hi", serves /-/healthz and /metrics, and exits on SIGTERM. With
// PROXY_CONFIG set (the echo16k scenario) it answers 400 to any request
// but a POST of echoBody(16 KiB) as application/octet-stream, so that a
// load sending anything else has errors.
func fakeProxy() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pub, err := net.Listen("tcp", os.Getenv("PROXY_HTTP_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	adm, err := net.Listen("tcp", os.Getenv("PROXY_ADMIN_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/-/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("success")) })
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Fprintf(w, "# TYPE go_gc_duration_seconds summary\ngo_gc_duration_seconds_count %d\n", ms.NumGC)
		fmt.Fprintf(w, "go_goroutines %d\ngo_memstats_heap_inuse_bytes %g\n", runtime.NumGoroutine(), float64(ms.HeapInuse))
	})
	go func() { _ = http.Serve(adm, mux) }()
	var n atomic.Int64
	dieAfter, _ := strconv.ParseInt(os.Getenv(fakeDieAfterEnv), 10, 64)
	echo16k := os.Getenv("PROXY_CONFIG") != ""
	want := echoBody(16 << 10)
	go func() {
		_ = http.Serve(pub, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			i := n.Add(1)
			if i == dieAfter {
				os.Exit(3)
			}
			if i%20 == 0 {
				runtime.GC() // so that every phase has GC cycles to count
			}
			body, _ := io.ReadAll(r.Body)
			if echo16k && (r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/octet-stream" || !bytes.Equal(body, want)) {
				http.Error(w, "want the echo16k request", http.StatusBadRequest)
				return
			}
			_, _ = w.Write([]byte("hi"))
		}))
	}()
	line, _ := json.Marshal(map[string]any{
		"level": "info", "http_addr": pub.Addr().String(), "admin_addr": adm.Addr().String(), "message": "serving",
		"gc_percent": os.Getenv("PROXY_GC_PERCENT"), "gogc": os.Getenv("GOGC"), "access_log": os.Getenv("PROXY_ACCESS_LOG"),
	})
	fmt.Fprintln(os.Stderr, string(line))
	<-ctx.Done()
	return 0
}
