package config

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"
	"time"
)

const exampleYAML = `http_options: {host: 127.0.0.1, port: 8000, request_timeout_s: 30, keep_alive_timeout_s: 90}
applications:
  - name: api
    route_prefix: /api
    deployments:
      - name: slow
        handler: sleep          # built-ins: static, echo, sleep
        num_replicas: 2
        max_ongoing_requests: 5
        max_queued_requests: 10
        user_config: {ms: 100}
`

const minimalYAML = `applications:
  - name: app
    deployments:
      - name: dep
        handler: echo
`

// mustParse parses src and fails the test on error.
func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	want := &Config{
		HTTPOptions: HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 0, KeepAliveTimeoutS: 90},
		Applications: []Application{{
			Name:        "default",
			RoutePrefix: "/",
			Deployments: []Deployment{{
				Name:                     "hello",
				Handler:                  "static",
				NumReplicas:              16,
				MaxOngoingRequests:       100,
				MaxQueuedRequests:        -1,
				HealthCheckPeriodS:       10,
				HealthCheckTimeoutS:      30,
				GracefulShutdownTimeoutS: 20,
				MaxConstructorRetryCount: 20,
				DiscoveryIntervalS:       10,
				HealthCheckPath:          "/-/healthz",
				UserConfig:               json.RawMessage(`{"body":"hi"}`),
			}},
		}},
	}
	c.lines = nil // positions are TestConfigLine's
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", c, want)
	}

	// Each call returns its own value.
	c.Applications[0].Deployments[0].UserConfig[2] = 'X'
	c.Applications[0].Name = "changed"
	if d := Default(); d.Applications[0].Name != "default" || string(d.Applications[0].Deployments[0].UserConfig) != `{"body":"hi"}` {
		t.Errorf("Default() shares state between calls: %+v", d.Applications[0])
	}
}

func TestParseDefaults(t *testing.T) {
	tests := []struct {
		name string
		src  string
	}{
		{"absent sections", minimalYAML},
		{"empty http_options", "http_options:\n" + minimalYAML},
		{"empty mapping http_options", "http_options: {}\n" + minimalYAML},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.src)
			want := &Config{
				HTTPOptions: HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 0, KeepAliveTimeoutS: 90},
				Applications: []Application{{
					Name:        "app",
					RoutePrefix: "/",
					Deployments: []Deployment{{
						Name:                     "dep",
						Handler:                  "echo",
						NumReplicas:              1,
						MaxOngoingRequests:       5,
						MaxQueuedRequests:        -1,
						HealthCheckPeriodS:       10,
						HealthCheckTimeoutS:      30,
						GracefulShutdownTimeoutS: 20,
						MaxConstructorRetryCount: 20,
						DiscoveryIntervalS:       10,
						HealthCheckPath:          "/-/healthz",
						UserConfig:               nil,
					}},
				}},
			}
			c.lines = nil // positions are TestConfigLine's
			if !reflect.DeepEqual(c, want) {
				t.Errorf("Parse =\n%+v\nwant\n%+v", c, want)
			}
		})
	}
}

