package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadEnvDefaults(t *testing.T) {
	for _, environ := range []map[string]string{
		nil,
		{"HOME": "/root", "HTTP_ADDR": "ignored: no prefix"},
		// Empty variables count as unset.
		{"PROXY_LOG_LEVEL": "", "PROXY_HTTP_ADDR": "", "PROXY_REQUEST_TIMEOUT": "", "PROXY_MAX_BODY_BYTES": ""},
	} {
		e, err := ReadEnv(environ)
		if err != nil {
			t.Fatalf("ReadEnv(%v) = %v", environ, err)
		}
		want := Env{
			HTTPAddr:          "",
			AdminAddr:         "127.0.0.1:8080",
			ConfigPath:        "",
			LogLevel:          "info",
			LogFormat:         "json",
			AccessLog:         true,
			LeanFront:         true,
			RequestTimeout:    0,
			KeepAliveTimeout:  0,
			ReadHeaderTimeout: 10 * time.Second,
			ClientBodyTimeout: time.Minute,
			ClientSendTimeout: time.Minute,
			MaxHeaderBytes:    1 << 20,
			MaxBodyBytes:      100 << 20,
			GCTuning:          true,
			GCPercent:         400,
			GCMemoryLimit:     MemoryLimit{Ratio: 0.9},
		}
		if !reflect.DeepEqual(e, want) {
			t.Errorf("ReadEnv(%v) =\n%+v\nwant\n%+v", environ, e, want)
		}
	}
}

func TestReadEnvValid(t *testing.T) {
	tests := []struct {
		name, value string
		check       func(e Env) bool
	}{
		{"PROXY_HTTP_ADDR", "0.0.0.0:9000", func(e Env) bool { return e.HTTPAddr == "0.0.0.0:9000" }},
		{"PROXY_HTTP_ADDR", "[::1]:0", func(e Env) bool { return e.HTTPAddr == "[::1]:0" }},
		{"PROXY_ADMIN_ADDR", ":9090", func(e Env) bool { return e.AdminAddr == ":9090" }},
		{"PROXY_CONFIG", "/etc/serve.yaml", func(e Env) bool { return e.ConfigPath == "/etc/serve.yaml" }},
		{"PROXY_LOG_LEVEL", "trace", func(e Env) bool { return e.LogLevel == "trace" }},
		{"PROXY_LOG_LEVEL", "debug", func(e Env) bool { return e.LogLevel == "debug" }},
		{"PROXY_LOG_LEVEL", "warn", func(e Env) bool { return e.LogLevel == "warn" }},
		{"PROXY_LOG_LEVEL", "ERROR", func(e Env) bool { return e.LogLevel == "error" }},
		{"PROXY_LOG_FORMAT", "console", func(e Env) bool { return e.LogFormat == "console" }},
		{"PROXY_LOG_FORMAT", "JSON", func(e Env) bool { return e.LogFormat == "json" }},
		{"PROXY_ACCESS_LOG", "false", func(e Env) bool { return !e.AccessLog }},
		{"PROXY_ACCESS_LOG", "0", func(e Env) bool { return !e.AccessLog }},
		{"PROXY_LEAN_FRONT", "false", func(e Env) bool { return !e.LeanFront }},
		{"PROXY_REQUEST_TIMEOUT", "1m30s", func(e Env) bool { return e.RequestTimeout == 90*time.Second }},
		{"PROXY_REQUEST_TIMEOUT", "0s", func(e Env) bool { return e.RequestTimeout == 0 && e.requestTimeoutSet }},
		{"PROXY_KEEP_ALIVE_TIMEOUT", "5s", func(e Env) bool { return e.KeepAliveTimeout == 5*time.Second }},
		{"PROXY_READ_HEADER_TIMEOUT", "250ms", func(e Env) bool { return e.ReadHeaderTimeout == 250*time.Millisecond }},
		{"PROXY_CLIENT_BODY_TIMEOUT", "0", func(e Env) bool { return e.ClientBodyTimeout == 0 }},
		{"PROXY_CLIENT_BODY_TIMEOUT", "5s", func(e Env) bool { return e.ClientBodyTimeout == 5*time.Second }},
		{"PROXY_CLIENT_SEND_TIMEOUT", "0", func(e Env) bool { return e.ClientSendTimeout == 0 }},
		{"PROXY_CLIENT_SEND_TIMEOUT", "2m", func(e Env) bool { return e.ClientSendTimeout == 2*time.Minute }},
		{"PROXY_MAX_HEADER_BYTES", "64KiB", func(e Env) bool { return e.MaxHeaderBytes == 64<<10 }},
		{"PROXY_MAX_BODY_BYTES", "1GB", func(e Env) bool { return e.MaxBodyBytes == 1e9 }},
		{"PROXY_MAX_BODY_BYTES", "4096", func(e Env) bool { return e.MaxBodyBytes == 4096 }},
		{"PROXY_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7,::1", func(e Env) bool {
			return fmt.Sprint(e.TrustedProxies) == "[10.0.0.0/8 192.168.1.7/32 ::1/128]"
		}},
		{"PROXY_VIA", "edge-1", func(e Env) bool { return e.Via == "edge-1" }},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			e, err := ReadEnv(map[string]string{tt.name: tt.value})
			if err != nil {
				t.Fatalf("ReadEnv = %v", err)
			}
			if !tt.check(e) {
				t.Errorf("ReadEnv = %+v", e)
			}
		})
	}
}

