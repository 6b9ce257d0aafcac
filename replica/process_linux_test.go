package replica

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
