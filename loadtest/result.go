package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Quantiles are the percentiles every Result reports, in percent.
var Quantiles = []float64{50, 66, 75, 80, 90, 95, 98, 99, 99.9, 100}

// Percentile is the latency under which a share of the responses came.
type Percentile struct {
	// Quantile is the share, in percent (50, 99.9, 100).
	Quantile float64
	// Latency is the highest latency of that share, to the histogram's
	// precision (3 significant digits); 100 is the exact maximum.
	Latency time.Duration
}

// Result is what a Run measured.
//
// Every request the run started ends in exactly one of Completed (a
// response, whatever its status), Failed (no whole response: a transport
// error, a timeout, or dropped by the open loop) or Cancelled (still in
// flight when the run ended).
type Result struct {
	// URL, Method, Concurrency, Rate and KeepAlive restate the load.
	URL         string
	Method      string
	Concurrency int
	Rate        float64
	KeepAlive   bool

	// Total is Completed + Failed: the requests whose outcome is known.
	Total int64
	// Completed counts responses, whatever their status.
	Completed int64
	// Failed counts requests without a whole response, Dropped included.
	Failed int64
	// Dropped counts open-loop requests not sent because MaxInFlight were
	// in flight when they were due; they are also in Failed.
	Dropped int64
	// Cancelled counts requests in flight when the run ended (Duration
	// reached or the context done); they are in no other count.
	Cancelled int64
	// Non2xx counts responses with a status outside 200..299.
	Non2xx int64
	// StatusCodes counts responses by status code.
	StatusCodes map[int]int64
	// Bytes is the response body bytes read.
	Bytes int64
	// Elapsed is the wall time from the first send to the end of the run.
	Elapsed time.Duration
	// RequestsPerSec is the requests sent whose outcome is known (Total
	// less Dropped) per second of Elapsed, as ab computes it: failed ones
	// count, as in ab and hey.
	RequestsPerSec float64

	// Mean, Min and Max are the exact latencies of the responses (failed
	// requests have none). Closed loop latency runs from the send to the
	// end of the body; open loop latency from the intended send time. Max
	// also counts each Cancelled request at its age when it was cancelled,
	// as the percentiles do.
	Mean, Min, Max time.Duration
	// Percentiles holds one entry per element of Quantiles, in order: of
	// the responses' latencies and the Cancelled requests' ages (lower
	// bounds of theirs), so that a stall at the end of a run shows.
	Percentiles []Percentile

	// Errors counts failures by message (addresses stripped), at most a few
	// dozen distinct messages; the rest are under "(other errors)".
	Errors map[string]int64

	hist *hdrhistogram.Histogram
}

// measured reports whether any latency was: a response's, or a cancelled
// request's age.
func (r *Result) measured() bool { return r.Completed > 0 || r.Cancelled > 0 }

// finish fills the derived fields from the histogram and counts.
func (r *Result) finish() {
	r.Total = r.Completed + r.Failed
	if r.Elapsed > 0 {
		// Dropped requests were never sent: counting them would make a
		// target that cannot keep up look as fast as the rate asked.
		r.RequestsPerSec = float64(r.Total-r.Dropped) / r.Elapsed.Seconds()
	}
	r.Percentiles = make([]Percentile, len(Quantiles))
	for i, q := range Quantiles {
		r.Percentiles[i] = Percentile{Quantile: q, Latency: r.Latency(q)}
	}
}

// Latency returns the latency under which q percent of the responses came
// (0 < q <= 100), the Cancelled requests counted at their ages, to the
// histogram's precision; 100 is the exact maximum, and 0 is returned when
// there were neither.
func (r *Result) Latency(q float64) time.Duration {
	if r.hist == nil || r.hist.TotalCount() == 0 {
		return 0
	}
	if q >= 100 {
		return r.Max
	}
	// The histogram reports the highest value equivalent to the bucket;
	// never above the exact maximum.
	return min(time.Duration(r.hist.ValueAtQuantile(q))*time.Microsecond, r.Max)
}

