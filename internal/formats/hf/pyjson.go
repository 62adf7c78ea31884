package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// pyFloat is a float that JSON-encodes as Python's json.dumps writes a
// float (repr): 8.0 and 500000.0, not Go's 8 and 500000, 1e-05, 1e+16.
// transformers reads an integer where config.json should hold a float as
// a different value type (it warns that rope_scaling's factor must be a
// float), so the family fields ucp writes keep Python's spelling.
type pyFloat float64

func (f pyFloat) MarshalJSON() ([]byte, error) {
	x := float64(f)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil, fmt.Errorf("config.json: %v has no JSON form", x)
	}
	// repr switches to exponent form outside 1e-4 <= |x| < 1e16.
	e := strconv.FormatFloat(x, 'e', -1, 64)
	exp, err := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if err != nil {
		return nil, err
	}
	if x != 0 && (exp < -4 || exp >= 16) {
		return []byte(e), nil
	}
	s := strconv.FormatFloat(x, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return []byte(s), nil
}

// pyFloats returns v with every float64 inside it (maps, slices) a
// pyFloat. The family tables hold counts as int64, so a float64 there is a
// float in transformers' configuration too.
func pyFloats(v any) any {
	switch t := v.(type) {
	case float64:
		return pyFloat(t)
	case map[string]any:
		for k, x := range t {
			t[k] = pyFloats(x)
		}
	case []any:
		for i, x := range t {
			t[i] = pyFloats(x)
		}
	}
	return v
}

// literalJSON decodes a JSON object keeping each number's text, so that
// writing it back spells 8.0 as 8.0 and 4096 as 4096.
func literalJSON(b []byte) (map[string]any, error) {
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return m, d.Decode(&m)
}
