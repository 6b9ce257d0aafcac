package replica

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// When a replica's process dies, what it left in its process group (here
// a shell's background server) dies too, rather than hold the port
// (found by an exploratory run).
func TestProcessGroupKilledWithIt(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	p, err := StartProcess("r", ProcessOptions{Command: []string{"sh", "-c", `sleep 300 & echo $! > "$0"; wait`, pidFile}})
	if err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 {
		if b, err := os.ReadFile(pidFile); err == nil && strings.HasSuffix(string(b), "\n") {
			child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			t.Fatal("the shell did not start its child")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL) // the shell alone
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the replica's process did not exit")
	}
	for alive(child) {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("the shell's child %d outlived the replica", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs: a zombie (which a container's init may
// never reap) does not.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// A server that daemonizes (setsid, then the leader exits 0) leaves the
// replica's process group: the proxy kills it by the REPLICA_ID it
// inherited, or it would hold the port, one more at every restart (found
// by an exploratory run).
func TestDaemonizedServerKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "daemon.pid")
	logs := &processLog{}
	p, err := StartProcess("r#daemon", ProcessOptions{
		Command: []string{"sh", "-c", `setsid sh -c 'echo $$ > "$0"; exec sleep 300' "$0" & sleep 0.2`, pidFile},
		Log:     zerolog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the leader did not exit")
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	daemon, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGKILL) })
	for deadline := time.Now().Add(10 * time.Second); alive(daemon); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the daemonized server %d outlived its replica", daemon)
		}
	}
	if !strings.Contains(logs.String(), "daemonized") {
		t.Errorf("no log line says why it was killed:\n%s", logs.String())
	}
}
