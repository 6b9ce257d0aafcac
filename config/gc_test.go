package config

import (
	"strings"
	"testing"
	"time"
)

func TestGCEnv(t *testing.T) {
	e, err := ReadEnv(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if !e.GCTuning || e.GCPercent != 400 || e.GCMemoryLimit != (MemoryLimit{Ratio: 0.9}) {
		t.Fatalf("defaults: tuning %v percent %v limit %v", e.GCTuning, e.GCPercent, e.GCMemoryLimit)
	}
	valid := []struct {
		name, value string
		check       func(Env) bool
	}{
		{"PROXY_GC_TUNING", "false", func(e Env) bool { return !e.GCTuning }},
		{"PROXY_GC_PERCENT", "250", func(e Env) bool { return e.GCPercent == 250 }},
		{"PROXY_GC_PERCENT", "off", func(e Env) bool { return e.GCPercent == GCOff }},
		{"PROXY_GC_PERCENT", "OFF", func(e Env) bool { return e.GCPercent == GCOff }},
		{"PROXY_GC_MEMORY_LIMIT", "512MiB", func(e Env) bool { return e.GCMemoryLimit == MemoryLimit{Bytes: 512 << 20} }},
		{"PROXY_GC_MEMORY_LIMIT", "1GiB", func(e Env) bool { return e.GCMemoryLimit == MemoryLimit{Bytes: 1 << 30} }},
		{"PROXY_GC_MEMORY_LIMIT", "0.75", func(e Env) bool { return e.GCMemoryLimit == MemoryLimit{Ratio: 0.75} }},
		{"PROXY_GC_MEMORY_LIMIT", "1.0", func(e Env) bool { return e.GCMemoryLimit == MemoryLimit{Ratio: 1} }},
		{"PROXY_GC_MEMORY_LIMIT", "none", func(e Env) bool { return e.GCMemoryLimit.None() }},
		{"PROXY_ADMIN_TOKEN", "s3cret", func(e Env) bool { return e.AdminToken == "s3cret" }},
		{"PROXY_DRAIN_DELAY", "5s", func(e Env) bool { return e.DrainDelay == 5*time.Second }},
	}
	for _, tt := range valid {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			e, err := ReadEnv(map[string]string{tt.name: tt.value})
			if err != nil || !tt.check(e) {
				t.Fatalf("ReadEnv: %v, %+v", err, e)
			}
		})
	}
	invalid := []struct{ name, value, want string }{
		{"PROXY_GC_TUNING", "yes please", "invalid boolean"},
		{"PROXY_DRAIN_DELAY", "-1s", "must be >= 0"},
		{"PROXY_DRAIN_DELAY", "soon", "invalid duration"},
		{"PROXY_GC_PERCENT", "0", "integer from 1 to 2147483647"},
		{"PROXY_GC_PERCENT", "-5", "integer from 1 to 2147483647"},
		{"PROXY_GC_PERCENT", "4oo", "invalid GC percent"},
		{"PROXY_GC_PERCENT", "4294967297", "integer from 1 to 2147483647"}, // Go would wrap it to 1
		{"PROXY_GC_MEMORY_LIMIT", "1.5", "ratio above 0 and at most 1.0"},
		{"PROXY_GC_MEMORY_LIMIT", "0.0", "ratio"},
		{"PROXY_GC_MEMORY_LIMIT", "12 parsecs", "invalid memory limit"},
		{"PROXY_GC_MEMORY_LIMIT", "-1GiB", "invalid memory limit"},
		{"PROXY_GC_MEMORY_LIMIT", "100000000000GiB", "is too large: at most"},
		{"PROXY_GC_MEMORY_LIMIT", "1073741824", "with a unit"},
		{"PROXY_GC_MEMORY_LIMIT", "1MiB", "16MiB floor"},
		// The size's own reason, not only "want a size with a unit" for a
		// value that had one (a tester).
		{"PROXY_GC_MEMORY_LIMIT", "10TiB", `unknown unit "TiB"`},
		{"PROXY_GC_MEMORY_LIMIT", "512Mb", `"Mb" reads as bits`},
		{"PROXY_GC_MEMORY_LIMIT", "0B", "write none for no limit"},
		{"PROXY_GC_MEMORY_LIMIT", "0", "write none for no limit"},
	}
	for _, tt := range invalid {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			_, err := ReadEnv(map[string]string{tt.name: tt.value})
			if err == nil || !strings.Contains(err.Error(), tt.name+":") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to name %s and say %q", err, tt.name, tt.want)
			}
		})
	}
}

func TestGCStrings(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{GCPercent(400).String(), "400"},
		{GCOff.String(), "off"},
		{MemoryLimit{Ratio: 0.9}.String(), "0.9"},
		{MemoryLimit{Bytes: 64 << 20}.String(), "64MiB"},
		{MemoryLimit{}.String(), "none"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
