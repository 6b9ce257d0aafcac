package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caarlos0/env/v11"
)

// envPrefix starts the name of every variable Env reads.
const envPrefix = "PROXY_"

// Env is the process environment's settings.
//
// An empty variable counts as unset. The HTTP settings override the config
// file's http_options only when set; see Apply.
type Env struct {
	// HTTPAddr, from PROXY_HTTP_ADDR, is the ingress address as host:port.
	// When set it overrides http_options host and port; unset, they apply
	// (by default 127.0.0.1:8000).
	HTTPAddr string `env:"HTTP_ADDR"`
	// AdminAddr, from PROXY_ADMIN_ADDR, is the admin server's address as
	// host:port; "127.0.0.1:8080" by default.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:8080"`
	// ConfigPath, from PROXY_CONFIG, is the config file to load; empty,
	// the default, means Default().
	ConfigPath string `env:"CONFIG"`
	// LogLevel, from PROXY_LOG_LEVEL, is one of trace, debug, info, warn
	// or error (zerolog's names); "info" by default.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// LogFormat, from PROXY_LOG_FORMAT, is "json" (the default) or
	// "console".
	LogFormat string `env:"LOG_FORMAT" envDefault:"json"`
	// AccessLog, from PROXY_ACCESS_LOG, turns the access log on or off;
	// on by default.
	AccessLog bool `env:"ACCESS_LOG" envDefault:"true"`
	// RequestTimeout, from PROXY_REQUEST_TIMEOUT (a Go duration such as
	// "30s", 0 or more), overrides http_options request_timeout_s when
	// set; "0s" means no timeout.
	RequestTimeout time.Duration `env:"REQUEST_TIMEOUT"`
	// KeepAliveTimeout, from PROXY_KEEP_ALIVE_TIMEOUT (a Go duration
	// above 0), overrides http_options keep_alive_timeout_s when set.
	KeepAliveTimeout time.Duration `env:"KEEP_ALIVE_TIMEOUT"`
	// ReadHeaderTimeout, from PROXY_READ_HEADER_TIMEOUT (a Go duration
	// above 0), bounds reading a request's headers; 10s by default.
	ReadHeaderTimeout time.Duration `env:"READ_HEADER_TIMEOUT" envDefault:"10s"`
	// DrainDelay, from PROXY_DRAIN_DELAY (a Go duration, 0 or more), is how
	// long /-/healthz answers 503 on SIGTERM while the proxy still accepts
	// connections, so that a load balancer polling it stops sending first;
	// 0 (the default) closes the listeners at once.
	DrainDelay time.Duration `env:"DRAIN_DELAY" envDefault:"0s"`
	// ClientBodyTimeout, from PROXY_CLIENT_BODY_TIMEOUT (a Go duration, 0
	// or more), is the longest wait for the next part of a request's body
	// (nginx's client_body_timeout): a client that stalls its upload is
	// answered 408 rather than hold its replica's slot; 60s by default, 0
	// for no limit.
	ClientBodyTimeout time.Duration `env:"CLIENT_BODY_TIMEOUT" envDefault:"60s"`
	// ClientSendTimeout, from PROXY_CLIENT_SEND_TIMEOUT (a Go duration, 0
	// or more), is the longest a client may take no part of a response
	// being written to it (nginx's send_timeout): past it the client is
	// taken for gone (499) and its connection closed, rather than hold
	// its replica's slot; 60s by default, 0 for no limit.
	ClientSendTimeout time.Duration `env:"CLIENT_SEND_TIMEOUT" envDefault:"60s"`
	// MaxHeaderBytes, from PROXY_MAX_HEADER_BYTES (above 0), bounds a
	// request's headers; 1MiB by default.
	MaxHeaderBytes ByteSize `env:"MAX_HEADER_BYTES" envDefault:"1MiB"`
	// MaxBodyBytes, from PROXY_MAX_BODY_BYTES (above 0), bounds a
	// request's body; 100MiB by default.
	MaxBodyBytes ByteSize `env:"MAX_BODY_BYTES" envDefault:"100MiB"`
	// AdminToken, from PROXY_ADMIN_TOKEN, is the secret that mutating
	// admin calls (PUT /-/gc) must present as "Authorization: Bearer
	// <token>"; empty by default, when the admin listener's being on
	// loopback is the protection.
	AdminToken string `env:"ADMIN_TOKEN"`

	// LeanFront, from PROXY_LEAN_FRONT, is the feature flag of the lean
	// HTTP/1.1 front on the public listener (package proxy/front); true
	// by default. false serves it with net/http's server alone.
	LeanFront bool `env:"LEAN_FRONT" envDefault:"true"`

	// GCTuning, from PROXY_GC_TUNING, is the feature flag of the tuned GC
	// settings below; true by default. false leaves Go's defaults alone.
	GCTuning bool `env:"GC_TUNING" envDefault:"true"`
	// GCPercent, from PROXY_GC_PERCENT, is the tuned GOGC: an integer >=
	// 1 or "off". The default was chosen from measurements (README, "GC
	// tuning").
	GCPercent GCPercent `env:"GC_PERCENT" envDefault:"400"`
	// GCMemoryLimit, from PROXY_GC_MEMORY_LIMIT, is the tuned soft memory
	// limit: a size ("512MiB"), a ratio of the cgroup's memory limit
	// ("0.9"), or "none". The default is 0.9.
	GCMemoryLimit MemoryLimit `env:"GC_MEMORY_LIMIT" envDefault:"0.9"`

	// TrustedProxies, from PROXY_TRUSTED_PROXIES (comma-separated IPs or
	// CIDR prefixes, such as "10.0.0.0/8,192.168.1.7"), are the peers
	// (load balancers in front of the proxy) whose X-Forwarded-For,
	// -Proto and -Host are passed on to upstream replicas; from any other
	// peer they are replaced by what the proxy saw. None by default.
	TrustedProxies Prefixes `env:"TRUSTED_PROXIES"`
	// Via, from PROXY_VIA, is the pseudonym the proxy adds to the Via
	// header of what it forwards to and from upstream replicas ("1.1
	// <Via>"); empty, the default, adds none.
	Via string `env:"VIA"`

	// requestTimeoutSet records that PROXY_REQUEST_TIMEOUT was set, which
	// RequestTimeout alone cannot tell when it is 0 ("no timeout" must
	// still override the file). HTTPAddr and KeepAliveTimeout need no
	// flag: their zero is not a value they can be set to.
	requestTimeoutSet bool
}

