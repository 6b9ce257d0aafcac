package loadtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults applied by Run to zero fields of a Config.
const (
	// DefaultConcurrency is the number of closed-loop workers when
	// Config.Concurrency is 0 (ab's default).
	DefaultConcurrency = 1
	// DefaultMaxInFlight bounds the open loop's requests in flight when
	// Config.MaxInFlight is 0.
	DefaultMaxInFlight = 10000
	// DefaultTimeout is the per-request deadline when Config.Timeout is 0.
	DefaultTimeout = 30 * time.Second
)

// Config describes one load: what to send, where, how many and how fast.
// Requests, Duration or both must be set; the run stops at whichever limit
// is reached first.
type Config struct {
	// URL is the target, http or https. Its host must be loopback
	// (127.0.0.0/8, ::1 or localhost) unless AllowRemote is set.
	URL string
	// Method is the HTTP method. If empty, GET is used.
	Method string
	// Header is added to every request. A "Host" entry sets the request's
	// Host.
	Header http.Header
	// Body is sent with every request. If nil, requests have no body.
	Body []byte

	// Requests is the number of requests to send; 0 means no limit (then
	// Duration must be set).
	Requests int64
	// Duration bounds the sending; 0 means no limit (then Requests must be
	// set). Requests still in flight when it ends get up to DrainTimeout to
	// finish; those still running then are cancelled and counted in
	// Result.Cancelled, so a run never outlasts Duration by much more.
	Duration time.Duration

	// Concurrency is the number of closed-loop workers, each with at most
	// one request in flight. If 0, DefaultConcurrency is used. It does not
	// apply to the open loop (Rate > 0).
	Concurrency int
	// Rate, if > 0, switches to the open loop: request i is due at
	// start + i/Rate, whatever the server's state, and its latency is
	// measured from that intended time.
	Rate float64
	// MaxInFlight bounds the open loop's requests in flight. A request due
	// while MaxInFlight are in flight is not sent: it is counted as failed
	// and dropped (Result.Dropped). If 0, DefaultMaxInFlight is used.
	MaxInFlight int

	// Timeout is each request's deadline, from its send until its body is
	// read. If 0, DefaultTimeout is used.
	Timeout time.Duration
	// DisableKeepAlives opens a new connection for every request, like ab
	// without -k. By default connections are kept alive and reused.
	DisableKeepAlives bool

	// AllowRemote permits a URL whose host is not loopback. This project
	// only load tests loopback; the guard stays on unless asked.
	AllowRemote bool

	// Progress receives a progress bar while the run lasts. If nil, no
	// progress is shown. See TerminalProgress.
	Progress io.Writer
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Method == "" {
		c.Method = http.MethodGet
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Validate reports the first problem with c, naming the field and the
// allowed range. Zero fields that have defaults are valid.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("URL: required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL: scheme must be http or https, got %q", c.URL)
	}
	if u.Host == "" {
		return fmt.Errorf("URL: no host in %q", c.URL)
	}
	if p := u.Port(); p != "" {
		// Before the run, not as every request's dial error.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("URL: port %q is not 1 to 65535", p)
		}
	}
	for k, vv := range c.Header {
		if !validToken(k) {
			return fmt.Errorf("Header: not a valid header name: %q", k)
		}
		for _, v := range vv {
			if !validHeaderValue(v) {
				return fmt.Errorf("Header: the value of %s has a control character: %q", k, v)
			}
		}
	}
	if !c.AllowRemote {
		if err := CheckLoopback(c.URL); err != nil {
			return fmt.Errorf("URL: %w", err)
		}
	}
	if c.Method != "" && !validToken(c.Method) {
		return fmt.Errorf("Method: not a valid HTTP method: %q", c.Method)
	}
	switch {
	case c.Requests < 0:
		return fmt.Errorf("Requests: must be >= 0, got %d", c.Requests)
	case c.Duration < 0:
		return fmt.Errorf("Duration: must be >= 0, got %v", c.Duration)
	case c.Requests == 0 && c.Duration == 0:
		return errors.New("Requests, Duration: at least one must be set")
	case c.Concurrency < 0:
		return fmt.Errorf("Concurrency: must be >= 1, got %d", c.Concurrency)
	case !(c.Rate >= 0): // NaN too
		return fmt.Errorf("Rate: must be >= 0 requests/s, got %g", c.Rate)
	case c.Rate > 1e7:
		return fmt.Errorf("Rate: must be <= 1e7 requests/s, got %g", c.Rate)
	case c.MaxInFlight < 0:
		return fmt.Errorf("MaxInFlight: must be >= 1, got %d", c.MaxInFlight)
	case c.Timeout < 0:
		return fmt.Errorf("Timeout: must be >= 0, got %v", c.Timeout)
	}
	return nil
}

// CheckLoopback returns nil if rawURL's host is a loopback address
// (127.0.0.0/8 or ::1) or "localhost", and an error naming the host
// otherwise. Other names are refused without being resolved.
func CheckLoopback(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("host %q is not loopback (127.0.0.1, ::1, localhost); this project only load tests loopback", host)
}

// validHeaderValue reports whether s may be a header field's value: no
// control character but a tab (RFC 9110 section 5.5), so no CR or LF to
// split it into two fields.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// validToken reports whether s is an HTTP token (RFC 9110, section 5.6.2),
// the syntax of a method.
func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}
