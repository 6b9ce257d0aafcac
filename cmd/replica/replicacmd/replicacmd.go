// Package replicacmd is the replica host binary, cmd/replica, as a library,
// so that a binary of your own serves the handlers you register in Go:
//
//	func main() {
//		reg := replica.NewRegistry() // static, echo, sleep
//		reg.MustRegister("model", newModel)
//		os.Exit(replicacmd.Main(reg))
//	}
//
// A replica host runs K actors of one registered handler in its process,
// each enforcing its own max_ongoing_requests, and serves them to proxies
// over the replica-host protocol (replica.Host), whose control calls it
// fans out to its actors.
//
// Usage:
//
//	replica -handler static -replicas 8 -max-ongoing 100 -listen 127.0.0.1:9001 [-user-config '{"body":"hi"}']
//	replica -config serve.yaml -deployment app/name -listen 127.0.0.1:9001
//
// With -config, the proxy's own config file says what the host runs: the
// deployment (handler: host) gives host_handler, num_replicas (actors per
// host), max_ongoing_requests, user_config and graceful_shutdown_timeout_s.
//
// The protocol is plain TCP unless -tls-cert and -tls-key are given; with
// -tls-client-ca too, only proxies with a client certificate signed by that
// CA may connect (mutual TLS; the proxy's side is the deployment's
// host_tls). A host listening beyond loopback without it logs a warning.
//
// It applies the same GC settings as the proxy (PROXY_GC_TUNING,
// PROXY_GC_PERCENT, PROXY_GC_MEMORY_LIMIT; GOGC and GOMEMLIMIT win) and
// obeys the proxy's set_gc broadcasts; it logs as the proxy does
// (PROXY_LOG_LEVEL, PROXY_LOG_FORMAT). It prints "listening on ADDR" to
// stdout once the socket is bound, so scripts can wait for that line. On
// SIGTERM or SIGINT it refuses new requests (the proxies send them to other
// replicas), waits up to -grace for those it holds, and exits 0, or 1 if
// some were still running at -grace and were cut. SIGHUP is logged and
// ignored: a host reloads nothing.
package replicacmd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

// Version is what -version prints and the start line logs, as
// proxycmd.Version is the proxy's: set it at build time (-ldflags "-X
// github.com/serveproxy/serveproxy/cmd/replica/replicacmd.Version=v1.2.3")
// or before Main; empty, it is the build's module version and VCS
// revision.
var Version = ""

// Exit codes, as the proxy's.
const (
	exitOK      = 0
	exitFailed  = 1 // could not serve, or requests were cut at the grace period
	exitInvalid = 2 // bad flags, environment or handler config
)

// Main runs a replica host with the process's arguments and environment,
// serving the handler kinds of reg, until SIGTERM or SIGINT, and returns
// the exit code: 0 after a clean stop, 1 when it could not serve or cut
// requests at the grace period, 2 for bad flags, environment or handler
// config. A nil reg serves the built-in kinds.
func Main(reg *replica.Registry) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Run(ctx, os.Args[1:], config.Environ(), reg, os.Stdout, os.Stderr)
}

