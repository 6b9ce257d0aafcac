//go:build !linux

package replica

import (
	"errors"
	"syscall"
)

// processAttr returns nil: process groups and parent-death signals are
// Linux's here.
func processAttr() *syscall.SysProcAttr { return nil }

// signalGroup reports that groups are not used, so the process alone is
// signalled.
func signalGroup(int, syscall.Signal) error { return errors.ErrUnsupported }

// killEscaped finds nothing: process environments are read from Linux's
// /proc.
func killEscaped(string, int, int) []int { return nil }
