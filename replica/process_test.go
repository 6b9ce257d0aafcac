package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// childModeEnv makes the test binary run as a replica process instead of
// the tests: "serve" answers REPLICA_ID on PORT, "stubborn" does too but
// ignores SIGTERM, "crash" exits with status 3 at once, "unwell" answers
// 500 once and then nothing.
const childModeEnv = "REPLICA_TEST_CHILD"

func runChild(mode string) {
	if mode == "crash" {
		fmt.Fprintln(os.Stderr, "cannot load the model")
		os.Exit(3)
	}
	if mode == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+os.Getenv("PORT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening on", l.Addr())
	fmt.Fprintln(os.Stderr, "a line on stderr")
	id := os.Getenv("REPLICA_ID")
	if mode == "unwell" {
		// Its first answer is a 500; it answers nothing after that.
		var answered atomic.Bool
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if answered.Swap(true) {
				<-r.Context().Done()
				return
			}
			http.Error(w, "unwell", http.StatusInternalServerError)
			fmt.Println("answered 500")
		}))
		return
	}
	_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, id) }))
}

// childCommand is the test binary, to be run in mode.
func childCommand(t *testing.T, mode string) ProcessOptions {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return ProcessOptions{Command: []string{exe}, Env: []string{childModeEnv + "=" + mode}}
}

func TestProcessServesAndStops(t *testing.T) {
	logs := &processLog{}
	o := childCommand(t, "serve")
	o.Log = zerolog.New(logs)
	p, err := StartProcess("dep#abcdef", o)
	if err != nil {
		t.Fatal(err)
	}
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(p.URL() + "/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process never served: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	http.DefaultClient.CloseIdleConnections()
	if body != "dep#abcdef" {
		t.Fatalf("REPLICA_ID seen by the process = %q", body)
	}
	start := time.Now()
	if err := p.Stop(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("stopping on SIGTERM took %v", took)
	}
	got := logs.String()
	for _, want := range []string{`"replica":"dep#abcdef"`, `"stream":"stdout","line":"listening on 127.0.0.1:`, `"stream":"stderr","line":"a line on stderr"`} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %s:\n%s", want, got)
		}
	}
}

func TestProcessKilledAfterGrace(t *testing.T) {
	logs := &processLog{}
	o := childCommand(t, "stubborn")
	o.Log = zerolog.New(logs)
	p, err := StartProcess("r", o)
	if err != nil {
		t.Fatal(err)
	}
	waitListening(t, p)
	start := time.Now()
	_ = p.Stop(context.Background(), 200*time.Millisecond)
	if took := time.Since(start); took < 200*time.Millisecond || took > 10*time.Second {
		t.Fatalf("stop of a process ignoring SIGTERM took %v, want the 200ms grace then SIGKILL", took)
	}
	var exit *os.ProcessState
	if ee := (*exec.ExitError)(nil); errors.As(p.ExitError(), &ee) {
		exit = ee.ProcessState
	}
	if exit == nil || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit = %v, want killed by SIGKILL", p.ExitError())
	}
	if !strings.Contains(logs.String(), "killing it (SIGKILL)") {
		t.Errorf("no log line says the process was killed:\n%s", logs.String())
	}
}

func TestProcessCrash(t *testing.T) {
	logs := &processLog{}
	o := childCommand(t, "crash")
	o.Log = zerolog.New(logs)
	p, err := StartProcess("r", o)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a crashing process never exited")
	}
	if err := p.ExitError(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit = %v, want status 3", err)
	}
	if !strings.Contains(logs.String(), "cannot load the model") {
		t.Fatalf("its stderr is not in the log: %s", logs.String())
	}
}

func TestProcessBadCommand(t *testing.T) {
	if _, err := StartProcess("r", ProcessOptions{}); err == nil || !strings.Contains(err.Error(), "no program") {
		t.Fatalf("empty command: %v", err)
	}
	if _, err := StartProcess("r", ProcessOptions{Command: []string{"/nonexistent/server"}}); err == nil || !strings.Contains(err.Error(), "/nonexistent/server") {
		t.Fatalf("missing program: %v", err)
	}
}

