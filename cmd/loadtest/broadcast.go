package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/serveproxy/serveproxy/replica"
)

// The seed's four tables (issue 4): table 1 at bcSizeActors actors, tables 2
// and 4 with a bcPayload payload, inline and by reference.
const (
	bcSizeActors = 400
	bcPayload    = 1 << 20
	// bcBigBytes is how much foreach copies in one run (payload × actors)
	// from which a row is measured -big-reps times instead of -reps: a run
	// of 8 MiB × 400 actors copies 3.2 GB.
	bcBigBytes = 64 << 20
	// bcRunTimeout bounds one run of either path.
	bcRunTimeout = time.Minute
)

// broadcastOptions is the broadcast command line.
type broadcastOptions struct {
	tables  []int // which of the four, in order
	reps    int   // runs per path and row
	bigReps int   // runs per path for rows of at least bcBigBytes
	sizes   []int // table 1's payload sizes, bytes
	actors  []int // tables 2 to 4's actor counts
	json    bool
}

// parseBroadcast turns the broadcast command line into its options.
func parseBroadcast(args []string, stderr io.Writer) (broadcastOptions, error) {
	fs := flag.NewFlagSet("loadtest broadcast", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: loadtest broadcast [flags]\n\n"+
			"The seed's four tables for in-process actors, foreach (replica.ForeachBroadcast, the seed's\n"+
			"foreach_remote: a copy of the payload and a goroutine per actor) beside the batch path\n"+
			"(replica.Pool.Broadcast), timed until every actor has answered:\n"+
			"  1: payload size at %d actors   2: actors at 1 MiB\n"+
			"  3: actors, no payload           4: actors, 1 MiB passed by reference (Pool.Put once, not timed)\n\nflags:\n", bcSizeActors)
		fs.PrintDefaults()
	}
	tables := fs.String("table", "1,2,3,4", "comma-separated `tables` to run, of 1,2,3,4")
	reps := fs.Int("reps", 9, "runs of each path per row; a cell is their median")
	bigReps := fs.Int("big-reps", 3, fmt.Sprintf("runs of each path for rows where foreach copies at least %d MiB a run", bcBigBytes>>20))
	sizes := fs.String("sizes", "10,409600,819200,1228800,1638400,2097152,4194304,8388608", "table 1's payload sizes in `bytes`")
	actors := fs.String("actors", "50,150,250,350,450,550,650,750,850,950", "tables 2 to 4's actor `counts`")
	asJSON := fs.Bool("json", false, "print JSON instead of text, at the end")
	if err := parse(fs, args); err != nil {
		return broadcastOptions{}, err
	}
	opts := broadcastOptions{reps: *reps, bigReps: *bigReps, json: *asJSON}
	var err error
	if opts.tables, err = intList("-table", *tables, 1); err != nil {
		return broadcastOptions{}, err
	}
	if opts.sizes, err = intList("-sizes", *sizes, 0); err != nil {
		return broadcastOptions{}, err
	}
	if opts.actors, err = intList("-actors", *actors, 1); err != nil {
		return broadcastOptions{}, err
	}
	switch {
	case fs.NArg() > 0:
		return broadcastOptions{}, usagef("unexpected arguments: %q", fs.Args())
	case *reps < 1:
		return broadcastOptions{}, usagef("-reps: must be >= 1, got %d", *reps)
	case *bigReps < 1:
		return broadcastOptions{}, usagef("-big-reps: must be >= 1, got %d", *bigReps)
	}
	for _, t := range opts.tables {
		if t > 4 {
			return broadcastOptions{}, usagef("-table: want tables of 1,2,3,4, got %d", t)
		}
	}
	return opts, nil
}

// intList parses a comma-separated list of distinct integers >= lowest.
func intList(name, s string, lowest int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < lowest {
			return nil, usagef("%s: want comma-separated integers >= %d, got %q", name, lowest, f)
		}
		if slices.Contains(out, v) {
			return nil, usagef("%s: %d given twice", name, v)
		}
		out = append(out, v)
	}
	return out, nil
}

