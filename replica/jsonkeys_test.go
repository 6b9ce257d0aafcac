package replica

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestExactKeys(t *testing.T) {
	type cfg struct {
		Body    string `json:"body"`
		Status  int    `json:"status,omitempty"`
		Plain   int
		Skipped int `json:"-"`
		hidden  int
	}
	for in, want := range map[string]string{
		`{"body": "a", "status": 1, "Plain": 2}`: "",
		`{"BODY": "a"}`:                          `unknown field "BODY": keys are matched exactly, the field is "body"`,
		`{"body": "a", "Body": "b"}`:             `unknown field "Body"`,
		`{"body": "a", "body": "b"}`:             `field "body" given twice`, // as the doc says (a tester)
		`{"Zeta": 1, "Alpha": 2, "Mid": 3}`:      `unknown field "Zeta"`,     // the first written, every time (found by review)
		`{"plain": 1}`:                           `the field is "Plain"`,
		`{"Skipped": 1}`:                         `unknown field "Skipped"`,
		`{"hidden": 1}`:                          `unknown field "hidden"`,
		`[1]`:                                    "",
		`{"body": `:                              "",
	} {
		var c cfg
		err := ExactKeys([]byte(in), &c)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("ExactKeys(%s) = %v, want %q", in, err, want)
		}
	}
	var raw json.RawMessage
	if err := ExactKeys([]byte(`{"ANY": 1}`), &raw); err != nil {
		t.Errorf("ExactKeys into a RawMessage = %v, want nil (no fields to match)", err)
	}
}

// A built-in's user_config key in another case is an error, not taken for
// the field: {"body": "a", "Body": "b"} kept the last one, silently (found
// by a tester).
func TestUserConfigKeysAreExact(t *testing.T) {
	// {"BODY": 1} named body's type, a key the user never wrote (found by
	// a tester): the key is what is wrong.
	for _, uc := range []string{`{"BODY": "upper"}`, `{"body": "a", "Body": "b"}`, `{"BODY": 1}`} {
		if _, err := NewStatic(json.RawMessage(uc)); err == nil || !strings.Contains(err.Error(), "static: user_config: unknown field") {
			t.Errorf("static with %s: %v, want an unknown field", uc, err)
		}
	}
	if _, err := NewSleep(json.RawMessage(`{"MS": 5}`)); err == nil || !strings.Contains(err.Error(), `the field is "ms"`) {
		t.Errorf("sleep with MS: %v", err)
	}
}

type commonConfig struct {
	Timeout int `json:"timeout"`
}

type InnerConfig struct {
	Level int `json:"level"`
}

type embeddingConfig struct {
	commonConfig        // promoted by encoding/json: "timeout"
	*InnerConfig        // pointer embed, promoted too: "level"
	Word         string `json:"word"`
	Dash         int    `json:"-,"` // the key "-"
}

// ExactKeys takes what encoding/json (with DisallowUnknownFields) takes in
// the exact case: promoted fields of embedded structs, the key "-" (found
// by review).
func TestExactKeysTakesWhatJSONTakes(t *testing.T) {
	for _, in := range []string{`{"word": "a", "timeout": 5}`, `{"level": 2}`, `{"-": 1}`} {
		var c embeddingConfig
		dec := json.NewDecoder(strings.NewReader(in))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("%s: encoding/json refuses it too: %v", in, err)
		}
		if err := DecodeUserConfig("model", json.RawMessage(in), &embeddingConfig{}); err != nil {
			t.Errorf("%s: %v (encoding/json took it: %+v)", in, err, c)
		}
	}
}

// A config type with its own UnmarshalJSON (accepting an alias key) is
// left to it.
type aliasedConfig struct {
	MS int `json:"ms"`
}

func (a *aliasedConfig) UnmarshalJSON(b []byte) error {
	var m map[string]int
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	a.MS = m["ms"] + 1000*m["seconds"]
	return nil
}

func TestExactKeysLeavesAnUnmarshalerAlone(t *testing.T) {
	var a aliasedConfig
	if err := DecodeUserConfig("model", json.RawMessage(`{"seconds": 2}`), &a); err != nil {
		t.Errorf("custom UnmarshalJSON: %v (decoded to %+v)", err, a)
	}
}
