package atomic

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// checkHeader (issue 26 fault 9) accepts only the contiguous tensor of the
// manifest's dtype and shape filling its storage exactly.
func TestCheckHeader(t *testing.T) {
	st := func(n int64) *torchfile.Storage { return &torchfile.Storage{DType: dtype.Float32, Numel: n} }
	for _, tc := range []struct {
		name string
		t    torchfile.Tensor
		want string
	}{
		{"exact", torchfile.Tensor{Storage: st(6), DType: dtype.Float32, Shape: []int64{2, 3}, Stride: []int64{3, 1}}, ""},
		{"shape", torchfile.Tensor{Storage: st(6), DType: dtype.Float32, Shape: []int64{3, 2}, Stride: []int64{2, 1}}, "the manifest says"},
		{"dtype", torchfile.Tensor{Storage: st(6), DType: dtype.Float16, Shape: []int64{2, 3}, Stride: []int64{3, 1}}, "the manifest says"},
		{"larger storage", torchfile.Tensor{Storage: st(12), DType: dtype.Float32, Shape: []int64{2, 3}, Stride: []int64{3, 1}}, "a view"},
		{"offset", torchfile.Tensor{Storage: st(6), DType: dtype.Float32, StorageOffset: 1, Shape: []int64{2, 3}, Stride: []int64{3, 1}}, "a view"},
		{"transposed", torchfile.Tensor{Storage: st(6), DType: dtype.Float32, Shape: []int64{2, 3}, Stride: []int64{1, 2}}, "a view"},
		{"no storage", torchfile.Tensor{DType: dtype.Float32, Shape: []int64{2, 3}, Stride: []int64{3, 1}}, "no storage"},
	} {
		err := checkHeader(&tc.t, dtype.Float32, []int64{2, 3})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
