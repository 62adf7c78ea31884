package megatron

import (
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestDistBucketArgsBadInput: the dp_reshardable reader places the
// bucketed optimizer state by the saving run's args (layers, pipeline
// split, expert degrees); args that disagree with the saved model are an
// error naming the checkpoint and the arg, never a misplaced bucket. The
// folders are ucp's core 0.18 writes (args in common.pt, which a test can
// edit) of a real core 0.19 save, read back unedited first.
func TestDistBucketArgsBadInput(t *testing.T) {
	a := convertFixture(t, "dist/core0_19_tp2_pp2_tied_bf16_dprs_args")
	save := writeDist(t, a, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018, OptimSharding: DPReshardable})
	indexDist(t, save, Options{}) // the unedited write reads
	cases := []struct {
		name string
		edit func(pyobj.Value) pyobj.Value
		want string
	}{
		{"num_layers", setIn(int64(6), "args", "num_layers"), "args.num_layers is 6 but decoder layers 0..1 are saved"},
		{"custom pipeline layout", setIn("Et|tL", "args", "pipeline_model_parallel_layout"), "args.pipeline_model_parallel_layout is set"},
		{"first stage takes every layer", setIn(int64(2), "args", "decoder_first_pipeline_num_layers"), "the saving run's pipeline split"},
		{"pipeline size", setIn(int64(4), "args", "pipeline_model_parallel_size"), "args.pipeline_model_parallel_size is 4"},
		{"virtual pipeline not dividing", setIn(int64(3), "args", "virtual_pipeline_model_parallel_size"), "the saving run's pipeline split"},
		{"experts without expert state", setIn(int64(2), "args", "expert_model_parallel_size"), "no bucketed state of an expert optimizer"},
		{"num_layers a string", setIn("4", "args", "num_layers"), "num_layers"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := testkit.CopyTree(t, save)
			iters, err := filepath.Glob(filepath.Join(dir, "iter_*", commonFile))
			if err != nil || len(iters) != 1 {
				t.Fatalf("common.pt of %s: %v %v", dir, iters, err)
			}
			rewrite(t, iters[0], c.edit)
			wantDistError(t, dir, filepath.Base(dir), c.want)
		})
	}
}