func TestParseExample(t *testing.T) {
	c := mustParse(t, exampleYAML)
	want := &Config{
		HTTPOptions: HTTPOptions{Host: "127.0.0.1", Port: 8000, RequestTimeoutS: 30, KeepAliveTimeoutS: 90},
		Applications: []Application{{
			Name:        "api",
			RoutePrefix: "/api",
			Deployments: []Deployment{{
				Name:                     "slow",
				Handler:                  "sleep",
				NumReplicas:              2,
				MaxOngoingRequests:       5,
				MaxQueuedRequests:        10,
				HealthCheckPeriodS:       10,
				HealthCheckTimeoutS:      30,
				GracefulShutdownTimeoutS: 20,
				MaxConstructorRetryCount: 20,
				DiscoveryIntervalS:       10,
				HealthCheckPath:          "/-/healthz",
				UserConfig:               json.RawMessage(`{"ms":100}`),
			}},
		}},
	}
	c.lines = nil // positions are TestConfigLine's
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

func TestParseValues(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		check func(t *testing.T, c *Config)
	}{
		{
			name: "explicit values replace every default",
			src: `http_options:
  host: 0.0.0.0
  port: 0
  request_timeout_s: 1.5
  keep_alive_timeout_s: 5
applications:
  - name: a
    route_prefix: /a/b
    deployments:
      - name: d
        handler: h
        num_replicas: 3
        max_ongoing_requests: 7
        max_queued_requests: -1
        health_check_period_s: 0.5
        health_check_timeout_s: 2
        graceful_shutdown_timeout_s: 0
        user_config: {}
`,
			check: func(t *testing.T, c *Config) {
				want := HTTPOptions{Host: "0.0.0.0", Port: 0, RequestTimeoutS: 1.5, KeepAliveTimeoutS: 5}
				if c.HTTPOptions != want {
					t.Errorf("HTTPOptions = %+v, want %+v", c.HTTPOptions, want)
				}
				d := c.Applications[0].Deployments[0]
				if d.NumReplicas != 3 || d.MaxOngoingRequests != 7 || d.MaxQueuedRequests != -1 ||
					d.HealthCheckPeriodS != 0.5 || d.HealthCheckTimeoutS != 2 || d.GracefulShutdownTimeoutS != 0 ||
					string(d.UserConfig) != "{}" {
					t.Errorf("deployment = %+v", d)
				}
			},
		},
		{
			name: "user_config keeps order, nesting and types",
			src: `applications:
  - name: a
    deployments:
      - name: d
        handler: h
        user_config:
          z: 1
          a: [1.5, "two", true, null, -3]
          m: {k: v}
          s: |
            line
`,
			check: func(t *testing.T, c *Config) {
				got := string(c.Applications[0].Deployments[0].UserConfig)
				want := `{"z":1,"a":[1.5,"two",true,null,-3],"m":{"k":"v"},"s":"line\n"}`
				if got != want {
					t.Errorf("user_config = %s, want %s", got, want)
				}
			},
		},
		{
			name: "anchors, aliases and merge keys",
			src: `applications:
  - name: a
    deployments:
      - &common
        name: first
        handler: echo
        num_replicas: 4
        max_ongoing_requests: 9
      - name: second
        num_replicas: 2   # the mapping's own key wins, even before the merge key
        <<: *common
      - <<: [{max_ongoing_requests: 1}, *common]   # earlier merged mappings win
        name: third
  - name: b
    route_prefix: /b
    deployments: [*common]
`,
			check: func(t *testing.T, c *Config) {
				ds := c.Applications[0].Deployments
				if ds[1].Handler != "echo" || ds[1].NumReplicas != 2 || ds[1].MaxOngoingRequests != 9 {
					t.Errorf("second = %+v", ds[1])
				}
				if ds[2].Handler != "echo" || ds[2].NumReplicas != 4 || ds[2].MaxOngoingRequests != 1 {
					t.Errorf("third = %+v", ds[2])
				}
				if got := c.Applications[1].Deployments[0]; !reflect.DeepEqual(got, ds[0]) {
					t.Errorf("alias = %+v, want %+v", got, ds[0])
				}
			},
		},
		{
			name: "tags",
			src: `applications:
  - name: !!str 2024
    deployments: [{name: d, handler: h, num_replicas: !!int "3"}]
`,
			check: func(t *testing.T, c *Config) {
				if a := c.Applications[0]; a.Name != "2024" || a.Deployments[0].NumReplicas != 3 {
					t.Errorf("application = %+v", a)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustParse(t, tt.src))
		})
	}
}

func TestDurations(t *testing.T) {
	o := HTTPOptions{RequestTimeoutS: 1.5, KeepAliveTimeoutS: 90}
	d := Deployment{HealthCheckPeriodS: 10, HealthCheckTimeoutS: 0.25, GracefulShutdownTimeoutS: 0}
	for _, tt := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"RequestTimeout", o.RequestTimeout(), 1500 * time.Millisecond},
		{"KeepAliveTimeout", o.KeepAliveTimeout(), 90 * time.Second},
		{"HealthCheckPeriod", d.HealthCheckPeriod(), 10 * time.Second},
		{"HealthCheckTimeout", d.HealthCheckTimeout(), 250 * time.Millisecond},
		{"GracefulShutdownTimeout", d.GracefulShutdownTimeout(), 0},
		{"huge clamps", HTTPOptions{RequestTimeoutS: 1e300}.RequestTimeout(), time.Duration(maxSeconds) * time.Second},
		{"negative is 0", HTTPOptions{RequestTimeoutS: -1}.RequestTimeout(), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestFieldErrorFormat(t *testing.T) {
	for _, tt := range []struct {
		err  FieldError
		want string
	}{
		{FieldError{"c.yaml", 7, "applications[0].name", "is required"}, "c.yaml:7: applications[0].name: is required"},
		{FieldError{"c.yaml", 0, "applications", "at least one application is required"}, "c.yaml: applications: at least one application is required"},
		{FieldError{"", 0, "applications[0].name", "is required"}, "applications[0].name: is required"},
		{FieldError{"c.yaml", 3, "", "invalid YAML: oops"}, "c.yaml:3: invalid YAML: oops"},
	} {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	errs := Errors{{"a", 1, "x", "m1"}, {"a", 2, "y", "m2"}}
	if got, want := errs.Error(), "a:1: x: m1\na:2: y: m2"; got != want {
		t.Errorf("Errors.Error() = %q, want %q", got, want)
	}
}

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o600) }

