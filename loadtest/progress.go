package loadtest

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressTick is how often the progress bar is redrawn.
const progressTick = 200 * time.Millisecond

// progressMax is the bar's scale: progress is shown in permille of the
// run, by count or by time, whichever is further along.
const progressMax = 1000

// TerminalProgress returns os.Stderr if it is a terminal, else nil: the
// Config.Progress to use for a command line tool, which should show a bar
// to a person and nothing to a script or a log file.
func TerminalProgress() io.Writer {
	if term.IsTerminal(int(os.Stderr.Fd())) {
		return os.Stderr
	}
	return nil
}

// progress redraws a bar on cfg.Progress until finished is closed. It
// reads only atomics, so the request path never waits for the terminal.
func (l *loop) progress(finished <-chan struct{}) {
	bar := progressbar.NewOptions64(progressMax,
		progressbar.OptionSetWriter(l.cfg.Progress),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetDescription("0 requests"),
	)
	tick := time.NewTicker(progressTick)
	defer tick.Stop()
	for {
		select {
		case <-finished:
			_ = bar.Finish()
			return
		case <-tick.C:
		}
		done := l.done.Load()
		var frac float64
		if l.cfg.Requests > 0 {
			frac = float64(done) / float64(l.cfg.Requests)
		}
		if l.cfg.Duration > 0 {
			frac = max(frac, float64(time.Since(l.start))/float64(l.cfg.Duration))
		}
		_ = bar.Set64(min(int64(frac*progressMax), progressMax-1))
		bar.Describe(fmt.Sprintf("%d requests", done))
	}
}
