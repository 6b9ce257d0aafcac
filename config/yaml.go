package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Load reads the config file at path and parses it; see Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse decodes and validates a YAML config file; name is used in error
// messages. Fields absent from the file take their defaults, while explicit
// values, zeros included, must pass validation.
//
// A file that fails is reported as Errors, every problem found in one pass
// and in file order, each with the line of its key: YAML syntax (one error
// at the line the parser reports), unknown fields, values of the wrong type,
// and the rules Validate applies. Anchors, aliases and merge keys (<<) are
// supported. With Errors, the Config returned is what could be decoded
// (each failed field keeps its default), so that a caller can look for more
// problems in the same pass (the binary checks handler names); it must not
// be served. After a YAML syntax error it is nil.
func Parse(name string, data []byte) (*Config, error) {
	// A byte order mark, which YAML allows before a document (an editor
	// on Windows writes one), would be read as part of the first key.
	bom := len(data)
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	bom -= len(data)
	if !utf8.Valid(data) {
		// The parser would keep the bytes, and the names made of them
		// would turn into U+FFFD on their way to JSON and metrics.
		line, col := notUTF8At(data)
		if line == 1 {
			col += bom // the column an editor shows
		}
		return nil, Errors{{File: name, Line: line, Msg: fmt.Sprintf("invalid YAML: the file is not UTF-8 (a byte that is no UTF-8 at column %d)", col)}}
	}
	// Repeated keys are the decoder's to report, with every other
	// problem, rather than a parse error that stops at the first.
	tokens := lexer.Tokenize(string(data))
	if tk := tooDeep(tokens); tk != nil {
		return nil, Errors{{File: name, Line: tk.Position.Line,
			Msg: fmt.Sprintf("invalid YAML: [ ] or { } nested more than %d levels deep (user_config may nest %d)", maxFlowDepth, maxDepth)}}
	}
	file, err := parser.Parse(tokens, 0, parser.AllowDuplicateMapKey())
	if err != nil {
		line, msg := syntaxError(data, err)
		return nil, Errors{{File: name, Line: line, Msg: msg}}
	}

	d := newDecoder(name, file)
	c := new(Config)
	c.setDefaults()

	var root ast.Node
	for _, doc := range file.Docs {
		if doc == nil || isEmpty(doc.Body) {
			continue
		}
		if _, ok := doc.Body.(*ast.DirectiveNode); ok {
			// %YAML 1.1 (PyYAML's, Serve's) or 1.2, %TAG: the parser
			// gives a directive as a document of its own.
			continue
		}
		if root != nil {
			d.fail(nil, posOf(doc.Body), "a config file holds one YAML document, found another")
			break
		}
		root = doc.Body
	}
	if root != nil {
		d.value(reflect.ValueOf(c).Elem(), root, nil, posOf(root))
	}

	v := validator{skip: d.failed, given: func(p fieldPath) bool {
		_, ok := d.positions[p.String()]
		return ok
	}}
	v.config(c)
	found := d.errs
	for _, p := range v.problems {
		at := d.posOf(p.path)
		found = append(found, located{FieldError{File: name, Line: at.line, Field: p.path.String(), Msg: p.msg}, at})
	}
	if len(found) > 0 {
		// The decoder reports in file order; the rules report in struct
		// order, which positions put back into file order. Stable, so
		// problems at one place keep the order they were found in.
		slices.SortStableFunc(found, func(a, b located) int { return a.at.compare(b.at) })
		errs := make(Errors, len(found))
		for i, l := range found {
			errs[i] = l.FieldError
		}
		c.setLines(d)
		return c, errs
	}
	c.setLines(d)
	return c, nil
}

// setLines keeps the line of every field decoded, for Config.Line.
func (c *Config) setLines(d *decoder) {
	c.lines = make(map[string]int, len(d.positions))
	for path, at := range d.positions {
		c.lines[path] = at.line
	}
}

const (
	// maxNodes bounds the YAML nodes one Parse visits, counting every
	// expansion of an alias, so that a few lines of nested aliases (a
	// "billion laughs") cannot make it run for ever.
	maxNodes = 1 << 18
	// maxDepth bounds the nesting within user_config and of merge keys,
	// which also stops an alias from expanding inside itself.
	maxDepth = 100
	// maxFlowDepth bounds the nesting of [ ] and { } before the file is
	// parsed: the parser's time and memory grow with its square (a 40 KB
	// file nested 20000 deep took 660 MB). A user_config in a file
	// written all in flow style may nest maxDepth within a few levels.
	maxFlowDepth = 2 * maxDepth
)

