package deepspeed_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	. "github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// setKey returns an edit that sets root[keys[0]]...[keys[n-1]] = v.
func setKey(v pyobj.Value, keys ...string) func(pyobj.Value) pyobj.Value {
	return func(root pyobj.Value) pyobj.Value {
		d := root.(*pyobj.Dict)
		for _, k := range keys[:len(keys)-1] {
			next, _ := d.Get(k)
			d = next.(*pyobj.Dict)
		}
		d.Set(keys[len(keys)-1], v)
		return root
	}
}

// TestReshardMalformedSource: a malformed value in the files Reshard
// starts from (the model-state template and zero/optimizer_state.pt of the
// atomic checkpoint) is an error naming the file and the key, never taken
// for "absent" (an empty config, the default version, a new loss scaler).
func TestReshardMalformedSource(t *testing.T) {
	const model, optim = "mp_rank_00_model_states.pt", "zero/optimizer_state.pt"
	src := convertDS(t, testkit.Fixture("deepspeed/z1_tiny_dp4_padonly", "checkpoint"))
	cases := []struct {
		name, file string
		edit       func(pyobj.Value) pyobj.Value
		want       string
	}{
		{"ds_config a list", model, setKey(&pyobj.List{}, "ds_config"), `["ds_config"]: got list, want dict`},
		{"zero_optimization a string", model, setKey("stage 1", "ds_config", "zero_optimization"), `ds_config: ["zero_optimization"]: got str, want dict`},
		{"micro batch a string", model, setKey("4", "ds_config", "train_micro_batch_size_per_gpu"), `ds_config: ["train_micro_batch_size_per_gpu"]: got str, want int`},
		{"ds_version an int", model, setKey(int64(14), "ds_version"), `["ds_version"]: got int, want str`},
		{"module a list", model, setKey(&pyobj.List{}, "module"), `["module"]: got list, want dict`},
		{"param_shapes a dict", model, setKey(pyobj.NewDict(pyobj.PlainDict), "param_shapes"), `["param_shapes"]: got dict, want list`},
		{"buffer_names None", model, setKey(nil, "buffer_names"), `["buffer_names"]: got None, want a list of str`},
		{"param_groups a dict", optim, setKey(pyobj.NewDict(pyobj.PlainDict), "param_groups"), `["param_groups"]: got dict, want list`},
		{"loss_scaler a string", optim, setKey("LossScaler", "loss_scaler"), `["loss_scaler"]: got str, want a loss scaler object`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := testkit.CopyTree(t, src)
			testkit.Resave(t, filepath.Join(a, filepath.FromSlash(c.file)), c.edit)
			r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			save := t.TempDir()
			_, err = Reshard(context.Background(), r, filepath.Join(save, "tag"), ReshardOptions{DP: 2, TP: 1, Zero: 1})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), filepath.Base(c.file)) {
				t.Fatalf("error %v\nwant one naming %s and saying %s", err, c.file, c.want)
			}
			if ents, _ := os.ReadDir(save); len(ents) != 0 {
				t.Errorf("wrote %v before failing", ents)
			}
		})
	}
}
