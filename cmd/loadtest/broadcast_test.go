package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// tinyBroadcast are broadcast flags that run every table in well under a
// second.
var tinyBroadcast = []string{"broadcast", "-reps", "1", "-big-reps", "1", "-sizes", "10,1000", "-actors", "3,40"}

func TestBroadcastTables(t *testing.T) {
	code, stdout, stderr := runCmd(t, tinyBroadcast...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"machine: ", "GOMAXPROCS", "Table 1: payload size, 400 actors", "Table 2: ", "Table 3: ", "Table 4: ", "foreach (ms)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	// Two rows per table, each with a reduction.
	if n := strings.Count(stdout, "%\n"); n != 8 {
		t.Errorf("%d rows, want 8:\n%s", n, stdout)
	}
}

func TestBroadcastJSON(t *testing.T) {
	code, stdout, stderr := runCmd(t, append(tinyBroadcast, "-table", "3,4", "-json")...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	var rep bcReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v in %q", err, stdout)
	}
	if rep.Machine.GOMAXPROCS < 1 || rep.Machine.Go == "" || len(rep.Tables) != 2 || rep.Tables[0].Table != 3 || rep.Tables[1].Table != 4 {
		t.Fatalf("report %+v", rep)
	}
	for _, tab := range rep.Tables {
		if len(tab.Rows) != 2 {
			t.Fatalf("table %d: %d rows", tab.Table, len(tab.Rows))
		}
		for _, r := range tab.Rows {
			if r.ForeachMs <= 0 || r.BatchMs <= 0 || r.Reps != 1 || r.ByRef != (tab.Table == 4) {
				t.Errorf("table %d: row %+v", tab.Table, r)
			}
		}
	}
}

func TestBroadcastFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"-table", "5"}, "-table"},
		{[]string{"-table", "1,1"}, "given twice"},
		{[]string{"-reps", "0"}, "-reps"},
		{[]string{"-big-reps", "0"}, "-big-reps"},
		{[]string{"-sizes", "x"}, "-sizes"},
		{[]string{"-actors", "0"}, "-actors"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		code, stdout, stderr := runCmd(t, append([]string{"broadcast"}, tc.args...)...)
		if code != exitInvalid || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming %s", tc.args, code, stdout, stderr, tc.want)
		}
	}
}
