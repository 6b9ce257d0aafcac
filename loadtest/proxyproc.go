package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds on a proxy process's life.
const (
	// proxyStartTimeout bounds the wait for the "serving" line and a 200
	// from /-/healthz.
	proxyStartTimeout = 20 * time.Second
	// proxyStopTimeout is the grace between SIGTERM and SIGKILL.
	proxyStopTimeout = 10 * time.Second
)

// proxyProc is a running proxy binary.
type proxyProc struct {
	cmd *exec.Cmd
	// HTTPAddr and AdminAddr are the bound addresses from the "serving"
	// line.
	HTTPAddr, AdminAddr string
	logPath             string
	exited              chan struct{} // closed once Wait returned
	waitErr             error         // Wait's result; read after exited
}

// proxyEnv returns the environment for a proxy child: this process's,
// without any PROXY_* variable and without the runtime's own GC knobs (a
// GOGC or GOMEMLIMIT from the caller's shell would override every setting
// under test), plus vars.
func proxyEnv(parent []string, vars map[string]string) []string {
	var env []string
	for _, kv := range parent {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PROXY_") || k == "GOGC" || k == "GOMEMLIMIT" {
			continue
		}
		env = append(env, kv)
	}
	for _, k := range sortedKeys(vars) {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// startProxy starts the proxy binary at path with vars set, its stderr in
// the file logPath, and returns once it logged its "serving" line and its
// admin /-/healthz answers 200. The process is stopped (see stop) on any
// error.
func startProxy(ctx context.Context, path string, vars map[string]string, logPath string) (*proxyProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child holds its own descriptor
	// #nosec G204 -- path is the proxy binary the caller chose or built.
	cmd := exec.Command(path)
	cmd.Env = proxyEnv(os.Environ(), vars)
	// The child writes its log straight to the file: copying it through
	// this process would spend the load generator's CPU on log lines.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proxyProc{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	if err := p.waitReady(ctx); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// waitReady polls the log for the "serving" line, then /-/healthz for 200.
func (p *proxyProc) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, proxyStartTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer client.CloseIdleConnections()
	for {
		if p.HTTPAddr == "" {
			if s, ok := findServing(p.logPath); ok {
				p.HTTPAddr, p.AdminAddr = s.HTTPAddr, s.AdminAddr
				if err := CheckLoopback("http://" + s.HTTPAddr); err != nil {
					return fmt.Errorf("proxy serving on %s: %w", s.HTTPAddr, err)
				}
				if err := CheckLoopback("http://" + s.AdminAddr); err != nil {
					return fmt.Errorf("proxy admin on %s: %w", s.AdminAddr, err)
				}
			}
		}
		if p.AdminAddr != "" && healthy(ctx, client, "http://"+p.AdminAddr+"/-/healthz") {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("proxy exited while starting: %v", p.waitErr)
		case <-ctx.Done():
			if p.HTTPAddr == "" {
				return fmt.Errorf("no serving line within %v: %w", proxyStartTimeout, ctx.Err())
			}
			return fmt.Errorf("admin /-/healthz not 200 within %v: %w", proxyStartTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// healthy reports whether GET url answers 200.
func healthy(ctx context.Context, c *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// servingLine is the part of the proxy's "serving" log line read here.
type servingLine struct {
	Message   string `json:"message"`
	HTTPAddr  string `json:"http_addr"`
	AdminAddr string `json:"admin_addr"`
}

// findServing scans the log file for the "serving" line.
func findServing(path string) (servingLine, bool) {
	f, err := os.Open(path)
	if err != nil {
		return servingLine{}, false
	}
	defer f.Close()
	return parseServing(f)
}

// parseServing returns the first JSON line of r whose "message" is
// "serving" and that names both addresses.
func parseServing(r io.Reader) (servingLine, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"serving"`)) {
			continue
		}
		var s servingLine
		if json.Unmarshal(line, &s) == nil && s.Message == "serving" && s.HTTPAddr != "" && s.AdminAddr != "" {
			return s, true
		}
	}
	return servingLine{}, false
}

// stop sends SIGTERM, then SIGKILL if the process has not exited after
// proxyStopTimeout, and waits for it.
func (p *proxyProc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(proxyStopTimeout)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// alive reports whether the process is still running.
func (p *proxyProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// gcCycles returns go_gc_duration_seconds_count from the admin /metrics.
func (p *proxyProc) gcCycles(ctx context.Context) (float64, error) {
	body, err := p.metrics(ctx)
	if err != nil {
		return 0, err
	}
	return ParseMetric(strings.NewReader(body), "go_gc_duration_seconds_count")
}

// metricsTimeout bounds one GET of the admin /metrics.
const metricsTimeout = 5 * time.Second

// metrics returns the admin /metrics page (its first 16 MiB).
func (p *proxyProc) metrics(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, metricsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.AdminAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return string(b), err
}

// ParseMetric returns the value of the unlabelled sample name in
// Prometheus text exposition r ("name 123"). It is an error if there is
// none.
func ParseMetric(r io.Reader, name string) (float64, error) {
	m, err := ParseMetrics(r, name)
	return m[name], err
}

// ParseMetrics returns the values of the unlabelled samples names in
// Prometheus text exposition r ("name 123", "name 1.8432e+06"), the first
// of each. It is an error if one is missing or not a number.
func ParseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	got := make(map[string]float64, len(names))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() && len(got) < len(want) {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		if _, seen := got[f[0]]; seen {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return got, fmt.Errorf("metric %s: %w", f[0], err)
		}
		got[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return got, err
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			return got, fmt.Errorf("metric %s: not found", n)
		}
	}
	return got, nil
}

// tailFile returns the last n lines of the file at path (of its last
// 64 KiB at most) that are not access log lines, for error messages.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 64<<10 {
		_, _ = f.Seek(-64<<10, io.SeekEnd)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	// Access log lines say nothing about why the proxy failed.
	var lines []string
	for line := range strings.SplitSeq(strings.TrimRight(string(b), "\n"), "\n") {
		if !strings.Contains(line, `"component":"access"`) {
			lines = append(lines, line)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errProxyDied is returned when the proxy exits during a run.
var errProxyDied = errors.New("proxy exited during the run")

// checkProxyPath checks that path names an executable file, for the
// harnesses' ProxyPath.
func checkProxyPath(path string) error {
	if path == "" {
		return errors.New("ProxyPath: required")
	}
	if st, err := os.Stat(path); err != nil {
		return fmt.Errorf("ProxyPath: %w", err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("ProxyPath: %s is not an executable file", path)
	}
	return nil
}