// Run is Main without the process: args are the flags (without the
// program's name), env the environment; it serves until ctx ends. A nil
// reg serves the built-in kinds.
func Run(ctx context.Context, args []string, env map[string]string, reg *replica.Registry, stdout, stderr io.Writer) int {
	if reg == nil {
		reg = replica.NewRegistry()
	}
	fs := flag.NewFlagSet("replica", flag.ContinueOnError)
	fs.SetOutput(stderr)
	handler := fs.String("handler", "static", "the registered handler `kind` the actors run ("+strings.Join(reg.Names(), ", ")+")")
	replicas := fs.Int("replicas", 1, "how many actors to run, 1 to 65535")
	maxOngoing := fs.Int("max-ongoing", 5, "each actor's max_ongoing_requests")
	listen := fs.String("listen", "127.0.0.1:9001", "the `address` to listen on for proxies")
	userConfig := fs.String("user-config", "", "the handler's user_config, as `JSON`")
	name := fs.String("name", "", "begin the actors' ids with `name` (default: the handler kind)")
	grace := fs.Duration("grace", 20*time.Second, "how long SIGTERM waits for the requests in flight (graceful_shutdown_timeout_s)")
	configPath := fs.String("config", "", "take the handler, replicas, limit, user_config and grace from this proxy config `file`'s deployment (with -deployment)")
	deployment := fs.String("deployment", "", "with -config, the `app/name` of a deployment with handler: host and host_handler")
	tlsCert := fs.String("tls-cert", "", "serve TLS with this PEM certificate `file` (with -tls-key)")
	tlsKey := fs.String("tls-key", "", "the PEM `file` of -tls-cert's key")
	tlsClientCA := fs.String("tls-client-ca", "", "with -tls-cert, accept only proxies whose client certificate one of the PEM certificates in this `file` signed")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK // -h asked for the usage, printed
		}
		return exitInvalid
	}
	if *showVersion {
		fmt.Fprintln(stdout, "replica", proxy.BuildVersion(Version))
		return exitOK
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "replica: unexpected arguments: %v\n", fs.Args())
		return exitInvalid
	}
	// As the proxy's graceful_shutdown_timeout_s: a negative grace would
	// cut every request in flight at SIGTERM, and exit 1 for it.
	if *grace < 0 {
		fmt.Fprintf(stderr, "replica: -grace: must be >= 0, got %v\n", *grace)
		return exitInvalid
	}
	if *configPath == "" && *deployment == "" {
		// Under the flags' names, not the fields NewHost names (found by
		// a tester: "-max-ongoing 0" read "max_ongoing_requests").
		switch {
		case *replicas < 1 || *replicas > 0xffff:
			fmt.Fprintf(stderr, "replica: -replicas: must be 1 to 65535, got %d\n", *replicas)
			return exitInvalid
		case *maxOngoing < 1 || int64(*maxOngoing) > 0xffffffff:
			fmt.Fprintf(stderr, "replica: -max-ongoing: must be 1 to %d, got %d\n", int64(0xffffffff), *maxOngoing)
			return exitInvalid
		}
	}
	var fieldAt func(field string, key ...string) string // in the file, with -config
	if *configPath != "" || *deployment != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		d, where, err := fromConfig(*configPath, *deployment, set)
		if err != nil {
			fmt.Fprintf(stderr, "replica: %v\n", err)
			return exitInvalid
		}
		fieldAt = where
		*handler, *replicas, *maxOngoing, *name = d.HostHandler, d.NumReplicas, d.MaxOngoingRequests, d.Name
		*userConfig, *grace = string(d.UserConfig), d.GracefulShutdownTimeout()
	}
	e, err := config.ReadEnv(env)
	if err != nil {
		fmt.Fprintf(stderr, "replica: environment: %v\n", err)
		return exitInvalid
	}
	// GC settings first, before the handlers allocate anything to speak of.
	gc, err := gctune.Apply(e, env)
	if err != nil {
		fmt.Fprintf(stderr, "replica: environment: %v\n", err)
		return exitInvalid
	}
	// What the file gave is named as the file's, not as a flag not given.
	handlerFrom, configFrom := "-handler", "-user-config"
	if fieldAt != nil {
		handlerFrom, configFrom = fieldAt("host_handler"), fieldAt("user_config")
	}
	factory, err := reg.Lookup(*handler)
	if err != nil {
		if !slices.Contains([]string{config.HandlerHost, config.HandlerUpstream, config.HandlerCommand}, *handler) {
			// Not Lookup's list, which names the proxy's kinds for
			// replicas elsewhere: a host runs in-process kinds only.
			err = fmt.Errorf("unknown handler %q (this binary's kinds: %s)", *handler, strings.Join(reg.Names(), ", "))
		}
		fmt.Fprintf(stderr, "replica: %s: %v\n", handlerFrom, err)
		return exitInvalid
	}
	var uc json.RawMessage
	if *userConfig != "" {
		if b := bytes.TrimSpace([]byte(*userConfig)); len(b) == 0 || b[0] != '{' || !json.Valid(b) {
			fmt.Fprintf(stderr, "replica: %s: must be a JSON object, got %s\n", configFrom, *userConfig)
			return exitInvalid
		}
		uc = json.RawMessage(*userConfig)
	}
	if *name == "" {
		*name = *handler
	}
	// As the proxy's: the log never waits for stderr, and a closed stderr
	// fails the writes (counted) rather than killing the host by SIGPIPE.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	logOut := proxy.NewLogWriter(stderr)
	defer logOut.Close()
	log := proxy.NewLogger(logOut, e.LogLevel, e.LogFormat)
	logOut.ReportDrops(func(n int) {
		log.Warn().Int("lines", n).Msg("lines of this log were lost: stderr did not take them in time (a burst larger than the log's buffers, or a reader that stopped)")
	})
	for _, w := range config.UnknownEnv(env) {
		log.Warn().Msg(w)
	}
	tlsCfg, err := serverTLS(*tlsCert, *tlsKey, *tlsClientCA, log)
	if err != nil {
		fmt.Fprintf(stderr, "replica: %v\n", err)
		return exitInvalid
	}
	h, err := replica.NewHost(replica.HostConfig{
		Name: *name, Factory: factory, UserConfig: uc,
		Replicas: *replicas, MaxOngoing: *maxOngoing, GC: gc, Log: log,
	})
	if err != nil {
		if fieldAt != nil {
			// The factory's refusal is of the user_config: its line, or
			// an unknown key's own.
			at := fieldAt("user_config")
			if uf, ok := errors.AsType[*replica.UnknownFieldError](err); ok {
				at = fieldAt("user_config", uf.Field)
			}
			err = fmt.Errorf("%s (deployment %s): %w", at, *deployment, err)
		}
		fmt.Fprintf(stderr, "replica: %v\n", err)
		return exitInvalid
	}
	if err := config.CheckListenAddr(*listen); err != nil {
		fmt.Fprintf(stderr, "replica: -listen: %v\n", err)
		return exitInvalid
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "replica: -listen %s: %v\n", *listen, err)
		return exitFailed
	}
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	// A SIGHUP would kill the host (Go's default), cutting its requests:
	// sent by one who reloads the proxy of the same file, say.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// The bound address, not the flag's, so that ":0" says the real port.
	fmt.Fprintf(stdout, "listening on %s\n", l.Addr())
	st := gc.State()
	log.Info().Str("version", proxy.BuildVersion(Version)).Str("listen", l.Addr().String()).Str("handler", *handler).Int("replicas", *replicas).
		Int("max_ongoing_requests", *maxOngoing).Int("gc_percent", st.Percent).Str("gc_memory_limit", st.MemoryLimit).
		Bool("tls", tlsCfg != nil).Bool("tls_client_auth", *tlsClientCA != "").
		Msg("replica host serving")
	if *tlsClientCA == "" && !isLoopback(l.Addr()) {
		log.Warn().Str("listen", l.Addr().String()).
			Msg("replica host: listening beyond loopback without -tls-client-ca: anyone who can reach this port can send its actors requests and control calls")
	}

	served := make(chan error, 1)
	go func() { served <- h.Serve(l) }()