// tooDeep returns the token at which tokens' flow collections nest deeper
// than maxFlowDepth, or nil.
func tooDeep(tokens token.Tokens) *token.Token {
	depth := 0
	for _, tk := range tokens {
		switch tk.Type {
		case token.SequenceStartType, token.MappingStartType:
			if depth++; depth > maxFlowDepth {
				return tk
			}
		case token.SequenceEndType, token.MappingEndType:
			depth--
		}
	}
	return nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// decoder walks a YAML AST onto config structs, guided by their yaml tags.
// It reports every problem it meets and carries on with the next value,
// which keeps its default.
type decoder struct {
	name     string
	anchors  map[string][]*ast.AnchorNode // by name, in file order
	circular map[*ast.AliasNode]bool      // aliases inside their own anchor
	budget   int                          // nodes left to visit; see maxNodes

	// positions maps the path of every key and list element decoded to
	// where it is, for locating the problems validation finds afterwards.
	positions map[string]pos

	errs   []located
	failed []fieldPath // the paths in errs, which validation skips
}

func newDecoder(name string, file *ast.File) *decoder {
	d := &decoder{
		name:      name,
		anchors:   make(map[string][]*ast.AnchorNode),
		circular:  make(map[*ast.AliasNode]bool),
		budget:    maxNodes,
		positions: make(map[string]pos),
	}
	for _, doc := range file.Docs {
		if doc != nil {
			d.collectAnchors(doc.Body, nil)
		}
	}
	return d
}

// collectAnchors records the anchors under n in file order, and marks the
// aliases that name an anchor they are inside of (&a [*a]): YAML has no
// such thing, and expanding one would never end. open holds the anchors
// enclosing n.
func (d *decoder) collectAnchors(n ast.Node, open []*ast.AnchorNode) {
	switch t := n.(type) {
	case *ast.AnchorNode:
		if t == nil {
			return
		}
		name := tokenValue(t.Name)
		d.anchors[name] = append(d.anchors[name], t)
		d.collectAnchors(t.Value, append(open[:len(open):len(open)], t))
	case *ast.AliasNode:
		if t == nil || t.Value == nil {
			return
		}
		if as := d.anchors[tokenValue(t.Value)]; len(as) > 0 && slices.Contains(open, as[len(as)-1]) {
			d.circular[t] = true
		}
	case *ast.MappingNode:
		if t == nil {
			return
		}
		for _, mv := range t.Values {
			d.collectAnchors(mv, open)
		}
	case *ast.MappingValueNode:
		if t == nil {
			return
		}
		d.collectAnchors(t.Key, open)
		d.collectAnchors(t.Value, open)
	case *ast.MappingKeyNode:
		if t != nil {
			d.collectAnchors(t.Value, open)
		}
	case *ast.SequenceNode:
		if t == nil {
			return
		}
		for _, el := range t.Values {
			d.collectAnchors(el, open)
		}
	case *ast.TagNode:
		if t != nil {
			d.collectAnchors(t.Value, open)
		}
	}
}

// fail reports a problem with the value at p, which validation then
// skips: it holds its default, not what the file says.
func (d *decoder) fail(p fieldPath, at pos, format string, args ...any) {
	d.report(p, at, format, args...)
	d.failed = append(d.failed, p)
}

// report reports a problem at p whose value was decoded all the same
// (a key given twice: its first value), which validation goes on to check.
func (d *decoder) report(p fieldPath, at pos, format string, args ...any) {
	d.errs = append(d.errs, located{FieldError{File: d.name, Line: at.line, Field: p.String(), Msg: fmt.Sprintf(format, args...)}, at})
}

// posOf returns the position of the deepest part of p that is in the file:
// the key itself, or else the mapping or element it is missing from.
func (d *decoder) posOf(p fieldPath) pos {
	for i := len(p); i > 0; i-- {
		if at, ok := d.positions[p[:i].String()]; ok {
			return at
		}
	}
	return pos{}
}

// spend takes one node from the budget, reporting once when it runs out.
func (d *decoder) spend(p fieldPath, at pos) bool {
	d.budget--
	if d.budget == 0 {
		d.fail(p, at, "config too large: more than %d YAML nodes once aliases are expanded", maxNodes)
	}
	return d.budget > 0
}

// value decodes n onto dst, one of the config structs or their fields.
func (d *decoder) value(dst reflect.Value, n ast.Node, p fieldPath, at pos) {
	if !d.spend(p, at) {
		return
	}
	n, tag := d.follow(n)
	if tag != "" {
		d.fail(p, at, "%s", tagMessage(tag))
		return
	}
	if a, ok := n.(*ast.AliasNode); ok {
		d.fail(p, at, "%s", d.aliasProblem(a))
		return
	}
	optional := dst.Kind() == reflect.Pointer && dst.Type().Elem().Kind() == reflect.Struct
	if isNull(n) && optional {
		// An optional section that turns something on (host_tls) must not
		// turn it off by being left empty, its fields commented out.
		d.fail(p, at, "is empty: give its fields ({} for their defaults), or remove it")
		return
	}
	if isNull(n) && (dst.Kind() == reflect.Struct || dst.Kind() == reflect.Slice) {
		return // an empty section: keep the defaults
	}
	switch {
	case dst.Type() == rawMessageType:
		d.userConfig(dst, n, p, at)
	case dst.Kind() == reflect.Struct:
		d.mapping(dst, n, p, at)
	case optional:
		// An optional section (host_tls): a mapping, even {}, turns it on.
		v := reflect.New(dst.Type().Elem())
		d.mapping(v.Elem(), n, p, at)
		dst.Set(v)
	case dst.Kind() == reflect.Slice:
		d.list(dst, n, p, at)
	default:
		d.scalar(dst, n, p, at)
	}
}

func (d *decoder) mapping(dst reflect.Value, n ast.Node, p fieldPath, at pos) {
	entries, ok := d.entries(n, p, at, 0)
	if !ok {
		return
	}
	t := dst.Type()
	for _, e := range entries {
		fp := p.child(e.key)
		i := fieldIndex(t, e.key)
		if i < 0 {
			if hint := serveFieldHint(t.Name(), e.key); hint != "" {
				d.fail(fp, e.at, "a Ray Serve field this proxy does not take: %s", hint)
				continue
			}
			names := fieldNames(t)
			if near := nearest(e.key, names); near != "" {
				d.fail(fp, e.at, "unknown field (%s?); known fields are %s", near, strings.Join(names, ", "))
				continue
			}
			d.fail(fp, e.at, "unknown field; known fields are %s", strings.Join(names, ", "))
			continue
		}
		d.positions[fp.String()] = e.at
		d.value(dst.Field(i), e.value, fp, e.at)
	}
}

func (d *decoder) list(dst reflect.Value, n ast.Node, p fieldPath, at pos) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		d.fail(p, at, "must be a list, got %s%s", describe(n), listHint(p, n))
		return
	}
	s := reflect.MakeSlice(dst.Type(), len(seq.Values), len(seq.Values))
	for i, el := range seq.Values {
		ep := p.at(i)
		elAt := elementPos(seq, i)
		if elAt.line == 0 {
			elAt = at
		}
		d.positions[ep.String()] = elAt
		item := s.Index(i)
		if df, ok := item.Addr().Interface().(defaulter); ok {
			df.setDefaults()
		}
		d.value(item, el, ep, elAt)
	}
	dst.Set(s)
}

