package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// gate is an io.Writer that blocks until opened, to make the log fall behind.
type gate struct {
	open chan struct{}
	mu   sync.Mutex
	buf  bytes.Buffer
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

func TestAsyncWriterKeepsOrderAndFlushes(t *testing.T) {
	var out syncBuffer
	w := newAsyncWriter(&out, nil)
	// Several buffers' worth, but fewer than all of them hold: on a busy
	// machine the writer's goroutine may not run until Close, and lines
	// past that are dropped by design (5000 lines flaked so).
	const n = 3000
	for i := range n {
		fmt.Fprintf(w, "line %06d %s\n", i, strings.Repeat("x", 40))
	}
	// The timer flushes without Close.
	waitFor(t, "a timed flush", func() bool { return strings.Contains(out.String(), "line 000000") })
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("wrote %d lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, fmt.Sprintf("line %06d ", i)) {
			t.Fatalf("line %d is %q: out of order", i, l)
		}
	}
}

func TestAsyncWriterDropsInsteadOfBlocking(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	var dropped atomic.Int64
	w := newAsyncWriter(g, func(n int) { dropped.Add(int64(n)) })
	line := []byte(strings.Repeat("y", 1023) + "\n")
	const n = 2000 // 2 MB: far more than the buffers hold
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			_, _ = w.Write(line)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a stuck output")
	}
	// Counted while the output is still stuck, for the metric to show
	// it: the log's goroutine is blocked in its write.
	if dropped.Load() == 0 {
		t.Fatal("no line counted as dropped while the output is stuck")
	}
	close(g.open)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	kept := int64(g.buf.Len() / len(line))
	if dropped.Load() == 0 || kept+dropped.Load() != n {
		t.Fatalf("kept %d + dropped %d lines, want some dropped and %d in all", kept, dropped.Load(), n)
	}
}

func TestStampCache(t *testing.T) {
	var c stampCache
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 123_400_000, time.UTC)
	if got := c.format(t0); got != "2026-12-01T08:00:00.123Z" {
		t.Fatalf("format = %q", got)
	}
	if got := c.format(t0.Add(500 * time.Microsecond)); got != "2026-12-01T08:00:00.123Z" {
		t.Fatalf("same millisecond: %q", got)
	}
	if got := c.format(t0.Add(time.Millisecond)); got != "2026-12-01T08:00:00.124Z" {
		t.Fatalf("next millisecond: %q", got)
	}
}

func TestAppendMillis(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                  "0.000",
		12949 * time.Nanosecond:            "0.012",
		1500 * time.Microsecond:            "1.500",
		2*time.Second + 3*time.Microsecond: "2000.003",
		-1500 * time.Microsecond:           "-1.500",
	} {
		if got := string(appendMillis(nil, d)); got != want {
			t.Errorf("appendMillis(%v) = %s, want %s", d, got, want)
		}
	}
}

