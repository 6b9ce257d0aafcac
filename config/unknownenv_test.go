package config

import (
	"slices"
	"testing"
)

func TestUnknownEnv(t *testing.T) {
	got := UnknownEnv(map[string]string{
		"PROXY_ADMIN_TOKN":         "x", // a typo: warned, with the name meant
		"PROXY_HTTP_ADDR":          "127.0.0.1:1",
		"PROXY_GC_PERCENT":         "200",
		"PROXY_SOMETHING":          "1",        // nothing near it
		"PROXY_SERVICE_HOST":       "10.0.0.1", // Kubernetes' service links for a Service "proxy"
		"PROXY_SERVICE_PORT_HTTP":  "8000",
		"PROXY_PORT":               "tcp://10.0.0.1:8000",
		"PROXY_PORT_8000_TCP_ADDR": "10.0.0.1",
		"HTTP_PROXY":               "x", // not ours
	})
	want := []string{
		"PROXY_ADMIN_TOKN: not a variable the proxy reads; ignored (PROXY_ADMIN_TOKEN?)",
		"PROXY_SOMETHING: not a variable the proxy reads; ignored",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("UnknownEnv =\n%q\nwant\n%q", got, want)
	}
}
