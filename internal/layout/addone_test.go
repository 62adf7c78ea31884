package layout_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestWriteFillsCasts: a float32 state written as every dtype the Mover
// casts to, with and without AddOne (Megatron's apply_layernorm_1p: 1
// added in float32, then cast), cut into small tasks shared by three
// workers and into more than one Chunk per task. Each element must be
// float32 arithmetic then the cast: bfloat16/float16 rounded to nearest
// even, float64 exact, integers truncated toward zero, bool x != 0. Values
// where the order matters: 2^-30 and 2^24 (+1 is lost in float32, not in
// float64: the float64 and int64 outputs tell), -1.5 (+1 is -0.5, which
// truncates to 0 where floor gives -1), 1e-8. The tensor's last piece has
// no AddOne: the flag is the piece's.
func TestWriteFillsCasts(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-8, 1.0 / (1 << 30), 0.5, -1, -1.5, 3.14159, 1 << 24, 1e30, -1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 65504, 65519, 1.00390625, 2.00390625, -2, 0.99999994, 2.7, -2.7}
	fracs := []float32{0, 0.25, 0.5, -0.75, 0.999}
	var signed, nonneg []float32
	for k := range layout.Chunk + 4000 { // more than one Chunk
		signed = append(signed, float32(k%201-100)+fracs[k%len(fracs)])
	}
	for k := range 1000 {
		nonneg = append(nonneg, float32(k%200)+max(fracs[k%len(fracs)], 0))
	}
	vals := append(append(append([]float32{}, special...), signed...), nonneg...)
	region := map[string][2]int{
		"all":    {0, len(vals)},
		"signed": {len(special), len(special) + len(signed)},
		"nonneg": {len(special) + len(signed), len(vals)},
	}
	r := castAtomic(t, vals)

	le := binary.LittleEndian
	want := func(dt dtype.DType, x float32, add bool) []byte {
		y := x
		if add {
			y = x + 1 // float32 arithmetic
		}
		b := make([]byte, dt.Size())
		switch dt {
		case dtype.Float32:
			le.PutUint32(b, math.Float32bits(y))
		case dtype.BFloat16:
			le.PutUint16(b, dtype.BFloat16Bits(math.Float32bits(y)))
		case dtype.Float16:
			le.PutUint16(b, dtype.Float16Bits(math.Float32bits(y)))
		case dtype.Float64:
			le.PutUint64(b, math.Float64bits(float64(y)))
		case dtype.Int64:
			le.PutUint64(b, uint64(int64(math.Trunc(float64(y)))))
		case dtype.Int32:
			le.PutUint32(b, uint32(int32(math.Trunc(float64(y)))))
		case dtype.Int16:
			le.PutUint16(b, uint16(int16(math.Trunc(float64(y)))))
		case dtype.Int8:
			b[0] = byte(int8(math.Trunc(float64(y))))
		case dtype.Uint8:
			b[0] = uint8(math.Trunc(float64(y)))
		case dtype.Bool:
			if y != 0 {
				b[0] = 1
			}
		}
		return b
	}
	cases := []struct {
		dt     dtype.DType
		region string
	}{
		{dtype.Float32, "all"}, {dtype.BFloat16, "all"}, {dtype.Float16, "all"}, {dtype.Float64, "all"},
		{dtype.Int64, "signed"}, {dtype.Int32, "signed"}, {dtype.Int16, "signed"}, {dtype.Int8, "signed"},
		{dtype.Uint8, "nonneg"}, {dtype.Bool, "all"},
	}
	const plain = 5 // the last elements, a piece without AddOne
	for _, tc := range cases {
		for _, addOne := range []bool{false, true} {
			name := tc.dt.String()
			if addOne {
				name += "+1"
			}
			t.Run(name, func(t *testing.T) {
				lo, hi := int64(region[tc.region][0]), int64(region[tc.region][1])
				n, es := hi-lo, int64(tc.dt.Size())
				f, err := os.Create(filepath.Join(t.TempDir(), "out"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				var regions layout.Regions
				i := regions.Add(f, 3, n*es)
				fill := layout.TensorFill{I: i, DType: tc.dt, N: n, Pieces: []layout.StatePiece{
					{Param: "w", State: fragment.FP32, Local: lo, N: n - plain, AddOne: addOne},
					{Param: "w", State: fragment.FP32, Local: hi - plain, N: plain, At: n - plain}}}
				var read, written int64
				progress := func(r, w int64) { read, written = read+r, written+w } // one worker below
				if err := layout.WriteFillsProgress(context.Background(), r, &regions, []layout.TensorFill{fill}, 1, 4096, progress); err != nil {
					t.Fatal(err)
				}
				if read != 4*n || written != es*n {
					t.Errorf("progress read %d, wrote %d bytes, want %d, %d", read, written, 4*n, es*n)
				}
				// Three workers sharing tasks of about 1000 elements.
				if err := layout.WriteFills(context.Background(), r, &regions, []layout.TensorFill{fill}, 3, 1000*es); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, n*es)
				if _, err := f.ReadAt(got, 3); err != nil {
					t.Fatal(err)
				}
				for k := range n {
					x := vals[lo+k]
					w := want(tc.dt, x, addOne && k < n-plain)
					if g := got[k*es : (k+1)*es]; string(g) != string(w) {
						t.Fatalf("element %d (%v): % x, want % x", k, x, g, w)
					}
				}
			})
		}
	}
}

// castAtomic is an atomic checkpoint of one parameter "w" whose fp32
// state holds vals.
func castAtomic(t *testing.T, vals []float32) *atomic.Reader {
	t.Helper()
	data := make([]byte, 4*len(vals))
	for k, v := range vals {
		binary.LittleEndian.PutUint32(data[4*k:], math.Float32bits(v))
	}
	r, err := atomic.OpenReader(oneStateAtomic(t, data), atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// oneStateAtomic converts a one-parameter checkpoint: "w", whose fp32
// state is the float32 elements data; it returns the atomic folder.
func oneStateAtomic(t *testing.T, data []byte) string {
	t.Helper()
	numel := int64(len(data) / 4)
	src := filepath.Join(t.TempDir(), "src.pt")
	if err := torchfile.Save(src, pyobj.DictOf("w", torchfile.NewBlob(dtype.Float32, []int64{numel}, data))); err != nil {
		t.Fatal(err)
	}
	sf, err := torchfile.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := sf.Root.(*pyobj.Dict).Get("w")
	ref := fragment.TensorRef{Path: src, T: v.(*torchfile.Tensor)}
	sf.Close()
	return testkit.Convert(t, &fragment.Table{Format: "test", Source: src, Params: []*fragment.Param{{Name: "w", Shape: []int64{numel},
		States: []*fragment.State{{Name: fragment.FP32, Shards: []fragment.Shard{{Shape: []int64{numel}}}, Frags: []fragment.Fragment{{Len: numel, Src: ref}}}}}}}, 1)
}
