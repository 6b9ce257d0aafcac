package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
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

// fakeProxy is the smallest stand-in for cmd/proxy that GCCompare can
// drive: it listens on PROXY_HTTP_ADDR and PROXY_ADMIN_ADDR, logs the
// "serving" line as JSON on stderr (and the GC variables it was given),
// answers "hi", serves /-/healthz and /metrics, and exits on SIGTERM.
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
	})
	go func() { _ = http.Serve(adm, mux) }()
	var n atomic.Int64
	go func() {
		_ = http.Serve(pub, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if n.Add(1)%20 == 0 {
				runtime.GC() // so that every phase has GC cycles to count
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
