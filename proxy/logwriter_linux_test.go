package proxy

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// openPTY returns the terminal end of a new pseudo-terminal, or skips the
// test where there is none.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Skipf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptmx.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Skipf("ptsname: %v", e)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open the terminal end: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

// On a terminal, the replicas' output (through Waiting) is coloured as
// the proxy's own lines are (found by review: it never was).
func TestWaitingWriterOnATerminal(t *testing.T) {
	tty := openPTY(t)
	l := NewLogWriter(tty)
	defer l.Close()
	if !isTerminal(l) || !isTerminal(l.Waiting()) {
		t.Fatalf("isTerminal: LogWriter on a terminal %v, its Waiting writer %v; want both true", isTerminal(l), isTerminal(l.Waiting()))
	}
}
