package config

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
)

// tlsDir holds the tests' certificates (see its README).
const tlsDir = "testdata/tls/"

func TestParseHostTLS(t *testing.T) {
	c, err := Parse("test.yaml", []byte(kindDeployment("host", `        hosts: ["10.0.0.5:9001"]
        host_tls:
          ca_file: `+tlsDir+`ca.pem
          cert_file: `+tlsDir+`proxy.pem
          key_file: `+tlsDir+`proxy-key.pem
          server_name: replica.test
`)))
	if err != nil {
		t.Fatal(err)
	}
	ht := c.Applications[0].Deployments[0].HostTLS
	if ht == nil || ht.ServerName != "replica.test" {
		t.Fatalf("host_tls %+v", ht)
	}
	cfg, err := ht.ClientConfig()
	if err != nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "replica.test" || cfg.MinVersion != tls.VersionTLS13 {
		t.Fatalf("ClientConfig: %v %+v", err, cfg)
	}

	// Absent: plain TCP. An empty mapping: TLS with the system's roots.
	for src, on := range map[string]bool{"": false, "        host_tls: {}\n": true} {
		c, err := Parse("test.yaml", []byte(kindDeployment("host", "        hosts: [\"10.0.0.5:9001\"]\n"+src)))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if got := c.Applications[0].Deployments[0].HostTLS != nil; got != on {
			t.Errorf("%q: TLS on %v, want %v", src, got, on)
		}
	}
}

func TestParseHostTLSErrors(t *testing.T) {
	tests := []struct {
		name, extra, field string
		line               int
		msg                string
	}{
		{"not a host", "        host_tls: {}\n", "host_tls", 6, `is only for handler "host"`},
		{"unknown field", "        hosts: [\"h:1\"]\n        host_tls: {ca: x}\n", "host_tls.ca", 7, "unknown field; known fields are ca_file, cert_file, key_file, server_name"},
		{"empty", "        hosts: [\"h:1\"]\n        host_tls:\n", "host_tls", 7, "is empty: give its fields ({} for their defaults), or remove it"},
		{"a list", "        hosts: [\"h:1\"]\n        host_tls: [a]\n", "host_tls", 7, "must be a mapping"},
		{"cert without key", "        hosts: [\"h:1\"]\n        host_tls:\n          cert_file: proxy.pem\n", "host_tls.key_file", 7, "required with cert_file"},
		{"key without cert", "        hosts: [\"h:1\"]\n        host_tls:\n          key_file: proxy-key.pem\n", "host_tls.cert_file", 7, "required with key_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := kindDeployment("host", tt.extra)
			if tt.name == "not a host" {
				src = withDeployment(tt.extra)
			}
			errs := parseErrors(t, src)
			var found bool
			for _, e := range errs {
				if strings.HasSuffix(e.Field, tt.field) && e.Line == tt.line && strings.Contains(e.Msg, tt.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %v, want one at %s line %d saying %q", errs, tt.field, tt.line, tt.msg)
			}
		})
	}
}

