package deepspeed

import (
	"context"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// editFile returns an edit that sets key (a path of dict keys) to v in a
// file's root dict.
func set(v pyobj.Value, keys ...pyobj.Value) func(root pyobj.Value) pyobj.Value {
	return func(root pyobj.Value) pyobj.Value {
		d := root.(*pyobj.Dict)
		for _, k := range keys[:len(keys)-1] {
			next, _ := d.Get(k)
			switch x := next.(type) {
			case *pyobj.Dict:
				d = x
			case *pyobj.List:
				d = x.Items[0].(*pyobj.Dict)
			}
		}
		d.Set(keys[len(keys)-1], v)
		return root
	}
}

// Malformed values of real keys are errors naming the file, the key path and
// what was wanted; none is taken for "absent" or read as a default.
func TestMalformedValues(t *testing.T) {
	const model, optim = "mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
	cases := []struct {
		name, fixture, file string
		edit                func(pyobj.Value) pyobj.Value
		want                string
	}{
		// Today's reader took these for a checkpoint without the info and
		// wrote a replacement.
		{"universal info a string", "z2_frozen_buffers_dp2", model, set("0.2", "universal_checkpoint_info"),
			model + `: ["universal_checkpoint_info"]: got str, want dict`},
		{"universal info a list", "megatron_tp2_bf16opt_dp2", model, set(&pyobj.List{}, "universal_checkpoint_info"),
			model + `: ["universal_checkpoint_info"]: got list, want dict`},
		// Read where it is stored, not reported later as missing.
		{"vocabulary size a string", "megatron_tp2_bf16opt_dp2", model, set("24", "universal_checkpoint_info", "original_vocab_size"),
			model + `: ["universal_checkpoint_info"]["original_vocab_size"]: got str, want int`},
		{"version a string", "megatron_tp2_bf16opt_dp2", model, set("0.2", "universal_checkpoint_info", "universal_checkpoint_version"),
			`["universal_checkpoint_info"]["universal_checkpoint_version"]: got str, want float`},
		{"sub-param widths a list", "megatron_tp2_unevengqa_z2_bf16_dp3", model, set(&pyobj.List{}, "universal_checkpoint_info", "sub_param_shard_widths"),
			`["universal_checkpoint_info"]["sub_param_shard_widths"]: got list, want dict`},
		{"unsupported patterns a list", "megatron_tp2_bf16opt_dp2", model, set(&pyobj.List{Items: []pyobj.Value{"x"}}, "universal_checkpoint_info", "autotp_unsupported_parameter_patterns"),
			`["autotp_unsupported_parameter_patterns"]: got list, want dict`},
		{"dp_world_size a string", "z1_fp32_dp2", "mp_rank_00_model_states.pt", set("2", "dp_world_size"),
			`["dp_world_size"]: got str, want int`},
		{"mp_world_size a string", "z1_fp32_dp2", "mp_rank_00_model_states.pt", set("1", "mp_world_size"),
			`["mp_world_size"]: got str, want int`},
		{"parallel dimensions a string degree", "z1_fp32_dp2", "mp_rank_00_model_states.pt",
			set(pyobj.DictOf("pp_degree", int64(1), "tp_degree", "1"), "checkpoint_parallel_dimensions"),
			`["checkpoint_parallel_dimensions"]["tp_degree"]: got str, want int`},
		{"shared_params a list", "z2_frozen_buffers_dp2", model, set(&pyobj.List{Items: []pyobj.Value{"x"}}, "shared_params"),
			`["shared_params"]: got list, want dict`},
		{"frozen shapes a list", "z2_frozen_buffers_dp2", model, set(&pyobj.List{}, "frozen_param_shapes"),
			`["frozen_param_shapes"]: got list, want dict`},
		{"buffer names a string", "z2_frozen_buffers_dp2", model, set("bn.running_mean", "buffer_names"),
			`["buffer_names"]: got str, want a list of str`},
		{"param_shapes name an int", "z1_fp32_dp2", "mp_rank_00_model_states.pt", set(pyobj.Size{2}, "param_shapes", int64(7)),
			`["param_shapes"][0]: key 7 is int, want str`},
		{"group paddings a string", "z2_frozen_buffers_dp2", optim, set("0", "optimizer_state_dict", "group_paddings"),
			`["optimizer_state_dict"]["group_paddings"]: got str, want a list of ints`},
		{"slice mappings of a group a string", "z2_frozen_buffers_dp2", optim, set(&pyobj.List{Items: []pyobj.Value{"x"}}, "optimizer_state_dict", "param_slice_mappings"),
			`["optimizer_state_dict"]["param_slice_mappings"][0]: got str, want dict`},
		{"exp_avg a list", "z1_fp32_dp2", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
			func(root pyobj.Value) pyobj.Value {
				osd, _ := root.(*pyobj.Dict).Get("optimizer_state_dict")
				base, _ := osd.(*pyobj.Dict).Get("base_optimizer_state")
				st, _ := base.(*pyobj.Dict).Get("state")
				g0, _ := st.(*pyobj.Dict).Get(int64(0))
				g0.(*pyobj.Dict).Set("exp_avg", &pyobj.List{})
				return root
			}, `["optimizer_state_dict"]["base_optimizer_state"]["state"][0]["exp_avg"]: got list, want tensor`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := testkit.BreakFile(t, testkit.Fixture("deepspeed", c.fixture, "checkpoint"), c.file, c.edit)
			_, err := Index(context.Background(), dir, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.file) {
				t.Fatalf("error %v\nwant one containing %s and %s", err, c.file, c.want)
			}
		})
	}
}