// ms converts d to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteText writes r in ab's shape, so that ParseText (and eyes used to ab)
// read it: "Complete requests:", "Failed requests:", "Non-2xx responses:"
// (only when there were some), "Requests per second:", "Time per
// request:", and the table of percentiles in milliseconds. Unlike ab's,
// "Complete requests" counts responses only, not failures.
func (r *Result) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	p := func(format string, a ...any) { fmt.Fprintf(ew, format, a...) }
	p("URL:                    %s %s\n", r.Method, r.URL)
	if r.Rate > 0 {
		p("Rate:                   %g [#/sec] (open loop, latency from intended send time)\n", r.Rate)
	} else {
		p("Concurrency Level:      %d\n", r.Concurrency)
	}
	p("Keep-Alive:             %t\n", r.KeepAlive)
	p("Time taken for tests:   %.3f seconds\n", r.Elapsed.Seconds())
	p("Complete requests:      %d\n", r.Completed)
	p("Failed requests:        %d\n", r.Failed)
	if r.Dropped > 0 {
		p("Dropped requests:       %d (max in flight reached)\n", r.Dropped)
	}
	if r.Cancelled > 0 {
		p("Cancelled requests:     %d (in flight at the end; their ages then are in the percentiles)\n", r.Cancelled)
	}
	if r.Non2xx > 0 {
		p("Non-2xx responses:      %d\n", r.Non2xx)
	}
	p("Body transferred:       %d bytes\n", r.Bytes)
	p("Requests per second:    %.2f [#/sec] (mean)\n", r.RequestsPerSec)
	if r.Completed > 0 {
		p("Time per request:       %.3f [ms] (mean)\n", ms(r.Mean))
	}
	if r.Rate == 0 && r.RequestsPerSec > 0 && r.Completed > 0 {
		p("Time per request:       %.3f [ms] (mean, across all concurrent requests)\n", 1000/r.RequestsPerSec)
	}
	if len(r.StatusCodes) > 0 {
		p("\nStatus codes:\n")
		for _, code := range slices.Sorted(maps.Keys(r.StatusCodes)) {
			p("  [%d] %d responses\n", code, r.StatusCodes[code])
		}
	}
	if len(r.Errors) > 0 {
		p("\nErrors:\n")
		for _, k := range sortedByCount(r.Errors) {
			p("  [%d] %s\n", r.Errors[k], k)
		}
	}
	p("\nLatency (ms)\n")
	p("              min    mean     max\n")
	switch {
	case r.Completed > 0:
		p("Total:   %7.3f %7.3f %7.3f\n", ms(r.Min), ms(r.Mean), ms(r.Max))
	case r.measured():
		// No response, so no min or mean: 0 would read as one.
		p("Total:   %7s %7s %7.3f\n", "-", "-", ms(r.Max))
	default:
		p("Total:   %7s %7s %7s\n", "-", "-", "-")
		p("\nNo latency measured: no response, and no request cancelled waiting.\n")
		return ew.err
	}
	if r.Cancelled > 0 {
		p("\nPercentage of the requests served (or, cancelled, waiting) within a certain time (ms)\n")
	} else {
		p("\nPercentage of the requests served within a certain time (ms)\n")
	}
	for _, pc := range r.Percentiles {
		label := strconv.FormatFloat(pc.Quantile, 'f', -1, 64) + "%"
		p("%6s  %9.3f", label, ms(pc.Latency))
		if pc.Quantile == 100 {
			p(" (longest request)")
		}
		p("\n")
	}
	return ew.err
}

// sortedByCount returns m's keys, largest count first, then by name.
func sortedByCount(m map[string]int64) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	})
	return keys
}

