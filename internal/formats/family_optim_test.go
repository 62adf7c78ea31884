package formats

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// roleStates reads every state of an atomic checkpoint of a known family
// by role, whatever the naming and fusion of its source: "HF name/state"
// -> the fp32 bytes of the role's tensor in Hugging Face row order, and
// "HF name/step" -> the step's value.
func roleStates(t *testing.T, r *atomic.Reader) map[string]string {
	t.Helper()
	c, err := r.Model()
	if err != nil {
		t.Fatal(err)
	}
	return roleStatesAs(t, r, c, r.Manifest.Source.Format)
}

// roleStatesAs is roleStates with the family config and source format
// given (a reader that records no family).
func roleStatesAs(t *testing.T, r *atomic.Reader, c *family.Config, format string) map[string]string {
	t.Helper()
	var ps []family.Param
	for _, e := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: e.Name, Shape: e.Shape})
	}
	src, err := family.Resolve(c, ps, format)
	if err != nil {
		t.Fatal(err)
	}
	views, err := src.Unfused(family.HF)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range views {
		e0, _ := r.Param(v.Pieces[0].Param)
		for _, f := range e0.Files {
			state := f.State
			if state == fragment.StepState {
				continue
			}
			var b []byte
			for _, pc := range v.Pieces {
				e, _ := r.Param(pc.Param)
				st, err := r.OpenState(pc.Param, state)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, pc.Len*4)
				if _, err := layout.ReadLocalAs(st, fragment.Shard{Shape: e.Shape}, pc.Start, pc.Len, dtype.Float32, buf); err != nil {
					t.Fatal(err)
				}
				st.Close()
				b = append(b, buf...)
			}
			out[v.Name+"/"+state] = string(b)
		}
		if sv, ok, err := r.Step(v.Pieces[0].Param); err != nil {
			t.Fatal(err)
		} else if ok {
			out[v.Name+"/step"] = stepString(sv)
		}
	}
	return out
}

func stepString(v any) string {
	if b, ok := v.(*torchfile.Blob); ok {
		if f, err := blobFloat(b); err == nil {
			return fmt.Sprint(f)
		}
	}
	switch x := v.(type) {
	case int64:
		return fmt.Sprint(float64(x))
	case float64:
		return fmt.Sprint(x)
	}
	return fmt.Sprintf("%T %v", v, v)
}

func blobFloat(b *torchfile.Blob) (float64, error) {
	out := make([]byte, 4)
	if err := dtype.ToFloat32(out, b.Data, b.DType); err != nil {
		return 0, err
	}
	return float64(dtype.Float32s(out)[0]), nil
}

func sameStates(t *testing.T, want, got map[string]string) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	bad := 0
	for _, k := range keys {
		g, ok := got[k]
		if !ok {
			t.Errorf("no %s", k)
			bad++
		} else if g != want[k] {
			t.Errorf("%s differs", k)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many differences")
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d states, want %d", len(got), len(want))
	}
}

