package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os/exec"
	"slices"
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
	// 90, 99) to its latency, and 99.9 to the p99.9 that WrkDoneHook
	// prints when the run's script has it. A percent wrk did not print is
	// absent: unknown, never 0.
	Latency map[float64]time.Duration
	// Mean and Max are the Avg and Max columns of the "Latency" thread
	// stats row (all threads, to 10µs at best: wrk prints two decimals).
	// Max is replaced by the exact one from WrkDoneHook's line when
	// present. Both are 0 when wrk printed no such row.
	Mean, Max time.Duration
	// SocketErrors sums "Socket errors: connect A, read B, write C,
	// timeout D"; 0 when wrk printed no such line.
	SocketErrors int64
	// Non2xx is "Non-2xx or 3xx responses", 0 when absent.
	Non2xx int64
	// CPU is the user and system time wrk itself spent on the run (set by
	// RunWrk, not by ParseWrk).
	CPU time.Duration
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
		case len(f) == 5 && f[0] == "Latency":
			// "Latency  0.87ms  1.11ms  9.82ms  89.32%": avg, stdev, max, +/-.
			res.Mean, err = parseWrkDuration(f[1])
			if err == nil && res.Max == 0 {
				res.Max, err = parseWrkDuration(f[3])
			}
		case strings.HasPrefix(line, wrkHookPrefix):
			err = parseWrkHook(strings.TrimPrefix(line, wrkHookPrefix), &res)
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

// wrkHookPrefix starts the line WrkDoneHook prints.
const wrkHookPrefix = "loadtest: latency_us"

// WrkDoneHook is a wrk Lua done function printing what `wrk --latency`
// does not: the p99.9 and the exact maximum, in microseconds, from wrk's
// own latency histogram (the one its distribution is read from), on a line
// ParseWrk reads:
//
//	loadtest: latency_us p99.9 16340 max 22999
//
// wrk calls done once, after the run and its report, so the hook costs the
// run nothing.
const WrkDoneHook = `done = function(summary, latency, requests)
  io.write(string.format("` + wrkHookPrefix + ` p99.9 %.0f max %.0f\n", latency:percentile(99.9), latency.max))
end
`

// parseWrkHook reads the pairs after wrkHookPrefix: "p99.9 16340 max 22999"
// (microseconds).
func parseWrkHook(s string, res *WrkResult) error {
	f := strings.Fields(s)
	if len(f)%2 != 0 {
		return fmt.Errorf("want NAME MICROSECONDS pairs, got %q", strings.TrimSpace(s))
	}
	for i := 0; i < len(f); i += 2 {
		us, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil || us < 0 || us > float64(histMaxUS) {
			return fmt.Errorf("%s: want microseconds, got %q", f[i], f[i+1])
		}
		d := time.Duration(us * float64(time.Microsecond))
		if f[i] == "max" {
			res.Max = d
			continue
		}
		// "p99.9"; other names, from a later hook, are skipped.
		if q, ok := strings.CutPrefix(f[i], "p"); ok {
			pct, err := strconv.ParseFloat(q, 64)
			if err != nil || pct <= 0 || pct > 100 {
				return fmt.Errorf("percentile %q: want p0..p100", f[i])
			}
			res.Latency[pct] = d
		}
	}
	return nil
}

// WrkScript returns a wrk Lua script that sends load's request (its
// method, header and body, so that wrk sends byte for byte what Run would)
// and ends with WrkDoneHook. A Config with neither method, header nor body
// gives the hook alone: wrk's own GET.
func WrkScript(load Config) string {
	var b strings.Builder
	b.WriteString("-- Written by loadtest for wrk -s.\n")
	if load.Method != "" && load.Method != http.MethodGet {
		fmt.Fprintf(&b, "wrk.method = %s\n", luaQuote([]byte(load.Method)))
	}
	for _, k := range slices.Sorted(maps.Keys(load.Header)) {
		// wrk.headers holds one value per name; a list is sent as one
		// comma-joined field, which HTTP reads the same (RFC 9110, 5.3).
		fmt.Fprintf(&b, "wrk.headers[%s] = %s\n", luaQuote([]byte(http.CanonicalHeaderKey(k))),
			luaQuote([]byte(strings.Join(load.Header[k], ", "))))
	}
	if load.Body != nil {
		fmt.Fprintf(&b, "wrk.body = %s\n", luaQuote(load.Body))
	}
	b.WriteString(WrkDoneHook)
	return b.String()
}

// luaQuote returns b as a double-quoted Lua string literal: printable ASCII
// as itself, everything else as a decimal escape (\ddd, three digits so
// that a following digit cannot join it).
func luaQuote(b []byte) string {
	var s strings.Builder
	s.Grow(len(b) + 2)
	s.WriteByte('"')
	for _, c := range b {
		switch {
		case c == '"' || c == '\\':
			s.WriteByte('\\')
			s.WriteByte(c)
		case c >= ' ' && c < 0x7f:
			s.WriteByte(c)
		default:
			fmt.Fprintf(&s, "\\%03d", c)
		}
	}
	s.WriteByte('"')
	return s.String()
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

// WrkConfig is one wrk run: `wrk -t1 -cC -dD --latency [-s SCRIPT] URL`.
type WrkConfig struct {
	// Path is the wrk binary. If empty, "wrk" is looked up in PATH.
	Path string
	// URL is the target; it must be loopback unless AllowRemote.
	URL string
	// Concurrency is wrk's -c. If 0, 100 is used.
	Concurrency int
	// Duration is wrk's -d, rounded up to whole seconds (at least 1s).
	Duration time.Duration
	// Script is wrk's -s, a Lua script file (see WrkScript). If empty, wrk
	// sends its own GET and prints no p99.9.
	Script string
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
	args := []string{"-t1", "-c" + strconv.Itoa(c), "-d" + strconv.FormatInt(sec, 10) + "s", "--latency"}
	if cfg.Script != "" {
		args = append(args, "-s", cfg.Script)
	}
	// #nosec G204 -- the binary is wrk, and every argument is a number, the
	// caller's script file or a URL checked above.
	cmd := exec.CommandContext(ctx, path, append(args, cfg.URL)...)
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
	res.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return res, nil
}