// TestHostTLSProblems checks that the files are read by Problems (the
// proxy's -check), not by Parse, which a host started from the same file
// uses too, and that each problem names its own field and file.
func TestHostTLSProblems(t *testing.T) {
	missing := HostTLS{CAFile: tlsDir + "none.pem", CertFile: tlsDir + "none-cert.pem", KeyFile: tlsDir + "proxy-key.pem"}
	if _, err := Parse("test.yaml", []byte(kindDeployment("host", "        hosts: [\"h:1\"]\n        host_tls: {ca_file: "+missing.CAFile+", cert_file: "+missing.CertFile+", key_file: "+missing.KeyFile+"}\n"))); err != nil {
		t.Fatalf("Parse read the TLS files: %v", err)
	}
	for _, tt := range []struct {
		name string
		ht   HostTLS
		want []string // "field: message part", in order
	}{
		{"fine", HostTLS{CAFile: tlsDir + "ca.pem", CertFile: tlsDir + "proxy.pem", KeyFile: tlsDir + "proxy-key.pem"}, nil},
		{"missing files", missing, []string{"ca_file: open " + tlsDir + "none.pem: no such file", "cert_file: open " + tlsDir + "none-cert.pem: no such file"}},
		{"a CA file of no certificate", HostTLS{CAFile: tlsDir + "README.md"}, []string{"ca_file: " + tlsDir + "README.md: no PEM certificate in it"}},
		{"a certificate file of no certificate", HostTLS{CertFile: tlsDir + "proxy-key.pem", KeyFile: tlsDir + "proxy-key.pem"},
			[]string{"cert_file: " + tlsDir + "proxy-key.pem: no PEM certificate in it"}},
		{"a key of another certificate", HostTLS{CertFile: tlsDir + "proxy.pem", KeyFile: tlsDir + "host-key.pem"},
			[]string{"key_file: " + tlsDir + "host-key.pem: tls: private key does not match public key"}},
		{"a certificate for a key", HostTLS{CertFile: tlsDir + "proxy.pem", KeyFile: tlsDir + "proxy.pem"},
			[]string{"key_file: " + tlsDir + "proxy.pem: tls: found a certificate rather than a key"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.ht.Problems()
			if len(got) != len(tt.want) {
				t.Fatalf("problems %v, want %d: %v", got, len(tt.want), tt.want)
			}
			for i, p := range got {
				if !strings.Contains(p.Error(), tt.want[i]) {
					t.Errorf("problem %d: %q, want %q", i, p.Error(), tt.want[i])
				}
			}
			if _, err := tt.ht.ClientConfig(); (err == nil) != (len(tt.want) == 0) {
				t.Errorf("ClientConfig: %v", err)
			}
		})
	}
}

func TestServerTLS(t *testing.T) {
	cfg, err := ServerTLS(tlsDir+"host.pem", tlsDir+"host-key.pem", "")
	if err != nil || len(cfg.Certificates) != 1 || cfg.ClientAuth != tls.NoClientCert {
		t.Fatalf("without a client CA: %v %+v", err, cfg)
	}
	cfg, err = ServerTLS(tlsDir+"host.pem", tlsDir+"host-key.pem", tlsDir+"ca.pem")
	if err != nil || cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil {
		t.Fatalf("with a client CA: %v %+v", err, cfg)
	}
	for _, bad := range [][3]string{
		{tlsDir + "none.pem", tlsDir + "host-key.pem", ""},
		{tlsDir + "host.pem", tlsDir + "proxy-key.pem", ""},
		{tlsDir + "host.pem", tlsDir + "host-key.pem", tlsDir + "host-key.pem"},
	} {
		if _, err := ServerTLS(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("ServerTLS%q: no error", bad)
		}
	}
}

func TestReloadingTLS(t *testing.T) {
	if _, err := ReloadingTLS(func() (*tls.Config, error) { return nil, errors.New("no files") }, nil); err == nil {
		t.Fatal("a first load that fails: no error")
	}
	var (
		next     = &tls.Config{ServerName: "first"}
		fail     error
		reported []error
	)
	current, err := ReloadingTLS(func() (*tls.Config, error) {
		if fail != nil {
			return nil, fail
		}
		return next, nil
	}, func(err error) { reported = append(reported, err) })
	if err != nil {
		t.Fatal(err)
	}
	next = &tls.Config{ServerName: "renewed"}
	if got := current(); got.ServerName != "renewed" {
		t.Errorf("after a renewal: %q", got.ServerName)
	}
	fail = errors.New("does not parse")
	for range 3 {
		if got := current(); got.ServerName != "renewed" {
			t.Errorf("a load that fails: %q, want the last good one", got.ServerName)
		}
	}
	if len(reported) != 1 || reported[0] != fail {
		t.Errorf("reported %v, want the failure once", reported)
	}
	fail = nil
	current()
	fail = errors.New("does not parse") // again, after a success: news again
	current()
	if len(reported) != 2 {
		t.Errorf("reported %v, want the failure again after a load succeeded", reported)
	}
}
