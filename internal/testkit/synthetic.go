package testkit

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// SetStep overwrites, in place, the float32 step tensor of param group 0
// in a DeepSpeed optimizer file; keys lead from the file's root to the
// torch optimizer's 'state' dict. The rest of the file is unchanged, so
// only the step tells it from the original.
func SetStep(tb testing.TB, path string, step float32, keys ...string) {
	tb.Helper()
	f, err := torchfile.Decode(path)
	if err != nil {
		tb.Fatal(err)
	}
	d := pyobj.NewDec(path, f.Root)
	for _, k := range keys {
		d = d.Key(k)
	}
	tt := pyobj.As[*torchfile.Tensor](d.Key(int64(0)).Key("step"), "a tensor")
	if err := d.Err(); err != nil {
		tb.Fatal(err)
	}
	if tt.DType.Size() != 4 {
		tb.Fatalf("%s: step is %v, want 4-byte elements", path, tt.DType)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Close()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], math.Float32bits(step))
	if _, err := w.WriteAt(b[:], tt.FileOffset()); err != nil {
		tb.Fatal(err)
	}
}

// Synthetic builds a table of bf16 parameters of the given sizes, each a
// single unsharded fragment of a source that exists only as a header:
// planning reads only sizes and dtypes.
func Synthetic(sizes ...int64) *fragment.Table {
	t := &fragment.Table{Format: "synthetic"}
	for i, n := range sizes {
		src := fragment.TensorRef{Path: "src", T: &torchfile.Tensor{DType: dtype.BFloat16, Shape: []int64{n}, Stride: []int64{1},
			Storage: &torchfile.Storage{DType: dtype.BFloat16, Numel: n}}}
		p := &fragment.Param{Name: fmt.Sprintf("p%d", i), Shape: []int64{n / 16, 16}}
		for _, s := range []string{fragment.FP32, fragment.ExpAvg, fragment.ExpAvgSq} {
			st := p.AddState(s)
			st.Shards = []fragment.Shard{{Shape: p.Shape}}
			st.Frags = []fragment.Fragment{{Len: n, Src: src}}
		}
		t.Params = append(t.Params, p)
	}
	return t
}
