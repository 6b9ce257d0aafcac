package proxycmd

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/serveproxy/serveproxy/config"
)

// checkWorkingDir reports a working_dir that is not a directory there is
// (at start it would read as the program missing).
func checkWorkingDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%q: %v", dir, errors.Unwrap(err))
	case !fi.IsDir():
		return fmt.Errorf("%q is not a directory", dir)
	}
	return nil
}

// checkCommand reports a command whose program cannot be found, at -check
// and before anything starts.
func checkCommand(d config.Deployment) error {
	if len(d.Command) == 0 {
		return errors.New("no program given")
	}
	prog := d.Command[0]
	if !strings.Contains(prog, "/") {
		path, err := exec.LookPath(prog)
		if err != nil {
			return fmt.Errorf("program %q not found on PATH", prog)
		}
		return checkExecutable(prog, path)
	}
	if !filepath.IsAbs(prog) && d.WorkingDir != "" {
		prog = filepath.Join(d.WorkingDir, prog)
	}
	path, err := exec.LookPath(prog)
	if err != nil {
		cause := errors.Unwrap(err)
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			cause = pe.Err // the path is said below
		}
		if prog != d.Command[0] {
			return fmt.Errorf("program %q (%s, in working_dir): %v", d.Command[0], prog, cause)
		}
		return fmt.Errorf("program %q: %v", d.Command[0], cause)
	}
	return checkExecutable(d.Command[0], path)
}

// checkExecutable reports a program found at path that the kernel will
// not run: an empty file, a script whose #! line names an interpreter that
// is not there (or not one: a directory, a file not executable, a name
// ending in the carriage return of Windows line endings), and on Linux a
// file that is neither a script nor a valid ELF binary. Each would fail at
// start with "no such file or directory", "permission denied" or "exec
// format error", which read as the script itself being at fault or
// missing.
func checkExecutable(prog, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil // exec will say
	}
	defer f.Close()
	head := make([]byte, 256) // the kernel reads no more of a #! line
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if n == 0 {
		return fmt.Errorf("program %q is an empty file: nothing to run", prog)
	}
	if rest, ok := bytes.CutPrefix(head, []byte("#!")); ok {
		return checkInterpreter(prog, rest)
	}
	if runtime.GOOS != "linux" || binfmtHandlers() {
		return nil // another OS's formats, or a handler of other files
	}
	if !bytes.HasPrefix(head, []byte(elf.ELFMAG)) {
		return fmt.Errorf("program %q has no #! line and is no binary: it cannot be executed (exec format error); name its interpreter first, as in [sh, %s]", prog, prog)
	}
	return checkELFHeader(prog, head)
}

// checkELFHeader checks what the kernel reads of an ELF file's header
// before it runs it: its class, byte order and type. Not its sections,
// which the kernel never reads (debug/elf does, and refuses binaries that
// run: one stripped of its section headers, say).
func checkELFHeader(prog string, head []byte) error {
	if len(head) < 18 {
		return fmt.Errorf("program %q is no valid executable: an ELF header cut short", prog)
	}
	class, data := elf.Class(head[elf.EI_CLASS]), elf.Data(head[elf.EI_DATA])
	if class != elf.ELFCLASS32 && class != elf.ELFCLASS64 {
		return fmt.Errorf("program %q is no valid executable: ELF class %v", prog, class)
	}
	var order binary.ByteOrder
	switch data {
	case elf.ELFDATA2LSB:
		order = binary.LittleEndian
	case elf.ELFDATA2MSB:
		order = binary.BigEndian
	default:
		return fmt.Errorf("program %q is no valid executable: ELF byte order %v", prog, data)
	}
	if t := elf.Type(order.Uint16(head[16:18])); t != elf.ET_EXEC && t != elf.ET_DYN {
		return fmt.Errorf("program %q is an ELF file of type %v, not an executable", prog, t)
	}
	return nil
}

// checkInterpreter checks the interpreter named by rest, a script's #!
// line after its "#!", as the kernel reads it: the path runs to the first
// space, tab or newline, a carriage return included.
func checkInterpreter(prog string, rest []byte) error {
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	line = bytes.TrimLeft(line, " \t")
	end := bytes.IndexAny(line, " \t")
	if end < 0 {
		end = len(line)
	}
	interp := string(line[:end])
	if crlf, ok := strings.CutSuffix(interp, "\r"); ok {
		return fmt.Errorf("program %q: its #! line ends in a carriage return (Windows line endings), so the interpreter looked for is %q, which is not there: convert the file to Unix line endings", prog, crlf+"\r")
	}
	if !filepath.IsAbs(interp) {
		return nil
	}
	fi, err := os.Stat(interp)
	switch {
	case err != nil:
		return fmt.Errorf("program %q: its #! line names the interpreter %q, which does not exist", prog, interp)
	case fi.IsDir():
		return fmt.Errorf("program %q: its #! line names the interpreter %q, which is a directory", prog, interp)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("program %q: its #! line names the interpreter %q, which is not executable", prog, interp)
	}
	return nil
}

// binfmtHandlers reports whether Linux's binfmt_misc has handlers
// registered, which may run files of other formats (a JAR, another
// architecture's binaries through QEMU).
func binfmtHandlers() bool {
	entries, err := os.ReadDir("/proc/sys/fs/binfmt_misc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Name() != "register" && e.Name() != "status" {
			return true
		}
	}
	return false
}
