package config

import "testing"

// BenchmarkHasDotSegment measures the dot-segment check every request
// runs: a path without a '.' (most of them) returns at the first scan.
func BenchmarkHasDotSegment(b *testing.B) {
	for _, path := range []string{"/", "/api/v1/users/42/orders", "/static/app.min.js", "/a/b/../c"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				HasDotSegment(path)
			}
		})
	}
}
