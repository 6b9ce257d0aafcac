package replica

import "syscall"

// processAttr puts a replica process in a process group of its own (so
// that a stop reaches its children) and has the kernel kill it if the
// proxy dies, so that a crashed proxy leaves no replica behind.
func processAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup signals the process group whose leader is pid.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
