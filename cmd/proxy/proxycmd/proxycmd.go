// Package proxycmd is the proxy binary, cmd/proxy, as a library, so that a
// binary of your own serves the handler kinds you register in Go, with
// every flag, environment setting, signal and endpoint of cmd/proxy:
//
//	func main() {
//		reg := replica.NewRegistry() // static, echo, sleep
//		reg.MustRegister("model", newModel)
//		os.Exit(proxycmd.Main(reg))
//	}
//
// With no configuration it serves Serve's benchmark app (16 replicas
// answering "hi" at /); with -config it serves the applications of a
// Serve-shaped YAML file, whose handler fields may name any kind of reg.
package proxycmd

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/serveproxy/serveproxy/config"
	"github.com/serveproxy/serveproxy/gctune"
	"github.com/serveproxy/serveproxy/proxy"
	"github.com/serveproxy/serveproxy/replica"
)

// Version is what -version prints and the start line logs. Set it at
// build time (-ldflags "-X
// github.com/serveproxy/serveproxy/cmd/proxy/proxycmd.Version=v1.2.3") or
// before Main; empty, it is the build's module version and VCS revision.
var Version = ""

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // the proxy could not start or stop cleanly
	exitInvalid = 2 // bad flags, environment or config
)

// Main runs the proxy with the process's arguments and environment,
// serving the handler kinds of reg, until SIGTERM or SIGINT (SIGHUP
// reloads the config file), and returns the exit code: 0 after a clean
// stop, 1 when it could not start or stop cleanly, 2 for bad flags,
// environment or config. A nil reg serves the built-in kinds.
func Main(reg *replica.Registry) int {
	return Run(context.Background(), os.Args[1:], config.Environ(), reg, os.Stdout, os.Stderr)
}

