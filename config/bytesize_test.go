package config

import (
	"strings"
	"testing"
)

func TestByteSizeUnmarshalText(t *testing.T) {
	tests := []struct {
		in   string
		want ByteSize
	}{
		{"0", 0},
		{"1", 1},
		{"1048576", 1 << 20},
		{"7B", 7},
		{"1KB", 1000},
		{"2MB", 2e6},
		{"3GB", 3e9},
		{"1KiB", 1024},
		{"512MiB", 512 << 20},
		{"2GiB", 2 << 30},
		{"1mib", 1 << 20},
		{"1MIB", 1 << 20},
		{"1kb", 1000},
		{"1 MiB", 1 << 20},
		{" 64KiB ", 64 << 10},
		{"1.5GiB", 3 << 29},
		{"1.5KB", 1500},
		{"0.5KiB", 512},
		{"9223372036854775807", 1<<63 - 1},
		{"8589934591GiB", 8589934591 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var got ByteSize
			if err := got.UnmarshalText([]byte(tt.in)); err != nil {
				t.Fatalf("UnmarshalText(%q) = %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("UnmarshalText(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestByteSizeUnmarshalTextErrors(t *testing.T) {
	tests := []struct {
		in, msg string
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"-1", "must not be negative"},
		{"-1MiB", "must not be negative"},
		{"MiB", "want a number"},
		{"1.2.3KB", "want a number"},
		{".", "want a number"},
		{"+5", "want a number"},
		{"5XB", `unknown unit "XB"`},
		{"5M", `unknown unit "M"`},
		{"5 MiB extra", `unknown unit "MiB extra"`},
		{"1e6", `unknown unit "e6"`},
		{"0.5B", "not a whole number of bytes"},
		{"1.0001KB", "not a whole number of bytes"},
		{"9223372036854775808", "larger than"},
		{"8589934592GiB", "larger than"},
		// A megabit's spelling (found by a tester: "10Mb" was 10 MB).
		{"10Mb", `"Mb" reads as bits; write MB or MiB`},
		{"1Kb", `"Kb" reads as bits`},
		{"1Gib", `"Gib" reads as bits`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			s := ByteSize(42)
			err := s.UnmarshalText([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("UnmarshalText(%q) = %v, want an error containing %q", tt.in, err, tt.msg)
			}
			if s != 42 {
				t.Errorf("UnmarshalText(%q) changed the value to %d on error", tt.in, s)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   ByteSize
		want string
	}{
		{0, "0B"},
		{7, "7B"},
		{1000, "1KB"},
		{1024, "1KiB"},
		{1 << 20, "1MiB"},
		{100 << 20, "100MiB"},
		{1500, "1500B"},
		{1500000, "1500KB"},
		{3 << 29, "1536MiB"},
		{2 << 30, "2GiB"},
		{5e9, "5GB"},
		{-2048, "-2KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.in.String(); got != tt.want {
				t.Errorf("ByteSize(%d).String() = %q, want %q", tt.in, got, tt.want)
			}
			text, _ := tt.in.MarshalText()
			var back ByteSize
			if tt.in >= 0 {
				if err := back.UnmarshalText(text); err != nil || back != tt.in {
					t.Errorf("round trip of %d through %q = %d, %v", tt.in, text, back, err)
				}
			}
		})
	}
}
