package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/replica"
)

// maxAdminBody bounds the body of an admin call.
const maxAdminBody = 1 << 20

// requireToken lets a mutating admin call (or the profiler) through only
// with the admin token, when one is set. A refusal is logged: someone may
// be trying tokens.
func (p *Proxy) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.opts.AdminToken != "" {
			// The scheme is case-insensitive (RFC 9110, 11.1).
			scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(got, " ")), []byte(p.opts.AdminToken)) != 1 {
				p.logRefusal(r)
				w.Header().Set("WWW-Authenticate", `Bearer realm="serveproxy admin"`)
				writeJSONError(w, http.StatusUnauthorized, errors.New("this call needs Authorization: Bearer <PROXY_ADMIN_TOKEN>"))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// logRefusal counts a refused admin call, and logs it at most once a
// second: someone trying tokens must not flood the log. A call refused
// within a second of the last line is told by the next, due at that
// second's end whatever follows, with the count since the last line and
// the last refused call's method, path and address.
func (p *Proxy) logRefusal(r *http.Request) {
	p.metrics.adminRefused.Inc()
	l := &p.refusals
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending++
	l.method, l.path, l.remote = clipped(r.Method), clipped(r.URL.Path), r.RemoteAddr
	if l.timer != nil {
		return // a line is due, and will count this one
	}
	if wait := time.Until(l.loggedAt.Add(time.Second)); wait > 0 {
		l.timer = time.AfterFunc(wait, func() { p.flushRefusals(false) })
		return
	}
	p.writeRefusalsLocked()
}

// flushRefusals writes the line of the refused calls not yet told, from
// the timer or, at the shutdown (stopping), before the log is closed.
func (p *Proxy) flushRefusals(stopping bool) {
	l := &p.refusals
	l.mu.Lock()
	defer l.mu.Unlock()
	if stopping && l.timer != nil {
		// Written here whether or not the timer's func has begun: one
		// waiting for the lock finds nothing pending, where one left to
		// write the line could do so after the log is closed.
		l.timer.Stop()
	}
	l.timer = nil
	if l.pending > 0 {
		p.writeRefusalsLocked()
	}
}

// writeRefusalsLocked writes the refused calls' line. refusals.mu must be
// held.
func (p *Proxy) writeRefusalsLocked() {
	l := &p.refusals
	p.opts.Log.Warn().Str("method", l.method).Str("path", l.path).Str("remote", l.remote).
		Int64("refused", l.pending).Msg("admin call refused: no or wrong PROXY_ADMIN_TOKEN (refused: how many since the last such line; method, path and remote: the last one's)")
	l.pending, l.loggedAt = 0, time.Now()
}

// refusalLog is what logRefusal has not told yet.
type refusalLog struct {
	// mu guards the fields below.
	mu                   sync.Mutex
	pending              int64       // calls refused since the last line
	method, path, remote string      // the last of them
	loggedAt             time.Time   // when the last line was written
	timer                *time.Timer // set while a line is due
}

// refuseWhileDraining answers 503 to the calls that change deployments
// once the proxy is shutting down: their replicas are being stopped, and
// a scale would start new ones.
func (p *Proxy) refuseWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.Draining() {
			writeJSONError(w, http.StatusServiceUnavailable, errors.New("the proxy is shutting down: nothing is changed"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // read by people and tools, never put in a page
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// errAdminBodyTooLarge is decodeJSON's error for a body over maxAdminBody.
var errAdminBodyTooLarge = fmt.Errorf("body larger than %d bytes", maxAdminBody)

// decodeStatus is the status of a decodeJSON error: 413 for a body too
// large, else 400.
func decodeStatus(err error) int {
	if errors.Is(err, errAdminBodyTooLarge) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// decodeJSON reads a JSON body strictly into v: unknown fields, trailing
// data and oversized bodies are errors.
func decodeJSON(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(body) > maxAdminBody {
		return errAdminBodyTooLarge
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("the body is empty: it must be a JSON object")
	}
	if !utf8.Valid(body) {
		// encoding/json would turn the bytes into U+FFFD, silently:
		// JSON between systems must be UTF-8 (RFC 8259, 8.1).
		return fmt.Errorf("invalid JSON: the body is not UTF-8 (a byte that is no UTF-8 at offset %d)", invalidUTF8At(body))
	}
	if k := duplicateKey(body); k != "" {
		// encoding/json keeps the last one, silently.
		return fmt.Errorf("invalid JSON: the key %q is twice in one object", k)
	}
	if err := replica.ExactKeys(body, v); err != nil {
		// Before decoding: see replica.DecodeUserConfig.
		return fmt.Errorf("invalid JSON: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON: %w", replica.PlainJSONError(err))
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		return errors.New("invalid JSON: more than one value")
	}
	return nil
}

// invalidUTF8At returns the offset of the first byte of b that does not
// begin a valid UTF-8 sequence, or len(b).
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// duplicateKey returns a key that is twice in one object of the JSON in
// b, at any depth, or "" (also when b is no valid JSON: Decode says why).
func duplicateKey(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func() (string, error)
	walk = func() (string, error) {
		t, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch t {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return "", err
				}
				key, _ := k.(string)
				if seen[key] {
					return key, nil
				}
				seen[key] = true
				if d, err := walk(); d != "" || err != nil {
					return d, err
				}
			}
		case json.Delim('['):
			for dec.More() {
				if d, err := walk(); d != "" || err != nil {
					return d, err
				}
			}
		default:
			return "", nil
		}
		_, err = dec.Token() // the closing delimiter
		return "", err
	}
	d, _ := walk()
	return d
}

// getGC answers the GC settings in force.
func (p *Proxy) getGC(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, p.opts.GC.State())
}

// gcUpdate is PUT /-/gc's body: {"percent": 300 or "off", "memory_limit":
// "256MiB" or "0.9" or "none"}. Either may be a JSON number or a string,
// read as the text of the environment variable's value.
type gcUpdate struct {
	Percent     json.RawMessage `json:"percent"`
	MemoryLimit json.RawMessage `json:"memory_limit"`
}

// putGC retunes the GC without a restart; bad input changes nothing.
func (p *Proxy) putGC(w http.ResponseWriter, r *http.Request) {
	var body gcUpdate
	if err := decodeJSON(r, &body); err != nil {
		writeJSONError(w, decodeStatus(err), err)
		return
	}
	u, err := body.update()
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err)
		return
	}
	if u.Percent == nil && u.MemoryLimit == nil {
		writeJSONError(w, http.StatusBadRequest, errors.New(`nothing to change: give "percent" and/or "memory_limit"`))
		return
	}
	s, err := p.opts.GC.Set(u)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err)
		return
	}
	p.opts.Log.Info().Int("percent", s.Percent).Str("memory_limit", s.MemoryLimit).Msg("GC retuned through PUT /-/gc")
	failed := p.broadcastGC(r.Context(), s)
	if len(failed) == 0 {
		writeJSON(w, http.StatusOK, s)
		return
	}
	// 207, not 200: the proxy's settings are in force and the replicas
	// that failed get them later, but the caller must not read that every
	// host runs them now.
	writeJSON(w, http.StatusMultiStatus, gcPartial{
		State:   s,
		Message: fmt.Sprintf("set_gc failed on %d replicas, listed in failed: the proxy's settings are in force, and each of those replicas is given them again at each health check until it takes them (a replica host that is down, once it reconnects)", len(failed)),
		Failed:  failed,
	})
}

