package deepspeed

import (
	"context"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// dictAt returns the dict reached from root by keys (ints index lists).
func dictAt(root pyobj.Value, keys ...pyobj.Value) *pyobj.Dict {
	v := root
	for _, k := range keys {
		if l, ok := v.(*pyobj.List); ok {
			v = l.Items[k.(int)]
			continue
		}
		v, _ = v.(*pyobj.Dict).Get(k)
	}
	return v.(*pyobj.Dict)
}

// Malformed values of real keys are errors naming the file, the key path and
// what was wanted; none is taken for "absent" or read as a default.
func TestMalformedValuesZero3(t *testing.T) {
	const model, optim = "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"
	cases := []struct {
		name, file string
		edit       func(root pyobj.Value)
		want       string
	}{
		{"universal info a string", model, func(r pyobj.Value) { dictAt(r).Set("universal_checkpoint_info", "0.2") },
			`["universal_checkpoint_info"]: got str, want dict`},
		{"vocabulary size a string", model, func(r pyobj.Value) {
			dictAt(r).Set("universal_checkpoint_info", pyobj.DictOf("original_vocab_size", "24"))
		}, `["universal_checkpoint_info"]["original_vocab_size"]: got str, want int`},
		{"frozen shapes a list", model, func(r pyobj.Value) { dictAt(r).Set("frozen_param_shapes", &pyobj.List{}) },
			`["frozen_param_shapes"]: got list, want dict`},
		{"buffer names a string", model, func(r pyobj.Value) { dictAt(r).Set("buffer_names", "x") },
			`["buffer_names"]: got str, want a list of str`},
		{"param_shapes name an int", model, func(r pyobj.Value) { dictAt(r, "param_shapes", 0).Set(int64(3), pyobj.Size{2}) },
			`["param_shapes"][0]: key 3 is int, want str`},
		{"partition group count a string", optim, func(r pyobj.Value) {
			dictAt(r, "optimizer_state_dict").Set("ds_zero_partition_groups",
				&pyobj.List{Items: []pyobj.Value{pyobj.DictOf("partition_count", "3", "partition_rank", int64(0))}})
		}, `["optimizer_state_dict"]["ds_zero_partition_groups"][0]["partition_count"]: got str, want int`},
		{"sub-group state a string", optim, func(r pyobj.Value) {
			dictAt(r, "optimizer_state_dict", "optimizer_state_dict", "state").Set(int64(0), "x")
		}, `["optimizer_state_dict"]["optimizer_state_dict"]["state"][0]: got str, want dict`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := testkit.BreakFile(t, testkit.Fixture("zero3", "frozen_buffers_dp3_fp16", "checkpoint"), c.file, func(root pyobj.Value) pyobj.Value { c.edit(root); return root })
			_, err := IndexZero3(context.Background(), dir, Zero3Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.file) {
				t.Fatalf("error %v\nwant one containing %s and %s", err, c.file, c.want)
			}
		})
	}
}
