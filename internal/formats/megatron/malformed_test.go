package megatron

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

// setIn returns an edit that sets root[keys[0]]...[keys[n-1]] = v, stepping
// into dicts, the first item of lists and the state of objects.
func setIn(v pyobj.Value, keys ...pyobj.Value) func(pyobj.Value) pyobj.Value {
	return func(root pyobj.Value) pyobj.Value {
		var d *pyobj.Dict
		cur := root
		for i, k := range keys {
			for {
				switch x := cur.(type) {
				case *pyobj.List:
					cur = x.Items[0]
					continue
				case *pyobj.Object:
					cur = x.State
					continue
				}
				break
			}
			d = cur.(*pyobj.Dict)
			if i < len(keys)-1 {
				cur, _ = d.Get(k)
			}
		}
		d.Set(keys[len(keys)-1], v)
		return root
	}
}

// TestMalformedValues: a malformed value of a real key is an error naming
// the file and the key, never taken for "absent" or a default.
func TestMalformedValues(t *testing.T) {
	const model = "model_optim_rng.pt"
	cases := []struct {
		name, fixture string
		edit          func(pyobj.Value) pyobj.Value
		want          string
	}{
		{"optimizer a string", "tp1_pp1", setIn("adam", "optimizer"), `["optimizer"]: got str, want dict`},
		{"wd_mult a string", "tp1_pp1", setIn("0", "optimizer", "optimizer", "param_groups", "wd_mult"), `["wd_mult"]: got str, want float`},
		{"is_expert_parallel a string", "tp1_pp1", setIn("no", "optimizer", "optimizer", "param_groups", "is_expert_parallel"),
			`["is_expert_parallel"]: got str, want bool`},
		{"param_groups a dict", "tp1_pp1", setIn(pyobj.NewDict(pyobj.PlainDict), "optimizer", "optimizer", "param_groups"),
			`["param_groups"]: got dict, want list`},
		{"fp32 main copies a dict", "tp1_pp1", setIn(pyobj.NewDict(pyobj.PlainDict), "optimizer", "fp32_from_fp16_params"),
			`["fp32_from_fp16_params"]: got dict, want list`},
		{"model a list", "tp1_pp1", setIn(&pyobj.List{}, "model"), `["model"]: got list, want dict`},
		{"args a dict", "tp1_pp1", setIn(pyobj.NewDict(pyobj.PlainDict), "args"), `["args"]: got dict, want an argparse.Namespace`},
		{"swiglu None", "tp2_gqa_swiglu", setIn(nil, "args", "swiglu"), "args.swiglu is None, not a bool"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, iter := fixtureCopy(t, c.fixture)
			rewrite(t, filepath.Join(iter, "mp_rank_00", model), c.edit)
			if _, err := os.Stat(filepath.Join(iter, "mp_rank_00")); err != nil {
				t.Fatal(err)
			}
			wantError(t, root, Options{}, model, c.want)
		})
	}
}

// TestReshardMalformedSource: a malformed value in the atomic checkpoint's
// extra_state.pt or zero/optimizer_state.pt is an error naming the file
// and the key, before anything is written.
func TestReshardMalformedSource(t *testing.T) {
	src := convertFixture(t, "tp2_gqa_swiglu")
	cases := []struct {
		name, file string
		edit       func(pyobj.Value) pyobj.Value
		dist       bool
		want       string
	}{
		{"extra state a list", atomic.ExtraState, func(pyobj.Value) pyobj.Value { return &pyobj.List{} }, false, "got list, want dict"},
		{"iteration a string", atomic.ExtraState, setIn("10", "iteration"), false, `["iteration"]: got str, want int`},
		{"transformer_impl an int", atomic.ExtraState, setIn(int64(1), "args", "transformer_impl"), false, `["transformer_impl"]: got int, want str`},
		{"swiglu a string (torch_dist)", atomic.ExtraState, setIn("yes", "args", "swiglu"), true, `args.swiglu is "yes", not a bool`},
		{"param_groups a dict", "zero/" + atomic.OptimizerState, setIn(pyobj.NewDict(pyobj.PlainDict), "param_groups"), false, `["param_groups"]: got dict, want list`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := testkit.CopyTree(t, src)
			testkit.Resave(t, filepath.Join(a, filepath.FromSlash(c.file)), c.edit)
			r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			save := filepath.Join(t.TempDir(), "save")
			o := ReshardOptions{TP: 1, PP: 1, DP: 1}
			if c.dist {
				_, err = ReshardDist(context.Background(), r, save, DistOptions{ReshardOptions: o})
			} else {
				_, err = Reshard(context.Background(), r, save, o)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), filepath.Base(c.file)) {
				t.Fatalf("error %v\nwant one naming %s and saying %s", err, c.file, c.want)
			}
			if ents, _ := os.ReadDir(save); len(ents) != 0 {
				t.Errorf("wrote %v before failing", ents)
			}
		})
	}
}