func (d *decoder) scalar(dst reflect.Value, n ast.Node, p fieldPath, at pos) {
	if isCollection(n) {
		d.fail(p, at, "must be %s, got %s", kindNoun(dst.Kind()), describe(n))
		return
	}
	v, err := scalarValue(n)
	if err != nil {
		d.fail(p, at, "%s", errorMessage(err))
		return
	}
	switch dst.Kind() {
	case reflect.String:
		if s, ok := v.(string); ok {
			dst.SetString(s)
			return
		}
	case reflect.Int:
		i, ok, inRange := toInt(v)
		got := describe(n)
		if !ok && plainMatches(n, yamlInt) {
			got = n.(*ast.StringNode).Value
			if octalMistake(got) {
				d.fail(p, at, "must be an integer, got %s: %s", got, octalMessage)
				return
			}
			// Too long for the parser's integers.
			ok, inRange = true, false
		}
		if ok {
			if !inRange {
				d.fail(p, at, "must be an integer of at most %d bits, got %s", strconv.IntSize, got)
				return
			}
			dst.SetInt(int64(i))
			return
		}
	case reflect.Float64:
		f, ok := toFloat(v)
		if !ok && plainMatches(n, yamlFloat) {
			// YAML 1.2's floats include 1e3, which the parser reads as
			// a string.
			f, err = strconv.ParseFloat(n.(*ast.StringNode).Value, 64)
			ok = err == nil
		}
		if ok {
			dst.SetFloat(f)
			return
		}
	}
	if _, null := n.(*ast.NullNode); null && len(p) == 3 && p[2].key == "route_prefix" {
		// Serve reads null as "not exposed over HTTP"; here every
		// application is served at its prefix.
		d.fail(p, at, "must be a string, got null: an application without HTTP (Serve's route_prefix: null) is not supported; give it a prefix, or leave the field out for /")
		return
	}
	if s, ok := n.(*ast.StringNode); ok && s.Value == "auto" && len(p) == 5 && p[4].key == "num_replicas" {
		// Serve's autoscaling with its default config.
		d.fail(p, at, `must be an integer, got "auto": autoscaling is not supported; set a count, or change it live with PUT /-/applications/{app}/deployments/{deployment}/num_replicas on the admin listener`)
		return
	}
	if s, ok := n.(*ast.StringNode); ok && s.Token != nil && s.Token.Type == token.StringType {
		if _, err := strconv.ParseFloat(s.Value, 64); errors.Is(err, strconv.ErrRange) {
			// The parser keeps a number too large for a float as a
			// plain string: "got string" would read as a quoting
			// mistake.
			d.fail(p, at, "must be %s, got %s: out of range", kindNoun(dst.Kind()), clippedValue(s.Value))
			return
		}
	}
	d.fail(p, at, "must be %s, got %s", kindNoun(dst.Kind()), describe(n))
}