// logLevels are zerolog's level names that PROXY_LOG_LEVEL accepts, listed
// here so that config need not import zerolog.
var logLevels = []string{"trace", "debug", "info", "warn", "error"}

var logFormats = []string{"json", "console"}

// Environ returns the process's environment as the map ReadEnv takes.
func Environ() map[string]string {
	m := make(map[string]string)
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// ReadEnv reads the PROXY_* variables from environ, a map of variable
// names to values (os.Environ's contents, or a test's), and checks them.
// Every bad variable is reported, each error naming it, as in
// `PROXY_REQUEST_TIMEOUT: invalid duration "5x"`.
func ReadEnv(environ map[string]string) (Env, error) {
	var e Env
	err := env.ParseWithOptions(&e, env.Options{
		Environment: environ,
		Prefix:      envPrefix,
		FuncMap: map[reflect.Type]env.ParserFunc{
			reflect.TypeFor[time.Duration](): parseDuration,
			reflect.TypeFor[bool]():          parseBool,
		},
	})
	e.requestTimeoutSet = environ[envPrefix+"REQUEST_TIMEOUT"] != ""

	// Problems by variable, reported in the order Env lists them; a
	// variable that did not parse is not checked again.
	bad := make(map[string]string)
	var other []error
	for _, err := range flattenEnvErrors(err) {
		var pe env.ParseError
		if errors.As(err, &pe) {
			if name := envVarOf(pe.Name); name != "" {
				bad[name] = pe.Err.Error()
				continue
			}
		}
		other = append(other, err)
	}
	check := func(field, msg string) {
		if name := envVarOf(field); msg != "" && bad[name] == "" {
			bad[name] = msg
		}
	}
	if e.HTTPAddr != "" {
		_, _, err := splitAddr(e.HTTPAddr)
		check("HTTPAddr", errString(err))
	}
	_, _, addrErr := splitAddr(e.AdminAddr)
	check("AdminAddr", errString(addrErr))
	check("LogLevel", oneOf(&e.LogLevel, logLevels))
	check("LogFormat", oneOf(&e.LogFormat, logFormats))
	if e.requestTimeoutSet {
		check("RequestTimeout", durationProblem(e.RequestTimeout, true))
	}
	if environ[envPrefix+"KEEP_ALIVE_TIMEOUT"] != "" {
		check("KeepAliveTimeout", durationProblem(e.KeepAliveTimeout, false))
	}
	check("ReadHeaderTimeout", durationProblem(e.ReadHeaderTimeout, false))
	check("DrainDelay", durationProblem(e.DrainDelay, true))
	check("ClientBodyTimeout", durationProblem(e.ClientBodyTimeout, true))
	check("ClientSendTimeout", durationProblem(e.ClientSendTimeout, true))
	if e.MaxHeaderBytes <= 0 || e.MaxHeaderBytes > maxHeaderBytesLimit {
		check("MaxHeaderBytes", fmt.Sprintf("must be > 0 and at most %v, got %d", maxHeaderBytesLimit, e.MaxHeaderBytes))
	}
	if e.MaxBodyBytes <= 0 {
		check("MaxBodyBytes", fmt.Sprintf("must be > 0, got %d", e.MaxBodyBytes))
	}
	check("AdminToken", adminTokenProblem(e.AdminToken))
	if e.Via != "" && !isToken(e.Via) {
		check("Via", fmt.Sprintf("must be one token (letters, digits, and !#$%%&'*+-.^_`|~), got %q", e.Via))
	}

	var errs []error
	t := reflect.TypeFor[Env]()
	for i := range t.NumField() {
		if name := envVarOf(t.Field(i).Name); bad[name] != "" {
			errs = append(errs, fmt.Errorf("%s: %s", name, bad[name]))
		}
	}
	errs = append(errs, other...)
	if len(errs) > 0 {
		return Env{}, errors.Join(errs...)
	}
	return e, nil
}

// Apply overrides c's http_options with the variables that were set:
// PROXY_HTTP_ADDR (split into host and port), PROXY_REQUEST_TIMEOUT and
// PROXY_KEEP_ALIVE_TIMEOUT. The rest of c is left alone. On error, naming
// the variable, c is not changed.
//
// A set RequestTimeout, HTTPAddr or KeepAliveTimeout is one that is not
// zero, or, for RequestTimeout, one that ReadEnv found set to 0.
func (e Env) Apply(c *Config) error {
	var (
		host string
		port int
		errs []error
	)
	if e.HTTPAddr != "" {
		var err error
		if host, port, err = splitAddr(e.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%sHTTP_ADDR: %w", envPrefix, err))
		}
	}
	setRequest := e.requestTimeoutSet || e.RequestTimeout != 0
	if msg := durationProblem(e.RequestTimeout, true); setRequest && msg != "" {
		errs = append(errs, fmt.Errorf("%sREQUEST_TIMEOUT: %s", envPrefix, msg))
	}
	setKeepAlive := e.KeepAliveTimeout != 0
	if msg := durationProblem(e.KeepAliveTimeout, false); setKeepAlive && msg != "" {
		errs = append(errs, fmt.Errorf("%sKEEP_ALIVE_TIMEOUT: %s", envPrefix, msg))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	e.overrides(c, host, port, setRequest, setKeepAlive)
	if e.HTTPAddr != "" {
		c.HTTPOptions.Host, c.HTTPOptions.Port = host, port
	}
	if setRequest {
		c.HTTPOptions.RequestTimeoutS = e.RequestTimeout.Seconds()
	}
	if setKeepAlive {
		c.HTTPOptions.KeepAliveTimeoutS = e.KeepAliveTimeout.Seconds()
	}
	return nil
}

// envVarOf returns the variable Env's field reads, such as PROXY_HTTP_ADDR
// for HTTPAddr, or "" for a field with no env tag.
func envVarOf(field string) string {
	f, ok := reflect.TypeFor[Env]().FieldByName(field)
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(f.Tag.Get("env"), ",")
	if key == "" {
		return ""
	}
	return envPrefix + key
}

// flattenEnvErrors flattens what env.ParseWithOptions returned.
func flattenEnvErrors(err error) []error {
	var agg env.AggregateError
	if errors.As(err, &agg) {
		return agg.Errors
	}
	if err != nil {
		return []error{err}
	}
	return nil
}

// parseDuration and parseBool replace env's parsers, whose errors quote Go
// internals (strconv.ParseBool: parsing "x": invalid syntax).
func parseDuration(v string) (any, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("invalid duration %q (want a Go duration such as 30s or 1m30s)", v)
	}
	return d, nil
}

func parseBool(v string) (any, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return nil, fmt.Errorf("invalid boolean %q (want true or false; 1, 0, t and f are taken too)", v)
	}
	return b, nil
}

