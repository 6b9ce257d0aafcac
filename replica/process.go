package replica

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
)

// ProcessOptions configure StartProcess.
type ProcessOptions struct {
	// Command is the program and its arguments (handler: command).
	Command []string
	// Dir is the working directory. If empty, the proxy's.
	Dir string
	// Env is added to the proxy's environment, after it, with $(PORT)
	// and $(REPLICA_ID) in its values expanded; PORT and REPLICA_ID are
	// set last and win.
	Env []string
	// Log receives the process's stdout and stderr, a line per event,
	// and what the proxy has to say of the process (killed after its
	// grace period, say), with its replica id. The zero Logger drops them.
	Log zerolog.Logger
	// Output, if not nil, receives the process's stdout and stderr
	// instead of Log: a logger that waits for its output rather than
	// lose a burst (see proxy.LogWriter.Waiting), where the proxy's own
	// lines of the process must not wait.
	Output *zerolog.Logger
}

// outputGrace is how long an exited replica's output is read for before
// its exit is reported anyway.
const outputGrace = 2 * time.Second

// maxLogLine bounds one line of a replica's output in the log; longer
// lines are split into entries of this size (each but the last marked
// "continued"), not buffered without bound.
const maxLogLine = 64 << 10

// Process is a replica process the proxy started: one HTTP server
// listening on 127.0.0.1:Port. It runs in a process group of its own, so
// that stopping it stops what it spawned too, and on Linux it dies with
// the proxy.
type Process struct {
	id   string
	port int
	cmd  *exec.Cmd
	log  zerolog.Logger // with the replica's id and pid

	exited  chan struct{} // closed once the process has exited
	done    chan struct{} // closed once, besides, its output is logged (or outputGrace passed)
	exitErr error         // how it exited; read after done
	// sent has bit 1<<sig set for each signal the proxy sent the process,
	// before it sends it; unasked, read after done, says the process ended
	// of none of them (see ExitedUnasked).
	sent    atomic.Uint64
	unasked bool
}

// childEnviron is the proxy's environment without its admin token: a
// replica process has no business with the proxy's admin API, and its
// output (an env dump, a crash report) goes into the log.
func childEnviron() []string {
	env := os.Environ()
	return slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, "PROXY_ADMIN_TOKEN=") })
}

