package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// expectedTensor is a tensor as torch itself described it in a fixture's
// JSON (testdata/gen/torch_fixtures.py).
type expectedTensor struct {
	key     []any
	dtype   string
	shape   []int64
	stride  []int64
	offset  int64
	storage string
	data    []byte
}

// node is one value of the fixture JSON.
type node struct {
	T      string            `json:"t"`
	V      json.RawMessage   `json:"v"`
	Items  []json.RawMessage `json:"items"`
	State  json.RawMessage   `json:"state"`
	Dtype  string            `json:"dtype"`
	Shape  []int64           `json:"shape"`
	Stride []int64           `json:"stride"`
	Offset int64             `json:"offset"`
	Key    string            `json:"key"`
	Hex    string            `json:"hex"`
}

// tensors lists a fixture's tensors in walk order with their key paths, as
// ucp inspect --json names them.
func tensors(t *testing.T, raw json.RawMessage, path []any, out *[]expectedTensor) {
	var n node
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatal(err)
	}
	switch n.T {
	case "tensor":
		data, err := hex.DecodeString(n.Hex)
		if err != nil {
			t.Fatal(err)
		}
		*out = append(*out, expectedTensor{key: append([]any(nil), path...), dtype: n.Dtype, shape: n.Shape, stride: n.Stride,
			offset: n.Offset, storage: n.Key, data: data})
	case "dict":
		for _, it := range n.Items {
			var kv []json.RawMessage
			if err := json.Unmarshal(it, &kv); err != nil || len(kv) != 2 {
				t.Fatalf("dict item %s", it)
			}
			var k node
			json.Unmarshal(kv[0], &k)
			var key any
			switch k.T {
			case "str":
				var s string
				json.Unmarshal(k.V, &s)
				key = s
			case "int":
				var i int64
				json.Unmarshal(k.V, &i)
				key = float64(i) // JSON numbers decode as float64
			default:
				key = "?" + k.T
			}
			tensors(t, kv[1], append(path, key), out)
		}
	case "list", "tuple":
		for i, it := range n.Items {
			tensors(t, it, append(path, float64(i)), out)
		}
	case "object":
		if n.State != nil {
			// Attributes of an object appear under their names.
			var st node
			json.Unmarshal(n.State, &st)
			if st.T == "dict" {
				tensors(t, n.State, path, out)
			}
		}
	}
}

// TestInspectEveryTorchFixture: ucp inspect --json reports every tensor of
// every torch fixture with torch's own dtype, shape, storage key and
// offset, and its byte range holds exactly torch's bytes.
func TestInspectEveryTorchFixture(t *testing.T) {
	files, _ := filepath.Glob(testkit.Fixture("torch", "*.pt"))
	if len(files) < 10 {
		t.Fatalf("only %d torch fixtures", len(files))
	}
	for _, pt := range files {
		t.Run(filepath.Base(pt), func(t *testing.T) {
			raw, err := os.ReadFile(strings.TrimSuffix(pt, ".pt") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var fx struct {
				Format string          `json:"format"`
				Prefix string          `json:"prefix"`
				Root   json.RawMessage `json:"root"`
			}
			if err := json.Unmarshal(raw, &fx); err != nil {
				t.Fatal(err)
			}
			var want []expectedTensor
			tensors(t, fx.Root, nil, &want)
			var out bytes.Buffer
			if err := runInspect(t.Context(), &out, pt, inspectOptions{JSON: true}); err != nil {
				t.Fatal(err)
			}
			var got fileReport
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Format != fx.Format || got.Prefix != fx.Prefix {
				t.Errorf("format %s/%s, want %s/%s", got.Format, got.Prefix, fx.Format, fx.Prefix)
			}
			if len(got.Tensors) != len(want) {
				t.Fatalf("%d tensors, torch has %d", len(got.Tensors), len(want))
			}
			file, err := os.ReadFile(pt)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range want {
				g := got.Tensors[i]
				if fmt.Sprint(g.Key) != fmt.Sprint(w.key) || g.DType != w.dtype || fmt.Sprint(g.Shape) != fmt.Sprint(nonNil(w.shape)) ||
					g.StorageOffset != w.offset || g.Storage != w.storage {
					t.Errorf("tensor %d: got %v %s %v offset %d storage %s, torch says %v %s %v offset %d storage %s",
						i, g.Key, g.DType, g.Shape, g.StorageOffset, g.Storage, w.key, w.dtype, w.shape, w.offset, w.storage)
					continue
				}
				if g.NBytes != int64(len(w.data)) {
					t.Errorf("%v: %d bytes, torch has %d", w.key, g.NBytes, len(w.data))
					continue
				}
				// The byte range: contiguous tensors lie at [data_offset, +nbytes).
				if g.Stride == nil && g.NBytes > 0 {
					if !bytes.Equal(file[g.DataOffset:g.DataOffset+g.NBytes], w.data) {
						t.Errorf("%v: bytes at %d are not torch's", w.key, g.DataOffset)
					}
				} else if g.NBytes > 0 {
					es := g.NBytes / torchfile.Numel(g.Shape)
					if !bytes.Equal(file[g.DataOffset:g.DataOffset+es], w.data[:es]) {
						t.Errorf("%v: first element at %d is not torch's", w.key, g.DataOffset)
					}
				}
			}
		})
	}
}