// oneOf lower-cases *v and returns a problem unless it is in allowed.
func oneOf(v *string, allowed []string) string {
	if lower := strings.ToLower(*v); slices.Contains(allowed, lower) {
		*v = lower
		return ""
	}
	return fmt.Sprintf("invalid value %q (want one of %s)", *v, strings.Join(allowed, ", "))
}

// maxHeaderBytesLimit bounds PROXY_MAX_HEADER_BYTES: net/http holds a
// request's whole header in memory, and adds 4 KiB to the limit, which
// near the largest int64 overflowed into a 431 for every request.
const maxHeaderBytesLimit ByteSize = 1 << 30

// minDuration is the shortest duration the environment takes, but 0: the
// file's minSeconds.
const minDuration = time.Duration(minSeconds * float64(time.Second))

// durationProblem checks a duration is above 0, or at least 0 when zeroOK,
// and fits the config's whole-seconds limit, and is not below minDuration.
func durationProblem(d time.Duration, zeroOK bool) string {
	max := time.Duration(maxSeconds) * time.Second
	switch {
	case zeroOK && (d < 0 || d > max):
		return fmt.Sprintf("must be >= 0 and <= %v, got %v", max, d)
	case !zeroOK && (d <= 0 || d > max):
		return fmt.Sprintf("must be > 0 and <= %v, got %v", max, d)
	case d > 0 && d < minDuration && zeroOK:
		// As in the file (minSeconds): a timeout of 1ns times out
		// everything, and is more likely a missing unit's typo.
		return fmt.Sprintf("must be 0 or at least %v, got %v", minDuration, d)
	case d > 0 && d < minDuration:
		return fmt.Sprintf("must be at least %v, got %v", minDuration, d)
	}
	return ""
}

