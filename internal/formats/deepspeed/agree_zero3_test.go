package deepspeed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

// TestMixedRunsRefusedZero3: the real ZeRO-3 checkpoint with rank 1's files
// from another run, or rank 1 at another step, is refused, naming the
// files, the ranks and the values.
func TestMixedRunsRefusedZero3(t *testing.T) {
	const step = "global_step3"
	real := testkit.Fixture("deepspeed-real", "z3_dp2_fp32", "checkpoint")
	tests := []struct {
		name   string
		break_ func(t *testing.T, d string)
		want   []string
	}{
		{"rank 1 at step 7", func(t *testing.T, d string) {
			testkit.SetStep(t, filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), 7, "optimizer_state_dict", "optimizer_state_dict", "state")
		}, []string{"different runs", "step of param group 0 differs", "zero_pp_rank_0_mp_rank_00_optim_states.pt (rank dp 0 mp 0) has 3",
			"zero_pp_rank_1_mp_rank_00_optim_states.pt (rank dp 1 mp 0) has 7"}},
		{"rank 1 of an fp16 run", func(t *testing.T, d string) {
			for _, k := range []string{"model", "optim"} {
				name := "zero_pp_rank_1_mp_rank_00_" + k + "_states.pt"
				b, err := os.ReadFile(testkit.Fixture("zero3", "dp2_fp16", "checkpoint", step, name))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, step, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"different runs", `ds_config differs at ["fp16"]`, "zero_pp_rank_1_mp_rank_00_model_states.pt (rank dp 1 mp 0)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testkit.CopyTree(t, real)
			tc.break_(t, d)
			_, err := IndexZero3(context.Background(), d, Zero3Options{})
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
