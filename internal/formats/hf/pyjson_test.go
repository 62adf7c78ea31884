package hf

import (
	"encoding/json"
	"testing"
)

// The want column is Python's json.dumps of the same float.
func TestPyFloat(t *testing.T) {
	for _, c := range []struct {
		x    float64
		want string
	}{
		{8, "8.0"}, {1e-5, "1e-05"}, {1e-6, "1e-06"}, {500000, "500000.0"}, {1e16, "1e+16"}, {0.1, "0.1"},
		{1e-4, "0.0001"}, {0.00012, "0.00012"}, {2.5, "2.5"}, {123456789012345680, "1.2345678901234568e+17"},
		{0, "0.0"}, {-3, "-3.0"}, {1234567, "1234567.0"},
	} {
		b, err := json.Marshal(pyFloat(c.x))
		if err != nil || string(b) != c.want {
			t.Errorf("%v: got %s (%v), want %s", c.x, b, err, c.want)
		}
	}
	m := pyFloats(map[string]any{"n": int64(4096), "eps": 1e-5, "rs": map[string]any{"factor": 8.0}})
	if b, _ := json.Marshal(m); string(b) != `{"eps":1e-05,"n":4096,"rs":{"factor":8.0}}` {
		t.Errorf("pyFloats: %s", b)
	}
	lit, err := literalJSON([]byte(`{"factor": 8.0, "hidden_size": 4096, "eps": 1e-05}`))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(lit); string(b) != `{"eps":1e-05,"factor":8.0,"hidden_size":4096}` {
		t.Errorf("literalJSON: %s", b)
	}
	if _, err := json.Marshal(pyFloat(1 / zero())); err == nil {
		t.Error("+Inf: no error")
	}
}

func zero() float64 { return 0 }
