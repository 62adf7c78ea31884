package fragment

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/torchfile"
)

// bruteRuns maps every local element of [start, start+n) one by one.
func bruteRuns(s *Shard, full []int64, start, n int64) map[int64]int64 {
	out := map[int64]int64{}
	lst := torchfile.ContiguousStrides(s.Shape)
	fst := torchfile.ContiguousStrides(full)
	for i := start; i < start+n; i++ {
		if s.Maps == nil {
			out[i] = i
			continue
		}
		// unravel i in the shard
		idx := make([]int64, len(s.Shape))
		rem := i
		for d := range s.Shape {
			idx[d] = rem / lst[d]
			rem %= lst[d]
		}
		for _, m := range s.Maps {
			in := true
			var f int64
			for d := range idx {
				if idx[d] < m.From[d] || idx[d] >= m.From[d]+m.Size[d] {
					in = false
					break
				}
				f += (idx[d] - m.From[d] + m.To[d]) * fst[d]
			}
			if in {
				out[i] = f
			}
		}
	}
	return out
}

func collect(s *Shard, full []int64, start, n int64) (map[int64]int64, int) {
	out := map[int64]int64{}
	runs := 0
	s.Runs(full, start, n, func(r Run) {
		runs++
		for k := int64(0); k < r.N; k++ {
			out[r.Local+k] = r.Full + k
		}
	})
	return out, runs
}

func TestRunsMatchBruteForce(t *testing.T) {
	tests := []struct {
		name     string
		full     []int64
		shard    Shard
		wantRuns int // for the whole shard, -1 to skip
	}{
		{"identity", []int64{4, 5}, Shard{Shape: []int64{4, 5}}, 1},
		{"shard-v rank1", []int64{6, 5}, Shard{Shape: []int64{3, 5}, Maps: []BoxMap{{From: []int64{0, 0}, To: []int64{3, 0}, Size: []int64{3, 5}}}}, 1},
		{"shard-h rank1", []int64{4, 6}, Shard{Shape: []int64{4, 3}, Maps: []BoxMap{{From: []int64{0, 0}, To: []int64{0, 3}, Size: []int64{4, 3}}}}, 4},
		{"vocab strip", []int64{5, 3}, Shard{Shape: []int64{4, 3}, Maps: []BoxMap{{From: []int64{0, 0}, To: []int64{4, 0}, Size: []int64{1, 3}}}}, 1},
		{"swiglu rank1 of 2", []int64{8, 3}, Shard{Shape: []int64{4, 3}, Maps: []BoxMap{
			{From: []int64{0, 0}, To: []int64{2, 0}, Size: []int64{2, 3}},
			{From: []int64{2, 0}, To: []int64{6, 0}, Size: []int64{2, 3}}}}, 2},
		{"3d box", []int64{2, 4, 6}, Shard{Shape: []int64{2, 2, 3}, Maps: []BoxMap{{From: []int64{0, 0, 0}, To: []int64{0, 2, 3}, Size: []int64{2, 2, 3}}}}, 4},
		{"0-dim", []int64{}, Shard{Shape: []int64{}, Maps: []BoxMap{{From: []int64{}, To: []int64{}, Size: []int64{}}}}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := torchfile.Numel(tc.shard.Shape)
			for start := int64(0); start <= n; start++ {
				for l := int64(0); start+l <= n; l++ {
					want := bruteRuns(&tc.shard, tc.full, start, l)
					got, runs := collect(&tc.shard, tc.full, start, l)
					if len(got) != len(want) {
						t.Fatalf("[%d,%d): %d elements placed, want %d", start, start+l, len(got), len(want))
					}
					for k, v := range want {
						if got[k] != v {
							t.Fatalf("[%d,%d): element %d -> %d, want %d", start, start+l, k, got[k], v)
						}
					}
					if start == 0 && l == n && tc.wantRuns >= 0 && runs != tc.wantRuns {
						t.Errorf("whole shard: %d runs, want %d", runs, tc.wantRuns)
					}
				}
			}
		})
	}
}

func TestRunsRandomBoxes(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 300; iter++ {
		nd := 1 + rng.Intn(3)
		full := make([]int64, nd)
		shape := make([]int64, nd)
		m := BoxMap{From: make([]int64, nd), To: make([]int64, nd), Size: make([]int64, nd)}
		for d := 0; d < nd; d++ {
			full[d] = 1 + rng.Int63n(5)
			shape[d] = 1 + rng.Int63n(5)
			m.Size[d] = rng.Int63n(min(full[d], shape[d]) + 1)
			m.From[d] = rng.Int63n(shape[d] - m.Size[d] + 1)
			m.To[d] = rng.Int63n(full[d] - m.Size[d] + 1)
		}
		s := Shard{Shape: shape, Maps: []BoxMap{m}}
		n := torchfile.Numel(shape)
		start := rng.Int63n(n + 1)
		l := rng.Int63n(n - start + 1)
		want := bruteRuns(&s, full, start, l)
		got, _ := collect(&s, full, start, l)
		if len(got) != len(want) {
			t.Fatalf("%v %+v [%d,%d): %d placed, want %d", full, m, start, start+l, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%v %+v: element %d -> %d, want %d", full, m, k, got[k], v)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	ref := TensorRef{Path: "x", T: &torchfile.Tensor{Shape: []int64{100}, Stride: []int64{1}}}
	v := func(sh []int64, to []int64, size []int64) Shard {
		return Shard{Shape: sh, Maps: []BoxMap{{From: make([]int64, len(sh)), To: to, Size: size}}}
	}
	tests := []struct {
		name    string
		st      State
		wantErr string
	}{
		{"ok split", State{Shards: []Shard{v([]int64{2, 3}, []int64{0, 0}, []int64{2, 3}), v([]int64{2, 3}, []int64{2, 0}, []int64{2, 3})},
			Frags: []Fragment{{Shard: 0, Len: 6, Src: ref}, {Shard: 1, Len: 4, Src: ref}, {Shard: 1, LocalStart: 4, Len: 2, Src: ref, SrcStart: 10}}}, ""},
		{"overlap", State{Shards: []Shard{v([]int64{2, 3}, []int64{0, 0}, []int64{2, 3}), v([]int64{2, 3}, []int64{1, 0}, []int64{2, 3})}}, "overlap"},
		{"gap", State{Shards: []Shard{v([]int64{2, 3}, []int64{0, 0}, []int64{2, 3})}}, "place 6 of the 12"},
		{"frag hole", State{Shards: []Shard{{Shape: []int64{4, 3}}}, Frags: []Fragment{{Shard: 0, Len: 5, Src: ref}, {Shard: 0, LocalStart: 6, Len: 6, Src: ref}}}, "come from no fragment"},
		{"frag twice", State{Shards: []Shard{{Shape: []int64{4, 3}}}, Frags: []Fragment{{Shard: 0, Len: 7, Src: ref}, {Shard: 0, LocalStart: 6, Len: 6, Src: ref}}}, "two fragments"},
		{"frag past source", State{Shards: []Shard{{Shape: []int64{4, 3}}}, Frags: []Fragment{{Shard: 0, Len: 12, Src: ref, SrcStart: 95}}}, "outside the stored tensor"},
		{"replica not counted", State{Shards: []Shard{{Shape: []int64{4, 3}}, {Shape: []int64{4, 3}, Replica: 1}},
			Frags: []Fragment{{Shard: 0, Len: 12, Src: ref}, {Shard: 1, Len: 12, Src: ref}}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.st.Validate([]int64{4, 3})
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
