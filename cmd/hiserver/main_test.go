package main

import (
	"net/http/httptest"
	"testing"
)

func TestHandlers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		requestID string // sent; "" for none
		wantID    string // answered; "" for no header
	}{
		{"bare", "", ""},
		{"headers, no id", "", placeholderID[0]},
		{"headers, id", "abc-123", "abc-123"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/", nil)
			if tc.requestID != "" {
				req.Header.Set("X-Request-ID", tc.requestID)
			}
			rec := httptest.NewRecorder()
			if tc.name == "bare" {
				hi(rec, req)
			} else {
				hiWithHeaders(rec, req)
			}
			if rec.Code != 200 || rec.Body.String() != "hi" {
				t.Fatalf("got %d %q, want 200 \"hi\"", rec.Code, rec.Body.String())
			}
			if got := rec.Header().Get("X-Request-Id"); got != tc.wantID {
				t.Errorf("X-Request-Id %q, want %q", got, tc.wantID)
			}
			if tc.name != "bare" && rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", rec.Header().Get("Content-Type"))
			}
		})
	}
}
