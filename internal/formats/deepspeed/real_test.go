package deepspeed

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

// The checkpoints in testdata/fixtures/deepspeed-real were written by the
// real DeepSpeed engine; ucp's output must equal their truth bit for bit
// and carry the same dict keys as DeepSpeed's own universal output.
var realCases = []string{"z1_dp2_fp32", "z2_dp2_bf16", "z1_dp2_fp16", "bf16opt_z1_dp2"}

func TestRealDeepSpeedCheckpoints(t *testing.T) {
	torch := testkit.NewTorchBatch(t)
	for _, c := range realCases {
		t.Run(c, func(t *testing.T) {
			dir := testkit.Fixture("deepspeed-real", c)
			tbl, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tbl.Degrees.DP != 2 || tbl.Degrees.TP != 1 || len(tbl.Params) != 18 {
				t.Fatalf("degrees %+v, %d params", tbl.Degrees, len(tbl.Params))
			}
			for _, workers := range []int{1, 3} {
				dst := testkit.Convert(t, tbl, workers)
				testkit.Check(t, dst, filepath.Join(dir, "truth.pt"))
				if workers == 1 {
					torch.Add(t, c, dst, filepath.Join(dir, "truth.pt"), filepath.Join(dir, "universal"))
				}
			}
		})
	}
	torch.Run(t)
}

func TestBadRankFiles(t *testing.T) {
	src := testkit.Fixture("deepspeed-real", "z1_dp2_fp32", "checkpoint")
	step := "global_step3"
	tests := []testkit.BrokenCase{
		{Name: "missing optimizer rank", Break: func(d string) error {
			return os.Remove(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
		}, Want: "missing rank file zero_pp_rank_1_mp_rank_00_optim_states.pt"},
		{Name: "missing model states", Break: func(d string) error {
			return os.Remove(filepath.Join(d, step, "mp_rank_00_model_states.pt"))
		}, Want: "no mp_rank_*_model_states.pt"},
		{Name: "duplicated rank", Break: func(d string) error {
			b, _ := os.ReadFile(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
			return os.WriteFile(filepath.Join(d, step, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"), b, 0o644)
		}, Want: "duplicated rank file"},
		{Name: "extra rank", Break: func(d string) error {
			b, _ := os.ReadFile(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
			if err := os.WriteFile(filepath.Join(d, step, "zero_pp_rank_2_mp_rank_00_optim_states.pt"), b, 0o644); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(d, step, "zero_pp_rank_3_mp_rank_00_optim_states.pt"), b, 0o644)
		}, Want: "unexpected rank files [zero_pp_rank_2_mp_rank_00_optim_states.pt zero_pp_rank_3_mp_rank_00_optim_states.pt]"},
		{Name: "missing middle rank", Break: func(d string) error {
			b, _ := os.ReadFile(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
			if err := os.WriteFile(filepath.Join(d, step, "zero_pp_rank_3_mp_rank_00_optim_states.pt"), b, 0o644); err != nil {
				return err
			}
			return os.Remove(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
		}, Want: "missing rank file zero_pp_rank_1_mp_rank_00_optim_states.pt"},
		{Name: "truncated optimizer file", Break: func(d string) error {
			p := filepath.Join(d, step, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
			b, _ := os.ReadFile(p)
			return os.WriteFile(p, b[:len(b)/2], 0o644)
		}, Want: "zero_pp_rank_0_mp_rank_00_optim_states.pt"},
		{Name: "inconsistent ranks", Break: func(d string) error {
			// rank 1's file claims to be rank 0's partition: the mappings disagree.
			b, _ := os.ReadFile(filepath.Join(d, step, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
			return os.WriteFile(filepath.Join(d, step, "zero_pp_rank_1_mp_rank_00_optim_states.pt"), b, 0o644)
		}, Want: "param_slice_mappings"},
		{Name: "latest names no tag", Break: func(d string) error {
			return os.WriteFile(filepath.Join(d, "latest"), []byte("global_step9"), 0o644)
		}, Want: "global_step9"},
	}
	testkit.Broken(t, src, tests, func(d string) error {
		_, err := Index(context.Background(), d, Options{})
		return err
	})
}
