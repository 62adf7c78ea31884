package megatron

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// Broken flattened_range checkpoints (core 0.14 fully_sharded_model_space)
// give errors naming the folder, file and key.
func TestDistFlatBadInput(t *testing.T) {
	const c = "core0_14_tp2_dp2_bf16_fsms"
	const fc2 = "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight"
	// setOrig sets fc2's nd_reformulated_orig_global_shape in mcore_data.
	setOrig := func(t *testing.T, md *dcp.Metadata, v pyobj.Value) {
		d, ok := md.Attrs["mcore_data"].(*pyobj.Dict)
		if !ok {
			t.Fatalf("no mcore_data dict: %v", md.Unknown)
		}
		e, _ := d.Get(fc2)
		ed, ok := e.(*pyobj.Dict)
		if !ok {
			t.Fatalf("mcore_data[%s] is %s", fc2, pyobj.TypeName(e))
		}
		ed.Set("nd_reformulated_orig_global_shape", v)
	}
	cases := []struct {
		name   string
		change func(t *testing.T, md *dcp.Metadata)
		want   []string
	}{
		{"hole in the flattened ranges", func(t *testing.T, md *dcp.Metadata) {
			e := entry(t, md, fc2)
			e.Chunks = e.Chunks[1:]
		}, []string{"iter_0000002", fc2, "chunks cover"}},
		{"no mcore_data", func(t *testing.T, md *dcp.Metadata) {
			delete(md.Attrs, "mcore_data")
			md.Unknown = slices.DeleteFunc(md.Unknown, func(s string) bool { return s == "mcore_data" })
		}, []string{"iter_0000002", "optimizer.state.", "flattened_range", "nd_reformulated_orig_global_shape"}},
		{"original shape of another key", func(t *testing.T, md *dcp.Metadata) {
			setOrig(t, md, pyobj.Tuple{int64(2), int64(8), int64(12)})
		}, []string{"iter_0000002", fc2, "nd_reformulated_orig_global_shape [2 8 12]"}},
		{"not a tuple", func(t *testing.T, md *dcp.Metadata) {
			setOrig(t, md, "2x12x8")
		}, []string{".metadata", fc2, `["nd_reformulated_orig_global_shape"]: got str, want a list of ints`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := testkit.CopyTree(t, distCase(c))
			rewriteMeta(t, filepath.Join(dir, "iter_0000002"), func(md *dcp.Metadata) { tc.change(t, md) })
			wantDistError(t, dir, tc.want...)
		})
	}
}