// listHint is what to write instead, for the lists people most often write
// in another shape: a command as one string, env as a mapping (Ray's
// env_vars).
func listHint(p fieldPath, n ast.Node) string {
	if len(p) == 0 {
		return ""
	}
	switch key := p[len(p)-1].key; {
	case key == "command" && !isMapping(n):
		return `: the program and its arguments, each an item, as exec takes them: [python3, app.py], or [sh, -c, "..."] for a shell line`
	case key == "env" && isMapping(n):
		return ": KEY=VALUE items, [K1=V1, K2=V2]"
	}
	return ""
}

// userConfig stores a mapping as the JSON object that reconfigure gets.
func (d *decoder) userConfig(dst reflect.Value, n ast.Node, p fieldPath, at pos) {
	if !isMapping(n) {
		d.fail(p, at, "must be a mapping, got %s", describe(n))
		return
	}
	var buf bytes.Buffer
	if d.json(&buf, n, p, at, 0) {
		dst.SetBytes(buf.Bytes())
	}
}

// json writes n as JSON, keeping the file's key order.
func (d *decoder) json(buf *bytes.Buffer, n ast.Node, p fieldPath, at pos, depth int) bool {
	if depth > maxDepth {
		d.fail(p, at, "nested more than %d levels deep", maxDepth)
		return false
	}
	if !d.spend(p, at) {
		return false
	}
	n, tag := d.follow(n)
	if tag != "" {
		d.fail(p, at, "%s", tagMessage(tag))
		return false
	}
	switch n := n.(type) {
	case *ast.AliasNode:
		d.fail(p, at, "%s", d.aliasProblem(n))
		return false
	case *ast.MappingNode, *ast.MappingValueNode:
		entries, ok := d.entries(n, p, at, depth)
		if !ok {
			return false
		}
		buf.WriteByte('{')
		for i, e := range entries {
			if i > 0 {
				buf.WriteByte(',')
			}
			if depth == 0 {
				// The handler's own fields: an error about one (an
				// unknown key) is said at its line (Config.Line).
				d.positions[p.child(e.key).String()] = e.at
			}
			key, _ := json.Marshal(e.key) // a string always marshals
			buf.Write(key)
			buf.WriteByte(':')
			if !d.json(buf, e.value, p.child(e.key), e.at, depth+1) {
				return false
			}
		}
		buf.WriteByte('}')
	case *ast.SequenceNode:
		buf.WriteByte('[')
		for i, el := range n.Values {
			if i > 0 {
				buf.WriteByte(',')
			}
			elAt := elementPos(n, i)
			if elAt.line == 0 {
				elAt = at
			}
			if !d.json(buf, el, p.at(i), elAt, depth+1) {
				return false
			}
		}
		buf.WriteByte(']')
	default:
		if v, ok := n.(*ast.StringNode); ok && plainMatches(n, yamlInt) && !leadingZero(v.Value) {
			// An integer too large for the parser's: a number still, its
			// digits as they are, as PyYAML (Serve's) reads it, not the
			// string a handler would refuse as such. JSON bounds none;
			// the handler says if it is too large for it. (1e3 and 08
			// are strings, to PyYAML as here.)
			buf.WriteString(strings.TrimPrefix(v.Value, "+"))
			return true
		}
		v, err := scalarValue(n)
		if err != nil {
			d.fail(p, at, "%s", errorMessage(err))
			return false
		}
		if f, ok := v.(float64); ok && (math.IsInf(f, 0) || math.IsNaN(f)) {
			d.fail(p, at, "%v cannot be represented in JSON", f)
			return false
		}
		b, err := json.Marshal(v)
		if err != nil {
			d.fail(p, at, "%s cannot be represented in JSON: %v", describe(n), err)
			return false
		}
		buf.Write(b)
	}
	return true
}

