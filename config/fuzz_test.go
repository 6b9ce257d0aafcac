package config

import (
	"errors"
	"testing"
)

// FuzzParse checks that Parse never panics, that whatever it accepts
// passes Validate, and that whatever it rejects comes as Errors.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		exampleYAML,
		minimalYAML,
		"",
		"applications: [\n",
		"applications:\n- name: a\n  deployments:\n  - {name: d, handler: h, user_config: &u {a: 1, b: *u}}\n",
		"x: &c {num_replicas: 3, handler: h}\napplications:\n- name: a\n  deployments:\n  - <<: *c\n    name: d\n",
		"a: &a [x,x]\nb: &b [*a,*a]\napplications: [{name: a, deployments: [{name: d, handler: h, user_config: {l: [*b,*b]}}]}]\n",
		"applications: [{name: a, route_prefix: /-/x, deployments: [{name: d, handler: h, num_replicas: 0}]}]\n---\nfoo: 1\n",
		"http_options: {port: 70000, request_timeout_s: .nan, keep_alive_timeout_s: .inf}\n",
		"applications: *nope\n",
		"\t- :\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("Parse error is not a non-empty Errors: %#v", err)
			}
			if c != nil {
				// What could be decoded must still be safe to walk.
				for _, a := range c.Applications {
					for _, d := range a.Deployments {
						_ = c.Line(d.Name)
					}
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate rejects: %v\ninput:\n%s", err, data)
		}
	})
}