// TestDeepSpeedToMegatronOptimizer: a Megatron-DeepSpeed checkpoint of the
// llama family (testdata/gen/deepspeed_fixtures.py, GQA in its [Q; K; V]
// layout, ZeRO-1 at TP 2) goes to Megatron-LM at TP 1, 2 and TP 1 x PP 2
// with its optimizer: read back by ucp's Megatron reader, every role's
// fp32 main parameter, exp_avg and exp_avg_sq equal the source's bit for
// bit and the step is the source's.
func TestDeepSpeedToMegatronOptimizer(t *testing.T) {
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := Index(context.Background(), testkit.Fixture("deepspeed", "megatron_llama_tp2_z1_bf16_dp4", "checkpoint"), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	want := roleStates(t, a)
	// --ckpt-format torch_dist writes the distributed optimizer: model-space
	// (fully_reshardable) or DDP's buckets at the target DP (dp_reshardable).
	for _, deg := range []struct {
		tp, pp, dp       int
		opt, format, shd string
	}{{1, 1, 1, "", "", ""}, {2, 1, 1, "fused", "", ""}, {1, 2, 1, "adamw", "", ""},
		{1, 1, 1, "", "torch_dist", ""}, {2, 1, 2, "adamw", "torch_dist", ""}, {1, 2, 1, "fused", "torch_dist", ""},
		{2, 1, 2, "adamw", "torch_dist", "dp_reshardable"}, {1, 2, 3, "", "torch_dist", "dp_reshardable"}} {
		t.Run(fmt.Sprintf("tp%d_pp%d_dp%d_%s_%s_%s", deg.tp, deg.pp, deg.dp, deg.opt, deg.format, deg.shd), func(t *testing.T) {
			mg := filepath.Join(t.TempDir(), "megatron")
			o := ReshardOptions{TP: deg.tp, PP: deg.pp, DP: deg.dp, Zero: -1, MegatronOptimizer: deg.opt, CkptFormat: deg.format, DistOptimSharding: deg.shd, NoSync: true}
			if _, err := tg.Reshard(context.Background(), a, mg, o); err != nil {
				t.Fatal(err)
			}
			tb2, err := Index(context.Background(), mg, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			wantFormat := "megatron"
			if deg.format != "" {
				wantFormat = deg.format
			}
			if tb2.Format != wantFormat || tb2.Model == nil || tb2.Model.Family != "llama" {
				t.Fatalf("read back as %s, model %+v", tb2.Format, tb2.Model)
			}
			b := testkit.ConvertOpen(t, tb2, 2, atomic.ReaderOptions{Verify: true})
			sameStates(t, want, roleStates(t, b))
		})
	}
	// Training arguments of the wrong type are refused, never dropped.
	for _, arg := range []string{"lr", "min_lr", "iteration"} {
		t.Run("malformed_"+arg, func(t *testing.T) {
			old, had := a.Manifest.Source.Args[arg]
			a.Manifest.Source.Args[arg] = "0.1"
			defer func() {
				if had {
					a.Manifest.Source.Args[arg] = old
				} else {
					delete(a.Manifest.Source.Args, arg)
				}
			}()
			_, err := tg.Reshard(context.Background(), a, filepath.Join(t.TempDir(), "megatron"), ReshardOptions{TP: 1, PP: 1, DP: 1, Zero: -1, NoSync: true})
			if err == nil || !strings.Contains(err.Error(), "args."+arg+" is 0.1, not a number") {
				t.Fatalf("error %v, want one naming args.%s", err, arg)
			}
		})
	}
}

// TestMegatronToDeepSpeedOptimizer: a Megatron-LM checkpoint of the llama
// family (GQA, SwiGLU, fp16, TP 2) goes to DeepSpeed with the family's
// Megatron-DeepSpeed names ([Q; K; V] QKV, dense_h_to_4h) at ZeRO 1/2/3
// and several TP x DP, and back through ucp's DeepSpeed reader: every
// role's fp32, exp_avg, exp_avg_sq and step equal the source's bit for
// bit; the written args give the family back (ZeRO 1/2). Then the
// Megatron-DeepSpeed fixture goes to Megatron-LM and back to DeepSpeed.
func TestMegatronToDeepSpeedOptimizer(t *testing.T) {
	ds, err := LookupTarget("deepspeed")
	if err != nil {
		t.Fatal(err)
	}
	mgT, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	open := openAtomic
	mg := open(t, testkit.Fixture("megatron", "tp2_gqa_swiglu", "checkpoint"))
	want := roleStates(t, mg)
	for _, deg := range []struct{ tp, dp, zero int }{{2, 2, 1}, {1, 3, 2}, {2, 1, 2}, {1, 2, 3}} {
		t.Run(fmt.Sprintf("tp%d_dp%d_z%d", deg.tp, deg.dp, deg.zero), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "ckpt", "global_step1")
			st, err := ds.Reshard(context.Background(), mg, out, ReshardOptions{TP: deg.tp, DP: deg.dp, Zero: deg.zero, NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Notes) == 0 || !strings.Contains(strings.Join(st.Notes, " "), "Megatron-DeepSpeed module (ucp's choice") {
				t.Errorf("notes %q do not say which parameter order was chosen", st.Notes)
			}
			b := open(t, out)
			if deg.zero == 3 {
				// The ZeRO-3 reader records no args: the source's config.
				sameStates(t, want, roleStatesAs(t, b, mg.Manifest.Source.Model, "deepspeed"))
				return
			}
			checkLossScaler(t, out)
			if m := b.Manifest.Source.Model; m == nil || m.Family != "llama" {
				t.Fatalf("family read back %+v", m)
			}
			sameStates(t, want, roleStates(t, b))
		})
	}
	t.Run("megatron-deepspeed_round_trip", func(t *testing.T) {
		src := open(t, testkit.Fixture("deepspeed", "megatron_llama_tp2_z1_bf16_dp4", "checkpoint"))
		mdir := filepath.Join(t.TempDir(), "megatron")
		if _, err := mgT.Reshard(context.Background(), src, mdir, ReshardOptions{TP: 2, PP: 1, DP: 1, Zero: -1, NoSync: true}); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "ckpt", "global_step3")
		if _, err := ds.Reshard(context.Background(), open(t, mdir), out, ReshardOptions{TP: 2, DP: 4, Zero: 1, NoSync: true}); err != nil {
			t.Fatal(err)
		}
		sameStates(t, roleStates(t, src), roleStates(t, open(t, out)))
	})
}