wait:
	for {
		select {
		case err := <-served:
			log.Error().Err(err).Msg("replica host: the listener failed")
			_ = h.Close()
			return exitFailed
		case <-hup:
			log.Warn().Msg("replica host: SIGHUP ignored: a host reloads nothing (restart it to change its flags or file; the proxy takes a user_config change to its hosts itself)")
		case <-ctx.Done():
			break wait
		}
	}
	log.Info().Stringer("grace", *grace).Msg("replica host draining")
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	err = h.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, replica.ErrHostClosed) {
		log.Warn().Err(serr).Msg("replica host: serving ended")
	}
	if err != nil {
		log.Warn().Err(err).Msg("replica host: requests still running at the grace period were cut")
		return exitFailed
	}
	log.Info().Msg("replica host stopped")
	return exitOK
}

// serverTLS checks the -tls-* flags and loads their files: nil, nil for
// plain TCP. The files are read again for every connection a client
// opens, so that a renewed certificate or CA is taken without a restart;
// when they do not load, the last ones that did serve, and log says why
// (once for each new reason).
func serverTLS(cert, key, clientCA string, log zerolog.Logger) (*tls.Config, error) {
	switch {
	case cert == "" && key == "" && clientCA == "":
		return nil, nil
	case cert == "" && key == "":
		return nil, errors.New("-tls-client-ca: needs -tls-cert and -tls-key (the host's own certificate)")
	case cert == "":
		return nil, errors.New("-tls-key: needs -tls-cert")
	case key == "":
		return nil, errors.New("-tls-cert: needs -tls-key")
	}
	load := func() (*tls.Config, error) {
		cfg, err := config.ServerTLS(cert, key, clientCA)
		var fe *config.TLSFileError
		if errors.As(err, &fe) {
			flag := map[string]string{"cert": "-tls-cert", "key": "-tls-key", "client_ca": "-tls-client-ca"}[fe.Field]
			return nil, fmt.Errorf("%s: %s", flag, fe.Message())
		}
		return cfg, err
	}
	current, err := config.ReloadingTLS(load, func(err error) {
		log.Warn().Err(err).Msg("replica host: reloading the TLS files failed; serving with the last ones that loaded")
	})
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return current(), nil },
	}, nil
}

