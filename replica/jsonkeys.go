package replica

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// ExactKeys returns an error naming a key of the JSON object raw that the
// struct v points to has no field for under exactly that name, or nil.
// encoding/json matches keys without regard to case, so that "BODY" sets
// body, and {"body": "a", "Body": "b"} keeps the last one, silently: a
// typo, or a key given twice, is an error here as the file's YAML makes
// it. Only the top level is checked; raw that is not an object, and v
// that is not a struct, are left to the decoder.
func ExactKeys(raw []byte, v any) error {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return nil // its own UnmarshalJSON decides what its keys are
	}
	keys, ok := objectKeys(raw)
	if !ok {
		return nil
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if hasJSONField(t, k) {
			if seen[k] {
				return fmt.Errorf("field %q given twice", k)
			}
			seen[k] = true
			continue
		}
		for i := range t.NumField() {
			if name, ok := jsonName(t.Field(i)); ok && strings.EqualFold(name, k) {
				return &UnknownFieldError{Field: k, Near: name}
			}
		}
		return &UnknownFieldError{Field: k}
	}
	return nil
}

// UnknownFieldError is a key of a user_config that names no field of the
// handler's config: the proxy's -check points at the key's own line.
type UnknownFieldError struct {
	Field string // the key as written
	Near  string // the field it differs from in case only, if any
}

// Error implements error.
func (e *UnknownFieldError) Error() string {
	if e.Near != "" {
		return fmt.Sprintf("unknown field %q: keys are matched exactly, the field is %q", e.Field, e.Near)
	}
	return fmt.Sprintf("unknown field %q", e.Field)
}

// objectKeys returns the keys of the JSON object raw at its top level, in
// the order written (so that of several wrong keys the first is named,
// every time), or false if raw is not one valid object.
func objectKeys(raw []byte) ([]string, bool) {
	if !json.Valid(raw) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, t.(string)) // a key: the object is valid
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return nil, false
		}
	}
	return keys, true
}

// hasJSONField reports whether struct type t has a field named key in
// JSON.
func hasJSONField(t reflect.Type, key string) bool {
	for i := range t.NumField() {
		f := t.Field(i)
		if et := embeddedStruct(f); et != nil {
			if hasJSONField(et, key) {
				return true
			}
			continue
		}
		if name, ok := jsonName(f); ok && name == key {
			return true
		}
	}
	return false
}

// embeddedStruct is the struct type of f when encoding/json promotes its
// fields (an embedded struct, or pointer to one, with no name in its
// tag), or nil.
func embeddedStruct(f reflect.StructField) reflect.Type {
	if !f.Anonymous {
		return nil
	}
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return nil
	}
	t := f.Type
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// jsonName is f's name in JSON, and whether it has one.
func jsonName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false
	}
	name, _, _ := strings.Cut(tag, ",")
	switch name {
	case "":
		return f.Name, true
	}
	return name, true
}