// entry is one key of a mapping, once merge keys are applied.
type entry struct {
	key   string
	at    pos
	value ast.Node
}

// entries lists the keys of mapping n in file order, with those of merge
// keys (<<) in place of the merge key. As YAML's merge key spec says, the
// mapping's own keys win over merged ones, and earlier merged mappings
// over later ones.
func (d *decoder) entries(n ast.Node, p fieldPath, at pos, depth int) ([]entry, bool) {
	if depth > maxDepth {
		d.fail(p, at, "merge keys nested more than %d levels deep", maxDepth)
		return nil, false
	}
	n = d.resolve(n)
	var pairs []*ast.MappingValueNode
	switch m := n.(type) {
	case *ast.MappingNode:
		pairs = m.Values
	case *ast.MappingValueNode:
		pairs = []*ast.MappingValueNode{m}
	case *ast.AliasNode:
		d.fail(p, at, "%s", d.aliasProblem(m))
		return nil, false
	default:
		d.fail(p, at, "must be a mapping, got %s", describe(n))
		return nil, false
	}

	own := make(map[string]bool, len(pairs))
	for _, mv := range pairs {
		if mv != nil && mv.Key != nil && !mv.Key.IsMergeKey() {
			own[d.keyText(mv.Key)] = true
		}
	}
	seen := make(map[string]bool, len(pairs))
	var out []entry
	for _, mv := range pairs {
		if mv == nil || mv.Key == nil {
			continue
		}
		if mv.Key.IsMergeKey() {
			for _, src := range d.mergeSources(mv, p, depth) {
				merged, ok := d.entries(src, p, posOf(mv.Key), depth+1)
				if !ok {
					continue
				}
				for _, e := range merged {
					if !own[e.key] && !seen[e.key] {
						seen[e.key] = true
						out = append(out, e)
					}
				}
			}
			continue
		}
		key := d.keyText(mv.Key)
		if _, tag := d.follow(mv.Key); tag != "" {
			d.fail(p.child(key), posOf(mv.Key), "%s (on the key)", tagMessage(tag))
			continue
		}
		if seen[key] {
			// Spellings the parser would tell apart, such as 1 and "1",
			// included.
			msg := "duplicate key"
			if i := slices.IndexFunc(out, func(e entry) bool { return e.key == key }); i >= 0 {
				msg = fmt.Sprintf("duplicate key (also on line %d)", out[i].at.line)
			}
			// The first is decoded, and checked: a second applications
			// key hid every problem of the first list (a tester).
			d.report(p.child(key), posOf(mv.Key), "%s", msg)
			continue
		}
		seen[key] = true
		out = append(out, entry{key: key, at: posOf(mv.Key), value: mv.Value})
	}
	return out, true
}

