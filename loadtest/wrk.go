package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// WrkResult is what ParseWrk reads from `wrk --latency` output.
type WrkResult struct {
	// RequestsPerSec is "Requests/sec".
	RequestsPerSec float64
	// Requests and Elapsed are from "N requests in 10.00s, X read".
	Requests int64
	Elapsed  time.Duration
	// Latency maps the percent of each "Latency Distribution" row (50, 75,
	// 90, 99) to its latency.
	Latency map[float64]time.Duration
	// SocketErrors sums "Socket errors: connect A, read B, write C,
	// timeout D"; 0 when wrk printed no such line.
	SocketErrors int64
	// Non2xx is "Non-2xx or 3xx responses", 0 when absent.
	Non2xx int64
}

// Errors is every failed or non-2xx/3xx request wrk reported.
func (w WrkResult) Errors() int64 { return w.SocketErrors + w.Non2xx }

// ParseWrk reads the output of `wrk --latency`. Unknown lines are skipped;
// output without "Requests/sec" or the request count is an error.
func ParseWrk(r io.Reader) (WrkResult, error) {
	res := WrkResult{Latency: make(map[float64]time.Duration)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	inDist, seenRate, seenCount := false, false, false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		f := strings.Fields(line)
		if inDist {
			if len(f) == 2 && strings.HasSuffix(f[0], "%") {
				q, err1 := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
				d, err2 := parseWrkDuration(f[1])
				if err := errors.Join(err1, err2); err != nil {
					return res, fmt.Errorf("wrk latency row %q: %w", line, err)
				}
				res.Latency[q] = d
				continue
			}
			inDist = false
		}
		var err error
		switch {
		case line == "Latency Distribution":
			inDist = true
		case strings.HasPrefix(line, "Requests/sec:") && len(f) >= 2:
			res.RequestsPerSec, err = strconv.ParseFloat(f[1], 64)
			seenRate = true
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			res.Requests, err = strconv.ParseInt(f[0], 10, 64)
			if err == nil {
				res.Elapsed, err = parseWrkDuration(strings.TrimSuffix(f[3], ","))
			}
			seenCount = true
		case strings.HasPrefix(line, "Socket errors:"):
			res.SocketErrors, err = sumCounts(strings.TrimPrefix(line, "Socket errors:"))
		case strings.HasPrefix(line, "Non-2xx or 3xx responses:") && len(f) >= 5:
			res.Non2xx, err = strconv.ParseInt(f[4], 10, 64)
		}
		if err != nil {
			return res, fmt.Errorf("wrk line %q: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	if !seenRate || !seenCount {
		return res, errors.New(`wrk output has no "Requests/sec:" or "N requests in" line`)
	}
	return res, nil
}

// sumCounts adds the numbers of "connect 0, read 12, write 0, timeout 3".
func sumCounts(s string) (int64, error) {
	var sum int64
	for part := range strings.SplitSeq(s, ",") {
		f := strings.Fields(part)
		if len(f) != 2 {
			return 0, fmt.Errorf("want \"NAME COUNT\", got %q", strings.TrimSpace(part))
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// wrkUnits are wrk's time suffixes, longest first so "ms" wins over "s".
var wrkUnits = []struct {
	suffix string
	unit   time.Duration
}{
	{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour},
}

// parseWrkDuration reads wrk's times: "528.00us", "0.86ms", "2.00s", "1.00m".
func parseWrkDuration(s string) (time.Duration, error) {
	for _, u := range wrkUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0, fmt.Errorf("time %q: %w", s, err)
			}
			return time.Duration(v * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("time %q: no unit (us, ms, s, m, h)", s)
}

// WrkConfig is one wrk run: `wrk -t1 -cC -dD --latency URL`.
type WrkConfig struct {
	// Path is the wrk binary. If empty, "wrk" is looked up in PATH.
	Path string
	// URL is the target; it must be loopback unless AllowRemote.
	URL string
	// Concurrency is wrk's -c. If 0, 100 is used.
	Concurrency int
	// Duration is wrk's -d, rounded up to whole seconds (at least 1s).
	Duration time.Duration
	// AllowRemote permits a URL whose host is not loopback.
	AllowRemote bool
}

// wrkGrace is how long past its -d a wrk run may take before it is killed.
const wrkGrace = 30 * time.Second

// RunWrk runs wrk with one thread and parses its output. wrk is killed if
// it outlives its duration by 30s or ctx ends.
func RunWrk(ctx context.Context, cfg WrkConfig) (WrkResult, error) {
	if !cfg.AllowRemote {
		if err := CheckLoopback(cfg.URL); err != nil {
			return WrkResult{}, err
		}
	}
	path := cfg.Path
	if path == "" {
		p, err := exec.LookPath("wrk")
		if err != nil {
			return WrkResult{}, err
		}
		path = p
	}
	c := cfg.Concurrency
	if c == 0 {
		c = 100
	}
	sec := max(1, int64((cfg.Duration+time.Second-1)/time.Second))
	ctx, cancel := context.WithTimeout(ctx, time.Duration(sec)*time.Second+wrkGrace)
	defer cancel()
	// #nosec G204 -- the binary is wrk, and every argument is a number or a
	// URL checked above.
	cmd := exec.CommandContext(ctx, path, "-t1", "-c"+strconv.Itoa(c), "-d"+strconv.FormatInt(sec, 10)+"s", "--latency", cfg.URL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return WrkResult{}, fmt.Errorf("wrk: %w", ctx.Err())
		}
		return WrkResult{}, fmt.Errorf("wrk: %w: %s", err, strings.TrimSpace(out.String()))
	}
	text := out.String()
	res, err := ParseWrk(strings.NewReader(text))
	if err != nil {
		return res, fmt.Errorf("%w; output:\n%s", err, text)
	}
	return res, nil
}
