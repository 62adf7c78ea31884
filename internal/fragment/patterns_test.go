package fragment

import (
	"reflect"
	"testing"

	"github.com/ucp-project/ucp/internal/torchfile"
)

// rowsOf returns, for each row of rank r's shard, the full-tensor row it
// holds (-1 for padding), for a 2-D tensor split along dim 0.
func rowsOf(t *testing.T, s Shard, full []int64) []int64 {
	t.Helper()
	cols := full[1]
	rows := make([]int64, s.Shape[0])
	for i := range rows {
		rows[i] = -1
	}
	s.Runs(full, 0, torchfile.Numel(s.Shape), func(r Run) {
		for k := int64(0); k < r.N; k += cols {
			rows[(r.Local+k)/cols] = (r.Full + k) / cols
		}
	})
	return rows
}

func TestSubParamsGQA(t *testing.T) {
	// GQA with uneven shards (formats/deepspeed/FORMAT.md, sub_param_shard_widths; as DeepSpeed's
	// test_merge_tp_slices_uses_uneven_sub_param_widths):
	// shape [(6,3,3), 2], widths [[4,2],[2,1],[2,1]].
	p := SubParams{Dim: 0, Widths: [][]int64{{4, 2}, {2, 1}, {2, 1}}}
	full := []int64{12, 2}
	want := [][]int64{{0, 1, 2, 3, 6, 7, 9, 10}, {4, 5, 8, 11}}
	for r := 0; r < 2; r++ {
		s, err := p.Shard(full, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := rowsOf(t, s, full); !reflect.DeepEqual(got, want[r]) {
			t.Errorf("rank %d rows %v, want %v", r, got, want[r])
		}
	}
	if got := p.SubParamWidths(); !reflect.DeepEqual(got, []int64{6, 3, 3}) {
		t.Errorf("widths %v", got)
	}
}

func TestSwiGLU(t *testing.T) {
	// SwiGLU (formats/megatron/NOTES.md, formats/deepspeed/FORMAT.md): T=2, ffn=4: rank0 [g0 g1 | u0 u1], rank1 [g2 g3 | u2 u3];
	// full = [g0 g1 g2 g3 u0 u1 u2 u3].
	p, err := EqualSubParams(0, 2, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	full := []int64{8, 3}
	want := [][]int64{{0, 1, 4, 5}, {2, 3, 6, 7}}
	for r := 0; r < 2; r++ {
		s, _ := p.Shard(full, r, 2)
		if got := rowsOf(t, s, full); !reflect.DeepEqual(got, want[r]) {
			t.Errorf("rank %d rows %v, want %v", r, got, want[r])
		}
	}
}

func TestVocabStripPad(t *testing.T) {
	// Vocabulary of 5 padded to 8 over 2 ranks: rank 1 holds rows 4..7, of which only 4 is real.
	padded := []int64{8, 3}
	var rows [][]int64
	for r := 0; r < 2; r++ {
		s, err := Split{Dim: 0}.Shard(padded, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		s = StripPad(s, padded, 0, 5)
		rows = append(rows, rowsOf(t, s, []int64{5, 3}))
	}
	want := [][]int64{{0, 1, 2, 3}, {4, -1, -1, -1}}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows %v, want %v", rows, want)
	}
	st := &State{}
	for r := 0; r < 2; r++ {
		s, _ := Split{Dim: 0}.Shard(padded, r, 2)
		st.Shards = append(st.Shards, StripPad(s, padded, 0, 5))
	}
	if n := PaddingElems(st); n != 9 {
		t.Errorf("padding %d, want 9", n)
	}
}

func TestChunkSizes(t *testing.T) {
	for _, tc := range []struct {
		L    int64
		T    int
		want []int64
	}{{10, 4, []int64{3, 3, 3, 1}}, {9, 4, []int64{3, 3, 3, 0}}, {5, 4, []int64{2, 2, 1, 0}}, {8, 4, []int64{2, 2, 2, 2}}, {0, 2, []int64{0, 0}}} {
		if got := ChunkSizes(tc.L, tc.T); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ChunkSizes(%d,%d) = %v, want %v", tc.L, tc.T, got, tc.want)
		}
	}
}

func param(full []int64, p Pattern, T int, avg bool) *Param {
	shards, err := Shards(p, full, T)
	if err != nil {
		panic(err)
	}
	return &Param{Shape: full, Average: avg, States: []*State{{Name: "fp32", Shards: shards}}}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		p    *Param
		want Kind
		dims []int
	}{
		{"unique", param([]int64{4, 6}, Whole{}, 1, false), Unique, nil},
		{"replicate", param([]int64{6}, Replicated{}, 2, false), Replicate, nil},
		{"partial", param([]int64{6}, Averaged{}, 2, true), Partial, nil},
		{"shard-v", param([]int64{4, 6}, Split{Dim: 0}, 2, false), ShardV, []int{0}},
		{"shard-h", param([]int64{4, 6}, Split{Dim: 1}, 2, false), ShardH, []int{1}},
		{"shard-hy", param([]int64{4, 6}, Grid{Dims: []int{0, 1}, Counts: []int{2, 2}}, 4, false), ShardHy, []int{0, 1}},
		{"shard-nc", param([]int64{8, 3}, SubParams{Dim: 0, Widths: [][]int64{{2, 2}, {2, 2}}}, 2, false), ShardNC, []int{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, dims := Classify(tc.p)
			if k != tc.want || !reflect.DeepEqual(dims, tc.dims) {
				t.Errorf("Classify = %v %v, want %v %v", k, dims, tc.want, tc.dims)
			}
			if err := tc.p.States[0].Validate(tc.p.Shape); err != nil && len(tc.p.States[0].Frags) > 0 {
				t.Error(err)
			}
		})
	}
}

func TestShardsTileFullTensor(t *testing.T) {
	// Every pattern's placed shards cover every element of the full tensor once.
	tests := []struct {
		p    Pattern
		full []int64
		T    int
	}{
		{Split{Dim: 0}, []int64{8, 3}, 4},
		{Split{Dim: 1}, []int64{3, 8}, 2},
		{Split{Dim: 0, Sizes: ChunkSizes(9, 4)}, []int64{9, 2}, 4},
		{Grid{Dims: []int{0, 1}, Counts: []int{2, 3}}, []int64{4, 6}, 6},
		{SubParams{Dim: 0, Widths: [][]int64{{4, 2}, {2, 1}, {2, 1}}}, []int64{12, 2}, 2},
		{Replicated{}, []int64{5}, 3},
	}
	for _, tc := range tests {
		shards, err := Shards(tc.p, tc.full, tc.T)
		if err != nil {
			t.Fatal(err)
		}
		seen := make([]int, torchfile.Numel(tc.full))
		for _, s := range shards {
			if s.Replica > 0 {
				continue
			}
			s.Runs(tc.full, 0, torchfile.Numel(s.Shape), func(r Run) {
				for k := int64(0); k < r.N; k++ {
					seen[r.Full+k]++
				}
			})
		}
		for i, n := range seen {
			if n != 1 {
				t.Errorf("%T %v: element %d placed %d times", tc.p, tc.full, i, n)
				break
			}
		}
	}
}