// StartProcess starts o.Command with PORT (a free loopback port) and
// REPLICA_ID=id in its environment, and $(PORT) and $(REPLICA_ID) in its
// arguments and o.Env's values replaced by their values ($$(NAME) is a
// literal $(NAME); no shell runs, and any other $ is left as it is). The
// proxy's PROXY_ADMIN_TOKEN is not passed on. It does not wait for the
// server to listen: health-check it for that.
func StartProcess(id string, o ProcessOptions) (*Process, error) {
	if len(o.Command) == 0 || o.Command[0] == "" {
		return nil, errors.New("command: no program given")
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("command: finding a free port: %w", err)
	}
	expand := func(s string) string { return config.ExpandReplicaVars(s, strconv.Itoa(port), id) }
	args := make([]string, len(o.Command)-1)
	for i, a := range o.Command[1:] {
		args[i] = expand(a)
	}
	cmd := exec.Command(o.Command[0], args...)
	cmd.Dir = o.Dir
	cmd.Env = childEnviron()
	for _, e := range o.Env {
		cmd.Env = append(cmd.Env, expand(e)) // as Kubernetes expands env values
	}
	cmd.Env = append(cmd.Env, "PORT="+strconv.Itoa(port), "REPLICA_ID="+id)
	cmd.SysProcAttr = processAttr()
	// Pipes of our own, not StdoutPipe: Wait must not wait for them, since
	// a descendant that outlives the replica may hold them open.
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	stderr, stderrW, err := os.Pipe()
	if err != nil {
		stdout.Close()
		stdoutW.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	err = cmd.Start()
	stdoutW.Close() // the child has its own copies
	stderrW.Close()
	if err != nil {
		stdout.Close()
		stderr.Close()
		return nil, fmt.Errorf("command %q: %w", o.Command[0], err)
	}
	log := o.Log.With().Str("replica", id).Int("pid", cmd.Process.Pid).Logger()
	p := &Process{id: id, port: port, cmd: cmd, log: log, exited: make(chan struct{}), done: make(chan struct{})}
	outLog := log
	if o.Output != nil {
		outLog = o.Output.With().Str("replica", id).Int("pid", cmd.Process.Pid).Logger()
	}
	var output sync.WaitGroup
	for _, s := range []struct {
		name string
		r    *os.File
	}{{"stdout", stdout}, {"stderr", stderr}} {
		output.Add(1)
		go func() {
			defer output.Done()
			defer s.r.Close()
			logLines(&outLog, s.name, s.r)
		}()
	}
	go func() {
		p.exitErr = cmd.Wait()
		p.unasked = endedUnasked(cmd.ProcessState, p.sent.Load())
		// What the process left running in its group (a shell's server
		// that was not exec'd) is part of the replica, and goes with it:
		// it would hold the port and serve no one.
		_ = signalGroup(cmd.Process.Pid, syscall.SIGKILL)
		// And what left the group, found by the REPLICA_ID and PORT it
		// inherited (the group's leader is the process: see processAttr).
		if pids := killEscaped(id, port, cmd.Process.Pid); len(pids) > 0 {
			log.Warn().Ints("killed", pids).Msg("replica process left processes outside its process group (it daemonized, with setsid or a double fork?): killed them; run the server in the foreground")
		}
		close(p.exited)
		// The output's last lines, unless a descendant keeps the pipes
		// open: then the readers go on, and the exit is not held up.
		logged := make(chan struct{})
		go func() { output.Wait(); close(logged) }()
		t := time.NewTimer(outputGrace)
		select {
		case <-logged:
		case <-t.C:
		}
		t.Stop()
		close(p.done)
	}()
	return p, nil
}

// logLines logs each line read from r, until EOF.
func logLines(log *zerolog.Logger, stream string, r io.Reader) {
	br := bufio.NewReaderSize(r, maxLogLine)
	for {
		line, err := br.ReadSlice('\n')
		cut := errors.Is(err, bufio.ErrBufferFull)
		if len(line) > 0 {
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			e := log.Info().Str("stream", stream)
			if cut {
				e = e.Bool("continued", true) // the line goes on in the next event
			}
			e.Bytes("line", line).Msg("replica output")
		}
		if err != nil && !cut {
			return
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago. The
// process binds it itself; a race with another program is possible but
// rare, and shows as a start that fails its health check.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ID returns the replica id the process was given.
func (p *Process) ID() string { return p.id }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// URL returns the base URL the process serves on.
func (p *Process) URL() string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitedUnasked reports whether the process ended of its own accord or of
// a signal the proxy did not send (it crashed, or was killed by someone
// else), not of the proxy's stop; call it after Done is closed.
func (p *Process) ExitedUnasked() bool { return p.unasked }

// ExitError returns how the process exited (nil for status 0); call it
// after Done is closed.
func (p *Process) ExitError() error { return p.exitErr }

// Stop sends SIGTERM to the process group, waits up to grace (or ctx) for
// the process to exit, then sends SIGKILL. It returns once the process has
// exited; the error says how it exited if that was not by our signal.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr
	default:
	}
	p.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		// Not done, which also waits for the output: a descendant that
		// keeps the pipes open held it up outputGrace, past a short
		// grace, and a process gone at once was reported still running
		// and sent SIGKILL (a tester).
		<-p.done
		return nil
	case <-t.C:
		if grace > 0 { // 0 is a kill asked for
			p.log.Warn().Stringer("grace", grace).Msg("replica process still running after SIGTERM and its graceful_shutdown_timeout_s: killing it (SIGKILL)")
		}
	case <-ctx.Done():
		p.log.Warn().Msg("replica process still running after SIGTERM when its stop was cut short: killing it (SIGKILL)")
	}
	p.signal(syscall.SIGKILL)
	<-p.done
	return nil
}

// signal signals the process's group, or the process alone where groups
// are not used.
func (p *Process) signal(sig syscall.Signal) {
	p.sent.Or(1 << uint(sig))
	if signalGroup(p.cmd.Process.Pid, sig) != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// endedUnasked reports whether a process that ended as st did, after the
// signals of mask sent (bit 1<<sig each), ended of none of them: killed
// by a signal not sent, or exited with none sent. Whether the proxy's
// signal or the process's end came first cannot be told from the clock:
// a process killed by someone else, then sent the proxy's SIGTERM before
// it was reaped, still died of the SIGKILL.
func endedUnasked(st *os.ProcessState, mask uint64) bool {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return mask&(1<<uint(ws.Signal())) == 0
	}
	return mask == 0
}
