package replica

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// processAttr puts a replica process in a process group of its own (so
// that a stop reaches its children) and has the kernel kill it if the
// proxy dies, so that a crashed proxy leaves no replica behind.
func processAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup signals the process group whose leader is pid.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }

// killEscaped kills the processes still carrying the replica's
// REPLICA_ID=id and PORT=port in their environment once its process and
// group are gone: descendants that left the group (a server that
// daemonizes with setsid, say) would hold the replica's port and serve no
// one, one more at every restart. Both must match, so that another
// proxy's replica (ids are random, ports are unique while bound) is never
// taken for one. It returns their pids.
func killEscaped(id string, port int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	wantID, wantPort := []byte("REPLICA_ID="+id+"\x00"), []byte("PORT="+strconv.Itoa(port)+"\x00")
	self := os.Getpid()
	var killed []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !hasVar(env, wantID) || !hasVar(env, wantPort) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// hasVar reports whether env, a NUL-separated environment, has kv, one of
// its entries ending in NUL.
func hasVar(env, kv []byte) bool {
	return bytes.HasPrefix(env, kv) || bytes.Contains(env, append([]byte{0}, kv...))
}