func TestReadEnvInvalid(t *testing.T) {
	tests := []struct {
		name, value, msg string
	}{
		{"PROXY_HTTP_ADDR", "8000", "invalid address"},
		{"PROXY_HTTP_ADDR", "localhost:http", "port must be a number between 0 and 65535"},
		{"PROXY_HTTP_ADDR", "localhost:65536", "port must be a number between 0 and 65535"},
		{"PROXY_HTTP_ADDR", "localhost:+80", "port must be a number between 0 and 65535"},
		{"PROXY_ADMIN_ADDR", "nope", "invalid address"},
		{"PROXY_LOG_LEVEL", "verbose", `invalid value "verbose" (want one of trace, debug, info, warn, error)`},
		{"PROXY_LOG_LEVEL", "fatal", "invalid value"},
		{"PROXY_LOG_FORMAT", "text", `invalid value "text" (want one of json, console)`},
		{"PROXY_ACCESS_LOG", "maybe", `invalid boolean "maybe"`},
		{"PROXY_LEAN_FRONT", "no thanks", `invalid boolean "no thanks"`},
		{"PROXY_REQUEST_TIMEOUT", "5x", `invalid duration "5x"`},
		{"PROXY_REQUEST_TIMEOUT", "30", `invalid duration "30"`},
		{"PROXY_REQUEST_TIMEOUT", "-1s", "must be >= 0"},
		{"PROXY_KEEP_ALIVE_TIMEOUT", "soon", `invalid duration "soon"`},
		{"PROXY_KEEP_ALIVE_TIMEOUT", "0s", "must be > 0"},
		{"PROXY_READ_HEADER_TIMEOUT", "0", "must be > 0"},
		{"PROXY_CLIENT_BODY_TIMEOUT", "-1s", "must be >= 0"},
		{"PROXY_CLIENT_SEND_TIMEOUT", "-1s", "must be >= 0"},
		{"PROXY_READ_HEADER_TIMEOUT", "1d", `invalid duration "1d"`},
		{"PROXY_MAX_HEADER_BYTES", "0", "must be > 0"},
		{"PROXY_MAX_HEADER_BYTES", "9223372036854775807", "must be > 0 and at most 1GiB, got 9223372036854775807"},
		{"PROXY_REQUEST_TIMEOUT", "1ns", "must be 0 or at least 1ms, got 1ns"},
		{"PROXY_KEEP_ALIVE_TIMEOUT", "999us", "must be at least 1ms, got 999µs"},
		{"PROXY_CLIENT_SEND_TIMEOUT", "10", `invalid duration "10"`},
		{"PROXY_MAX_HEADER_BYTES", "1MB5", "invalid byte size"},
		{"PROXY_MAX_BODY_BYTES", "-1", "must not be negative"},
		{"PROXY_MAX_BODY_BYTES", "10XB", `unknown unit "XB"`},
		{"PROXY_VIA", "my proxy", `must be one token`},
		{"PROXY_VIA", "a,b", `must be one token`},
		{"PROXY_ADMIN_TOKEN", "s3cret\n", "a trailing newline"},
		{"PROXY_ADMIN_TOKEN", " s3cret", "begins or ends with whitespace"},
		{"PROXY_ADMIN_TOKEN", "s3\x01cret", "control character"},
		{"PROXY_TRUSTED_PROXIES", "10.0.0.0/33", `"10.0.0.0/33" is not an IP prefix`},
		{"PROXY_TRUSTED_PROXIES", "10.0.0.0/8,lb.internal", `"lb.internal" is not an IP address or prefix`},
		{"PROXY_TRUSTED_PROXIES", "10.0.0.0/33, 10.0.0.1,lb.internal", `"10.0.0.0/33" is not an IP prefix (such as 10.0.0.0/8); "lb.internal" is not an IP address or prefix`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			_, err := ReadEnv(map[string]string{tt.name: tt.value})
			if err == nil {
				t.Fatal("ReadEnv succeeded")
			}
			want := tt.name + ": "
			if got := err.Error(); !strings.HasPrefix(got, want) || !strings.Contains(got, tt.msg) {
				t.Errorf("ReadEnv error = %q, want %q...%q", got, want, tt.msg)
			}
		})
	}
	t.Run("spec example", func(t *testing.T) {
		_, err := ReadEnv(map[string]string{"PROXY_REQUEST_TIMEOUT": "5x"})
		if want := `PROXY_REQUEST_TIMEOUT: invalid duration "5x"`; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ReadEnv error = %v, want %s...", err, want)
		}
	})
}