func TestConfigLine(t *testing.T) {
	c, err := Parse("f.yaml", []byte(exampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		field string
		line  int
	}{
		{"applications[0].route_prefix", 4},
		{"applications[0].deployments[0].handler", 7},
		{"applications[0].deployments[0].user_config", 11},
		// Absent fields fall back to the nearest enclosing one.
		{"applications[0].deployments[0].health_check_period_s", 6},
		{"nothing", 0},
	}
	for _, tt := range tests {
		if got := c.Line(tt.field); got != tt.line {
			t.Errorf("Line(%q) = %d, want %d", tt.field, got, tt.line)
		}
	}
	if got := Default().Line("applications[0]"); got != 0 {
		t.Errorf("Default().Line = %d, want 0", got)
	}
}

// A byte order mark before the document is no part of its first key (it
// read as an unknown field "\ufeffapplications", found by a tester).
func TestParseByteOrderMark(t *testing.T) {
	c, err := Parse("bom.yaml", []byte("\ufeffapplications:\n  - name: a\n    route_prefix: /\n    deployments:\n      - {name: a, handler: static}\n"))
	if err != nil || len(c.Applications) != 1 {
		t.Fatalf("Parse with a BOM: %v", err)
	}
}

// A %YAML directive (PyYAML writes and reads them) opens the document; it
// was refused as "unexpected scalar value type" (a tester).
func TestYAMLDirective(t *testing.T) {
	for _, dir := range []string{"%YAML 1.1\n", "%YAML 1.2\n", "%TAG !e! tag:example.com,2000:\n"} {
		c := mustParse(t, dir+"---\n"+minimalYAML)
		if len(c.Applications) != 1 || c.Applications[0].Name != "app" {
			t.Errorf("%q: got %+v", dir, c.Applications)
		}
	}
}

// A file that is not UTF-8 is refused where its first bad byte is: its
// names would have turned into U+FFFD in JSON and metrics (a tester).
func TestNotUTF8(t *testing.T) {
	_, err := Parse("u8.yaml", []byte("applications:\n  - name: a\xff\n    deployments: [{name: d, handler: echo}]\n"))
	want := "u8.yaml:2: invalid YAML: the file is not UTF-8 (a byte that is no UTF-8 at column 12)"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	// After a byte order mark, the column an editor shows (the mark is
	// three bytes).
	_, err = Parse("u8.yaml", []byte("\ufeffapplications: \xff\n"))
	want = "u8.yaml:1: invalid YAML: the file is not UTF-8 (a byte that is no UTF-8 at column 18)"
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
}

// A key of a user_config has its own line, for an error about it (an
// unknown key, found by the handler's factory); one not in the file, or
// nested deeper, is the user_config's.
func TestUserConfigField(t *testing.T) {
	c := mustParse(t, `applications:
  - name: a
    route_prefix: /
    deployments:
      - name: d
        handler: static
        user_config:
          body: hi
          Status: 201
          nested: {inner: 1}
`)
	const uc = "applications[0].deployments[0].user_config"
	for key, want := range map[string]struct {
		field string
		line  int
	}{
		"Status": {uc + ".Status", 9},
		"body":   {uc + ".body", 8},
		"absent": {uc, 7},
		"inner":  {uc, 7},
	} {
		if f := c.UserConfigField(uc, key); f != want.field || c.Line(f) != want.line {
			t.Errorf("UserConfigField(%q) = %q at line %d, want %q at line %d", key, f, c.Line(f), want.field, want.line)
		}
	}
}
