package router

import (
	"strings"
	"testing"
)

func TestTableMatch(t *testing.T) {
	table, err := NewTable([]Route{
		{Prefix: "/", Application: "root"},
		{Prefix: "/api", Application: "api"},
		{Prefix: "/api/v2", Application: "v2"},
		{Prefix: "/a", Application: "a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, want string
	}{
		{"/", "root"},
		{"/x", "root"},
		{"/api", "api"},
		{"/api/", "api"},
		{"/api/x", "api"},
		{"/apix", "root"}, // not on a "/" boundary
		{"/api/v2", "v2"},
		{"/api/v2/models/1", "v2"},
		{"/api/v20", "api"},
		{"/a", "a"},
		{"/ab", "root"},
		{"/a/b/c/d", "a"},
		{"", "root"},
		{"//", "root"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			r := table.Match(tt.path)
			if r == nil || r.Application != tt.want {
				t.Fatalf("Match(%q) = %v, want application %q", tt.path, r, tt.want)
			}
		})
	}
}

func TestTableNoCatchAll(t *testing.T) {
	table, err := NewTable([]Route{{Prefix: "/api", Application: "api"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/", "/ap", "/apis", "/other/api"} {
		if r := table.Match(p); r != nil {
			t.Errorf("Match(%q) = %q, want no route", p, r.Application)
		}
	}
}

func TestNewTableErrors(t *testing.T) {
	tests := []struct {
		name   string
		routes []Route
	}{
		{"no leading slash", []Route{{Prefix: "api"}}},
		{"trailing slash", []Route{{Prefix: "/api/"}}},
		{"empty", []Route{{Prefix: ""}}},
		{"duplicate", []Route{{Prefix: "/a", Application: "x"}, {Prefix: "/a", Application: "y"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewTable(tt.routes); err == nil {
				t.Fatal("NewTable succeeded, want an error")
			}
		})
	}
}

func BenchmarkTableMatch(b *testing.B) {
	table, _ := NewTable([]Route{{Prefix: "/"}, {Prefix: "/api"}, {Prefix: "/api/v2"}})
	b.ReportAllocs()
	for b.Loop() {
		table.Match("/api/v2/models/resnet/predict")
	}
}

func FuzzTableMatch(f *testing.F) {
	table, _ := NewTable([]Route{{Prefix: "/", Application: "root"}, {Prefix: "/a", Application: "a"}, {Prefix: "/a/b", Application: "ab"}})
	for _, s := range []string{"/", "/a", "/a/b/c", "/ab", "", "//a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		r := table.Match(path)
		if r == nil {
			t.Fatalf("Match(%q) = nil with a catch-all route", path)
		}
		if r.Prefix != "/" && path != r.Prefix && !(len(path) > len(r.Prefix) && path[:len(r.Prefix)] == r.Prefix && path[len(r.Prefix)] == '/') {
			t.Fatalf("Match(%q) = %q: not a prefix on a / boundary", path, r.Prefix)
		}
	})
}

// TestTableMatchLongPath checks a path far longer than any prefix: the
// match starts at the longest prefix's depth, whatever the path's length.
func TestTableMatchLongPath(t *testing.T) {
	table, _ := NewTable([]Route{{Prefix: "/", Application: "root"}, {Prefix: "/a", Application: "a"}, {Prefix: "/a/bb", Application: "ab"}})
	for path, want := range map[string]string{
		"/a/" + strings.Repeat("x/", 1<<19):   "a",
		"/a/bb/" + strings.Repeat("y", 1<<20): "ab",
		"/a/bbb" + strings.Repeat("y", 1<<20): "a",
		"/" + strings.Repeat("z", 1<<20):      "root",
	} {
		if r := table.Match(path); r == nil || r.Application != want {
			t.Errorf("Match(%.12q...) = %v, want %q", path, r, want)
		}
	}
}
