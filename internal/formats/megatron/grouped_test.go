package megatron

import (
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// fullIndex lists, for each element of a rank's stored tensor in
// row-major order, its row-major index in the full tensor (-1 where
// nothing is placed), through the rank's pieces.
func fullIndex(pcs []piece, full []int64) []int64 {
	var out []int64
	for _, pc := range pcs {
		sh := pc.shard
		n := torchfile.Numel(sh.Shape)
		part := make([]int64, n)
		for i := range part {
			part[i] = -1
		}
		sh.Runs(full, 0, n, func(r fragment.Run) {
			for k := int64(0); k < r.N; k++ {
				part[r.Local+k] = r.Full + k
			}
		})
		out = append(out, part...)
	}
	return out
}

// groupedState is one state of a parameter whose shards are the pieces of
// every rank, each rank one stored tensor of the given local shape.
func groupedState(t *testing.T, full, local []int64, pieces [][]piece) *fragment.Param {
	t.Helper()
	p := &fragment.Param{Name: "w", Shape: full}
	st := p.AddState(fragment.FP32)
	src := fragment.TensorRef{Path: "x", T: &torchfile.Tensor{Shape: local, Stride: torchfile.ContiguousStrides(local)}}
	for r, pcs := range pieces {
		var n int64
		for _, pc := range pcs {
			if pc.off != n {
				t.Fatalf("rank %d: piece at %d, want %d", r, pc.off, n)
			}
			ln := torchfile.Numel(pc.shard.Shape)
			st.Shards = append(st.Shards, pc.shard)
			st.Frags = append(st.Frags, fragment.Fragment{Shard: len(st.Shards) - 1, Len: ln, Src: src, SrcStart: pc.off})
			n += ln
		}
		if n != torchfile.Numel(local) {
			t.Fatalf("rank %d: pieces hold %d elements, the stored tensor %v", r, n, local)
		}
	}
	if err := st.Validate(full); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGroupedShards places GroupedMLP weights of 4 experts over EP 2 and
// TP 2 and compares with mappings worked out by hand from Megatron's
// views (NOTES.md §4.1).
func TestGroupedShards(t *testing.T) {
	for _, c := range []struct {
		name    string
		weight1 bool
		local   []int64
		H       int64
		G       int64
		full    []int64
		want    map[int][]int64 // shard e*T+r -> full index of each local element
	}{
		{
			// H 2, F 4, SwiGLU: full weight1 [2, 32] is [E 4, H 2, gate 4 | up 4]
			// in memory. Rank (e, r) stores [2, 8] = [j 2, h 2, gate 2 | up 2]:
			// local element (j, h, g, c) is full (2e+j)*16 + h*8 + g*4 + 2r + c.
			// EP rank e owns full row e; TP rank r columns 4k+2r, 4k+2r+1.
			name: "weight1", weight1: true, local: []int64{2, 8}, H: 2, G: 2, full: []int64{2, 32},
			want: map[int][]int64{
				0: {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
				1: {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
				2: {32, 33, 36, 37, 40, 41, 44, 45, 48, 49, 52, 53, 56, 57, 60, 61},
				3: {34, 35, 38, 39, 42, 43, 46, 47, 50, 51, 54, 55, 58, 59, 62, 63},
			},
		},
		{
			// H 4, F 2, SwiGLU: [E 4, H 4, gate 2 | up 2]; rank (e, r) stores
			// [4, 2] = [j 2, h 4, gate 1 | up 1]: full rows 2e, 2e+1 (H/EP = 2
			// rows hold the 8 (expert, hidden) lines of experts 2e, 2e+1).
			name: "weight1 two rows per EP rank", weight1: true, local: []int64{4, 4}, H: 4, G: 2, full: []int64{4, 16},
			want: map[int][]int64{
				1: {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31},
				2: {32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62},
			},
		},
		{
			// No gating, H 2, F 4: [E 4, H 2, F 4]; rank (e, r) stores [2, 4] =
			// [j 2, h 2, 2]: full (2e+j)*8 + h*4 + 2r + c.
			name: "weight1 not gated", weight1: true, local: []int64{2, 4}, H: 2, G: 1, full: []int64{2, 16},
			want: map[int][]int64{
				3: {18, 19, 22, 23, 26, 27, 30, 31},
			},
		},
		{
			// weight2 [E*F, H] with F 4, H 3: rank (e, r) stores [j 2 x F/T 2, 3]:
			// local row 2j+f is full row (2e+j)*4 + 2r + f.
			name: "weight2", local: []int64{4, 3}, H: 3, G: 2, full: []int64{16, 3},
			want: map[int][]int64{
				0: {0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17},
				1: {6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23},
				2: {24, 25, 26, 27, 28, 29, 36, 37, 38, 39, 40, 41},
				3: {30, 31, 32, 33, 34, 35, 42, 43, 44, 45, 46, 47},
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			full, shards, err := groupedShards(c.weight1, c.local, c.H, 4, 2, 2, c.G)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(full, c.full) {
				t.Fatalf("full shape %v, want %v", full, c.full)
			}
			for i, want := range c.want {
				if got := fullIndex(shards[i], full); !reflect.DeepEqual(got, want) {
					t.Errorf("rank %d (%s): full indices\n got %v\nwant %v", i, shards[i][0].shard.Label, got, want)
				}
			}
			// Every rank's pieces tile its stored tensor, and together
			// they tile the full tensor: Shard-NC.
			p := groupedState(t, full, c.local, shards)
			if k, _ := fragment.Classify(p); k != fragment.ShardNC {
				t.Errorf("pattern %v, want Shard-NC", k)
			}
		})
	}
}

// At TP 1 an EP rank holds whole experts: one block of rows (Shard-V).
func TestGroupedShardsTP1(t *testing.T) {
	full, shards, err := groupedShards(true, []int64{4, 8}, 4, 4, 2, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(full, []int64{4, 16}) {
		t.Fatalf("full shape %v", full)
	}
	want := make([]int64, 32)
	for i := range want {
		want[i] = 32 + int64(i) // EP rank 1: experts 2, 3 = the second half of the memory
	}
	if got := fullIndex(shards[1], full); !reflect.DeepEqual(got, want) {
		t.Errorf("EP rank 1: %v", got)
	}
	p := groupedState(t, full, []int64{4, 8}, shards)
	if k, dims := fragment.Classify(p); k != fragment.ShardV || !reflect.DeepEqual(dims, []int{0}) {
		t.Errorf("pattern %v %v, want Shard-V [0]", k, dims)
	}
}

// EP does not divide H (nor, in some rows, the local expert count): an EP
// rank's weight1 starts or ends inside a full row, and is placed in pieces.
func TestGroupedShardsHiddenNotDividedByEP(t *testing.T) {
	// E 4, EP 2, H 3, gated, F 2, T 2 (F/T 1): full [3, 16], memory
	// [E 4, H 3, G 2, F 2]. Rank (e, r) stores [j 2, h 3, g 2, 1]: local
	// (j, h, g) is full ((2e+j)*3 + h)*4 + 2g + r. Rank 0 ends inside
	// row 1 (lines 0..5 of 12, 4 per row), rank 1 starts inside it.
	full, pieces, err := groupedShards(true, []int64{3, 4}, 3, 4, 2, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(full, []int64{3, 16}) {
		t.Fatalf("full shape %v", full)
	}
	for i, want := range map[int][]int64{
		0: {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22},
		3: {25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47},
	} {
		if got := fullIndex(pieces[i], full); !reflect.DeepEqual(got, want) {
			t.Errorf("rank %d: full indices\n got %v\nwant %v", i, got, want)
		}
	}
	if len(pieces[0]) != 2 || len(pieces[3]) != 2 {
		t.Errorf("pieces per rank: %d and %d, want a block of whole rows and a part of a row each", len(pieces[0]), len(pieces[3]))
	}
	p := groupedState(t, full, []int64{3, 4}, pieces)
	if k, _ := fragment.Classify(p); k != fragment.ShardNC {
		t.Errorf("pattern %v, want Shard-NC", k)
	}
}

// Every element of every rank lands where Megatron's views put it, for
// geometries where EP and the local expert count divide H or not: local
// weight1 (j, h, g, c) of rank (e, r) is full element
// (((e*nle+j)*H + h)*G + g)*F + r*F/T + c; weight2 (j, f, h) is
// ((e*nle+j)*F + r*F/T + f)*H + h.
func TestGroupedShardsViews(t *testing.T) {
	for _, c := range []struct{ H, E, EP, T, G, F int64 }{
		{13, 6, 2, 2, 2, 4}, // H 13 over EP 2, 3 local experts: head, rows and tail pieces
		{13, 4, 2, 1, 2, 6}, // expert TP 1
		{5, 8, 4, 2, 1, 4},  // not gated, EP 4
		{7, 6, 3, 1, 2, 2},  // EP 3
		{2, 8, 4, 2, 2, 2},  // fewer hidden rows than experts per row
		{12, 4, 2, 2, 2, 8}, // EP divides H: one piece
		{1, 4, 4, 1, 1, 2},  // one local expert, H 1
	} {
		nle, w := c.E/c.EP, c.F/c.T
		for _, w1 := range []bool{true, false} {
			local := []int64{c.H, nle * c.G * w}
			if !w1 {
				local = []int64{nle * w, c.H}
			}
			full, pieces, err := groupedShards(w1, local, c.H, c.E, int(c.EP), int(c.T), c.G)
			if err != nil {
				t.Fatalf("%+v weight1 %v: %v", c, w1, err)
			}
			for e := int64(0); e < c.EP; e++ {
				for r := int64(0); r < c.T; r++ {
					got := fullIndex(pieces[e*c.T+r], full)
					var want []int64
					if w1 {
						for j := int64(0); j < nle; j++ {
							for h := int64(0); h < c.H; h++ {
								for g := int64(0); g < c.G; g++ {
									for k := int64(0); k < w; k++ {
										want = append(want, (((e*nle+j)*c.H+h)*c.G+g)*c.F+r*w+k)
									}
								}
							}
						}
					} else {
						for j := int64(0); j < nle; j++ {
							for f := int64(0); f < w; f++ {
								for h := int64(0); h < c.H; h++ {
									want = append(want, ((e*nle+j)*c.F+r*w+f)*c.H+h)
								}
							}
						}
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%+v weight1 %v rank (%d, %d):\n got %v\nwant %v", c, w1, e, r, got, want)
					}
				}
			}
			groupedState(t, full, local, pieces)
		}
	}
}

func TestGroupedShardsErrors(t *testing.T) {
	for _, c := range []struct {
		weight1 bool
		local   []int64
		H       int64
		EP      int
		want    string
	}{
		{true, []int64{8, 6}, 8, 2, "weight1 has shape [8 6]"},
		{true, []int64{4, 8}, 8, 2, "weight1 has shape [4 8]"},
		{false, []int64{8, 4}, 8, 2, "weight2 has shape [8 4]"},
		{false, []int64{8, 8, 1}, 8, 2, "not 2 dims"},
		{false, []int64{8, 8}, 8, 3, "4 experts do not split over expert parallel 3"},
	} {
		_, _, err := groupedShards(c.weight1, c.local, c.H, 4, c.EP, 2, 2)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("groupedShards(%v, %v, H %d, EP %d) = %v, want %q", c.weight1, c.local, c.H, c.EP, err, c.want)
		}
	}
}

// Experts are expert-parallel (own optimizer, own DDP buffers) only with
// EP > 1, for GroupedMLP as for the other expert layouts.
func TestExpertParallel(t *testing.T) {
	for _, c := range []struct {
		name string
		ep   int
		want bool
	}{
		{"decoder.layers.0.mlp.experts.weight1", 2, true},
		{"decoder.layers.0.mlp.experts.weight1", 1, false},
		{"decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight", 1, false},
		{"decoder.layers.0.mlp.experts.linear_fc2.weight3", 4, true},
		{"decoder.layers.0.mlp.shared_experts.linear_fc1.weight", 2, false},
		{"decoder.layers.0.mlp.router.weight", 2, false},
	} {
		if got := expertParallel(c.name, c.ep); got != c.want {
			t.Errorf("expertParallel(%s, %d) = %v", c.name, c.ep, got)
		}
	}
}

// Rewritten copies of the GroupedMLP fixture: args that contradict the
// fused shapes, or layouts ucp does not read, are errors naming the file.
func TestGroupedArgsErrors(t *testing.T) {
	const c = "moe_groupedmlp_tp2_ep2_distopt"
	w1 := "decoder.layers.0.mlp.experts.weight1"
	for _, tc := range []struct {
		name string
		edit func(args *pyobj.Dict)
		want []string
	}{
		{"moe_ffn_hidden_size", func(a *pyobj.Dict) { a.Set("moe_ffn_hidden_size", int64(16)) },
			[]string{w1, "expert hidden size of 8 but args.moe_ffn_hidden_size is 16"}},
		{"ffn_hidden_size fallback", func(a *pyobj.Dict) { a.Set("moe_ffn_hidden_size", nil); a.Set("ffn_hidden_size", int64(12)) },
			[]string{w1, "args.ffn_hidden_size is 12"}},
		{"num_experts", func(a *pyobj.Dict) { a.Set("num_experts", nil) },
			[]string{w1, "GroupedMLP weight", "args.num_experts is not set"}},
		{"moe_extended_tp", func(a *pyobj.Dict) { a.Set("moe_extended_tp", true) },
			[]string{"model_optim_rng.pt", "moe_extended_tp"}},
		{"swiglu", func(a *pyobj.Dict) { a.Set("swiglu", false) },
			// not gated: weight1's 16 columns are 2 experts of 8 / TP 2 = F 16
			[]string{w1, "expert hidden size of 16 but args.moe_ffn_hidden_size is 8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, iter := fixtureCopy(t, c)
			dirs, err := filepath.Glob(filepath.Join(iter, "mp_rank_*"))
			if err != nil || len(dirs) != 4 {
				t.Fatalf("%v: %v", dirs, err)
			}
			for _, d := range dirs {
				rewrite(t, filepath.Join(d, "model_optim_rng.pt"), func(r pyobj.Value) pyobj.Value {
					tc.edit(argsOf(r))
					return r
				})
			}
			wantError(t, root, Options{}, tc.want...)
		})
	}
}

// The real megatron-core GroupedMLP checkpoints (TestFixtures compares them
// bit for bit with the live truth): each (EP, expert-TP) rank's weight1 is
// placed in pieces exactly when EP does not divide hidden_size, and the
// patterns are the truth's.
func TestGroupedRealFixtures(t *testing.T) {
	for _, c := range []struct {
		name      string
		H, E, F   int64
		ranks     int // EP x expert TP
		piecesMin int // shards of weight1's fp32 state
	}{
		{"core0_15_gmm_tp2_ep2_torch", 12, 4, 8, 4, 4},
		{"core0_15_gmm_tp2_ep2_h13_torch", 13, 6, 4, 4, 8},      // per EP rank: rows + tail, head + rows
		{"core0_15_gmm_tp2_etp1_ep2_h13_torch", 13, 4, 6, 2, 4}, // rows + tail, head + rows
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl := index(t, testkit.Fixture("megatron", c.name, "checkpoint"), Options{})
			for _, layer := range []string{"0", "1"} {
				w1 := tbl.Param("decoder.layers." + layer + ".mlp.experts.weight1")
				w2 := tbl.Param("decoder.layers." + layer + ".mlp.experts.weight2")
				if w1 == nil || w2 == nil {
					t.Fatalf("layer %s: no GroupedMLP weights", layer)
				}
				if want := []int64{c.H, c.E * 2 * c.F}; !reflect.DeepEqual(w1.Shape, want) {
					t.Errorf("weight1 shape %v, want %v", w1.Shape, want)
				}
				if want := []int64{c.E * c.F, c.H}; !reflect.DeepEqual(w2.Shape, want) {
					t.Errorf("weight2 shape %v, want %v", w2.Shape, want)
				}
				placed := 0
				for _, sh := range w1.State(fragment.FP32).Shards {
					if sh.Replica == 0 {
						placed++
					}
				}
				if placed != c.piecesMin {
					t.Errorf("weight1: %d placed shards, want %d over %d ranks", placed, c.piecesMin, c.ranks)
				}
			}
		})
	}
}

// What ucp still does not read of a GroupedMLP checkpoint is refused,
// naming the file and the reason.
func TestGroupedRefused(t *testing.T) {
	for _, tc := range []struct {
		name, fixture string
		edit          func(args *pyobj.Dict)
		want          []string
	}{
		// Expert TP != TP with the distributed optimizer (refused for every
		// expert layout: the expert buffers' layout at ETP != TP is unread).
		{"expert TP with the distributed optimizer", "core0_15_gmm_tp2_ep2_torch",
			func(a *pyobj.Dict) { a.Set("expert_tensor_parallel_size", int64(1)) },
			[]string{"model_optim_rng.pt", "expert_tensor_parallel_size 1 differs from tensor_model_parallel_size 2 with the distributed optimizer"}},
		// args that contradict the stored shapes.
		{"num_experts", "core0_15_gmm_tp2_ep2_h13_torch",
			func(a *pyobj.Dict) { a.Set("num_experts", int64(12)) },
			[]string{"model_optim_rng.pt", "decoder.layers.0.mlp.experts.weight1", "expert hidden size of 2 but args.moe_ffn_hidden_size is 4"}},
		{"num_experts at expert TP 1", "core0_15_gmm_tp2_etp1_ep2_h13_torch",
			func(a *pyobj.Dict) { a.Set("num_experts", int64(8)) },
			[]string{"model_optim_rng.pt", "decoder.layers.0.mlp.experts.weight1", "expert hidden size of 3 but args.moe_ffn_hidden_size is 6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testkit.CopyTree(t, testkit.Fixture("megatron", tc.fixture, "checkpoint"))
			// TP 2 x EP 2 saves 4 folders; with expert TP 1 the ranks
			// (tp, ep) = (0, 0) and (1, 1) hold every expert-TP part.
			files, err := filepath.Glob(filepath.Join(root, "iter_*", "mp_rank_*", "model_optim_rng.pt"))
			if err != nil || len(files) < 2 {
				t.Fatalf("%v: %v", files, err)
			}
			for _, f := range files {
				rewrite(t, f, func(r pyobj.Value) pyobj.Value {
					tc.edit(argsOf(r))
					return r
				})
			}
			wantError(t, root, Options{}, tc.want...)
		})
	}
}

// torch_dist: GroupedMLP saves each EP rank's experts as one chunk of nle
// entries on the expert axis, cut into one chunk per expert; every expert
// then reads as SequentialMLP's (TestDistFixtures compares the values).
func TestGroupedDist(t *testing.T) {
	for _, c := range []struct {
		name     string
		E        int
		fc1, fc2 []int64
		pattern  string // of fc1
	}{
		{"core0_15_gmm_tp2_ep2_dist", 4, []int64{16, 12}, []int64{12, 8}, "Shard-NC"},
		{"core0_15_gmm_tp2_ep2_h13_dist", 6, []int64{8, 13}, []int64{13, 4}, "Shard-NC"},
		{"core0_15_gmm_tp2_etp1_ep2_h13_dist", 4, []int64{12, 13}, []int64{13, 6}, "Shard-V"}, // whole, in two chunks (gate, up)
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl := indexDist(t, distCase(c.name), Options{VocabSize: 50})
			for l := 0; l < 2; l++ {
				for e := 0; e < c.E; e++ {
					pre := fmt.Sprintf("decoder.layers.%d.mlp.experts.local_experts.%d.", l, e)
					fc1, fc2 := tbl.Param(pre+"linear_fc1.weight"), tbl.Param(pre+"linear_fc2.weight")
					if fc1 == nil || fc2 == nil {
						t.Fatalf("%s: missing", pre)
					}
					if !reflect.DeepEqual(fc1.Shape, c.fc1) || !reflect.DeepEqual(fc2.Shape, c.fc2) {
						t.Errorf("%s: shapes %v, %v, want %v, %v", pre, fc1.Shape, fc2.Shape, c.fc1, c.fc2)
					}
					if k, _ := fragment.Classify(fc1); k.String() != c.pattern {
						t.Errorf("%s linear_fc1: pattern %v, want %s", pre, k, c.pattern)
					}
				}
			}
		})
	}
}

// GroupedMLP's dp_reshardable and fully_sharded_model_space optimizer
// states keep the fused layout: refused, naming the folder and why.
func TestGroupedDistRefused(t *testing.T) {
	root := testkit.CopyTree(t, distCase("core0_15_gmm_tp2_ep2_dist"))
	common := filepath.Join(root, "iter_0000002", "common.pt")
	rewrite(t, common, func(r pyobj.Value) pyobj.Value {
		od, _ := r.(*pyobj.Dict).Get("optimizer")
		d := od.(*pyobj.Dict)
		for i := 0; i < d.Len(); i++ {
			_, sub := d.Item(i)
			sub.(*pyobj.Dict).Set("param_state_sharding_type", "fully_sharded_model_space")
		}
		return r
	})
	wantDistError(t, root, "GroupedMLP experts", "fully_sharded_model_space optimizer state", "fused weight1/weight2 layout")
}

// groupedMLP tells GroupedMLP from the other expert layouts by args when
// no chunk spans several experts (one local expert).
func TestGroupedMLPArgs(t *testing.T) {
	for _, c := range []struct {
		args map[string]pyobj.Value
		want bool
	}{
		{map[string]pyobj.Value{"moe_grouped_gemm": true, "transformer_impl": "local"}, true},
		{map[string]pyobj.Value{"moe_grouped_gemm": true, "transformer_impl": "transformer_engine"}, false},
		{map[string]pyobj.Value{"moe_grouped_gemm": true, "transformer_impl": "transformer_engine", "moe_use_legacy_grouped_gemm": true}, true},
		{map[string]pyobj.Value{"moe_grouped_gemm": false, "transformer_impl": "local"}, false},
		{map[string]pyobj.Value{}, false},
	} {
		d := pyobj.NewDict(pyobj.PlainDict)
		for k, v := range c.args {
			d.Set(k, v)
		}
		r := &distReader{dir: "x", args: &pyobj.Object{State: d}}
		if got, err := r.groupedMLP(); err != nil || got != c.want {
			t.Errorf("args %v: groupedMLP %v, %v; want %v", c.args, got, err, c.want)
		}
	}
	if got, err := (&distReader{dir: "x"}).groupedMLP(); err != nil || got {
		t.Errorf("no args: %v, %v", got, err)
	}
}

// The same GroupedMLP run saved as --ckpt-format torch and as torch_dist
// (same seeds, same optimizer): the legacy reader's fused weight1 [H, E*G*F]
// / weight2 [E*F, H] hold, per expert, the dist reader's linear_fc1 [G*F, H]
// / linear_fc2 [H, F] transposed (weight1's memory is [E, H, G*F]), for every
// state, when EP divides H and when it does not.
func TestGroupedTorchAndDistAgree(t *testing.T) {
	for _, c := range []struct {
		name        string
		E, H, GF, F int64
	}{
		{"core0_15_gmm_tp2_ep2", 4, 12, 16, 8},
		{"core0_15_gmm_tp2_ep2_h13", 6, 13, 8, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			legacy := testkit.Convert(t, index(t, testkit.Fixture("megatron", c.name+"_torch", "checkpoint"), Options{}), 2)
			dist := testkit.Convert(t, indexDist(t, distCase(c.name+"_dist"), Options{VocabSize: 50}), 2)
			read := func(dir, name, state string) []float32 {
				t.Helper()
				raw, _, err := testkit.ReadAtomic(filepath.Join(dir, atomic.StatePath(name, state)))
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(raw)/4)
				for i := range out {
					out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
				}
				return out
			}
			for _, state := range []string{fragment.FP32, "exp_avg", "exp_avg_sq"} {
				for l := 0; l < 2; l++ {
					pre := fmt.Sprintf("decoder.layers.%d.mlp.experts.", l)
					w1, w2 := read(legacy, pre+"weight1", state), read(legacy, pre+"weight2", state)
					for g := int64(0); g < c.E; g++ {
						fc1 := read(dist, fmt.Sprintf("%slocal_experts.%d.linear_fc1.weight", pre, g), state)
						fc2 := read(dist, fmt.Sprintf("%slocal_experts.%d.linear_fc2.weight", pre, g), state)
						for h := int64(0); h < c.H; h++ {
							for k := int64(0); k < c.GF; k++ {
								if a, b := w1[(g*c.H+h)*c.GF+k], fc1[k*c.H+h]; a != b {
									t.Fatalf("%s %s: weight1 expert %d (h %d, %d) = %v, linear_fc1 %v", pre, state, g, h, k, a, b)
								}
							}
							for f := int64(0); f < c.F; f++ {
								if a, b := w2[(g*c.F+f)*c.H+h], fc2[h*c.F+f]; a != b {
									t.Fatalf("%s %s: weight2 expert %d (f %d, h %d) = %v, linear_fc2 %v", pre, state, g, f, h, a, b)
								}
							}
						}
					}
				}
			}
		})
	}
}