// mergeSources returns the mappings a merge key's value names.
func (d *decoder) mergeSources(mv *ast.MappingValueNode, p fieldPath, depth int) []ast.Node {
	v := d.resolve(mv.Value)
	if isNull(v) {
		return nil
	}
	srcs := []ast.Node{v}
	if seq, ok := v.(*ast.SequenceNode); ok {
		srcs = srcs[:0]
		for _, el := range seq.Values {
			srcs = append(srcs, d.resolve(el))
		}
	}
	for _, src := range srcs {
		if a, ok := src.(*ast.AliasNode); ok {
			d.fail(p, posOf(mv.Key), "%s", d.aliasProblem(a))
			return nil
		}
		if !isMapping(src) {
			d.fail(p, posOf(mv.Key), "merge key << takes a mapping or a list of mappings, got %s", describe(src))
			return nil
		}
	}
	return srcs
}

// coreTags are the YAML tags a config may carry: the core schema's, which
// only say what kind of value follows. Any other (!env, !!binary, an
// application's own) asks for a meaning nothing here gives it, and would
// be dropped in silence: !env HOME read as the string "HOME".
var coreTags = map[string]bool{
	"!!str": true, "!!int": true, "!!float": true, "!!bool": true, "!!null": true, "!!map": true, "!!seq": true,
	// The non-specific tag: ! 08 is the string "08". (The parser refuses
	// the verbatim forms, !<tag:yaml.org,2002:str>, itself.)
	"!": true,
}

// tagMessage says why tag is refused.
func tagMessage(tag string) string {
	return fmt.Sprintf("the YAML tag %s is not supported: a config holds plain values (of the tags, only the core schema's !!str, !!int, !!float, !!bool, !!null, !!map and !!seq)", tag)
}

// resolve looks through anchors, aliases and the tags of collections to
// the node that holds the value, or nil for none. An alias with no anchor
// before it is returned as is. The bound stops chains that lead back to
// themselves.
func (d *decoder) resolve(n ast.Node) ast.Node {
	n, _ = d.follow(n)
	return n
}

// follow is resolve, and returns too the first tag on the way that is not
// in coreTags, or "".
func (d *decoder) follow(n ast.Node) (_ ast.Node, strange string) {
	for range 16 {
		if isNil(n) {
			return nil, strange // a missing value is a null
		}
		switch t := n.(type) {
		case *ast.AnchorNode:
			n = t.Value
		case *ast.AliasNode:
			a := d.anchorFor(t)
			if a == nil {
				return t, strange
			}
			n = a.Value
		case *ast.TagNode:
			if tag := t.Start.Value; strange == "" && !coreTags[tag] {
				strange = tag
			}
			// Scalars keep their tag (!!str 1 is a string); scalarValue
			// reads it.
			if t.Value == nil || !isCollection(d.resolve(t.Value)) {
				return t, strange
			}
			n = t.Value
		default:
			return n, strange
		}
	}
	return n, strange
}

// aliasProblem says why an alias that resolve left unresolved is wrong.
func (d *decoder) aliasProblem(a *ast.AliasNode) string {
	name := tokenValue(a.Value)
	if d.circular[a] {
		return fmt.Sprintf("alias *%s is inside its own anchor &%s", name, name)
	}
	return fmt.Sprintf("alias *%s has no anchor &%s before it", name, name)
}

// anchorFor returns the last anchor of the alias's name defined before it.
func (d *decoder) anchorFor(alias *ast.AliasNode) *ast.AnchorNode {
	if alias.Value == nil {
		return nil
	}
	if d.circular[alias] {
		return nil
	}
	at := offsetOf(alias)
	var found *ast.AnchorNode
	for _, a := range d.anchors[tokenValue(alias.Value)] {
		if offsetOf(a) < at {
			found = a
		}
	}
	return found
}

// keyText returns a mapping key as the string it names.
func (d *decoder) keyText(k ast.Node) string {
	switch t := d.resolve(k).(type) {
	case *ast.StringNode:
		return t.Value
	case *ast.MappingKeyNode:
		if t.Value != nil {
			return d.keyText(t.Value)
		}
	case *ast.TagNode:
		if t.Value != nil {
			return d.keyText(t.Value)
		}
	case nil:
		return ""
	}
	return tokenValue(k)
}

// The YAML 1.2 core schema's integers and floats (without .inf and .nan,
// which the parser reads itself).
var (
	yamlInt   = regexp.MustCompile(`^[-+]?[0-9]+$`)
	yamlFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)
)

