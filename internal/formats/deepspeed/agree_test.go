package deepspeed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

// TestMixedRunsRefused: a rank file taken from another run of the same
// model (same partition sizes, so nothing else notices) is refused,
// naming both files and the field they disagree on. All inputs are
// checkpoints written by the real DeepSpeed engine.
func TestMixedRunsRefused(t *testing.T) {
	const step = "global_step3"
	rank1 := filepath.Join(step, "zero_pp_rank_1_mp_rank_00_optim_states.pt")
	real := func(c string) string { return testkit.Fixture("deepspeed-real", c, "checkpoint") }
	copyFrom := func(c, name string) func(t *testing.T, d string) {
		return func(t *testing.T, d string) {
			b, err := os.ReadFile(filepath.Join(real(c), step, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, rank1), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		base   string
		break_ func(t *testing.T, d string)
		want   []string
	}{
		{"rank 1 of an fp16 run", "z1_dp2_fp32", copyFrom("z1_dp2_fp16", filepath.Base(rank1)),
			[]string{"different runs", `ds_config differs at ["fp16"]`, "mp_rank_00_model_states.pt (model-parallel rank 0) has nothing",
				"zero_pp_rank_1_mp_rank_00_optim_states.pt (rank dp 1 mp 0) has {\"enabled\": True"}},
		{"rank 1 of a BF16_Optimizer run", "z1_dp2_fp32", copyFrom("bf16opt_z1_dp2", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
			[]string{"different runs", "optimizer wrapper differs", "ZeRO stage 1", "BF16_Optimizer"}},
		{"rank 1 of an fp32 run into fp16", "z1_dp2_fp16", copyFrom("z1_dp2_fp32", filepath.Base(rank1)),
			[]string{"different runs", `ds_config differs at ["fp16"]`}},
		{"rank 1 at step 7", "z1_dp2_fp32", func(t *testing.T, d string) {
			testkit.SetStep(t, filepath.Join(d, rank1), 7, "optimizer_state_dict", "base_optimizer_state", "state")
		}, []string{"step of param group 0 differs", "zero_pp_rank_0_mp_rank_00_optim_states.pt (rank dp 0 mp 0) has 3", "zero_pp_rank_1_mp_rank_00_optim_states.pt (rank dp 1 mp 0) has 7"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testkit.CopyTree(t, real(tc.base))
			tc.break_(t, d)
			_, err := Index(context.Background(), d, Options{})
			if err == nil {
				t.Fatal("converted rank files of two runs")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
