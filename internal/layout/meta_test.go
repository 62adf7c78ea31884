package layout_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// subShape is a SubparamShape object of the given attributes.
func subShape(attrs *pyobj.Dict) *pyobj.Object {
	return &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.checkpoint.constants", Name: "SubparamShape"}, State: attrs, Built: true}
}

// A state file's keys of the wrong type are errors naming the file and the
// key, not zero values.
func TestReadMetaMalformed(t *testing.T) {
	cases := []struct {
		key  string
		v    pyobj.Value
		want string
	}{
		{"cat_dim", "0", `["cat_dim"]: got str, want int`},
		{"param_n_sub_params", 2.5, `["param_n_sub_params"]: got float, want int`},
		{"vocab_tensor", "yes", `["vocab_tensor"]: got str, want bool`},
		{"sub_param_shape", int64(3), `["sub_param_shape"]: got int, want an object`},
		{"sub_param_shape", subShape(pyobj.DictOf("partition_dim", "0", "shape", pyobj.Tuple{int64(2)})), `["sub_param_shape"].partition_dim: got str, want int`},
		{"sub_param_shape", subShape(pyobj.DictOf("partition_dim", int64(0))), "has no attribute shape"},
		{"sub_param_shape", subShape(pyobj.DictOf("partition_dim", int64(0), "shape", pyobj.Tuple{"w"})), `["sub_param_shape"].shape[0]: got str, want int`},
		{"sub_param_shape", subShape(pyobj.DictOf("partition_dim", int64(1), "shape", pyobj.Tuple{int64(2)})), "partition_dim 1 of 1 dims"},
	}
	for _, c := range cases {
		t.Run(c.key, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fp32.pt")
			root := pyobj.DictOf("param", torchfile.NewBlob(dtype.Float32, []int64{1}, make([]byte, 4)), c.key, c.v)
			if err := torchfile.Save(path, root); err != nil {
				t.Fatal(err)
			}
			_, err := layout.ReadMeta(path)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("error %v, want one naming %s and containing %s", err, path, c.want)
			}
		})
	}
	good := filepath.Join(t.TempDir(), "fp32.pt")
	root := pyobj.DictOf("param", torchfile.NewBlob(dtype.Float32, []int64{1}, make([]byte, 4)), "cat_dim", int64(1), "vocab_tensor", true)
	if err := torchfile.Save(good, root); err != nil {
		t.Fatal(err)
	}
	if m, err := layout.ReadMeta(good); err != nil || m.CatDim != 1 || !m.Vocab {
		t.Fatalf("%+v %v", m, err)
	}
}
