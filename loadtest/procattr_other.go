//go:build !linux

package loadtest

import "syscall"

// childProcAttr returns nil: only Linux kills children with their parent.
func childProcAttr() *syscall.SysProcAttr { return nil }
