package proxycmd

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Programs the kernel will not run are refused at -check, each with why:
// a tester's scripts passed -check and failed at start with "no such file
// or directory" (a #! line with a carriage return) or "exec format error".
func TestCheckExecutable(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-exec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	linuxOnly := runtime.GOOS != "linux" || binfmtHandlers()
	for _, tc := range []struct {
		name, content string
		want          string // "" for no problem
		linux         bool   // the check is Linux's, with no binfmt_misc handler
	}{
		{"script", "#!/bin/sh\necho hi\n", "", false},
		{"script with an argument", "#! /bin/sh -e\necho hi\n", "", false},
		{"empty", "", "is an empty file", false},
		{"crlf", "#!/bin/sh\r\necho hi\r\n", `its #! line ends in a carriage return (Windows line endings), so the interpreter looked for is "/bin/sh\r"`, false},
		{"no interpreter", "#!/no/such/sh\n", `names the interpreter "/no/such/sh", which does not exist`, false},
		{"interpreter a directory", "#!" + dir + "\n", "which is a directory", false},
		{"interpreter not executable", "#!" + notExec + "\n", "which is not executable", false},
		{"no #! line", "echo hi\n", "has no #! line and is no binary", true},
		{"a broken ELF file", "\x7fELF\x09\x01\x01 nothing more", "is no valid executable: ELF class", true},
		{"an ELF header cut short", "\x7fELF\x02\x01", "an ELF header cut short", true},
		{"an ELF file of no byte order", "\x7fELF\x02\x07\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00", "ELF byte order", true},
		{"an ELF object file", "\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00", "an ELF file of type ET_REL, not an executable", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.linux && linuxOnly {
				t.Skip("checked on Linux with no binfmt_misc handler only")
			}
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o755); err != nil {
				t.Fatal(err)
			}
			err := checkExecutable(path, path)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkExecutable = %v, want no problem", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkExecutable = %v, want %q", err, tc.want)
			}
		})
	}
	if err := checkExecutable(self, self); err != nil {
		t.Fatalf("the test binary itself: %v", err)
	}
	// Its sections are none of the kernel's business: a binary whose
	// section headers are cut off runs (a review: debug/elf refused it).
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "no-sections")
	if err := os.WriteFile(cut, b[:len(b)/2], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkExecutable(cut, cut); err != nil {
		t.Fatalf("a binary without its section headers: %v", err)
	}
}
