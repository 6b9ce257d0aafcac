package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHandlers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handler   http.HandlerFunc
		requestID string // sent; "" for none
		wantID    string // answered; "" for no header
	}{
		{"bare", hi, "", ""},
		{"headers, no id", hiWithHeaders, "", placeholderID[0]},
		{"headers, id", hiWithHeaders, "abc-123", "abc-123"},
		{"request id alone", hiWithRequestID, "abc-123", "abc-123"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/", nil)
			if tc.requestID != "" {
				req.Header.Set("X-Request-ID", tc.requestID)
			}
			rec := httptest.NewRecorder()
			tc.handler(rec, req)
			if rec.Code != 200 || rec.Body.String() != "hi" {
				t.Fatalf("got %d %q, want 200 \"hi\"", rec.Code, rec.Body.String())
			}
			if got := rec.Header().Get("X-Request-Id"); got != tc.wantID {
				t.Errorf("X-Request-Id %q, want %q", got, tc.wantID)
			}
			// Set, or sniffed by net/http: the same either way.
			if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}
