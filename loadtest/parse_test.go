package loadtest

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseTextAB(t *testing.T) {
	for _, tc := range []struct {
		file                     string
		rps                      float64
		complete, failed, non2xx int64
		taken                    time.Duration
		mean                     float64
		p50, p99, p100           float64
	}{
		{"testdata/ab.txt", 65636.18, 2000, 0, 0, 30 * time.Millisecond, 0.305, 0, 3, 5},
		{"testdata/ab-non2xx.txt", 1698.04, 200, 0, 200, 118 * time.Millisecond, 2.356, 2, 12, 12},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			s, err := ParseText(f)
			if err != nil {
				t.Fatalf("ParseText: %v", err)
			}
			if s.RequestsPerSec != tc.rps || s.Complete != tc.complete || s.Failed != tc.failed || s.Non2xx != tc.non2xx {
				t.Errorf("got %.2f req/s, %d complete, %d failed, %d non-2xx; want %.2f %d %d %d",
					s.RequestsPerSec, s.Complete, s.Failed, s.Non2xx, tc.rps, tc.complete, tc.failed, tc.non2xx)
			}
			if s.TimeTaken != tc.taken || s.MeanMs != tc.mean {
				t.Errorf("time taken %v, mean %vms; want %v, %vms", s.TimeTaken, s.MeanMs, tc.taken, tc.mean)
			}
			if len(s.Percentiles) != 9 || s.Percentiles[50] != tc.p50 || s.Percentiles[99] != tc.p99 || s.Percentiles[100] != tc.p100 {
				t.Errorf("percentiles %v, want 9 rows with p50 %v p99 %v p100 %v", s.Percentiles, tc.p50, tc.p99, tc.p100)
			}
		})
	}
}

func TestParseTextErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "Requests per second"},
		{"no rate", "Complete requests: 5\n", "Requests per second"},
		{"bad count", "Complete requests: many\nRequests per second: 1 [#/sec]\n", `line 1`},
		{"bad rate", "Requests per second: fast\n", "line 1"},
		{"bad percentile", "Requests per second: 1\n" + percentileHeader + "\n  50%  soon\n", "line 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseText(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseText(%q): %v, want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
}

func FuzzParseText(f *testing.F) {
	for _, file := range []string{"testdata/ab.txt", "testdata/ab-non2xx.txt"} {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("Requests per second: 1\n" + percentileHeader + "\n 50% 1\n100% 2 (longest request)\n")
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseText(strings.NewReader(in))
		if err == nil && s.Percentiles == nil {
			t.Error("nil percentiles without an error")
		}
	})
}
