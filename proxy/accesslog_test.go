package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
