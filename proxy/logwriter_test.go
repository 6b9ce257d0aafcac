package proxy

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refusing is an output that takes nothing, as a closed pipe.
type refusing struct{}

func (refusing) Write([]byte) (int, error) { return 0, syscall.EPIPE }

func TestLogWriterCountsLinesItsOutputRefuses(t *testing.T) {
	l := NewLogWriter(refusing{})
	for range 10 {
		if _, err := l.Write([]byte(`{"level":"warn"}` + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := l.Dropped(); got != 10 {
		t.Fatalf("Dropped() = %d, want 10", got)
	}
}

func TestLogWriterWritesWithoutClose(t *testing.T) {
	var out syncBuffer
	l := NewLogWriter(&out)
	defer l.Close()
	_, _ = l.Write([]byte("one line\n"))
	waitFor(t, "the line written out", func() bool { return out.String() == "one line\n" })
}

func TestLogWriterCloseDoesNotWaitForAStuckOutput(t *testing.T) {
	g := &gate{open: make(chan struct{})}
	defer close(g.open)
	l := NewLogWriter(g)
	_, _ = l.Write([]byte(strings.Repeat("z", 100) + "\n"))
	start := time.Now()
	err := l.Close()
	if !errors.Is(err, errLogBlocked) {
		t.Fatalf("Close() = %v, want errLogBlocked", err)
	}
	if d := time.Since(start); d > logCloseTimeout+10*time.Second {
		t.Fatalf("Close took %v with the output stuck", d)
	}
}