// CheckListenAddr reports what is wrong with addr as an address to listen
// on (host:port, the host empty for every interface, port 0 for any), as
// the proxy's PROXY_HTTP_ADDR is checked: for other binaries' flags.
func CheckListenAddr(addr string) error {
	_, _, err := splitAddr(addr)
	return err
}

// splitAddr splits a host:port address, with a port from 0 to 65535.
func splitAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("invalid address %q: want host:port, such as 127.0.0.1:8000", addr)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 || strings.Trim(p, "0123456789") != "" {
		return "", 0, fmt.Errorf("invalid address %q: port must be a number between 0 and 65535", addr)
	}
	if !validHost(host) {
		return "", 0, fmt.Errorf("invalid address %q: %q is not an IP address or a host name", addr, host)
	}
	return host, port, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Prefixes is a list of IP prefixes, written as comma-separated CIDR
// prefixes or bare addresses (a bare address is its own /32 or /128).
type Prefixes []netip.Prefix

// UnmarshalText implements encoding.TextUnmarshaler. Its error names
// every entry that is not an address or a prefix, not only the first.
func (p *Prefixes) UnmarshalText(b []byte) error {
	var out Prefixes
	var bad []string
	for _, f := range strings.Split(string(b), ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			pr, err := netip.ParsePrefix(f)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%q is not an IP prefix (such as 10.0.0.0/8)", f))
				continue
			}
			out = append(out, pr.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%q is not an IP address or prefix", f))
			continue
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	*p = out
	return nil
}

// adminTokenProblem says why token could never be presented in an
// Authorization header (which loses a value's surrounding whitespace and
// cannot hold control characters), or "".
func adminTokenProblem(token string) string {
	switch {
	case token != strings.TrimSpace(token):
		return "begins or ends with whitespace, which no Authorization header can carry (a trailing newline from the file it was read from?)"
	case strings.ContainsFunc(token, unicode.IsControl):
		return "holds a control character, which no Authorization header can carry"
	}
	return ""
}

// isToken reports whether s is an HTTP token (RFC 9110, 5.6.2): what a
// Via pseudonym must be.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// UnknownEnv returns a warning for each PROXY_ variable in environ that
// the proxy does not read, in name order, with the name it may have meant:
// a typo (PROXY_ADMIN_TOKN) must not pass as a setting in force. The
// variables Kubernetes sets for a Service named "proxy" (PROXY_SERVICE_HOST,
// PROXY_PORT_8000_TCP, ...) are not warned of.
func UnknownEnv(environ map[string]string) []string {
	params, err := env.GetFieldParamsWithOptions(&Env{}, env.Options{Prefix: envPrefix})
	if err != nil {
		return nil // Env's own tags: cannot fail
	}
	known := make([]string, 0, len(params))
	for _, p := range params {
		known = append(known, p.Key)
	}
	var warnings []string
	for name := range environ {
		if !strings.HasPrefix(name, envPrefix) || slices.Contains(known, name) || serviceLink(name) {
			continue
		}
		w := name + ": not a variable the proxy reads; ignored"
		if near := nearest(name, known); near != "" {
			w += " (" + near + "?)"
		}
		warnings = append(warnings, w)
	}
	slices.Sort(warnings)
	return warnings
}

// serviceLink reports whether name is one of the variables Kubernetes
// gives every pod for a Service named "proxy".
func serviceLink(name string) bool {
	rest, ok := strings.CutPrefix(name, envPrefix)
	if !ok {
		return false
	}
	switch {
	case rest == "PORT", rest == "SERVICE_HOST", strings.HasPrefix(rest, "SERVICE_PORT"):
		return true
	case strings.HasPrefix(rest, "PORT_"): // PORT_8000_TCP, PORT_8000_TCP_ADDR, ...
		port, _, _ := strings.Cut(rest[len("PORT_"):], "_")
		_, err := strconv.Atoi(port)
		return err == nil
	}
	return false
}

// nearest returns the name in names closest to s by edit distance, if it
// is within 2 edits.
func nearest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
