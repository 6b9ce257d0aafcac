package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"github.com/serveproxy/serveproxy/config"
)

// The Kubernetes examples must stay valid: every document parses, and the
// proxy config in the ConfigMap of each kind of replica passes the proxy's
// own checks.
func TestKubernetesExample(t *testing.T) {
	for _, tc := range []struct {
		replicas string
		kinds    map[string]int
		handler  string
		srv      string // the start of the discovery target
	}{
		{"replicas.yaml", map[string]int{"Deployment": 2, "Service": 2, "ConfigMap": 1}, config.HandlerUpstream, "dns+srv://_http._tcp.model."},
		{"replica-hosts.yaml", map[string]int{"Deployment": 2, "Service": 2, "ConfigMap": 1, "NetworkPolicy": 1}, config.HandlerHost, "dns+srv://_host._tcp.replica-hosts."},
	} {
		t.Run(tc.replicas, func(t *testing.T) {
			var serveYAML string
			kinds := map[string]int{}
			for _, file := range []string{"../../deploy/kubernetes/" + tc.replicas, "../../deploy/kubernetes/proxy.yaml"} {
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				dec := yaml.NewDecoder(bytes.NewReader(b))
				for {
					var doc struct {
						Kind string            `yaml:"kind"`
						Data map[string]string `yaml:"data"`
					}
					if err := dec.Decode(&doc); err != nil {
						if errors.Is(err, io.EOF) {
							break
						}
						t.Fatalf("%s: %v", file, err)
					}
					kinds[doc.Kind]++
					if s, ok := doc.Data["serve.yaml"]; ok {
						serveYAML = s
					}
				}
			}
			if len(kinds) != len(tc.kinds) {
				t.Fatalf("documents by kind: %v, want %v", kinds, tc.kinds)
			}
			for k, n := range tc.kinds {
				if kinds[k] != n {
					t.Fatalf("documents by kind: %v, want %v", kinds, tc.kinds)
				}
			}
			cfg, err := config.Parse("serve.yaml", []byte(serveYAML))
			if err != nil {
				t.Fatalf("the ConfigMap's serve.yaml: %v", err)
			}
			if d := cfg.Applications[0].Deployments[0]; d.Handler != tc.handler || !strings.HasPrefix(d.Discovery, tc.srv) {
				t.Fatalf("deployment %+v: want handler %s with SRV discovery %s...", d, tc.handler, tc.srv)
			}
		})
	}
}