// octalMistake reports whether v, an integer as yamlInt matches it, has a
// leading 0 and an 8 or a 9: YAML 1.1 (and so the parser, and Serve's
// PyYAML) reads a leading 0 as octal, and left this one a string.
func octalMistake(v string) bool {
	return leadingZero(v) && strings.ContainsAny(v, "89")
}

// octalMessage says why octalMistake's numbers are refused.
const octalMessage = "a leading 0 makes YAML read an integer as octal, which has no 8 or 9: write it without the 0"

// leadingZero reports whether v, an integer as yamlInt matches it, has a
// leading 0 (and more digits): YAML 1.1 octal, or no integer at all.
func leadingZero(v string) bool {
	v = strings.TrimLeft(v, "+-")
	return len(v) > 1 && v[0] == '0'
}

// plainMatches reports whether n is an unquoted string that re matches.
func plainMatches(n ast.Node, re *regexp.Regexp) bool {
	sn, ok := n.(*ast.StringNode)
	return ok && sn.Token != nil && sn.Token.Type == token.StringType && re.MatchString(sn.Value)
}

// scalarValue returns a scalar node's value. The common node types are
// read directly; the rest (tags such as !!str 1, block strings) are decoded
// as goccy/go-yaml would into an any. Both are the values the parser gave.
func scalarValue(n ast.Node) (any, error) {
	switch t := n.(type) {
	case nil, *ast.NullNode:
		return nil, nil
	case *ast.StringNode:
		return t.Value, nil
	case *ast.IntegerNode:
		return t.Value, nil
	case *ast.FloatNode:
		return t.Value, nil
	case *ast.InfinityNode:
		return t.Value, nil
	case *ast.NanNode:
		return math.NaN(), nil
	case *ast.BoolNode:
		return t.Value, nil
	}
	var v any
	err := yaml.NodeToValue(n, &v)
	return v, err
}

func toInt(v any) (i int, ok, inRange bool) {
	switch v := v.(type) {
	case int:
		return v, true, true
	case int64:
		return int(v), true, v >= math.MinInt && v <= math.MaxInt
	case uint64:
		return int(v), true, v <= math.MaxInt
	case uint:
		return int(v), true, v <= math.MaxInt
	}
	return 0, false, false
}

func toFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case float64:
		return v, true
	case int:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint64:
		return float64(v), true
	case uint:
		return float64(v), true
	}
	return 0, false
}

func kindNoun(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Int:
		return "an integer"
	case reflect.Float64:
		return "a number"
	}
	return k.String()
}

// describe names a node's kind and value for error messages.
func describe(n ast.Node) string {
	switch t := n.(type) {
	case nil, *ast.NullNode:
		return "null"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode:
		return "string " + quoteClipped(t.Value)
	case *ast.LiteralNode:
		if t.Value != nil {
			return "string " + quoteClipped(t.Value.Value)
		}
		return "a block string"
	case *ast.IntegerNode:
		return "integer " + tokenValue(t)
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "number " + tokenValue(t)
	case *ast.BoolNode:
		return "boolean " + tokenValue(t)
	case *ast.TagNode:
		return tokenValue(t) + " " + describe(t.Value)
	case *ast.AliasNode:
		return "an alias"
	}
	return quoteClipped(tokenValue(n))
}

func quoteClipped(s string) string {
	if c := clippedValue(s); c != s {
		return strconv.Quote(c[:len(c)-3]) + "..."
	}
	return strconv.Quote(s)
}