// gcPartial is PUT /-/gc's answer when some replicas failed set_gc: the
// settings in force, as for a 200, and the failures, each as PUT
// .../user_config reports a replica's result, with its deployment.
type gcPartial struct {
	gctune.State
	Message string         `json:"message"`
	Failed  []gcCallResult `json:"failed"`
}

// gcCallResult is one replica's failed set_gc.
type gcCallResult struct {
	Application string `json:"application"`
	Deployment  string `json:"deployment"`
	callResult
}

func (b gcUpdate) update() (gctune.Update, error) {
	var u gctune.Update
	if text, ok := jsonText(b.Percent); ok {
		u.Percent = new(config.GCPercent)
		if err := u.Percent.UnmarshalText([]byte(text)); err != nil {
			return u, fmt.Errorf("percent: %w", err)
		}
	}
	if text, ok := jsonText(b.MemoryLimit); ok {
		u.MemoryLimit = new(config.MemoryLimit)
		if err := u.MemoryLimit.UnmarshalText([]byte(text)); err != nil {
			return u, fmt.Errorf("memory_limit: %w", err)
		}
	}
	return u, nil
}

// jsonText is a field's value as the text its parser reads: a string's
// contents, or a number (or anything else) as written; false for a field
// absent or null. A number is not refused for its type: its text gets the
// parser's own error, which says what the value may be.
func jsonText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	return string(raw), true
}

// broadcastGC sends the GC settings now in force to every replica (set_gc):
// in-process replicas share the proxy's GC and take it as done; replicas
// in processes of their own retune theirs. Each deployment remembers the
// settings, and gives them to the replicas that failed them (again at
// each health check) and to replica hosts that join or reconnect later.
// A failure is logged and returned: the proxy's own settings are in force
// either way.
func (p *Proxy) broadcastGC(ctx context.Context, s gctune.State) []gcCallResult {
	payload, err := json.Marshal(s)
	if err != nil {
		p.opts.Log.Error().Err(err).Msg("encoding set_gc")
		return nil
	}
	// Not cancelled when the caller leaves, as a reconfigure is not: the
	// proxy's settings changed, and the replicas are to follow.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	// Every deployment at once: a stalled replica host held the ones
	// after its own for the whole timeout, and they failed with it, in
	// process ones included (a tester).
	results := make([][]replica.Result, len(p.deployments))
	var wg sync.WaitGroup
	for i, d := range p.deployments {
		wg.Go(func() { results[i] = d.SetGC(ctx, payload) })
	}
	wg.Wait()
	var failed []gcCallResult
	for i, d := range p.deployments {
		for _, r := range results[i] {
			if r.Err != nil {
				err := callError(r.Err, controlTimeout)
				p.opts.Log.Warn().Str("application", d.App()).Str("deployment", d.Name()).Str("replica", r.Actor).
					Err(err).Msg("set_gc failed on a replica: given it again at each health check, or once it reconnects")
				failed = append(failed, gcCallResult{Application: d.App(), Deployment: d.Name(),
					callResult: callResult{Replica: r.Actor, Error: err.Error()}})
			}
		}
	}
	return failed
}

// callError says what a replica's failed control call came to: a
// deadline names the wait, where "context deadline exceeded" said
// nothing of what did not answer.
func callError(err error, timeout time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %v (a replica host stalled or overloaded?): %w", timeout, err)
	}
	return err
}