// Run is Main with the arguments (without the program's name), the
// environment and the outputs given: the end of ctx shuts the proxy down
// as a SIGTERM does (a proxy embedded in a program of its own). It still
// takes the process's signals: SIGTERM and SIGINT stop it, SIGHUP reloads
// its file, and once a shutdown has begun (ctx's end or a signal) it gives
// them back to their default, so that a second one kills at once, as it
// does the proxy's own binary; a program that must outlive the proxy
// handles them itself (signal.Notify). Run also sets what is one per
// process: the garbage collector's GOGC and memory limit (gctune, unless
// PROXY_GC_TUNING is false) and zerolog's TimeFieldFormat.
func Run(ctx context.Context, args []string, env map[string]string, reg *replica.Registry, stdout, stderr io.Writer) int {
	if reg == nil {
		reg = replica.NewRegistry()
	}
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "Serve-shaped YAML config `file` (default: $PROXY_CONFIG, else the built-in benchmark app)")
	check := fs.Bool("check", false, "validate the config and exit: 0 if valid, 2 with every problem listed")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK // -h asked for the usage, printed
		}
		return exitInvalid
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "proxy: unexpected arguments: %v\n", fs.Args())
		return exitInvalid
	}
	if *showVersion {
		fmt.Fprintln(stdout, "proxy", versionString())
		return exitOK
	}

	e, envErr := config.ReadEnv(env)
	if envErr != nil {
		printLines(stderr, envErr) // one PROXY_NAME: message line each
		if !*check {
			return exitInvalid
		}
		// -check goes on to the GC's and the file's problems, all listed
		// at once: they are read with the variables that are good.
		env = withoutBadVars(env, envErr)
		var err error
		if e, err = config.ReadEnv(env); err != nil {
			e, _ = config.ReadEnv(map[string]string{"PROXY_CONFIG": env["PROXY_CONFIG"]})
		}
	}
	configSet := false
	fs.Visit(func(f *flag.Flag) { configSet = configSet || f.Name == "config" })
	if configSet && *configPath == "" {
		fmt.Fprintln(stderr, "proxy: -config: the path is empty (leave the flag out to serve PROXY_CONFIG's file, or the built-in app)")
		return exitInvalid
	}
	unknownEnv := append(config.UnknownEnv(env), config.IgnoredEnv(env)...)
	unknownEnv = append(unknownEnv, config.OpenAdmin(e)...)
	if v := env["PROXY_CONFIG"]; configSet && v != "" && v != *configPath {
		unknownEnv = append(unknownEnv, fmt.Sprintf("PROXY_CONFIG=%s is ignored: -config %s wins", v, *configPath))
	}
	if *check {
		for _, w := range unknownEnv {
			fmt.Fprintln(stderr, "warning:", w)
		}
	}
	// GC settings first, before the proxy allocates anything to speak of.
	gc, err := gctune.Apply(e, env)
	if err != nil {
		printLines(stderr, err)
		if !*check {
			return exitInvalid
		}
		envErr = err
	}
	path := *configPath
	if path == "" {
		path = e.ConfigPath
	}
	if path != "" {
		// Opened, not only looked at: one that cannot be read (its
		// permissions) is named with where it came from too.
		f, err := os.Open(path)
		if err == nil {
			var fi os.FileInfo
			if fi, err = f.Stat(); err == nil && fi.IsDir() {
				err = fmt.Errorf("%s is a directory, not a YAML file", path)
			}
			f.Close()
		}
		if err != nil {
			from := "-config"
			if *configPath == "" {
				from = "PROXY_CONFIG"
			}
			fmt.Fprintf(stderr, "proxy: config file (%s): %v\n", from, err)
			return exitInvalid
		}
	}
	cfg, problems := loadConfig(path, e, reg, nil)
	var warnings []config.FieldError
	if cfg != nil {
		warnings = cfg.Warnings()
		for i := range warnings {
			warnings[i].File = displayName(path)
		}
	}
	if *check {
		// With the problems: fixing those alone must not leave these
		// for the next run to tell.
		defer func() {
			for _, w := range warnings {
				fmt.Fprintln(stderr, "warning:", w.Error())
			}
		}()
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		if !*check {
			fmt.Fprintf(stderr, "proxy: %d problem(s); nothing started\n", len(problems))
		}
		return exitInvalid
	}
	if envErr != nil {
		return exitInvalid // -check: the environment's problems, printed above
	}
	if *check {
		fmt.Fprintf(stdout, "%s: ok, %d application(s)\n", displayName(path), len(cfg.Applications))
		return exitOK
	}

	// The proxy's own log never waits for stderr: a log collector that
	// stops reading must cost lines (counted in
	// serve_proxy_log_dropped_total), not requests or the shutdown; one
	// that goes away leaves the writes failing (EPIPE) rather than the
	// proxy killed by SIGPIPE.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	logOut := proxy.NewLogWriter(stderr)
	defer logOut.Close()
	log := proxy.NewLogger(logOut, e.LogLevel, e.LogFormat)
	logOut.ReportDrops(func(n int) {
		log.Warn().Int("lines", n).Msg("lines of this log were lost: stderr did not take them in time (a burst larger than the log's buffers, or a reader that stopped); serve_proxy_log_dropped_total counts them")
	})
	log.Info().Str("version", versionString()).Str("config", displayName(path)).
		Str("http_addr", httpAddr(cfg)).Str("admin_addr", e.AdminAddr).
		Bool("access_log", e.AccessLog).Bool("lean_front", e.LeanFront).Stringer("request_timeout", cfg.HTTPOptions.RequestTimeout()).
		Stringer("keep_alive_timeout", cfg.HTTPOptions.KeepAliveTimeout()).
		Stringer("client_body_timeout", e.ClientBodyTimeout).Stringer("client_send_timeout", e.ClientSendTimeout).
		Int64("max_header_bytes", int64(e.MaxHeaderBytes)).Int64("max_body_bytes", int64(e.MaxBodyBytes)).
		Msg("starting")
	for _, w := range unknownEnv {
		log.Warn().Msg(w)
	}
	for _, w := range warnings {
		log.Warn().Msg(w.Error())
	}
	st := gc.State()
	log.Info().Bool("tuning", st.Tuning).Int("percent", st.Percent).Str("percent_source", st.PercentSource).
		Str("memory_limit", st.MemoryLimit).Str("memory_limit_source", st.MemoryLimitSource).Str("note", st.Note).
		Msg("GC settings in force (PROXY_GC_TUNING=false for Go's defaults; GOGC or GOMEMLIMIT win over tuning)")

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// SIGHUP reloads the file; one that comes during the start waits for
	// it (rather than kill the proxy, Go's default).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, stop, hup, path, cfg, e, reg, gc, log, logOut, stderr); err != nil {
		log.Error().Err(err).Msg("proxy failed")
		return exitFailed
	}
	return exitOK
}

// withoutBadVars returns env without the variables that err, ReadEnv's,
// names (one "PROXY_NAME: message" line each).
func withoutBadVars(env map[string]string, err error) map[string]string {
	good := maps.Clone(env)
	for _, line := range strings.Split(err.Error(), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, "PROXY_") {
			delete(good, name)
		}
	}
	return good
}

