package loadtest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/PID/stat's CPU times. It is fixed at 100 in
// Linux's user-space ABI (USER_HZ), whatever the kernel's own tick rate, so
// it needs no sysconf(_SC_CLK_TCK) and no cgo.
const userHZ = 100

// ProcCPU returns the CPU time (user + system, all threads) that process
// pid has used so far, from /proc/PID/stat.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime + stime from the contents of /proc/PID/stat.
// Fields are counted after the last ')' because the command name, in
// parentheses, may hold spaces and parentheses itself.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')' after the command name")
	}
	// After ") ": state(3) ppid(4) ... utime(14) stime(15), so utime is the
	// 12th field and stime the 13th.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want >= 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: utime/stime: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / userHZ), nil
}

// ProcMemory is a process's resident memory, from /proc/PID/status.
type ProcMemory struct {
	// RSS is the resident set now (VmRSS), in bytes.
	RSS int64
	// HWM is the peak resident set (VmHWM), in bytes: since the process
	// started, or since ResetPeakRSS.
	HWM int64
}

// ReadProcMemory returns process pid's resident memory.
func ReadProcMemory(pid int) (ProcMemory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcMemory{}, err
	}
	return parseStatus(b)
}

// parseStatus reads VmRSS and VmHWM ("VmHWM:	  12345 kB") from the
// contents of /proc/PID/status.
func parseStatus(b []byte) (ProcMemory, error) {
	var m ProcMemory
	var seenRSS, seenHWM bool
	for line := range strings.SplitSeq(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("/proc status: %s: want \"N kB\", got %q", key, strings.TrimSpace(val))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc status: %s: %w", key, err)
		}
		if key == "VmRSS" {
			m.RSS, seenRSS = kb<<10, true
		} else {
			m.HWM, seenHWM = kb<<10, true
		}
	}
	if !seenRSS || !seenHWM {
		return m, errors.New("/proc status: no VmRSS or VmHWM line (a kernel thread, or a zombie?)")
	}
	return m, nil
}

// ResetPeakRSS resets process pid's VmHWM to its current RSS (Linux 4.0+,
// "5" to /proc/PID/clear_refs), so that a later ReadProcMemory reports the
// peak since now. It needs permission to write the process's clear_refs.
func ResetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
