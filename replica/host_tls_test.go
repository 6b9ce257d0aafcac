package replica

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
)

// tlsTestdata is where the tests' certificates are (see its README).
const tlsTestdata = "../config/testdata/tls/"

// tlsHost starts a host on a TLS listener whose clients must show a
// certificate signed by the tests' CA.
func tlsHost(t *testing.T) string {
	t.Helper()
	cfg, err := config.ServerTLS(tlsTestdata+"host.pem", tlsTestdata+"host-key.pem", tlsTestdata+"ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveHost(t, HostConfig{Name: "echo", Factory: factoryOf(echoHandler), Replicas: 1, MaxOngoing: 4}, tls.NewListener(l, cfg))
	return l.Addr().String()
}

// tlsDial is HostOptions.Dial for the given host_tls.
func tlsDial(t *testing.T, ht config.HostTLS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	t.Helper()
	cfg, err := ht.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return (&tls.Dialer{Config: cfg}).DialContext
}

func TestHostMutualTLS(t *testing.T) {
	noLeaks(t)
	addr := tlsHost(t)
	c := connect(t, addr, HostOptions{Dial: tlsDial(t, config.HostTLS{
		CAFile: tlsTestdata + "ca.pem", CertFile: tlsTestdata + "proxy.pem", KeyFile: tlsTestdata + "proxy-key.pem",
	})})
	req, err := http.NewRequest(http.MethodPost, "http://example.test/over/tls", strings.NewReader("sealed"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := serveOn(t, c.Replicas()[0], req)
	if err != nil || w.status != http.StatusCreated || !strings.Contains(w.body.String(), "/over/tls") || !strings.HasSuffix(w.body.String(), "body=sealed") {
		t.Fatalf("over TLS: %v, %d %q", err, w.status, w.body.String())
	}
}

func TestHostTLSRefusals(t *testing.T) {
	noLeaks(t)
	addr := tlsHost(t)
	for _, tc := range []struct {
		name string
		tls  config.HostTLS
		want string // in ConnectHost's error
	}{
		{"no client certificate", config.HostTLS{CAFile: tlsTestdata + "ca.pem"}, "certificate required"},
		{"a certificate of another CA", config.HostTLS{
			CAFile: tlsTestdata + "ca.pem", CertFile: tlsTestdata + "stranger.pem", KeyFile: tlsTestdata + "stranger-key.pem",
		}, "certificate required"}, // Go's client sends none the host's CAs did not sign
		{"a host the proxy does not trust", config.HostTLS{
			CAFile: tlsTestdata + "other-ca.pem", CertFile: tlsTestdata + "proxy.pem", KeyFile: tlsTestdata + "proxy-key.pem",
		}, "certificate signed by unknown authority"},
		{"the wrong name", config.HostTLS{
			CAFile: tlsTestdata + "ca.pem", CertFile: tlsTestdata + "proxy.pem", KeyFile: tlsTestdata + "proxy-key.pem",
			ServerName: "elsewhere.test",
		}, "not elsewhere.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := ConnectHost(ctx, addr, HostOptions{Dial: tlsDial(t, tc.tls)})
			if err == nil {
				c.Close()
				t.Fatal("connected; want a refusal")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), addr) {
				t.Errorf("error %q, want one naming %s and saying %q", err, addr, tc.want)
			}
		})
	}
	// A TLS dial to a host that accepts and says nothing ends at the
	// deadline, and says what waited.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			nc, err := silent.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
		}
	}()
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	_, err = ConnectHost(sctx, silent.Addr().String(), HostOptions{Dial: tlsDial(t, config.HostTLS{CAFile: tlsTestdata + "ca.pem"})})
	if err == nil || !strings.Contains(err.Error(), "no connection before the deadline (the TCP connect, and with TLS its handshake)") {
		t.Errorf("a silent TLS host: %v", err)
	}

	// Plain TCP to a TLS host: the handshake fails, it does not hang.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := ConnectHost(ctx, addr, HostOptions{}); err == nil {
		c.Close()
		t.Fatal("plain TCP connected to a TLS host")
	}
}

// TestHostTCPProbe checks that a connection closed before a byte, as a
// Kubernetes tcpSocket probe or a load balancer's check does, is logged
// at debug, not as a failed handshake, with TLS and without.
func TestHostTCPProbe(t *testing.T) {
	noLeaks(t)
	serverTLS, err := config.ServerTLS(tlsTestdata+"host.pem", tlsTestdata+"host-key.pem", tlsTestdata+"ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tcp", "tls"} {
		t.Run(name, func(t *testing.T) {
			logs := &syncBuffer{}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			if name == "tls" {
				l = tls.NewListener(l, serverTLS)
			}
			serveHost(t, HostConfig{Name: "echo", Factory: factoryOf(echoHandler), Replicas: 1, MaxOngoing: 4,
				Log: zerolog.New(logs).Level(zerolog.DebugLevel)}, l)
			probe, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			probe.Close()
			eventually(t, "the probe's debug line", func() bool {
				return strings.Contains(logs.String(), "connection closed before its hello")
			})
			if strings.Contains(logs.String(), `"level":"warn"`) {
				t.Fatalf("a probe logged at warn:\n%s", logs.String())
			}
		})
	}
}