// TestAccessLineMatchesZerolog holds the access log's fast path to the
// bytes zerolog writes for the same line, and checks that a value JSON
// must escape takes zerolog's path.
func TestAccessLineMatchesZerolog(t *testing.T) {
	end := time.Date(2026, 12, 4, 19, 0, 0, 123_456_789, time.UTC)
	base := accessEntry{
		end: end, requestID: "3f1c", method: "GET", path: "/api/x", status: 200, bytes: 2,
		elapsed: 1234 * time.Microsecond, replica: "hello#3", remoteAddr: "127.0.0.1:5555",
	}
	cases := map[string]func(e *accessEntry){
		"plain":           func(*accessEntry) {},
		"warn":            func(e *accessEntry) { e.status = 502; e.err = "replica hello#3 could not be reached" },
		"empty fields":    func(e *accessEntry) { e.requestID, e.replica, e.path = "", "", "" },
		"404":             func(e *accessEntry) { e.status = 404; e.replica = "" },
		"quote in path":   func(e *accessEntry) { e.path = `/a"b` },
		"backslash id":    func(e *accessEntry) { e.requestID = `a\b` },
		"control in path": func(e *accessEntry) { e.path = "/a\nb\x01" },
		"utf-8 path":      func(e *accessEntry) { e.path = "/caf\u00e9" },
		"bad utf-8":       func(e *accessEntry) { e.path = "/\xff" },
		"DEL":             func(e *accessEntry) { e.requestID = "\x7f" },
		"quoted error":    func(e *accessEntry) { e.status = 500; e.err = `parse "x": bad` },
	}
	for _, app := range []string{"default", `odd "app"`} {
		for name, change := range cases {
			t.Run(app+"/"+name, func(t *testing.T) {
				e := base
				change(&e)
				var fast, slow bytes.Buffer
				a := NewAccessLogger(&fast, "json", nil)
				r := a.forRoute(app, "/api", "hello")
				level := zerolog.InfoLevel
				if e.status >= 500 {
					level = zerolog.WarnLevel
				}
				line, ok := a.appendLine(nil, r, &e, level)
				wantFast := plainJSON(e.path) && plainJSON(e.requestID) && plainJSON(e.err)
				if ok != wantFast {
					t.Fatalf("fast path taken = %v, want %v", ok, wantFast)
				}
				b := NewAccessLogger(&slow, "json", nil)
				b.writeZerolog(b.forRoute(app, "/api", "hello"), &e, level)
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				if !json.Valid(slow.Bytes()) {
					t.Fatalf("zerolog's line is not JSON: %s", slow.Bytes())
				}
				if ok && string(line) != slow.String() {
					t.Fatalf("fast path:\n%s\nzerolog:\n%s", line, slow.Bytes())
				}
				// write picks the path: its line is zerolog's either way.
				a.write(r, &e)
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				if fast.String() != slow.String() {
					t.Fatalf("write:\n%s\nzerolog:\n%s", fast.Bytes(), slow.Bytes())
				}
			})
		}
	}
}

// FuzzAccessLine checks the fast path against zerolog for any values.
func FuzzAccessLine(f *testing.F) {
	f.Add("id", "GET", "/x", "r#1", "127.0.0.1:1", "", 200, 2)
	f.Add("a\"b", "POST", "/\xff", "", "", "boom", 503, 0)
	f.Fuzz(func(t *testing.T, id, method, path, replicaID, remote, errText string, status, n int) {
		e := accessEntry{
			end: time.Unix(1_800_000_000, 5e6), requestID: id, method: method, path: path, status: status,
			bytes: n, elapsed: 7 * time.Millisecond, replica: replicaID, remoteAddr: remote, err: errText,
		}
		a := NewAccessLogger(io.Discard, "json", nil)
		defer a.Close()
		line, ok := a.appendLine(nil, a.forRoute("default", "/", "hello"), &e, zerolog.InfoLevel)
		if !ok {
			return
		}
		var slow bytes.Buffer
		b := NewAccessLogger(&slow, "json", nil)
		b.writeZerolog(b.forRoute("default", "/", "hello"), &e, zerolog.InfoLevel)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if string(line) != slow.String() {
			t.Fatalf("fast path:\n%s\nzerolog:\n%s", line, slow.Bytes())
		}
	})
}

// TestAccessLineLevels: a route built while zerolog's global level hid
// info lines has no opening of its own, and its lines, once the level
// allows them, are zerolog's; a logger whose own level hides a line
// writes none (found by review).
func TestAccessLineLevels(t *testing.T) {
	e := accessEntry{end: time.Unix(1_800_000_000, 0), requestID: "id", method: "GET", path: "/", status: 200, replica: "r#1"}
	var out bytes.Buffer
	a := NewAccessLogger(&out, "json", nil)
	prev := zerolog.GlobalLevel()
	zerolog.SetGlobalLevel(zerolog.ErrorLevel) // no test runs in parallel here
	r := a.forRoute("default", "/", "hello")
	zerolog.SetGlobalLevel(prev)
	a.write(r, &e)
	quiet := a.forRoute("default", "/", "hello")
	quiet.log = quiet.log.Level(zerolog.WarnLevel)
	a.write(quiet, &e)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 1 || !json.Valid([]byte(lines[0])) || !strings.HasPrefix(lines[0], `{"level":"info","component":"access"`) {
		t.Fatalf("lines %q, want the first route's one info line, as zerolog writes it", lines)
	}
}