// waitListening waits (bounded) until p accepts connections.
func waitListening(t *testing.T, p *Process) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(p.URL(), "http://"))
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process never listened: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processLog is a log sink safe for the output goroutines of a process.
type processLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *processLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *processLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestProcessArgumentsExpanded: $(PORT) and $(REPLICA_ID) in a command's
// arguments are its port and id, without a shell, as Kubernetes expands a
// container's args; $$(PORT) is a literal $(PORT), as $$(HOME) is $(HOME)
// (the escape the config's warning advises, found by review), another
// $(NAME) is left as it is, and a shell's own $PORT is left for the shell.
func TestProcessArgumentsExpanded(t *testing.T) {
	out := filepath.Join(t.TempDir(), "args")
	t.Setenv("PROXY_ADMIN_TOKEN", "s3cret") // not for the replica
	p, err := StartProcess("dep#xyz", ProcessOptions{Command: []string{
		"sh", "-c", `printf '%s|%s|%s|%s|%s|%s|%s|%s|%s|%s' "$1" "$2" "$3" "$4" "$5" "$PORT" "$BIND" "${PROXY_ADMIN_TOKEN-unset}" "$6" "$7" > "$0"`, out, "$(PORT)", "$(REPLICA_ID)", "127.0.0.1:$(PORT)", "$$(PORT)", "$PORT", "$$(HOME)", "$(HOME)",
	}, Env: []string{"BIND=127.0.0.1:$(PORT)"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not exit")
	}
	b, err := os.ReadFile(out)
	if err != nil || p.ExitError() != nil {
		t.Fatalf("the command: %v, exit %v", err, p.ExitError())
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(p.URL(), "http://"))
	if want := port + "|dep#xyz|127.0.0.1:" + port + "|$(PORT)|$PORT|" + port + "|127.0.0.1:" + port + "|unset|$(HOME)|$(HOME)"; string(b) != want {
		t.Fatalf("arguments = %q, want %q", b, want)
	}
}

// A start cut short says what the replica last answered, not the check
// its own end cut short: a tester saw "context deadline exceeded" for a
// replica answering 500 at once, in 4 starts of 12. Here the start is
// cut as the replica's second check waits.
func TestCommandStartKeepsTheLastAnswer(t *testing.T) {
	logs := &processLog{}
	o := childCommand(t, "unwell")
	o.Log = zerolog.New(logs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		for !strings.Contains(logs.String(), "answered 500") && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(2 * healthPoll) // the next check under way
		cancel()
	}()
	r, err := StartCommandReplica(ctx, "r", o, UpstreamOptions{MaxOngoing: 1}, time.Second)
	if err == nil {
		_ = r.(Stopper).Stop(context.Background())
		t.Fatal("an unwell replica started")
	}
	if !strings.Contains(err.Error(), "not healthy in time") || !strings.Contains(err.Error(), "500") {
		t.Fatalf("start = %v, want its 500 named", err)
	}
}

// A process that exits at its SIGTERM is not reported still running, nor
// sent SIGKILL, when a descendant of it that left its group keeps its
// output pipes open: the wait for the output (outputGrace) had outlasted a
// shorter grace (a tester's Python server, its setsid child with a clean
// environment, which the escaped-process sweep does not find).
func TestProcessExitSeenWhileOutputHeld(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	logs := &processLog{}
	begin := time.Now()
	p, err := StartProcess("r", ProcessOptions{
		Command: []string{"sh", "-c", "env -i PATH=\"$PATH\" setsid sleep 2.5 & trap 'exit 0' TERM; while :; do sleep 0.05; done"},
		Log:     zerolog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the child started
	start := time.Now()
	_ = p.Stop(context.Background(), time.Second)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("stop took %v", took)
	}
	if strings.Contains(logs.String(), "killing it (SIGKILL)") {
		t.Errorf("a process that exited at its SIGTERM was reported still running:\n%s", logs.String())
	}
	// The readers of its output end with the orphan (goleak).
	time.Sleep(time.Until(begin.Add(3500 * time.Millisecond)))
}
