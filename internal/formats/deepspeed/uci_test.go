package deepspeed

import (
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestClassifyWithoutInfo: with no universal_checkpoint_info, shards that
// differ in one dim are concatenated along it; equal shards are refused.
func TestClassifyWithoutInfo(t *testing.T) {
	r, err := ReadRules(pyobj.NewDec("mp_rank_00_model_states.pt", pyobj.NewDict(pyobj.PlainDict)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		shapes  [][]int64
		kind    fragment.Kind
		full    []int64
		wantErr string
	}{
		{[][]int64{{3, 4}, {2, 4}}, fragment.ShardV, []int64{5, 4}, ""},
		{[][]int64{{4, 3}, {4, 3}, {4, 1}}, fragment.ShardH, []int64{4, 7}, ""},
		{[][]int64{{4, 3}, {4, 3}}, 0, nil, "cannot tell whether it is replicated or split"},
		{[][]int64{{4, 3}, {5, 2}}, 0, nil, "cannot tell"},
		{[][]int64{{7}}, fragment.Unique, []int64{7}, ""},
	}
	for i, tc := range tests {
		pl, err := r.Classify("w", tc.shapes)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("case %d: error %v, want %q", i, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if pl.Pattern.Kind() != tc.kind || !torchfile.SameShape(pl.Full, tc.full) {
			t.Errorf("case %d: %v %v, want %v %v", i, pl.Pattern.Kind(), pl.Full, tc.kind, tc.full)
		}
	}
	if len(r.Inferred()) != 2 {
		t.Errorf("inferred %v", r.Inferred())
	}
}

// TestUnmatchedAtTP1: a checkpoint saved at tensor-parallel size 1 keeps
// its universal_checkpoint_info, but no parameter is matched against it:
// its patterns are not reported as matching nothing. With TP shards, an
// unused pattern is.
func TestUnmatchedAtTP1(t *testing.T) {
	model := pyobj.DictOf("universal_checkpoint_info", pyobj.DictOf(
		"universal_checkpoint_version", 0.2,
		"tp_replicated_parameter_patterns", &pyobj.List{Items: []pyobj.Value{`.*layernorm\.weight`, `unused\.bias`}},
	))
	for _, tc := range []struct {
		shapes [][]int64
		want   string
	}{
		{[][]int64{{4}}, ""},
		{[][]int64{{4}, {4}}, `unused\.bias`},
	} {
		r, err := ReadRules(pyobj.NewDec("mp_rank_00_model_states.pt", model))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Classify("final_layernorm.weight", tc.shapes); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(r.Unmatched(), ","); got != tc.want {
			t.Errorf("TP %d: unmatched %q, want %q", len(tc.shapes), got, tc.want)
		}
	}
}