// TestHFToDeepSpeed: folders real transformers wrote (every dense family)
// go to DeepSpeed in the family's Hugging Face module layout (weights
// only: fp32 partitions, no Adam state) at ZeRO 1, 2 and 3, and come back
// through ucp's DeepSpeed reader with every tensor bit-identical; a tied
// lm_head is the embedding's alias; --tp 2 is refused naming AutoTP.
func TestHFToDeepSpeed(t *testing.T) {
	ds, err := LookupTarget("deepspeed")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range testkit.Cases(t, "hf_family", 6) {
		tbl, err := Index(context.Background(), testkit.Fixture("hf_family", name), "", Options{})
		if err != nil {
			t.Fatal(err)
		}
		a := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
		c := a.Manifest.Source.Model
		if c.Experts > 0 {
			continue
		}
		want := roleStates(t, a)
		for _, z := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/z%d", name, z), func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "ckpt", "global_step0")
				if _, err := ds.Reshard(context.Background(), a, out, ReshardOptions{TP: 1, DP: 2, Zero: z, NoSync: true}); err != nil {
					t.Fatal(err)
				}
				tb2, err := Index(context.Background(), out, "", Options{})
				if err != nil {
					t.Fatal(err)
				}
				b := testkit.ConvertOpen(t, tb2, 2, atomic.ReaderOptions{Verify: true})
				if c.Tied {
					e, ok := b.Param("model.embed_tokens.weight")
					if !ok || len(e.Aliases) != 1 || e.Aliases[0] != "lm_head.weight" {
						t.Errorf("tied head: embedding entry %+v", e)
					}
				}
				sameStates(t, want, roleStatesAs(t, b, c, "deepspeed"))
				checkLossScaler(t, out)
			})
		}
	}
	_, err = ds.Reshard(context.Background(), mustOpen(t, "hf_family", "qwen3_fp32"), filepath.Join(t.TempDir(), "x", "t"), ReshardOptions{TP: 2, DP: 1, Zero: 1, NoSync: true})
	if err == nil || !strings.Contains(err.Error(), "AutoTP") {
		t.Errorf("--tp 2 with HF names: %v", err)
	}
}

