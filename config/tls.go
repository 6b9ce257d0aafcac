package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// HostTLS is TLS on the connections of a deployment with handler "host" to
// its replica hosts (host_tls): the hosts' certificates are verified, and
// the proxy shows its own to hosts that require one (cmd/replica
// -tls-client-ca), so that only proxies holding a certificate of that CA
// can send a host requests and control calls.
type HostTLS struct {
	// CAFile holds the PEM certificates of the authorities that sign the
	// hosts' certificates; the system's roots if empty.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the proxy's client certificate and its key,
	// PEM, given together.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name every host's certificate must carry. If
	// empty, the host part of each hosts entry.
	ServerName string `yaml:"server_name"`
}

// ClientConfig loads t's files into the TLS configuration for dialing the
// hosts. Its error names the field and the file.
func (t *HostTLS) ClientConfig() (*tls.Config, error) {
	cfg, problems := t.load()
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s: %w", problems[0].field, problems[0].err)
	}
	return cfg, nil
}

// tlsProblem is what is wrong with one field of a HostTLS.
type tlsProblem struct {
	field string
	err   error
}

// load is ClientConfig with every problem, each with its field apart.
func (t *HostTLS) load() (*tls.Config, []tlsProblem) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: t.ServerName}
	var problems []tlsProblem
	if t.CAFile != "" {
		pool, err := loadCertPool(t.CAFile)
		if err != nil {
			problems = append(problems, tlsProblem{"ca_file", err})
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			problems = append(problems, tlsProblem{"cert_file", fmt.Errorf("with key_file: %w", err)})
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "":
		problems = append(problems, tlsProblem{"key_file", errors.New("required with cert_file: the certificate's key")})
	case t.KeyFile != "":
		problems = append(problems, tlsProblem{"cert_file", errors.New("required with key_file: the key's certificate")})
	}
	return cfg, problems
}

// ServerTLS returns a replica host's TLS configuration: its certificate
// and key, and, if clientCAFile is not empty, the authorities one of which
// must have signed every proxy's client certificate (mutual TLS). Its
// errors name the file.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// loadCertPool reads the PEM certificates in path.
func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