func TestReadEnvReportsEveryBadVariable(t *testing.T) {
	_, err := ReadEnv(map[string]string{
		"PROXY_MAX_BODY_BYTES":  "lots",
		"PROXY_LOG_LEVEL":       "loud",
		"PROXY_REQUEST_TIMEOUT": "5x",
		"PROXY_HTTP_ADDR":       "nowhere",
		"PROXY_ACCESS_LOG":      "perhaps",
	})
	if err == nil {
		t.Fatal("ReadEnv succeeded")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{"PROXY_HTTP_ADDR", "PROXY_LOG_LEVEL", "PROXY_ACCESS_LOG", "PROXY_REQUEST_TIMEOUT", "PROXY_MAX_BODY_BYTES"}
	if len(lines) != len(want) {
		t.Fatalf("ReadEnv error =\n%v\nwant one line for each of %v", err, want)
	}
	for i, name := range want {
		if !strings.HasPrefix(lines[i], name+": ") {
			t.Errorf("line %d = %q, want it to name %s", i, lines[i], name)
		}
	}
}

func TestApply(t *testing.T) {
	file := func() *Config {
		c := mustParse(t, exampleYAML) // 127.0.0.1:8000, request 30s, keep-alive 90s
		c.HTTPOptions.KeepAliveTimeoutS = 60
		return c
	}
	tests := []struct {
		name    string
		environ map[string]string
		want    HTTPOptions
	}{
		{"unset env leaves the file", nil, HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"empty env leaves the file", map[string]string{"PROXY_HTTP_ADDR": "", "PROXY_REQUEST_TIMEOUT": "", "PROXY_KEEP_ALIVE_TIMEOUT": ""},
			HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"other variables leave the file", map[string]string{"PROXY_ADMIN_ADDR": "0.0.0.0:1", "PROXY_READ_HEADER_TIMEOUT": "1s"},
			HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"address", map[string]string{"PROXY_HTTP_ADDR": "0.0.0.0:9000"}, HTTPOptions{Host: "0.0.0.0", Port: 9000, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"IPv6 address", map[string]string{"PROXY_HTTP_ADDR": "[::1]:8443"}, HTTPOptions{Host: "::1", Port: 8443, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"all interfaces, any port", map[string]string{"PROXY_HTTP_ADDR": ":0"}, HTTPOptions{Host: "", Port: 0, RequestTimeoutS: 30, KeepAliveTimeoutS: 60}},
		{"request timeout", map[string]string{"PROXY_REQUEST_TIMEOUT": "1.5s"}, HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 1.5, KeepAliveTimeoutS: 60}},
		{"request timeout 0 means none", map[string]string{"PROXY_REQUEST_TIMEOUT": "0s"}, HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 0, KeepAliveTimeoutS: 60}},
		{"keep-alive timeout", map[string]string{"PROXY_KEEP_ALIVE_TIMEOUT": "2m"}, HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 30, KeepAliveTimeoutS: 120}},
		{"everything", map[string]string{"PROXY_HTTP_ADDR": "10.0.0.1:80", "PROXY_REQUEST_TIMEOUT": "10s", "PROXY_KEEP_ALIVE_TIMEOUT": "5s"},
			HTTPOptions{Host: "10.0.0.1", Port: 80, RequestTimeoutS: 10, KeepAliveTimeoutS: 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := ReadEnv(tt.environ)
			if err != nil {
				t.Fatalf("ReadEnv = %v", err)
			}
			c := file()
			if err := e.Apply(c); err != nil {
				t.Fatalf("Apply = %v", err)
			}
			if c.HTTPOptions != tt.want {
				t.Errorf("HTTPOptions = %+v, want %+v", c.HTTPOptions, tt.want)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate after Apply = %v", err)
			}
			if want := file().Applications; c.Applications[0].Name != want[0].Name {
				t.Errorf("Apply changed applications: %+v", c.Applications)
			}
		})
	}
}

func TestApplyErrors(t *testing.T) {
	// Apply also checks an Env built in Go rather than read by ReadEnv. The
	// good HTTPAddr in the other rows shows that nothing is applied when
	// anything is wrong.
	tests := []struct {
		name string
		env  Env
	}{
		{"PROXY_HTTP_ADDR", Env{HTTPAddr: "no-port"}},
		{"PROXY_HTTP_ADDR", Env{HTTPAddr: "host:99999"}},
		{"PROXY_REQUEST_TIMEOUT", Env{HTTPAddr: "0.0.0.0:1", RequestTimeout: -time.Second}},
		{"PROXY_KEEP_ALIVE_TIMEOUT", Env{HTTPAddr: "0.0.0.0:1", KeepAliveTimeout: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			err := tt.env.Apply(c)
			if err == nil || !strings.HasPrefix(err.Error(), tt.name+": ") {
				t.Errorf("Apply = %v, want an error naming %s", err, tt.name)
			}
			if c.HTTPOptions != Default().HTTPOptions {
				t.Errorf("Apply changed the config on error: %+v", c.HTTPOptions)
			}
		})
	}
	t.Run("zero Env", func(t *testing.T) {
		c := Default()
		if err := (Env{}).Apply(c); err != nil || c.HTTPOptions != Default().HTTPOptions {
			t.Errorf("Apply = %v, HTTPOptions %+v", err, c.HTTPOptions)
		}
	})
}