// Report is the stable JSON form of a Result: snake_case names, durations
// in float milliseconds (elapsed in seconds), status codes as string keys.
// Each field means what the Result field of the same name does; fields are
// only ever added, never renamed.
type Report struct {
	URL            string           `json:"url"`
	Method         string           `json:"method"`
	Concurrency    int              `json:"concurrency,omitempty"`
	Rate           float64          `json:"rate,omitempty"`
	KeepAlive      bool             `json:"keep_alive"`
	Total          int64            `json:"total"`
	Completed      int64            `json:"completed"`
	Failed         int64            `json:"failed"`
	Dropped        int64            `json:"dropped"`
	Cancelled      int64            `json:"cancelled"`
	Non2xx         int64            `json:"non_2xx"`
	StatusCodes    map[string]int64 `json:"status_codes"`
	Bytes          int64            `json:"bytes"`
	ElapsedSeconds float64          `json:"elapsed_s"`
	RequestsPerSec float64          `json:"requests_per_sec"`
	Latency        LatencyReport    `json:"latency_ms"`
	Errors         map[string]int64 `json:"errors"`
}

// LatencyReport is a Report's latencies, in float milliseconds.
type LatencyReport struct {
	// Mean and Min are of the responses: null when there was none
	// (every request failed or was cancelled). Max and the percentiles
	// count the cancelled requests' ages too: null and empty when there
	// was neither (a 0 would read as a measurement).
	Mean *float64 `json:"mean"`
	Min  *float64 `json:"min"`
	Max  *float64 `json:"max"`
	// Percentiles maps "p50", "p99.9", "p100" to milliseconds.
	Percentiles map[string]float64 `json:"percentiles"`
}

// Report returns r in its JSON form.
func (r *Result) Report() Report {
	rep := Report{
		URL: r.URL, Method: r.Method, KeepAlive: r.KeepAlive,
		Total: r.Total, Completed: r.Completed, Failed: r.Failed, Dropped: r.Dropped,
		Cancelled: r.Cancelled, Non2xx: r.Non2xx, Bytes: r.Bytes,
		StatusCodes:    make(map[string]int64, len(r.StatusCodes)),
		ElapsedSeconds: r.Elapsed.Seconds(), RequestsPerSec: r.RequestsPerSec,
		Latency: LatencyReport{
			Percentiles: make(map[string]float64, len(r.Percentiles)),
		},
		Errors: make(map[string]int64, len(r.Errors)),
	}
	if r.Completed > 0 {
		mean, lowest := ms(r.Mean), ms(r.Min)
		rep.Latency.Mean, rep.Latency.Min = &mean, &lowest
	}
	if r.measured() {
		longest := ms(r.Max)
		rep.Latency.Max = &longest
		for _, p := range r.Percentiles {
			rep.Latency.Percentiles[PercentileKey(p.Quantile)] = ms(p.Latency)
		}
	}
	if r.Rate > 0 {
		rep.Rate = r.Rate
	} else {
		rep.Concurrency = r.Concurrency
	}
	for code, n := range r.StatusCodes {
		rep.StatusCodes[strconv.Itoa(code)] = n
	}
	maps.Copy(rep.Errors, r.Errors)
	return rep
}

// PercentileKey is the Report key of quantile q: "p50", "p99.9".
func PercentileKey(q float64) string {
	return "p" + strconv.FormatFloat(q, 'f', -1, 64)
}

// WriteJSON writes r's Report as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.Report())
}

// errWriter keeps the first write error and drops later writes.
type errWriter struct {
	w   io.Writer
	err error
}

// Write implements io.Writer.
func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// writeTable writes header and rows as aligned columns two spaces apart:
// the first left columns flush left (names), the rest flush right
// (numbers).
func writeTable(w io.Writer, left int, header []string, rows [][]string) error {
	width := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, cell := range r {
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	ew := &errWriter{w: w}
	for _, r := range append([][]string{header}, rows...) {
		var b strings.Builder
		for i, cell := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < left {
				b.WriteString(cell)
				if i < len(r)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad + cell)
			}
		}
		b.WriteString("\n")
		_, _ = io.WriteString(ew, b.String())
	}
	return ew.err
}
