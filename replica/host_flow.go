package replica

import (
	"context"
	"fmt"
	"sync"
)

// inbox is one stream's incoming streamed body: the connection's reader
// puts the data frames' bytes in, one consumer takes them out, and credit
// goes back to the sender as the consumer takes them. It holds at most
// streamWindow bytes, since the sender may not send more uncredited.
type inbox struct {
	// credit sends a credit frame for n bytes.
	credit func(n int)

	// mu guards the fields below.
	mu      sync.Mutex
	buf     []byte // received, not yet taken
	spare   []byte // what the consumer took last, for the next swap
	end     bool   // the last chunk came
	err     error  // the stream failed; reported once buf is taken
	allowed int    // how much more the sender may send
	owed    int    // taken and not yet credited

	wake chan struct{} // something changed; capacity 1
}

func newInbox(window int, credit func(int)) *inbox {
	return &inbox{credit: credit, allowed: window, wake: make(chan struct{}, 1)}
}

func (in *inbox) signal() {
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// put adds a data frame's bytes (copied). A sender that overruns its
// window breaks the protocol.
func (in *inbox) put(p []byte, end bool) error {
	in.mu.Lock()
	if in.end || in.err != nil {
		in.mu.Unlock()
		return nil // the consumer has given up, or a frame after the end: dropped
	}
	if len(p) > in.allowed {
		in.mu.Unlock()
		return fmt.Errorf("%w: %d bytes of data past the %d-byte flow-control window", ErrBadFrame, len(p), streamWindow)
	}
	in.allowed -= len(p)
	in.buf = append(in.buf, p...)
	in.end = end
	in.mu.Unlock()
	in.signal()
	return nil
}

// fail ends the body with err, after what was received.
func (in *inbox) fail(err error) {
	in.mu.Lock()
	if in.err == nil && !in.end {
		in.err = err
	}
	in.mu.Unlock()
	in.signal()
}

// take waits for data and returns all of it, valid until the next take;
// end is set with the last of it. It returns the stream's error, or ctx's,
// once there is no data left.
func (in *inbox) take(ctx context.Context) (p []byte, end bool, err error) {
	for {
		in.mu.Lock()
		if len(in.buf) > 0 || in.end || in.err != nil {
			p, end, err = in.buf, in.end, in.err
			if len(p) > 0 {
				err = nil // the data first
			}
			in.buf, in.spare = in.spare[:0], p
			in.owed += len(p)
			var grant int
			// Credit in quarters of the window: fewer frames, and the
			// sender never waits while the consumer does.
			if in.owed >= streamWindow/4 && !in.end {
				grant, in.owed = in.owed, 0
				in.allowed += grant
			}
			in.mu.Unlock()
			if grant > 0 {
				in.credit(grant)
			}
			return p, end, err
		}
		in.mu.Unlock()
		select {
		case <-in.wake:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// window is a stream's credit for sending data: how many more bytes the
// peer takes.
type window struct {
	// mu guards n and err.
	mu   sync.Mutex
	n    int
	err  error         // the stream is over: no more sends
	wake chan struct{} // credit came, or err was set; capacity 1
}

func newWindow(n int) *window { return &window{n: n, wake: make(chan struct{}, 1)} }

// add takes a credit frame. Credit past any sane window breaks the
// protocol.
func (w *window) add(n int) error {
	w.mu.Lock()
	w.n += n
	over := w.n > 4*streamWindow
	w.mu.Unlock()
	if over {
		return fmt.Errorf("%w: credit past the %d-byte flow-control window", ErrBadFrame, streamWindow)
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

// close makes waiting and later acquires fail with err.
func (w *window) close(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// acquire waits until there is credit and takes up to want bytes of it.
func (w *window) acquire(ctx context.Context, want int) (int, error) {
	for {
		w.mu.Lock()
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return 0, err
		}
		if w.n > 0 {
			n := min(w.n, want)
			w.n -= n
			w.mu.Unlock()
			return n, nil
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// giveBack returns credit taken and not used.
func (w *window) giveBack(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.n += n
	w.mu.Unlock()
}
