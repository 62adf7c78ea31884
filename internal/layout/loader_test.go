package layout_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// source is one rank file of the original checkpoint.
type source struct {
	f    *torchfile.File
	root *pyobj.Dict
}

func open(t *testing.T, path string) *source {
	t.Helper()
	f, err := torchfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &source{f: f, root: f.Root.(*pyobj.Dict)}
}

func (s *source) get(t *testing.T, keys ...any) pyobj.Value {
	t.Helper()
	var v pyobj.Value = s.root
	for _, k := range keys {
		switch x := v.(type) {
		case *pyobj.Dict:
			var ok bool
			if v, ok = x.Get(k); !ok {
				t.Fatalf("%s: no key %v", s.f.Name, k)
			}
		case *pyobj.List:
			v = x.Items[k.(int)]
		default:
			t.Fatalf("%s: %v in %s", s.f.Name, k, pyobj.TypeName(v))
		}
	}
	return v
}

func (s *source) floats(t *testing.T, keys ...any) []float32 {
	t.Helper()
	tt := s.get(t, keys...).(*torchfile.Tensor)
	v, err := s.f.ReadFloat32(tt, 0, tt.Numel())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tagDir(t *testing.T, ckpt string) string {
	b, err := os.ReadFile(filepath.Join(ckpt, "latest"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(ckpt, strings.TrimSpace(string(b)))
}

// targetParams returns the names and TP-local shapes of one param_shapes group.
func targetParams(t *testing.T, d *pyobj.Dict) ([]string, [][]int64) {
	var names []string
	var shapes [][]int64
	for i := 0; i < d.Len(); i++ {
		k, v := d.Item(i)
		s, _ := pyobj.Ints(v)
		names = append(names, k.(string))
		shapes = append(shapes, s)
	}
	return names, shapes
}

// loadPartition builds one rank's flat partition of a state from the atomic
// checkpoint, for parameters with the given TP-local shapes.
func loadPartition(t *testing.T, r *atomic.Reader, state string, names []string, shapes [][]int64, T, tp int,
	pieces func([]int64) ([]layout.Piece, int64, error)) ([]float32, []layout.Piece) {
	t.Helper()
	numels := make([]int64, len(names))
	shards := make([]fragment.Shard, len(names))
	states := make([]*atomic.State, len(names))
	for i, name := range names {
		st, err := r.OpenState(name, state)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		states[i] = st
		meta, err := layout.ReadMeta(st.Path)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := layout.TPShard(meta, st.Shape, T, tp, shapes[i][0])
		if err != nil {
			t.Fatal(err)
		}
		if torchfile.Numel(sh.Shape) != torchfile.Numel(shapes[i]) {
			t.Fatalf("%s: loader shard %v, source holds %v", name, sh.Shape, shapes[i])
		}
		shards[i], numels[i] = sh, torchfile.Numel(shapes[i])
	}
	ps, size, err := pieces(numels)
	if err != nil {
		t.Fatal(err)
	}
	part, err := layout.Fill(size, ps, func(p layout.Piece, dst []float32) error {
		return layout.ReadLocal(states[p.Param], shards[p.Param], p.Local, p.N, dst)
	})
	if err != nil {
		t.Fatal(err)
	}
	return part, ps
}

func compare(t *testing.T, what string, got, want []float32, ps []layout.Piece, skip func(int) bool) int {
	t.Helper()
	n := 0
	for _, p := range ps {
		if skip(p.Param) {
			continue
		}
		for k := p.At; k < p.At+p.N; k++ {
			if math.Float32bits(got[k]) != math.Float32bits(want[k]) {
				t.Fatalf("%s: element %d (param %d) is %v, the source holds %v", what, k, p.Param, got[k], want[k])
			}
			n++
		}
	}
	return n
}

// TestZero12SameParallelism converts a TP 2 x DP 2 Megatron-DeepSpeed
// checkpoint and loads it back at TP 2 x DP 2: every rank's fp32 and
// exp_avg partitions equal the ones DeepSpeed's layout put in the source
// files (vocabulary padding rows and averaged parameters aside: the atomic
// checkpoint holds neither the padding nor the per-rank copies).
func TestZero12SameParallelism(t *testing.T) {
	ckpt := testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")
	tbl, err := deepspeed.Index(context.Background(), ckpt, deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	dir := tagDir(t, ckpt)
	checked := 0
	for tp := 0; tp < 2; tp++ {
		ms := open(t, filepath.Join(dir, fmt.Sprintf("mp_rank_%02d_model_states.pt", tp)))
		names, shapes := targetParams(t, ms.get(t, "param_shapes", 0).(*pyobj.Dict))
		skip := func(i int) bool {
			p, _ := r.Param(names[i])
			return p.Pattern == "Partial" || p.VocabSize > 0
		}
		for dp := 0; dp < 2; dp++ {
			os := open(t, filepath.Join(dir, fmt.Sprintf("bf16_zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", dp, tp)))
			for _, c := range []struct {
				state string
				keys  []any
			}{
				{fragment.FP32, []any{"optimizer_state_dict", "single_partition_of_fp32_groups", 0}},
				{fragment.ExpAvg, []any{"optimizer_state_dict", "base_optimizer_state", "state", int64(0), "exp_avg"}},
			} {
				got, ps := loadPartition(t, r, c.state, names, shapes, 2, tp, func(n []int64) ([]layout.Piece, int64, error) {
					return layout.Zero12Pieces(n, 2, dp)
				})
				want := os.floats(t, c.keys...)
				if int64(len(want)) != int64(len(got)) {
					t.Fatalf("tp %d dp %d %s: partition of %d, source %d", tp, dp, c.state, len(got), len(want))
				}
				checked += compare(t, fmt.Sprintf("tp %d dp %d %s", tp, dp, c.state), got, want, ps, skip)
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d elements compared", checked)
	}
}

// TestZero3SameParallelism does the same for ZeRO-3 partitions: several
// sub-groups and two param groups, DP 3, and a TP 2 x DP 2 grid.
func TestZero3SameParallelism(t *testing.T) {
	for _, c := range []struct {
		name  string
		T, D  int
		bf16_ bool
	}{{"subgroups_2pg_dp3", 1, 3, false}, {"dp3_bf16", 1, 3, true}, {"tp2_dp2_bf16", 2, 2, true}} {
		t.Run(c.name, func(t *testing.T) {
			ckpt := testkit.Fixture("zero3", c.name, "checkpoint")
			tbl, err := deepspeed.IndexZero3(context.Background(), ckpt, deepspeed.Zero3Options{})
			if err != nil {
				t.Fatal(err)
			}
			r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{})
			dir := tagDir(t, ckpt)
			prefix := ""
			if c.bf16_ {
				prefix = "bf16_"
			}
			checked := 0
			for tp := 0; tp < c.T; tp++ {
				for dp := 0; dp < c.D; dp++ {
					ms := open(t, filepath.Join(dir, fmt.Sprintf("zero_pp_rank_%d_mp_rank_%02d_model_states.pt", dp, tp)))
					os := open(t, filepath.Join(dir, fmt.Sprintf("%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt", prefix, dp, tp)))
					groups := ms.get(t, "param_shapes").(*pyobj.List)
					for s := range groups.Items {
						names, shapes := targetParams(t, groups.Items[s].(*pyobj.Dict))
						got, ps := loadPartition(t, r, fragment.FP32, names, shapes, c.T, tp, func(n []int64) ([]layout.Piece, int64, error) {
							return layout.Zero3Pieces(n, c.D, dp)
						})
						want := os.floats(t, "optimizer_state_dict", "fp32_flat_groups", s)
						if len(want) != len(got) {
							t.Fatalf("sub-group %d: partition of %d, source %d", s, len(got), len(want))
						}
						checked += compare(t, fmt.Sprintf("tp %d dp %d sub-group %d", tp, dp, s), got, want, ps, func(int) bool { return false })
						// Padding is zero in the loader's view.
						inPiece := make([]bool, len(got))
						for _, p := range ps {
							for k := p.At; k < p.At+p.N; k++ {
								inPiece[k] = true
							}
						}
						for k, v := range got {
							if !inPiece[k] && v != 0 {
								t.Fatalf("padding element %d is %v", k, v)
							}
						}
					}
				}
			}
			if checked == 0 {
				t.Fatal("nothing compared")
			}
		})
	}
}

func TestTPShardSemantics(t *testing.T) {
	tests := []struct {
		name  string
		m     layout.Meta
		full  []int64
		T, t  int
		rows  int64
		shape []int64
	}{
		{"chunk uneven", layout.Meta{CatDim: 0}, []int64{10, 2}, 4, 3, 0, []int64{1, 2}},
		{"row parallel", layout.Meta{CatDim: 1}, []int64{3, 8}, 2, 1, 0, []int64{3, 4}},
		{"replicated", layout.Meta{CatDim: -1}, []int64{5}, 4, 2, 0, []int64{5}},
		{"vocab repadded", layout.Meta{CatDim: 0, Vocab: true}, []int64{43, 9}, 4, 3, 16, []int64{16, 9}},
		{"swiglu", layout.Meta{CatDim: 0, NSubParams: 2}, []int64{8, 3}, 2, 1, 0, []int64{4, 3}},
		{"gqa sub-params", layout.Meta{CatDim: 0, SubSizes: []int64{8, 4, 4}, PartDim: 0}, []int64{16, 9}, 2, 0, 0, []int64{8, 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sh, err := layout.TPShard(tc.m, tc.full, tc.T, tc.t, tc.rows)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(sh.Shape) != fmt.Sprint(tc.shape) {
				t.Errorf("shape %v, want %v", sh.Shape, tc.shape)
			}
		})
	}
	// The vocabulary rank 3 of 4 with 16 local rows holds rows 48..63 of a
	// 64-row padded table: all padding for a 43-row vocabulary.
	sh, _ := layout.TPShard(layout.Meta{CatDim: 0, Vocab: true}, []int64{43, 9}, 4, 3, 16)
	if sh.MappedCount() != 0 {
		t.Errorf("rank 3 places %d elements, want 0", sh.MappedCount())
	}
}

func TestPieces(t *testing.T) {
	// The example of formats/deepspeed/FORMAT.md, "Partitions": A=1026, B=10, D=3: S=346, rank 2 holds
	// A[692:1026] at 0 and B at 334.
	ps, S, _ := layout.Zero12Pieces([]int64{1026, 10}, 3, 2)
	if S != 346 || len(ps) != 2 || ps[0] != (layout.Piece{Param: 0, Local: 692, N: 334, At: 0}) || ps[1] != (layout.Piece{Param: 1, Local: 0, N: 10, At: 334}) {
		t.Errorf("ZeRO-1/2 pieces %+v, size %d", ps, S)
	}
	// §4.3: A=1026, B=10, D=3: every rank 346 elements, rank 2's B part is B[8:10].
	ps, S, _ = layout.Zero3Pieces([]int64{1026, 10}, 3, 2)
	if S != 346 || ps[1] != (layout.Piece{Param: 1, Local: 8, N: 2, At: 342}) {
		t.Errorf("ZeRO-3 pieces %+v, size %d", ps, S)
	}
	// A 1-element parameter over 4 ranks: ranks 1-3 hold only padding.
	ps, S, _ = layout.Zero3Pieces([]int64{1}, 4, 2)
	if S != 1 || len(ps) != 0 {
		t.Errorf("tiny: %+v %d", ps, S)
	}
}