// loadConfig reads the file (or takes the built-in app), applies the
// environment and checks that every handler exists and accepts its
// user_config. It returns every problem found, in file order, and the
// file as read whenever it parsed (for its warnings; not to be served if
// there are problems). taken, if
// not nil, reports whether application app's deployment d runs with d's
// user_config already: its factory took it, and is not asked again (a
// reload would otherwise build a handler, a model loaded, for every
// deployment in the file).
func loadConfig(path string, e config.Env, reg *replica.Registry, taken func(app string, d config.Deployment) bool) (*config.Config, []error) {
	var cfg *config.Config
	var found config.Errors
	if path == "" {
		cfg = config.Default()
	} else {
		c, err := config.Load(path)
		if err != nil && !errors.As(err, &found) {
			return nil, []error{err} // unreadable
		}
		cfg = c
	}
	if cfg == nil {
		return nil, splitErrors(found) // YAML syntax: nothing more to check
	}
	failed := make(map[string]bool, len(found))
	for _, fe := range found {
		failed[fe.Field] = true
	}
	for i, app := range cfg.Applications {
		for j, d := range app.Deployments {
			field := fmt.Sprintf("applications[%d].deployments[%d]", i, j)
			if failed[field+".handler"] || failed[field] {
				continue // reported already
			}
			if d.HostTLS != nil && !failed[field+".host_tls"] {
				// The proxy's own TLS files, read now rather than at the
				// first connection.
				for _, pr := range d.HostTLS.Problems() {
					if !failed[field+".host_tls."+pr.Field] {
						found = append(found, fieldError(cfg, path, field+".host_tls."+pr.Field, errors.New(pr.Message())))
					}
				}
			}
			handlerField, kind := field+".handler", d.Handler
			switch {
			case d.Handler == config.HandlerHost && d.HostHandler != "" && !failed[field+".host_handler"]:
				// What the hosts run from this file: checked here as an
				// in-process handler is.
				handlerField, kind = field+".host_handler", d.HostHandler
			case d.Handler == config.HandlerUpstream || d.Handler == config.HandlerHost:
				continue // forwarded, not in process: the config checked it
			}
			if d.Handler == config.HandlerCommand {
				if err := checkWorkingDir(d.WorkingDir); err != nil && !failed[field+".working_dir"] {
					found = append(found, fieldError(cfg, path, field+".working_dir", err))
					if len(d.Command) > 0 && strings.Contains(d.Command[0], "/") && !filepath.IsAbs(d.Command[0]) {
						continue // a program relative to the directory: nothing to look for
					}
				}
				if err := checkCommand(d); err != nil && !failed[field+".command"] {
					found = append(found, fieldError(cfg, path, field+".command", err))
				}
				continue
			}
			f, err := reg.Lookup(kind)
			if err != nil {
				found = append(found, fieldError(cfg, path, handlerField, err))
				continue
			}
			if failed[field+".user_config"] || taken != nil && taken(app.Name, d) {
				continue
			}
			// Build one handler to validate user_config now rather than
			// at the first replica; it never serves.
			if err := f.Check(d.UserConfig); err != nil {
				at := field + ".user_config"
				if uf, ok := errors.AsType[*replica.UnknownFieldError](err); ok {
					at = cfg.UserConfigField(at, uf.Field) // the key's own line
				}
				found = append(found, fieldError(cfg, path, at, err))
			}
		}
	}
	// The listeners' clash too, with the file's other problems: -check
	// lists every one at once.
	var clash error
	if e.HTTPAddr != "" { // the environment's, not the file's
		if err := listenClash(e.HTTPAddr, e.AdminAddr); err != nil {
			clash = fmt.Errorf("PROXY_HTTP_ADDR: %s: %w", e.HTTPAddr, err)
		}
	} else if !failed["http_options"] && !failed["http_options.host"] && !failed["http_options.port"] {
		if err := listenClash(httpAddr(cfg), e.AdminAddr); err != nil {
			found = append(found, fieldError(cfg, path, "http_options.port", err))
		}
	}
	if len(found) > 0 {
		slices.SortStableFunc(found, func(a, b config.FieldError) int { return cmp.Compare(a.Line, b.Line) })
		errs := splitErrors(found)
		if clash != nil {
			errs = append(errs, clash)
		}
		return cfg, errs
	}
	if clash != nil {
		return cfg, []error{clash}
	}
	if err := e.Apply(cfg); err != nil {
		return cfg, []error{fmt.Errorf("environment: %w", err)}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, splitErrors(err)
	}
	return cfg, nil
}

// printLines writes err to w one line of its message at a time, each a
// problem on its own (errors.Join's lines), as -check lists them.
func printLines(w io.Writer, err error) {
	for line := range strings.SplitSeq(err.Error(), "\n") {
		fmt.Fprintln(w, line)
	}
}

// listenClash reports an HTTP listener that would take the admin
// listener's port (or the other way round): one of them would fail at
// start.
func listenClash(httpAddr, adminAddr string) error {
	hh, hp, err1 := net.SplitHostPort(httpAddr)
	ah, ap, err2 := net.SplitHostPort(adminAddr)
	if err1 != nil || err2 != nil || hp != ap || hp == "0" {
		return nil
	}
	unspecified := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	// localhost binds the loopback address (Go's resolver reads it from
	// /etc/hosts, or answers it itself).
	loopback := func(h string) string {
		if h == "localhost" {
			return "127.0.0.1"
		}
		return h
	}
	if loopback(hh) == loopback(ah) || unspecified(hh) || unspecified(ah) {
		return fmt.Errorf("%s is the admin listener's port too (PROXY_ADMIN_ADDR %s): give them different ports", hp, adminAddr)
	}
	return nil
}

// fieldError names the field, and its line when the config knows it.
func fieldError(cfg *config.Config, file, field string, err error) config.FieldError {
	return config.FieldError{File: displayName(file), Line: cfg.Line(field), Field: field, Msg: err.Error()}
}

func splitErrors(err error) []error {
	var errs config.Errors
	if errors.As(err, &errs) {
		out := make([]error, len(errs))
		for i, e := range errs {
			out[i] = e
		}
		return out
	}
	return []error{err}
}

func displayName(path string) string {
	if path == "" {
		return "(built-in benchmark app)"
	}
	return path
}

func versionString() string { return proxy.BuildVersion(Version) }
