package proxy

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
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

// The console format colours a terminal's lines only: to a file or a
// pipe, through a LogWriter or not, its escape codes would be noise
// (found by a tester).
func TestConsoleLogHasNoColoursOffATerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lw := NewLogWriter(f)
	fl := NewLogger(lw, "info", "console")
	fl.Info().Str("k", "v").Msg("to a file")
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	bl := NewLogger(&buf, "info", "console")
	bl.Warn().Msg("to a buffer")
	a := NewAccessLogger(f, "console", nil)
	a.Info().Int("status", 200).Msg("")
	_ = a.Close()
	b, _ := os.ReadFile(f.Name())
	for what, s := range map[string]string{"file": string(b), "buffer": buf.String()} {
		if !strings.Contains(s, "k=v") && !strings.Contains(s, "to a buffer") {
			t.Fatalf("%s: %q has no line", what, s)
		}
		if strings.Contains(s, "\x1b[") {
			t.Errorf("%s: console lines with colours: %q", what, s)
		}
	}
}