// checkLossScaler: every optimizer file in the DeepSpeed tag folder dir
// holds a loss scaler object, as the engine saves it; a None there becomes
// the engine's scaler on load and fails its first backward (DeepSpeed
// v0.14.5, deepspeed/runtime/zero/stage_1_and_2.py, _load_global_state).
func checkLossScaler(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*optim_states.pt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no optimizer files in %s (%v)", dir, err)
	}
	for _, path := range files {
		f, err := torchfile.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		d := pyobj.NewDec(path, f.Root)
		// Key, not Opt: a missing loss_scaler is d's error, a None one
		// the check below.
		v := d.Key("optimizer_state_dict").Key("loss_scaler").Value()
		obj, ok := v.(*pyobj.Object)
		f.Close()
		if err := d.Err(); err != nil {
			t.Fatal(err)
		}
		if !ok || obj.Class == nil || !strings.HasSuffix(obj.Class.Name, "LossScaler") {
			t.Errorf("%s: loss_scaler is %s, want a LossScaler object", path, pyobj.Repr(v))
		}
	}
}

func mustOpen(t *testing.T, parts ...string) *atomic.Reader {
	t.Helper()
	return openAtomic(t, testkit.Fixture(parts...))
}

// openAtomic converts the checkpoint in dir and opens the atomic result,
// verified.
func openAtomic(t *testing.T, dir string) *atomic.Reader {
	t.Helper()
	tbl, err := Index(context.Background(), dir, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	return a
}

// TestDeepSpeedOrderRefused: a source with neither a DeepSpeed module
// layout nor a model family is refused, naming the ways to give one.
func TestDeepSpeedOrderRefused(t *testing.T) {
	ds, err := LookupTarget("deepspeed")
	if err != nil {
		t.Fatal(err)
	}
	a := mustOpen(t, "dcp", "ddp_w3", "checkpoint")
	_, err = ds.Reshard(context.Background(), a, filepath.Join(t.TempDir(), "x", "t"), ReshardOptions{TP: 1, DP: 1, Zero: 1, NoSync: true})
	if err == nil || !strings.Contains(err.Error(), "--like") || !strings.Contains(err.Error(), "model family") {
		t.Fatalf("error %v", err)
	}
}

// TestDeepSpeedMoERefused: every mixture-of-experts source, whatever its
// format, is refused by --to deepspeed by name (the family when known)
// before anything is written.
func TestDeepSpeedMoERefused(t *testing.T) {
	ds, err := LookupTarget("deepspeed")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		fixture []string
		want    string
	}{
		{[]string{"hf_family", "mixtral_bf16_sharded"}, "mixtral: mixture-of-experts models cannot be written to DeepSpeed"},
		{[]string{"hf_family", "qwen2_moe_fp32"}, "qwen2_moe: mixture-of-experts models cannot be written to DeepSpeed"},
		{[]string{"hf_family", "qwen3_moe_bf16"}, "qwen3_moe: mixture-of-experts models cannot be written to DeepSpeed"},
		{[]string{"megatron", "moe_ep2", "checkpoint"}, "mixture-of-experts models cannot be written to DeepSpeed"},
		{[]string{"megatron", "moe_groupedmlp_tp2_ep2_distopt", "checkpoint"}, "mixture-of-experts models cannot be written to DeepSpeed"},
		{[]string{"megatron_dist", "core0_19_moe_tp2_fp32_dprs", "checkpoint"}, "(parameter decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight): mixture-of-experts"},
		{[]string{"deepspeed-moe", "moe_ep2_edp1_z1_bf16", "checkpoint"}, "mixture-of-experts models cannot be written to DeepSpeed"},
	} {
		t.Run(strings.Join(c.fixture[:2], "/"), func(t *testing.T) {
			a := mustOpen(t, c.fixture...)
			out := filepath.Join(t.TempDir(), "ckpt", "global_step1")
			_, err := ds.Reshard(context.Background(), a, out, ReshardOptions{TP: 1, DP: 1, Zero: 1, NoSync: true})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if _, err := os.Stat(filepath.Dir(out)); !os.IsNotExist(err) {
				t.Errorf("%s exists after the refusal", filepath.Dir(out))
			}
		})
	}
}
