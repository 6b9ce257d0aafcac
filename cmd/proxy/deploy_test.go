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

// The Kubernetes example must stay valid: every document parses, and the
// proxy config in its ConfigMap passes the proxy's own checks.
func TestKubernetesExample(t *testing.T) {
	var serveYAML string
	kinds := map[string]int{}
	for _, file := range []string{"../../deploy/kubernetes/replicas.yaml", "../../deploy/kubernetes/proxy.yaml"} {
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
	if kinds["Deployment"] != 2 || kinds["Service"] != 2 || kinds["ConfigMap"] != 1 {
		t.Fatalf("documents by kind: %v, want 2 Deployments, 2 Services, 1 ConfigMap", kinds)
	}
	cfg, err := config.Parse("serve.yaml", []byte(serveYAML))
	if err != nil {
		t.Fatalf("the ConfigMap's serve.yaml: %v", err)
	}
	if d := cfg.Applications[0].Deployments[0]; d.Handler != config.HandlerUpstream || !strings.HasPrefix(d.Discovery, "dns+srv://_http._tcp.model.") {
		t.Fatalf("deployment %+v: want handler upstream with SRV discovery of the model Service", d)
	}
}
