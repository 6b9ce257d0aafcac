// Package router matches requests to applications by route prefix and
// schedules each request onto a replica of the application's ingress
// deployment: power of two choices among replicas with a free slot, a FIFO
// queue when all are full, and back-pressure once the queue is full.
package router

import (
	"fmt"
	"strings"
)

// Route maps a route prefix to an application's ingress deployment.
type Route struct {
	Prefix      string     // "/" or "/a/b": starts with "/", no trailing "/"
	Application string     // the application's name
	Deployment  string     // the ingress deployment's name
	Scheduler   *Scheduler // schedules requests onto the ingress's replicas
}

// Table is an immutable route table: the longest prefix on a "/" boundary
// wins, so "/a" matches "/a" and "/a/b" but not "/ab", and "/" matches
// everything no other route does.
type Table struct {
	routes   []*Route
	byPrefix map[string]*Route
	maxLen   int // the longest prefix: no longer part of a path can match
}

// NewTable builds a table. Prefixes must be well formed and unique.
func NewTable(routes []Route) (*Table, error) {
	t := &Table{byPrefix: make(map[string]*Route, len(routes))}
	for i := range routes {
		r := &routes[i]
		if err := checkPrefix(r.Prefix); err != nil {
			return nil, err
		}
		if other, ok := t.byPrefix[r.Prefix]; ok {
			return nil, fmt.Errorf("route prefix %q is used by applications %q and %q", r.Prefix, other.Application, r.Application)
		}
		t.byPrefix[r.Prefix] = r
		t.routes = append(t.routes, r)
		t.maxLen = max(t.maxLen, len(r.Prefix))
	}
	return t, nil
}

func checkPrefix(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("route prefix %q must start with \"/\"", p)
	case p != "/" && strings.HasSuffix(p, "/"):
		return fmt.Errorf("route prefix %q must not end with \"/\"", p)
	}
	return nil
}

// Match returns the route for path, or nil when none matches. It walks up
// the path one segment at a time, starting no deeper than the longest
// prefix, so its cost is bounded by the routes' depth, not the path's or the
// number of routes, and it allocates nothing.
func (t *Table) Match(path string) *Route {
	p := path
	if len(p) > t.maxLen {
		// Only a cut at a "/" within the first maxLen+1 bytes can match.
		if i := strings.LastIndexByte(p[:t.maxLen+1], '/'); i > 0 {
			p = p[:i]
		} else {
			p = "/"
		}
	}
	for len(p) > 1 {
		if r, ok := t.byPrefix[p]; ok {
			return r
		}
		i := strings.LastIndexByte(p, '/')
		if i <= 0 {
			break
		}
		p = p[:i]
	}
	return t.byPrefix["/"]
}

// Routes returns the table's routes in the order they were given.
func (t *Table) Routes() []*Route { return t.routes }
