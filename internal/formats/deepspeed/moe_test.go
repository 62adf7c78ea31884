package deepspeed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

// The checkpoints in testdata/fixtures/deepspeed-moe were written by the real
// DeepSpeed engine with deepspeed.moe.layer.MoE at expert parallelism 2
// (testdata/gen/deepspeed_moe_fixtures.py); ucp's output must equal the full
// state gathered from the live run bit for bit, experts under their global
// numbers.
var moeCases = []struct {
	name         string
	dp, ep, zero int
	dtype        string
}{
	{"moe_ep2_edp2_z2_fp32", 4, 2, 2, "float32"},
	{"moe_ep2_edp1_z1_bf16", 2, 2, 1, "bfloat16"},
}

func TestRealDeepSpeedMoE(t *testing.T) {
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			dir := testkit.Fixture("deepspeed-moe", c.name)
			tbl, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			want := fragment.Degrees{TP: 1, PP: 1, DP: c.dp, EP: c.ep, ZeRO: c.zero}
			if tbl.Degrees != want || tbl.DType != c.dtype {
				t.Fatalf("degrees %+v dtype %s, want %+v %s", tbl.Degrees, tbl.DType, want, c.dtype)
			}
			// embed, 2 x (ln weight and bias, gate), ln_f and head weight and bias: 11 dense;
			// 2 layers x 6 experts x 4 tensors.
			if got := len(tbl.Params); got != 11+2*6*4 {
				t.Fatalf("%d parameters, want %d", got, 11+2*6*4)
			}
			// Experts of a layer in global order, every one present.
			var experts []string
			for _, p := range tbl.Params {
				if strings.HasPrefix(p.Name, "blocks.1.moe.deepspeed_moe.experts.deepspeed_experts.") && strings.HasSuffix(p.Name, ".fc1.weight") {
					experts = append(experts, p.Name)
				}
			}
			if len(experts) != 6 || !strings.Contains(experts[5], "experts.5.fc1") {
				t.Fatalf("layer 1 experts %v", experts)
			}
			if err := tbl.Validate(); err != nil {
				t.Fatal(err)
			}
			for _, workers := range []int{1, 3} {
				dst := testkit.Convert(t, tbl, workers)
				testkit.Check(t, dst, filepath.Join(dir, "truth.pt"))
			}
		})
	}
}

func TestDeepSpeedMoEBadInput(t *testing.T) {
	src := testkit.Fixture("deepspeed-moe", "moe_ep2_edp2_z2_fp32", "checkpoint")
	step := "global_step3"
	tests := []testkit.BrokenCase{
		{Name: "missing expert file", Break: func(d string) error {
			return os.Remove(filepath.Join(d, step, "layer_1_expert_4_mp_rank_00_model_states.pt"))
		}, Want: "MoE layer 1 (blocks.1.moe) expert 4: missing file layer_1_expert_4_mp_rank_00_model_states.pt"},
		{Name: "expert file of another expert", Break: func(d string) error {
			b, err := os.ReadFile(filepath.Join(d, step, "layer_1_expert_3_mp_rank_00_model_states.pt"))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(d, step, "layer_1_expert_4_mp_rank_00_model_states.pt"), b, 0o644)
		}, Want: "layer_1_expert_4_mp_rank_00_model_states.pt: holds blocks.1.moe.deepspeed_moe.experts.deepspeed_experts.3.fc1.weight, not a weight of MoE layer 1 (blocks.1.moe) expert 4"},
		{Name: "extra expert file", Break: func(d string) error {
			b, err := os.ReadFile(filepath.Join(d, step, "layer_1_expert_3_mp_rank_00_model_states.pt"))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(d, step, "layer_1_expert_6_mp_rank_00_model_states.pt"), b, 0o644)
		}, Want: "unexpected expert files [layer_1_expert_6_mp_rank_00_model_states.pt]"},
		{Name: "truncated expert file", Break: func(d string) error {
			p := filepath.Join(d, step, "layer_0_expert_5_mp_rank_00_model_states.pt")
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, b[:len(b)/2], 0o644)
		}, Want: "layer_0_expert_5_mp_rank_00_model_states.pt"},
		{Name: "missing optimizer rank", Break: func(d string) error {
			return os.Remove(filepath.Join(d, step, "zero_pp_rank_3_mp_rank_00_optim_states.pt"))
		}, Want: "missing rank file zero_pp_rank_3_mp_rank_00_optim_states.pt"},
		{Name: "ranks swapped", Break: func(d string) error {
			// rank 1 holds expert-parallel rank 1's experts; as rank 2 it would be expert-data-parallel rank 1 of EP rank 0.
			a, b := filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), filepath.Join(d, step, "zero_pp_rank_2_mp_rank_00_optim_states.pt")
			tmp := a + ".tmp"
			if err := os.Rename(a, tmp); err != nil {
				return err
			}
			if err := os.Rename(b, a); err != nil {
				return err
			}
			return os.Rename(tmp, b)
		}, Want: "param_slice_mappings"},
	}
	testkit.Broken(t, src, tests, func(d string) error {
		_, err := Index(context.Background(), d, Options{})
		return err
	})
}