// bcMachine is what the figures were measured on.
type bcMachine struct {
	CPU        string `json:"cpu"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
}

func machine() bcMachine {
	return bcMachine{CPU: cpuModel(), NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
}

// cpuModel returns the CPU's model name on Linux, "unknown" elsewhere.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// bcTable is one of the seed's tables, measured.
type bcTable struct {
	Table int     `json:"table"`
	Title string  `json:"title"`
	Rows  []bcRow `json:"rows"`
}

// bcRow is one row: a broadcast's shape and the two paths' medians.
type bcRow struct {
	Actors       int     `json:"actors"`
	PayloadBytes int     `json:"payload_bytes"`
	ByRef        bool    `json:"by_ref"`
	Reps         int     `json:"reps"`
	ForeachMs    float64 `json:"foreach_ms"`
	BatchMs      float64 `json:"batch_ms"`
	ReductionPct float64 `json:"reduction_pct"` // rounded down to 0.1
}

// bcReport is the -json output.
type bcReport struct {
	Machine bcMachine `json:"machine"`
	Tables  []bcTable `json:"tables"`
}

// bcTitles are the seed's tables' titles.
var bcTitles = map[int]string{
	1: fmt.Sprintf("payload size, %d actors", bcSizeActors),
	2: "actors, 1 MiB payload",
	3: "actors, no payload",
	4: "actors, 1 MiB payload by reference (put once, before the clock starts)",
}

// rows returns table t's rows, unmeasured.
func (o broadcastOptions) rows(t int) []bcRow {
	var rows []bcRow
	if t == 1 {
		for _, s := range o.sizes {
			rows = append(rows, bcRow{Actors: bcSizeActors, PayloadBytes: s})
		}
		return rows
	}
	for _, n := range o.actors {
		switch t {
		case 2:
			rows = append(rows, bcRow{Actors: n, PayloadBytes: bcPayload})
		case 3:
			rows = append(rows, bcRow{Actors: n})
		case 4:
			rows = append(rows, bcRow{Actors: n, PayloadBytes: bcPayload, ByRef: true})
		}
	}
	return rows
}

// runBroadcast is the broadcast subcommand.
func runBroadcast(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseBroadcast(args, stderr)
	if err != nil {
		return report(stderr, "loadtest broadcast", err)
	}
	rep := bcReport{Machine: machine()}
	if !opts.json {
		m := rep.Machine
		fmt.Fprintf(stdout, "loadtest broadcast: in-process actors; foreach = replica.ForeachBroadcast (the seed's foreach_remote), batch = replica.Pool.Broadcast\n")
		fmt.Fprintf(stdout, "machine: %s, %d CPUs, GOMAXPROCS %d, %s %s/%s\n", m.CPU, m.NumCPU, m.GOMAXPROCS, m.Go, m.OS, m.Arch)
		fmt.Fprintf(stdout, "time: from the call until every actor has answered. A cell is the median of %d runs, foreach and batch alternating,\n"+
			"each from a collected heap after one untimed run of the same path; where foreach copies >= %d MiB a run,\n"+
			"of %d runs without the untimed one. reduction = 1 - batch/foreach, rounded down.\n", opts.reps, bcBigBytes>>20, opts.bigReps)
	}
	for _, t := range opts.tables {
		tab := bcTable{Table: t, Title: bcTitles[t]}
		if !opts.json {
			key := "actors"
			if t == 1 {
				key = "payload (B)"
			}
			fmt.Fprintf(stdout, "\nTable %d: %s\n%12s %14s %12s %10s\n", t, tab.Title, key, "foreach (ms)", "batch (ms)", "reduction")
		}
		for _, row := range opts.rows(t) {
			row, err = measureRow(ctx, row, opts)
			if err != nil {
				return reportRun(stderr, "loadtest broadcast", "tables", err)
			}
			tab.Rows = append(tab.Rows, row)
			if !opts.json {
				key := row.Actors
				if t == 1 {
					key = row.PayloadBytes
				}
				fmt.Fprintf(stdout, "%12d %14.4f %12.4f %9.1f%%\n", key, row.ForeachMs, row.BatchMs, row.ReductionPct)
			}
		}
		rep.Tables = append(rep.Tables, tab)
	}
	if opts.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return report(stderr, "loadtest broadcast", err)
		}
	}
	return exitOK
}

// sinkActor is an in-process actor that checks that it got the whole
// payload and answers nothing.
type sinkActor struct {
	id   string
	want int // payload length
}

func (a *sinkActor) ID() string   { return a.id }
func (a *sinkActor) Host() string { return "" }
func (a *sinkActor) Call(_ context.Context, _ string, p []byte) ([]byte, error) {
	if len(p) != a.want {
		return nil, fmt.Errorf("actor %s: payload of %d bytes, want %d", a.id, len(p), a.want)
	}
	return nil, nil
}

var _ replica.Actor = (*sinkActor)(nil)

// measureRow runs row's broadcast through both paths, alternating which goes
// first, and fills in their medians.
func measureRow(ctx context.Context, row bcRow, opts broadcastOptions) (bcRow, error) {
	actors := make([]replica.Actor, row.Actors)
	for i := range actors {
		actors[i] = &sinkActor{id: fmt.Sprint("actor", i), want: row.PayloadBytes}
	}
	pool := replica.NewPool(actors...)
	c := replica.Call{Method: "reconfigure"}
	if row.PayloadBytes > 0 {
		c.Payload = bytes.Repeat([]byte{'x'}, row.PayloadBytes)
	}
	if row.ByRef {
		ref := pool.Put(c.Payload)
		defer pool.Free(ref)
		c.Payload, c.Ref = nil, ref
	}
	warm := true
	row.Reps = opts.reps
	if !row.ByRef && row.PayloadBytes*row.Actors >= bcBigBytes {
		row.Reps, warm = opts.bigReps, false
	}
	paths := [2]func(context.Context) []replica.Result{
		func(ctx context.Context) []replica.Result { return replica.ForeachBroadcast(ctx, actors, c) },
		func(ctx context.Context) []replica.Result { return pool.Broadcast(ctx, c) },
	}
	var times [2][]time.Duration // foreach, batch
	for i := range row.Reps {
		for _, p := range [2]int{i % 2, 1 - i%2} {
			d, err := timeRun(ctx, row.Actors, warm, paths[p])
			if err != nil {
				return row, err
			}
			times[p] = append(times[p], d)
		}
	}
	f, b := median(times[0]), median(times[1])
	row.ForeachMs, row.BatchMs = ms(f), ms(b)
	row.ReductionPct = math.Floor(1000*(1-float64(b)/float64(f))) / 10
	return row, nil
}

// timeRun times one broadcast to n actors and checks every answer. It
// starts from a collected heap, so that neither path pays for the other's
// garbage, and, if warm, after one untimed run of the same path, so that
// neither pays for the first allocations after a collection either: that
// costs the batch path about 20µs, which is most of its time with few
// actors, and matters nothing beside a run that copies 64 MiB.
func timeRun(ctx context.Context, n int, warm bool, run func(context.Context) []replica.Result) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, bcRunTimeout)
	defer cancel()
	runtime.GC()
	if warm {
		if err := check(run(rctx), n); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	rs := run(rctx)
	d := time.Since(start)
	return d, check(rs, n)
}

// check returns an error if rs is not n answers without an error.
func check(rs []replica.Result, n int) error {
	if len(rs) != n {
		return fmt.Errorf("%d results from %d actors", len(rs), n)
	}
	for _, r := range rs {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// median returns the median of ds, the mean of the middle two for an even
// count.
func median(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
