// Package replica holds what runs a deployment's code: handlers and the
// factories that build them, replicas (actors) that enforce their own
// max_ongoing_requests, and the deployment controllers that own them.
package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Handler is a deployment's user code: one value per replica, built by a
// Factory, so each replica owns its state.
type Handler interface {
	ServeHTTP(http.ResponseWriter, *http.Request)
}

// Factory builds one replica's Handler from the deployment's user_config
// (nil when the config has none). It is called once per replica, and once
// more wherever a user_config is checked before replicas get it (the
// proxy's -check, start and reload, Deployment.Reconfigure): that
// handler never serves, and is closed at once if it is an io.Closer.
//
// A Handler that holds resources (a goroutine, a model, a file) may
// implement io.Closer, as a Serve deployment has __del__: Close is called
// once, when its replica stops (replaced, scaled away, or at shutdown),
// after its requests are done (or, for a replica in another process, cut
// at graceful_shutdown_timeout_s). Each call must return a new value: a
// checked handler is closed, so a factory that hands out one shared
// Closer would close it under the replicas serving with it.
type Factory func(userConfig json.RawMessage) (Handler, error)

// Check builds one handler from userConfig to see that the factory takes
// it, and closes it: it never serves. A factory that panics is an error
// (a *PanicError), not a crash: Check runs on a reload and on the admin
// API, where a bad config must cost a refusal, not the proxy.
func (f Factory) Check(userConfig json.RawMessage) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	h, err := f.build(userConfig)
	if err != nil {
		return err
	}
	if err := CloseHandler(h); err != nil {
		return fmt.Errorf("the handler built to check it did not close: %w", err)
	}
	return nil
}

// build calls f, and refuses a nil Handler that came with no error: every
// request to its replica would fail, where the config can be refused now.
// A factory that panics is an error (a *PanicError), as in Check.
func (f Factory) build(userConfig json.RawMessage) (h Handler, err error) {
	defer func() {
		if v := recover(); v != nil {
			h, err = nil, &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	h, err = f(userConfig)
	if err == nil && isNil(h) {
		return nil, errors.New("the handler factory returned a nil Handler and no error")
	}
	return h, err
}

// isNil reports whether h is nil, or holds a nil pointer or func (a nil
// map or slice may well serve, with methods on its nil value).
func isNil(h Handler) bool {
	if h == nil {
		return true
	}
	switch v := reflect.ValueOf(h); v.Kind() {
	case reflect.Pointer, reflect.Func:
		return v.IsNil()
	}
	return false
}

// CloseHandler closes h if it is an io.Closer, and is nil otherwise.
func CloseHandler(h Handler) error {
	if c, ok := h.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// HealthChecker is implemented by a Handler that can report its health, as a
// Serve deployment's check_health method does. A non-nil error is a failed
// check. It is called while the replica serves requests, so what it reads
// of the handler's state must be synchronized with ServeHTTP.
type HealthChecker interface {
	CheckHealth(ctx context.Context) error
}

// Reconfigurer is implemented by a Handler that accepts a new user_config
// without being rebuilt, as a Serve deployment's reconfigure method does.
// It is called while the replica serves requests (requests are not
// paused for it, nor in Serve), so the state it changes must be
// synchronized with ServeHTTP: an atomic.Pointer to the settings, say.
type Reconfigurer interface {
	Reconfigure(ctx context.Context, userConfig json.RawMessage) error
}

// Registry maps handler kinds (the config's `handler:` field) to factories.
// The zero value is empty; NewRegistry returns one holding the built-ins.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory // guarded by mu
}

// NewRegistry returns a registry holding the built-in handlers: static,
// echo and sleep.
func NewRegistry() *Registry {
	r := &Registry{}
	r.MustRegister("static", NewStatic)
	r.MustRegister("echo", NewEcho)
	r.MustRegister("sleep", NewSleep)
	return r
}

// reservedHandlers are the handler kinds that run outside the process
// (config.HandlerUpstream, config.HandlerCommand, config.HandlerHost): no
// Go handler may take their names.
var reservedHandlers = []string{"upstream", "command", "host"}

// Register adds a handler kind. Registering a name twice, a reserved one
// ("upstream", "command", "host"), or one that is not a word of letters,
// digits, '_', '-' and '.' (it is a YAML value, and part of a replica
// host's actor ids, "addr/kind#0") is an error.
func (r *Registry) Register(name string, f Factory) error {
	if name == "" || f == nil {
		return fmt.Errorf("replica: register: empty name or nil factory")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("replica: register: handler name %q: only letters, digits, '_', '-' and '.'", name)
		}
	}
	if slices.Contains(reservedHandlers, name) {
		return fmt.Errorf("replica: handler name %q is reserved for replicas outside the process", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.factories == nil {
		r.factories = make(map[string]Factory)
	}
	if _, ok := r.factories[name]; ok {
		return fmt.Errorf("replica: handler %q is already registered", name)
	}
	r.factories[name] = f
	return nil
}

// MustRegister is Register for program setup: it panics on error.
func (r *Registry) MustRegister(name string, f Factory) {
	if err := r.Register(name, f); err != nil {
		panic(err)
	}
}

// Lookup returns the factory registered under name. The error lists the
// registered kinds.
func (r *Registry) Lookup(name string) (Factory, error) {
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	switch {
	case !ok && slices.Contains(reservedHandlers, name):
		return nil, fmt.Errorf("handler %q runs replicas outside the process, not in it (in-process handlers: %v)", name, r.Names())
	case !ok:
		return nil, fmt.Errorf("unknown handler %q (registered: %s; and %s for replicas outside the process)", name, strings.Join(r.Names(), ", "), strings.Join(reservedHandlers, ", "))
	}
	return f, nil
}

// Names returns the registered kinds, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories))
	for n := range r.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
