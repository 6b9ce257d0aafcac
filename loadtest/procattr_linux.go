package loadtest

import "syscall"

// childProcAttr makes the kernel kill a child when this process dies, so
// that a crashed or killed harness leaves no proxy behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