// isLoopback reports whether a is a loopback address.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// fromConfig finds the deployment app/name of the proxy config at path,
// which must say what its hosts run (handler: host, host_handler). set
// holds the flags given: those the file gives too are an error, so that
// nothing is silently overridden.
func fromConfig(path, appDep string, set map[string]bool) (config.Deployment, func(field string, key ...string) string, error) {
	if path == "" || appDep == "" {
		return config.Deployment{}, nil, errors.New("-config and -deployment go together")
	}
	for _, f := range []string{"handler", "replicas", "max-ongoing", "user-config", "grace", "name"} {
		if set[f] {
			return config.Deployment{}, nil, fmt.Errorf("-%s: not with -config (the file's deployment gives it)", f)
		}
	}
	app, name, ok := strings.Cut(appDep, "/")
	if !ok || app == "" || name == "" {
		return config.Deployment{}, nil, fmt.Errorf("-deployment: want app/name, got %q", appDep)
	}
	cfg, err := config.Load(path)
	if err != nil {
		return config.Deployment{}, nil, fmt.Errorf("-config: %w", err)
	}
	for ai, a := range cfg.Applications {
		if a.Name != app {
			continue
		}
		for di, d := range a.Deployments {
			if d.Name != name {
				continue
			}
			if d.Handler != config.HandlerHost || d.HostHandler == "" {
				return config.Deployment{}, nil, fmt.Errorf("-deployment %s: in %s it is not handler: host with a host_handler (what the hosts run)", appDep, path)
			}
			// Where a field of the deployment is, as proxy -check says it
			// (its errors had no line, found by a tester); with a key, the
			// user_config key's own place, when field is user_config.
			where := func(field string, key ...string) string {
				f := fmt.Sprintf("applications[%d].deployments[%d].%s", ai, di, field)
				if len(key) > 0 {
					f = cfg.UserConfigField(f, key[0])
				}
				return config.FieldError{File: path, Line: cfg.Line(f), Field: f}.Error()
			}
			return d, where, nil
		}
	}
	// Named, as the admin API's 404s name theirs: the hosts' deployments
	// are what -deployment may take.
	var hosts []string
	for _, a := range cfg.Applications {
		for _, d := range a.Deployments {
			if d.Handler == config.HandlerHost && d.HostHandler != "" {
				hosts = append(hosts, a.Name+"/"+d.Name)
			}
		}
	}
	if len(hosts) == 0 {
		return config.Deployment{}, nil, fmt.Errorf("-deployment %s: no such deployment in %s, which has no deployment of handler: host with a host_handler", appDep, path)
	}
	return config.Deployment{}, nil, fmt.Errorf("-deployment %s: no such deployment in %s; its replica hosts' deployments: %s", appDep, path, strings.Join(hosts, ", "))
}
