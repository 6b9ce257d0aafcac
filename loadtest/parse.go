package loadtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Summary is what ParseText reads from a WriteText report or from ab's
// output.
type Summary struct {
	// RequestsPerSec is "Requests per second".
	RequestsPerSec float64
	// Complete, Failed and Non2xx are "Complete requests", "Failed
	// requests" and "Non-2xx responses" (0 when the line is absent, as ab
	// and WriteText leave it out when there were none).
	Complete, Failed, Non2xx int64
	// TimeTaken is "Time taken for tests", 0 if absent.
	TimeTaken time.Duration
	// MeanMs is the first "Time per request" (the mean per request), in
	// milliseconds.
	MeanMs float64
	// Percentiles maps the percent of each row of the "Percentage of the
	// requests served within a certain time (ms)" table (50, 99.9, 100) to
	// its milliseconds. ab prints whole milliseconds; WriteText, fractions.
	Percentiles map[float64]float64
}

// errNoRate is returned by ParseText for input without a
// "Requests per second" line.
var errNoRate = errors.New(`no "Requests per second:" line`)

// percentileHeader opens the percentile table in ab's and WriteText's
// output.
const percentileHeader = "Percentage of the requests served within a certain time (ms)"

// ParseText reads the summary lines of WriteText's or ab's output. Lines it
// does not know are skipped; a known line with a malformed value is an error
// naming the line. Input without a "Requests per second:" line is an error.
func ParseText(r io.Reader) (Summary, error) {
	s := Summary{Percentiles: make(map[float64]float64)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	seenRate, seenMean, inTable := false, false, false
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if inTable {
			q, v, ok, err := parsePercentileRow(line)
			if err != nil {
				return s, fmt.Errorf("line %d: %q: %w", lineNo, line, err)
			}
			if ok {
				s.Percentiles[q] = v
				continue
			}
			inTable = false
		}
		if line == percentileHeader {
			inTable = true
			continue
		}
		key, val, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		val = strings.TrimSpace(val)
		var err error
		switch key {
		case "Requests per second":
			s.RequestsPerSec, err = firstFloat(val)
			seenRate = true
		case "Complete requests":
			s.Complete, err = firstInt(val)
		case "Failed requests":
			s.Failed, err = firstInt(val)
		case "Non-2xx responses":
			s.Non2xx, err = firstInt(val)
		case "Time taken for tests":
			var sec float64
			sec, err = firstFloat(val)
			s.TimeTaken = time.Duration(sec * float64(time.Second))
		case "Time per request":
			if !seenMean {
				s.MeanMs, err = firstFloat(val)
				seenMean = true
			}
		}
		if err != nil {
			return s, fmt.Errorf("line %d: %q: %w", lineNo, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if !seenRate {
		return s, errNoRate
	}
	return s, nil
}

// parsePercentileRow reads "50%  12.345" or " 100%  20 (longest request)".
// ok is false for a line that is not a row (the table has ended).
func parsePercentileRow(line string) (q, v float64, ok bool, err error) {
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasSuffix(f[0], "%") {
		return 0, 0, false, nil
	}
	q, err = strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
	if err != nil {
		return 0, 0, false, nil // not a row after all
	}
	v, err = strconv.ParseFloat(f[1], 64)
	if err != nil {
		return 0, 0, false, fmt.Errorf("percentile %g%%: %w", q, err)
	}
	return q, v, true, nil
}

// firstFloat parses the first field of s.
func firstFloat(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, errors.New("no value")
	}
	return strconv.ParseFloat(f[0], 64)
}

// firstInt parses the first field of s.
func firstInt(s string) (int64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, errors.New("no value")
	}
	return strconv.ParseInt(f[0], 10, 64)
}
