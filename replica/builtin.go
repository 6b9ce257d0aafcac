package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// DecodeUserConfig decodes a user_config strictly into v, as the built-in
// handlers do: unknown fields are errors, so a typo in the YAML is never
// silently ignored, and the error names kind and the field as the YAML
// spells it ("model: user_config: threshold: want a number, got a
// string"). An empty or null config leaves v as it is.
func DecodeUserConfig(kind string, raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	// Keys first: encoding/json would decode "BODY" into body and report
	// a wrong type as body's, a key the user never wrote.
	if err := ExactKeys(raw, v); err != nil {
		return fmt.Errorf("%s: user_config: %w", kind, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: user_config: %w", kind, PlainJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%s: user_config: more after the JSON object", kind)
	}
	return nil
}

// staticConfig is the user_config of the static handler.
type staticConfig struct {
	Body        string `json:"body"`
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
}

// staticResponse is a static handler's answer, prepared once per
// (re)configuration so that serving it allocates nothing.
type staticResponse struct {
	body        []byte
	status      int
	contentType []string // nil when net/http's sniffing gives the same
}

// Static answers every request with the same body and status.
// Configured by user_config: body (default ""), status (default 200),
// content_type (default "text/plain; charset=utf-8").
type Static struct {
	resp atomic.Pointer[staticResponse]
}

// NewStatic is the Factory of the static handler.
func NewStatic(userConfig json.RawMessage) (Handler, error) {
	s := &Static{}
	if err := s.Reconfigure(context.Background(), userConfig); err != nil {
		return nil, err
	}
	return s, nil
}

// Reconfigure replaces the response; requests in flight finish with the old one.
func (s *Static) Reconfigure(_ context.Context, userConfig json.RawMessage) error {
	cfg := staticConfig{Status: http.StatusOK, ContentType: "text/plain; charset=utf-8"}
	if err := DecodeUserConfig("static", userConfig, &cfg); err != nil {
		return err
	}
	if cfg.Status < 200 || cfg.Status > 599 {
		// 1xx are interim answers: net/http would send a 200 after one;
		// beyond 599 is no status at all (RFC 9110, 15).
		return fmt.Errorf("static: user_config: status must be 200..599, got %d", cfg.Status)
	}
	if (cfg.Status == http.StatusNoContent || cfg.Status == http.StatusNotModified) && cfg.Body != "" {
		// net/http drops the body of either without a word.
		return fmt.Errorf("static: user_config: status %d has no body, got body %.40q", cfg.Status, cfg.Body)
	}
	mt, _, err := mime.ParseMediaType(cfg.ContentType)
	if err == nil && !strings.Contains(mt, "/") {
		err = errors.New("no type/subtype") // ParseMediaType takes a bare token
	}
	if err != nil {
		// net/http would send a line break in it as a space: the
		// header a client sees is not the one configured.
		return fmt.Errorf("static: user_config: content_type must be a media type (text/html; charset=utf-8), got %.80q: %w", cfg.ContentType, err)
	}
	s.resp.Store(&staticResponse{
		body:        []byte(cfg.Body),
		status:      cfg.Status,
		contentType: []string{cfg.ContentType},
	})
	return nil
}

// ServeHTTP writes the configured response.
func (s *Static) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	resp := s.resp.Load()
	if resp.contentType != nil {
		// The slice is shared by every response and never mutated:
		// assigning it avoids an allocation per request.
		w.Header()["Content-Type"] = resp.contentType
	}
	// net/http sets Content-Length itself for a body this size.
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

// echoResponse is what the echo handler answers, as JSON.
type echoResponse struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Query   map[string][]string `json:"query"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
}

// Echo answers each request with a JSON description of it: method, path,
// query, headers and body. It takes no user_config.
type Echo struct{}

// NewEcho is the Factory of the echo handler.
func NewEcho(userConfig json.RawMessage) (Handler, error) {
	var none struct{}
	if err := DecodeUserConfig("echo", userConfig, &none); err != nil {
		return nil, err
	}
	return Echo{}, nil
}

// ServeHTTP answers the request's description.
func (Echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		status, msg := http.StatusBadRequest, "reading request body: "+err.Error()
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			status = http.StatusRequestEntityTooLarge
			if err == error(tooLarge) { // net/http's own words name no limit
				msg = fmt.Sprintf("reading request body: too large: the limit is %d bytes", tooLarge.Limit)
			}
		}
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(echoResponse{
		Method:  r.Method,
		Path:    r.URL.Path,
		Query:   r.URL.Query(),
		Headers: r.Header,
		Body:    string(body),
	})
}

// sleepConfig is the user_config of the sleep handler.
type sleepConfig struct {
	MS   float64 `json:"ms"`
	Body string  `json:"body"`
}

// Sleep waits user_config.ms milliseconds (giving up if the request is
// cancelled), then answers user_config.body. It stands in for a model that
// takes time.
type Sleep struct {
	cfg atomic.Pointer[sleepConfig]
}

// NewSleep is the Factory of the sleep handler.
func NewSleep(userConfig json.RawMessage) (Handler, error) {
	s := &Sleep{}
	if err := s.Reconfigure(context.Background(), userConfig); err != nil {
		return nil, err
	}
	return s, nil
}

// plainNumber is x as written in a config: 86400001, not 8.6400001e+07
// (an exponent only for what is that large).
func plainNumber(x float64) string {
	if x > -1e15 && x < 1e15 {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// Reconfigure replaces the delay and body.
func (s *Sleep) Reconfigure(_ context.Context, userConfig json.RawMessage) error {
	var cfg sleepConfig
	if err := DecodeUserConfig("sleep", userConfig, &cfg); err != nil {
		return err
	}
	if cfg.MS < 0 || cfg.MS > maxSleepMS {
		return fmt.Errorf("sleep: user_config: ms must be 0 to %d (a day), got %s", maxSleepMS, plainNumber(cfg.MS))
	}
	s.cfg.Store(&cfg)
	return nil
}

// maxSleepMS bounds sleep's ms: a day, far below where the delay's
// time.Duration would overflow (and the sleep end at once).
const maxSleepMS = 24 * 60 * 60 * 1000

// ServeHTTP sleeps, then writes the body.
func (s *Sleep) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	t := time.NewTimer(time.Duration(cfg.MS * float64(time.Millisecond)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, cfg.Body)
}

// PlainJSONError rewrites encoding/json's type errors for the people who
// wrote the JSON, without Go's type names: "ms: want a number, got a
// string" rather than "cannot unmarshal string into Go struct field
// sleepConfig.ms of type int", and `unknown field "x"` without the
// "json: " before it (every caller says what it decoded). Other errors
// are returned as they are.
func PlainJSONError(err error) error {
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Type == nil {
		if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			if k, err := strconv.Unquote(msg); err == nil {
				return &UnknownFieldError{Field: k}
			}
			return errors.New("unknown field " + msg)
		}
		return err
	}
	want := te.Type.String()
	switch te.Type.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "an integer"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Slice, reflect.Array:
		want = "an array"
	case reflect.Struct, reflect.Map:
		want = "an object"
	}
	field := te.Field
	if field == "" {
		field = "the value"
	}
	return fmt.Errorf("%s: want %s, got a JSON %s", field, want, te.Value)
}
