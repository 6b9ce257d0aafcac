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
// REPLICA_ID=id and PORT=port in their environment once its process is
// gone and its group, pgid, was sent SIGKILL: descendants that left the
// group (a server that daemonizes with setsid, say) would hold the
// replica's port and serve no one, one more at every restart. Both must
// match, so that another proxy's replica (ids are random, ports are
// unique while bound) is never taken for one. The members of pgid are
// skipped: the group's kill ends them, but they may not have died yet (a
// shell's child run in the foreground), and they did not escape. It
// returns the pids it killed.
func killEscaped(id string, port, pgid int) []int {
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
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		if g, ok := statPgrp(stat); ok && g == pgid {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// statPgrp returns the process group in stat, the text of a
// /proc/PID/stat: its fifth field, counted after the last ')', since the
// second (the command's name, in parentheses) may hold spaces and
// parentheses of its own (proc(5)).
func statPgrp(stat []byte) (int, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(stat[i+1:]) // state, ppid, pgrp, ...
	if len(f) < 3 {
		return 0, false
	}
	g, err := strconv.Atoi(string(f[2]))
	return g, err == nil
}

// hasVar reports whether env, a NUL-separated environment, has kv, one of
// its entries ending in NUL.
func hasVar(env, kv []byte) bool {
	return bytes.HasPrefix(env, kv) || bytes.Contains(env, append([]byte{0}, kv...))
}