// clippedValue is s cut to 40 bytes with "..." after, for a value quoted
// in an error message.
func clippedValue(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// isNil reports whether n is nil or a nil pointer in an ast.Node, which
// the parser leaves for some missing parts.
func isNil(n ast.Node) bool {
	if n == nil {
		return true
	}
	v := reflect.ValueOf(n)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func isNull(n ast.Node) bool {
	_, ok := n.(*ast.NullNode)
	return n == nil || ok
}

func isMapping(n ast.Node) bool {
	switch n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return true
	}
	return false
}

func isCollection(n ast.Node) bool {
	_, seq := n.(*ast.SequenceNode)
	return seq || isMapping(n)
}

// isEmpty reports whether a document body holds no value at all.
func isEmpty(n ast.Node) bool {
	_, comments := n.(*ast.CommentGroupNode)
	return n == nil || comments
}

// fieldIndex returns the index of t's field with the yaml tag key, or -1.
func fieldIndex(t reflect.Type, key string) int {
	for i := range t.NumField() {
		if yamlName(t.Field(i)) == key {
			return i
		}
	}
	return -1
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if name := yamlName(t.Field(i)); name != "" {
			names = append(names, name)
		}
	}
	return names
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

// pos is a place in the file; line 0 means none.
type pos struct{ line, col int }

func (a pos) compare(b pos) int {
	if a.line != b.line {
		return a.line - b.line
	}
	return a.col - b.col
}

// located is a problem with the position it sorts by.
type located struct {
	FieldError
	at pos
}

// elementPos returns the position of a list element: its "-" in a block
// list, so that it sorts before the element's own keys, or else the
// element's.
func elementPos(seq *ast.SequenceNode, i int) pos {
	if i < len(seq.Entries) && seq.Entries[i] != nil {
		if tk := seq.Entries[i].Start; tk != nil && tk.Position != nil {
			return pos{tk.Position.Line, tk.Position.Column}
		}
	}
	return posOf(seq.Values[i])
}

func posOf(n ast.Node) pos {
	if isNil(n) {
		return pos{}
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return pos{tk.Position.Line, tk.Position.Column}
	}
	return pos{}
}

func offsetOf(n ast.Node) int {
	if isNil(n) {
		return 0
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Offset
	}
	return 0
}

func tokenValue(n ast.Node) string {
	if isNil(n) {
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

// errorLine and errorMessage take goccy/go-yaml's line and message apart,
// leaving out the source excerpt its Error method adds.
func errorLine(err error) int {
	var ye yaml.Error
	if errors.As(err, &ye) {
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			return tk.Position.Line
		}
	}
	return 0
}

// syntaxError is a parse error's line and message. A key indented deeper
// than those beside it reads to the parser as the last word of the value
// above, a plain scalar running on, and is reported at that value's line
// with the two as one token ("a route_prefix"): the key's own line and
// column are found after it, with a hint (a tester).
func syntaxError(data []byte, err error) (line int, msg string) {
	line, msg = errorLine(err), "invalid YAML: "+errorMessage(err)
	var ye yaml.Error
	if !errors.As(err, &ye) || !strings.HasSuffix(ye.GetMessage(), "not allowed in this context") {
		return line, msg
	}
	tk := ye.GetToken()
	if tk == nil || tk.Position == nil {
		return line, msg
	}
	words := strings.Fields(tk.Value)
	if len(words) < 2 {
		return line, msg // one word: errorMessage named it
	}
	key := words[len(words)-1]
	lines := strings.Split(string(data), "\n")
	// lines[i] is line i+1: the lines after the token's first.
	for i := tk.Position.Line; i < len(lines) && i < tk.Position.Line+len(words); i++ {
		if rest := strings.TrimLeft(lines[i], " "); strings.HasPrefix(rest, key+":") {
			col := len(lines[i]) - len(rest) + 1
			return i + 1, fmt.Sprintf("invalid YAML: %s (%q at column %d): is it indented deeper than the lines beside it?", ye.GetMessage(), key, col)
		}
	}
	return line, msg
}

func errorMessage(err error) string {
	var ye yaml.Error
	if !errors.As(err, &ye) {
		return err.Error()
	}
	msg := ye.GetMessage()
	tk := ye.GetToken()
	if !strings.HasSuffix(msg, "not allowed in this context") || tk == nil || tk.Position == nil ||
		tk.Value == "" || len(tk.Value) > 40 || strings.ContainsAny(tk.Value, " \t\r\n") {
		return msg
	}
	// The parser's words for a key or an item out of line with those
	// beside it: a reader seldom guesses it from them.
	return fmt.Sprintf("%s (%q at column %d): is it indented as the lines beside it are?", msg, tk.Value, tk.Position.Column)
}

// notUTF8At returns the line and column (in bytes, from 1) of the first
// byte of data that does not begin a valid UTF-8 sequence.
func notUTF8At(data []byte) (line, col int) {
	line, start := 1, 0
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return line, i - start + 1
		}
		if r == '\n' {
			line, start = line+1, i+1
		}
		i += n
	}
	return line, len(data) - start + 1
}
