package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"sync"
)

// HostTLS is TLS on the connections of a deployment with handler "host" to
// its replica hosts (host_tls): the hosts' certificates are verified, and
// the proxy shows its own to hosts that require one (cmd/replica
// -tls-client-ca), so that only proxies holding a certificate of that CA
// can send a host requests and control calls. It is the proxy's side
// only: the files are the proxy's, and a host started from the same file
// (cmd/replica -config) neither reads them nor takes its TLS from them.
// The proxy reads them again at every dial (see ReloadingTLS).
type HostTLS struct {
	// CAFile holds the PEM certificates of the authorities that sign the
	// hosts' certificates; the system's roots if empty.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the proxy's client certificate and its key,
	// PEM, given together.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name every host's certificate must carry. If
	// empty, the host part of each hosts entry (an IP address then needs
	// an IP SAN).
	ServerName string `yaml:"server_name"`
}

// TLSFileError is a TLS file that could not be used. Field is the YAML
// field of a HostTLS ("ca_file", "cert_file", "key_file"), or for
// ServerTLS which argument: "cert", "key" or "client_ca".
type TLSFileError struct {
	Field string
	Path  string // "" when the file is missing from the config
	Err   error  // the cause
}

// Error implements error: the field, then Message.
func (e *TLSFileError) Error() string { return e.Field + ": " + e.Message() }

// Message is what is wrong, with the file's path (once: an error of the
// os package names it already).
func (e *TLSFileError) Message() string {
	var pe *fs.PathError
	if e.Path == "" || errors.As(e.Err, &pe) {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *TLSFileError) Unwrap() error { return e.Err }

// ClientConfig loads t's files into the TLS configuration for dialing the
// hosts. Its error is the first of Problems.
func (t *HostTLS) ClientConfig() (*tls.Config, error) {
	cfg, problems := t.load()
	if len(problems) > 0 {
		return nil, problems[0]
	}
	return cfg, nil
}

// Problems reads t's files and returns what is wrong with each, nil if
// nothing is: cmd/proxy -check reports them at their lines.
func (t *HostTLS) Problems() []*TLSFileError {
	_, problems := t.load()
	return problems
}

func (t *HostTLS) load() (*tls.Config, []*TLSFileError) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: t.ServerName}
	var problems []*TLSFileError
	if t.CAFile != "" {
		pool, err := loadCertPool(t.CAFile)
		if err != nil {
			problems = append(problems, &TLSFileError{"ca_file", t.CAFile, err})
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := loadKeyPair(t.CertFile, t.KeyFile, "cert_file", "key_file")
		if err != nil {
			problems = append(problems, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "":
		problems = append(problems, &TLSFileError{"key_file", "", errors.New("required with cert_file: the certificate's key")})
	case t.KeyFile != "":
		problems = append(problems, &TLSFileError{"cert_file", "", errors.New("required with key_file: the key's certificate")})
	}
	return cfg, problems
}

// ServerTLS returns a replica host's TLS configuration: its certificate
// and key, and, if clientCAFile is not empty, the authorities one of which
// must have signed every proxy's client certificate (mutual TLS). Its
// error is a *TLSFileError naming the argument and the file.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, ferr := loadKeyPair(certFile, keyFile, "cert", "key")
	if ferr != nil {
		return nil, ferr
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, &TLSFileError{"client_ca", clientCAFile, err}
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// loadKeyPair reads a certificate and its key, each error under the name
// of the file it is about.
func loadKeyPair(certFile, keyFile, certField, keyField string) (tls.Certificate, *TLSFileError) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, &TLSFileError{certField, certFile, err}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, &TLSFileError{keyField, keyFile, err}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if !x509.NewCertPool().AppendCertsFromPEM(certPEM) {
			return tls.Certificate{}, &TLSFileError{certField, certFile, errNoCertificate}
		}
		// A key that does not parse, or is not the certificate's.
		return tls.Certificate{}, &TLSFileError{keyField, keyFile, err}
	}
	return cert, nil
}

var errNoCertificate = errors.New("no PEM certificate in it")

// loadCertPool reads the PEM certificates in path.
func loadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errNoCertificate
	}
	return pool, nil
}

// ReloadingTLS loads a TLS configuration with load, and returns a function
// that loads it afresh on each call: a certificate renewed on disk is
// taken at the next connection, with no restart. When a later load fails
// (a file that does not parse, say), the function returns the last
// configuration that loaded, and onError, if not nil, is told why: once
// for each new reason, not at every call. The first load must succeed: its
// error is returned.
func ReloadingTLS(load func() (*tls.Config, error), onError func(error)) (func() *tls.Config, error) {
	first, err := load()
	if err != nil {
		return nil, err
	}
	var (
		mu   sync.Mutex // guards good and told
		good = first    // the last configuration that loaded
		told string     // the failure last reported; "" since a load succeeded
	)
	return func() *tls.Config {
		cfg, err := load() // the files are read outside the lock
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if msg := err.Error(); msg != told && onError != nil {
				told = msg
				onError(err)
			}
			return good
		}
		good, told = cfg, ""
		return cfg
	}, nil
}
