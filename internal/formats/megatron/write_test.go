package megatron

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// convertFixture converts a Megatron fixture into a fresh atomic folder.
// A name "dist/<case>" is a torch_dist fixture of megatron_dist.
func convertFixture(t *testing.T, name string) string {
	t.Helper()
	if c, ok := strings.CutPrefix(name, "dist/"); ok {
		return testkit.Convert(t, indexDist(t, distCase(c), Options{}), 2)
	}
	return testkit.Convert(t, index(t, testkit.Fixture("megatron", name, "checkpoint"), Options{}), 2)
}

// sameAtomicStates fails unless atomic checkpoints a and b hold the same
// parameters in the same order with bit-identical values of every state
// (the split metadata beside 'param' may differ with the source's TP) and
// byte-identical step files, or with stepValue equal steps by value (the
// distributed optimizer saves a torch Adam step tensor as a float).
func sameAtomicStates(t *testing.T, a, b string, stepValue bool) {
	t.Helper()
	o := testkit.SameOptions{Ordered: true}
	if stepValue {
		o.StepOf = stepString
	}
	testkit.SameAtomic(t, a, b, o)
}

// stepString is a parameter's step as a number.
func stepString(t testing.TB, dir, param string) string {
	t.Helper()
	r, err := atomic.OpenReader(dir, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok, err := r.Step(param)
	if err != nil || !ok {
		t.Fatalf("%s: step of %s: %v", dir, param, err)
	}
	if b, isTensor := v.(*torchfile.Blob); isTensor {
		f, err := blobScalar(b)
		if err != nil {
			t.Fatal(err)
		}
		v = f
	}
	x, ok := pyobj.Float(v)
	if !ok {
		t.Fatalf("%s: step of %s is %s", dir, param, pyobj.Repr(v))
	}
	return fmt.Sprint(x)
}

func readBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reshardAtomic(t *testing.T, a string, o ReshardOptions) string {
	t.Helper()
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "save")
	o.NoSync = true // durability is not under test: fsyncs would only slow the suite
	if _, err := Reshard(context.Background(), r, dst, o); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestReshardRoundTrip: source(A) -> atomic -> Megatron at B -> atomic
// equals atomic(A) bit for bit; the written folder reads as a Megatron
// checkpoint of the new degrees with the expected rank folders.
func TestReshardRoundTrip(t *testing.T) {
	cases := []struct {
		fixture string
		o       ReshardOptions
		dirs    []string
	}{
		{"tp2_gqa_swiglu", ReshardOptions{TP: 1, PP: 1, DP: 1}, []string{"mp_rank_00"}},
		{"tp2_gqa_swiglu", ReshardOptions{TP: 2, PP: 2, DP: 2}, []string{"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"}},
		{"tp1_pp1", ReshardOptions{TP: 2, PP: 1, DP: 1}, []string{"mp_rank_00", "mp_rank_01"}},
		{"tp1_pp1", ReshardOptions{TP: 4, PP: 2, DP: 1}, nil},
		{"tp4_gqa_qkvbias", ReshardOptions{TP: 2, PP: 1, DP: 4}, nil},
		{"tp4_gqa_qkvbias", ReshardOptions{TP: 1, PP: 2, DP: 1}, nil},
		{"tp1_pp2", ReshardOptions{TP: 1, PP: 1, DP: 1}, nil},
		{"tp1_pp4_untied", ReshardOptions{TP: 2, PP: 2, DP: 1}, nil},
		{"tp1_pp4_untied", ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 1}, []string{"mp_rank_00_000", "mp_rank_00_001"}},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 1, PP: 4, DP: 2}, nil},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 2, PP: 1, DP: 1}, nil},
		{"tp2_dp2_distopt", ReshardOptions{TP: 1, PP: 2, DP: 1}, nil},
		{"tp2_dp2_distopt_f2", ReshardOptions{TP: 2, PP: 1, DP: 3}, nil},
		{"novocab_tp2", ReshardOptions{TP: 1, PP: 1, DP: 1}, nil},
		// Distributed optimizer written (distrib_optim.pt beside each model file).
		{"tp2_dp2_distopt", ReshardOptions{TP: 2, PP: 1, DP: 2, DistOptimizer: true}, nil},
		{"tp2_dp2_distopt", ReshardOptions{TP: 1, PP: 2, DP: 4, DistOptimizer: true}, nil},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 1, PP: 4, DP: 2, DistOptimizer: true}, nil},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 2, PP: 2, VPP: 2, DP: 2, DistOptimizer: true}, nil},
		{"tp1_pp2", ReshardOptions{TP: 2, PP: 2, DP: 2, DistOptimizer: true}, nil},
		{"tp4_gqa_qkvbias", ReshardOptions{TP: 1, PP: 1, DP: 8, DistOptimizer: true}, nil},
		{"tp1_pp4_untied", ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 3, DistOptimizer: true}, nil},
		{"tp2_gqa_swiglu", ReshardOptions{TP: 1, PP: 2, DP: 2, DistOptimizer: true}, nil},
		{"same_tp2_pp2", ReshardOptions{TP: 2, PP: 2, DP: 1}, nil},
		// torch_dist sources (args and param groups from the common state).
		{"dist/core0_19_tp2_dp2_bf16_fullrs", ReshardOptions{TP: 1, PP: 2, DP: 1}, nil},
		{"dist/core0_19_tp2_dp2_bf16_dprs", ReshardOptions{TP: 2, PP: 1, DP: 2, DistOptimizer: true}, nil},
		{"dist/core0_18_tp2_fp32_dprs", ReshardOptions{TP: 1, PP: 1, DP: 1}, nil},
		{"dist/core0_15_tp2_dp2_bf16_fullrs", ReshardOptions{TP: 1, PP: 1, DP: 2, DistOptimizer: true}, nil},
		{"dist/core0_14_tp2_dp4_fp32_fsms", ReshardOptions{TP: 1, PP: 2, DP: 1}, nil},
		// Uneven pipeline splits (--decoder-first/last-pipeline-num-layers).
		{"tp1_pp4_untied", ReshardOptions{TP: 1, PP: 3, DP: 1, FirstStageLayers: 2}, []string{"mp_rank_00_000", "mp_rank_00_001", "mp_rank_00_002"}},
		{"tp1_pp4_untied", ReshardOptions{TP: 2, PP: 2, DP: 2, LastStageLayers: 1, DistOptimizer: true}, nil},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 1, PP: 3, DP: 1, FirstStageLayers: 1, LastStageLayers: 1}, nil},
		// MoE from real core 0.19 torch_dist sources (SequentialMLP, 4 experts): EP 2 -> 1 and
		// 1 -> 2, 4, expert TP 1 (files of expertFiles), PP 2; the plain optimizer as
		// ChainedOptimizer's [dense, expert] list, the distributed one with distrib_optim.pt
		// [dense or None, expert or None] as each file's DP-rank-0 ranks save it.
		{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}, []string{"mp_rank_00", "mp_rank_01"}},
		{"dist/core0_19_moe_tp2_fp32_dprs", ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}, []string{"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"}},
		{"dist/core0_19_moe_tp2_ep2_fp32_dprs", ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 4, ETP: 1}, []string{"mp_rank_00_000", "mp_rank_00_002", "mp_rank_01_001", "mp_rank_01_003"}},
		{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", ReshardOptions{TP: 1, PP: 2, DP: 2, EP: 2}, nil},
		{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1, DistOptimizer: true}, nil},
		{"dist/core0_19_moe_tp2_fp32_dprs", ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2, DistOptimizer: true}, nil},
		{"dist/core0_19_moe_tp2_fp32_dprs", ReshardOptions{TP: 1, PP: 2, DP: 4, EP: 4, DistOptimizer: true}, nil},
	}
	atomics := map[string]string{} // converted once, in the parent test's temporary folder
	for _, c := range cases {
		if _, ok := atomics[c.fixture]; !ok {
			atomics[c.fixture] = convertFixture(t, c.fixture)
		}
		name := fmt.Sprintf("%s/tp%d_pp%d_vpp%d_dp%d_f%d_l%d_ep%d_etp%d_dist%v", c.fixture, c.o.TP, c.o.PP, c.o.VPP, c.o.DP, c.o.FirstStageLayers, c.o.LastStageLayers, c.o.EP, c.o.ETP, c.o.DistOptimizer)
		t.Run(name, func(t *testing.T) {
			a := atomics[c.fixture]
			save := reshardAtomic(t, a, c.o)
			it := "10"
			if strings.HasPrefix(c.fixture, "dist/") {
				it = "2"
			}
			if got := strings.TrimSpace(string(readBytes(t, filepath.Join(save, trackerFile)))); got != it {
				t.Errorf("%s holds %q, want %s", trackerFile, got, it)
			}
			if c.dirs != nil {
				ents, err := os.ReadDir(filepath.Join(save, fmt.Sprintf("iter_%07s", it)))
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, e := range ents {
					got = append(got, e.Name())
				}
				if strings.Join(got, ",") != strings.Join(c.dirs, ",") {
					t.Errorf("rank folders %v, want %v", got, c.dirs)
				}
			}
			if !Detect(save) {
				t.Fatal("the written folder is not detected as a Megatron checkpoint")
			}
			tbl := index(t, save, Options{})
			d := tbl.Degrees
			zero := 0
			if c.o.DistOptimizer {
				zero = 1
			}
			if d.TP != c.o.TP || d.PP != c.o.PP || d.VPP != c.o.VPP || d.DP != c.o.DP || d.ZeRO != zero {
				t.Errorf("degrees %+v, want TP %d PP %d VPP %d DP %d", d, c.o.TP, c.o.PP, c.o.VPP, c.o.DP)
			}
			// Steps by value: their Python type follows the target's Adam
			// (a tensor for torch AdamW, TestReshardAdamW).
			sameAtomicStates(t, a, testkit.Convert(t, tbl, 2), true)
		})
	}
}

// TestReshardLayout checks one written file against Megatron's layout
// directly: local layer numbers per stage and chunk, the tied output layer
// on the last stage, the padded vocabulary in args and tensors, the
// training dtype, the optimizer structure and no rng_state.
func TestReshardLayout(t *testing.T) {
	a := convertFixture(t, "tp1_pp1")
	save := reshardAtomic(t, a, ReshardOptions{TP: 2, PP: 2, VPP: 0, DP: 2})
	f, err := torchfile.Open(filepath.Join(save, "iter_0000010", "mp_rank_01_001", modelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	root := f.Root.(*pyobj.Dict)
	if _, ok := root.Get("rng_state"); ok {
		t.Error("rng_state written")
	}
	mv, _ := root.Get("model")
	md, ok := mv.(*pyobj.Dict)
	if !ok {
		t.Fatalf("model is %s", pyobj.TypeName(mv))
	}
	var names []string
	for _, k := range md.Keys() {
		names = append(names, k.(string))
	}
	joined := strings.Join(names, " ")
	if !strings.HasPrefix(joined, "decoder.layers.0.") || strings.Contains(joined, "decoder.layers.1.") || strings.Contains(joined, "embedding.") {
		t.Errorf("stage 1 of 2 holds %v; want global layer 1 as local layer 0 and no embedding", names)
	}
	ov, _ := md.Get("output_layer.weight")
	out, ok := ov.(*torchfile.Tensor)
	if !ok || strings.Join(names[len(names)-2:], " ") != "output_layer.weight output_layer._extra_state" {
		t.Fatalf("the last stage does not end with the tied output_layer.weight and its _extra_state: %v", names)
	}
	// TE spec (tp1_pp1): core_attention and every linear save _extra_state (None).
	for _, k := range []string{"decoder.layers.0.self_attention.core_attention._extra_state", "decoder.layers.0.self_attention.linear_proj._extra_state",
		"decoder.layers.0.self_attention.linear_qkv._extra_state", "decoder.layers.0.mlp.linear_fc1._extra_state", "decoder.layers.0.mlp.linear_fc2._extra_state"} {
		if v, ok := md.Get(k); !ok || v != nil {
			t.Errorf("%s: %v %v, want None", k, v, ok)
		}
	}
	// tp1_pp1: 100 rows, divisor 128 -> 256 at TP 2, 128 per rank, bf16.
	if out.Shape[0] != 128 || out.DType.String() != "bfloat16" {
		t.Errorf("output_layer.weight is %v %v, want 128 rows of bfloat16", out.DType, out.Shape)
	}
	av, _ := root.Get("args")
	args := av.(*pyobj.Object)
	for k, want := range map[string]int64{"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "data_parallel_size": 2,
		"world_size": 8, "padded_vocab_size": 256} {
		v, _ := args.Attr(k)
		if n, ok := pyobj.Int(v); !ok || n != want {
			t.Errorf("args.%s = %s, want %d", k, pyobj.Repr(v), want)
		}
	}
	opt, _ := pyobj.Path(root, "optimizer")
	od, ok := opt.(*pyobj.Dict)
	if !ok {
		t.Fatalf("optimizer is %s", pyobj.TypeName(opt))
	}
	for _, k := range []string{"optimizer", "fp32_from_fp16_params"} {
		if _, ok := od.Get(k); !ok {
			t.Errorf("optimizer has no %q (Float16OptimizerWithFloat16Params)", k)
		}
	}
}

// TestReshardRefused: targets the model cannot take are refused before
// anything is written.
func TestReshardRefused(t *testing.T) {
	gqa := convertFixture(t, "tp2_gqa_swiglu")                          // 8 heads, 2 query groups, 2 layers
	noArgs := convertFixture(t, "dist/core0_19_tp2_pp2_tied_bf16_dprs") // saved outside the training loop
	cases := []struct {
		name string
		a    string
		o    ReshardOptions
		want string
	}{
		{"tp does not divide query groups", gqa, ReshardOptions{TP: 4, PP: 1, DP: 1}, "does not divide the 2 query groups"},
		{"tp does not divide heads", gqa, ReshardOptions{TP: 3, PP: 1, DP: 1}, "does not divide the 8 attention heads"},
		{"pp does not divide layers", gqa, ReshardOptions{TP: 1, PP: 3, DP: 1}, "does not divide the 2 layers"},
		{"pp x vpp does not divide layers", gqa, ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 1}, "does not divide the 2 layers"},
		{"uneven first stage takes all", gqa, ReshardOptions{TP: 1, PP: 2, DP: 1, FirstStageLayers: 2}, "0 layers for 1 middle stages"},
		{"uneven without pp", gqa, ReshardOptions{TP: 1, PP: 1, DP: 1, LastStageLayers: 1}, "need --pp 2"},
		{"unknown optimizer", gqa, ReshardOptions{TP: 1, PP: 1, DP: 1, Optimizer: "sgd"}, "--megatron-optimizer"},
		{"vpp without pp", gqa, ReshardOptions{TP: 1, PP: 1, VPP: 2, DP: 1}, "needs --pp 2"},
		{"vpp 1", gqa, ReshardOptions{TP: 1, PP: 2, VPP: 1, DP: 1}, "--vpp 1"},
		{"tp 0", gqa, ReshardOptions{TP: 0, PP: 1, DP: 1}, "--tp must be at least 1"},
		{"pp 0", gqa, ReshardOptions{TP: 1, PP: 0, DP: 1}, "--pp must be at least 1"},
		{"dp 0", gqa, ReshardOptions{TP: 1, PP: 1, DP: 0}, "--dp must be at least 1"},
		{"torch_dist without args", noArgs, ReshardOptions{TP: 1, PP: 1, DP: 1}, "no args Namespace"},
		{"existing save folder", gqa, ReshardOptions{TP: 1, PP: 1, DP: 1}, "use --force"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := atomic.OpenReader(c.a, atomic.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(t.TempDir(), "save")
			if c.name == "existing save folder" {
				if err := os.MkdirAll(dst, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dst, trackerFile), []byte("7"), 0o644); err != nil {
					t.Fatal(err)
				}
				_, err = Reshard(context.Background(), r, dst, c.o)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want one saying %q", err, c.want)
				}
				if b := readBytes(t, filepath.Join(dst, trackerFile)); string(b) != "7" {
					t.Errorf("the existing tracker now says %q", b)
				}
				return
			}
			_, err = Reshard(context.Background(), r, dst, c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Errorf("%s was created", dst)
			}
		})
	}
}

// TestReshardDistribSame: resharding a distributed-optimizer fixture to its
// own degrees gives distrib_optim.pt tensors equal to the source's element
// for element (the DDP bucket layout, shared-embedding buckets and
// 64-element alignment reproduced), except the vocabulary padding rows:
// the atomic checkpoint does not keep them, ucp writes zeros there, the
// fixtures hold values.
func TestReshardDistribSame(t *testing.T) {
	for _, c := range []struct {
		fixture string
		o       ReshardOptions
		dirs    []string
	}{
		{"tp2_dp2_distopt", ReshardOptions{TP: 2, PP: 1, DP: 2, DistOptimizer: true}, []string{"mp_rank_00", "mp_rank_01"}},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 2, DistOptimizer: true}, []string{"mp_rank_00_000", "mp_rank_00_001"}},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			save := reshardAtomic(t, convertFixture(t, c.fixture), c.o)
			for _, d := range c.dirs {
				src := tensorBytes(t, filepath.Join(testkit.Fixture("megatron", c.fixture, "checkpoint", "iter_0000010", d, distribFile)))
				got := tensorBytes(t, filepath.Join(save, "iter_0000010", d, distribFile))
				if len(src) == 0 || len(src) != len(got) {
					t.Fatalf("%s: %d tensors, the source has %d", d, len(got), len(src))
				}
				for i := range src {
					if len(src[i]) != len(got[i]) {
						t.Errorf("%s: tensor %d has %d bytes, the source's %d", d, i, len(got[i]), len(src[i]))
						continue
					}
					diff := 0
					for k := 0; k+4 <= len(src[i]); k += 4 {
						if !bytes.Equal(src[i][k:k+4], got[i][k:k+4]) {
							diff++
							if !bytes.Equal(got[i][k:k+4], make([]byte, 4)) {
								t.Fatalf("%s: tensor %d element %d differs from the source's and is not padding", d, i, k/4)
							}
						}
					}
					// At most the padding rows of one vocabulary shard per chunk.
					if n := len(src[i]) / 4; diff*4 > n {
						t.Errorf("%s: tensor %d: %d of %d elements differ", d, i, diff, n)
					}
				}
			}
		})
	}
}

// tensorBytes returns the bytes of every tensor of a torch.save file in
// pickle order.
func tensorBytes(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := torchfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	var walk func(v pyobj.Value)
	walk = func(v pyobj.Value) {
		switch x := v.(type) {
		case *pyobj.Dict:
			for i := 0; i < x.Len(); i++ {
				_, it := x.Item(i)
				walk(it)
			}
		case *pyobj.List:
			for _, it := range x.Items {
				walk(it)
			}
		case *torchfile.Tensor:
			b, err := f.ReadTensor(x)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
	}
	walk(f.Root)
	return out
}

// TestReshardTorch loads written folders with real torch: the independent
// Python reader (testdata/gen/mgen/check.py, through
// check_megatron_reshard.py) rebuilds every atomic tensor, the 16-bit model
// weights, the tied copies and the step from the files and compares them
// with the source fixture's truth.pt.
func TestReshardTorch(t *testing.T) {
	py := testkit.Python(t)
	cases := []struct {
		fixture string
		o       ReshardOptions
	}{
		{"tp2_gqa_swiglu", ReshardOptions{TP: 1, PP: 2, DP: 1}},
		{"tp2_gqa_swiglu", ReshardOptions{TP: 2, PP: 1, DP: 2, DistOptimizer: true}},
		{"tp1_pp1", ReshardOptions{TP: 4, PP: 2, DP: 1}},
		{"tp4_gqa_qkvbias", ReshardOptions{TP: 2, PP: 2, DP: 2, DistOptimizer: true}},
		{"tp1_pp4_untied", ReshardOptions{TP: 2, PP: 2, VPP: 2, DP: 1}},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 2, PP: 4, DP: 2, DistOptimizer: true}},
		{"tp2_dp2_distopt", ReshardOptions{TP: 1, PP: 1, DP: 1}},
	}
	root := t.TempDir()
	args := []string{filepath.Join(testkit.RepoRoot(), "testdata", "gen", "check_megatron_reshard.py")}
	for i, c := range cases {
		dir := filepath.Join(root, fmt.Sprintf("case%d_%s", i, c.fixture))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(testkit.Fixture("megatron", c.fixture, "truth.pt"), filepath.Join(dir, "truth.pt")); err != nil {
			t.Fatal(err)
		}
		r, err := atomic.OpenReader(convertFixture(t, c.fixture), atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Reshard(context.Background(), r, filepath.Join(dir, "checkpoint"), c.o); err != nil {
			t.Fatal(err)
		}
		args = append(args, dir)
	}
	out, err := exec.Command(py, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("real torch check failed: %v\n%s", err, out)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "ok ") {
			n++
		}
	}
	if n != len(cases) {
		t.Fatalf("%d of %d cases passed:\n%s", n, len(cases), out)
	}
}

// TestReshardSameKeys: written at the source's own degrees, every file has
// the source's top-level keys (but rng_state) and model keys in the
// source's order, _extra_state entries included, for the TE and local
// specs, tied copies, VPP chunks and both optimizers.
func TestReshardSameKeys(t *testing.T) {
	for _, c := range []struct {
		fixture string
		o       ReshardOptions
	}{
		{"tp1_pp1", ReshardOptions{TP: 1, PP: 1, DP: 1}},
		{"tp2_gqa_swiglu", ReshardOptions{TP: 2, PP: 1, DP: 1}},
		{"tp1_pp2", ReshardOptions{TP: 1, PP: 2, DP: 1}},
		{"tp1_pp4_untied", ReshardOptions{TP: 1, PP: 4, DP: 1}},
		{"pp2_vpp2_distopt", ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 2, DistOptimizer: true}},
		{"tp2_dp2_distopt", ReshardOptions{TP: 2, PP: 1, DP: 2, DistOptimizer: true}},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			save := reshardAtomic(t, convertFixture(t, c.fixture), c.o)
			srcIter := testkit.Fixture("megatron", c.fixture, "checkpoint", "iter_0000010")
			ents, err := os.ReadDir(srcIter)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				want := modelKeys(t, filepath.Join(srcIter, e.Name(), modelFile))
				got := modelKeys(t, filepath.Join(save, "iter_0000010", e.Name(), modelFile))
				want = strings.ReplaceAll(want, " rng_state", "")
				if got != want {
					t.Errorf("%s:\n got %s\nwant %s", e.Name(), got, want)
				}
			}
		})
	}
}

// modelKeys lists a model_optim_rng.pt's top-level keys and then every
// model chunk's keys, in order.
func modelKeys(t *testing.T, path string) string {
	t.Helper()
	f, err := torchfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	root, ok := f.Root.(*pyobj.Dict)
	if !ok {
		t.Fatalf("%s: not a dict", path)
	}
	var out []string
	for _, k := range root.Keys() {
		out = append(out, fmt.Sprint(k))
	}
	for _, k := range root.Keys() {
		if ks, _ := k.(string); strings.HasPrefix(ks, "model") {
			v, _ := root.Get(k)
			d := v.(*pyobj.Dict)
			out = append(out, "|", ks+":")
			for _, mk := range d.Keys() {
				out = append(out, fmt.Sprint(mk))
			}
		}
	}
	return strings.Join(out, " ")
}

// TestPipelineSplit: the layer ranges of every stage and chunk as
// Megatron's get_num_layers_to_build / get_transformer_layer_offset
// (core_v0.19.0) give them.
func TestPipelineSplit(t *testing.T) {
	cases := []struct {
		L, P, V, F, Lst int
		want            string // stage: chunk ranges
		err             string
	}{
		{4, 2, 1, 0, 0, "[[[0 2]] [[2 2]]]", ""},
		{8, 2, 2, 0, 0, "[[[0 2] [4 2]] [[2 2] [6 2]]]", ""},
		{3, 2, 1, 2, 0, "[[[0 2]] [[2 1]]]", ""},
		{3, 2, 1, 0, 1, "[[[0 2]] [[2 1]]]", ""},
		{6, 3, 1, 2, 0, "[[[0 2]] [[2 2]] [[4 2]]]", ""},
		{7, 4, 1, 1, 0, "[[[0 1]] [[1 2]] [[3 2]] [[5 2]]]", ""},
		{8, 4, 1, 1, 1, "[[[0 1]] [[1 3]] [[4 3]] [[7 1]]]", ""},
		// Interleaved: chunk v of every stage, then v+1 (offset v*total + ...).
		{12, 3, 2, 2, 2, "[[[0 1] [6 1]] [[1 4] [7 4]] [[5 1] [11 1]]]", ""},
		{3, 2, 1, 0, 0, "", "does not divide the 3 layers"},
		{4, 3, 1, 1, 0, "", "leave 3 layers for 2 middle stages"},
		{4, 2, 1, 4, 0, "", "leave 0 layers for 1 middle stages"},
		{6, 2, 2, 3, 0, "", "which --vpp 2 does not divide"},
		{4, 1, 1, 2, 0, "", "need --pp 2"},
	}
	for _, c := range cases {
		got, err := pipelineSplit(c.L, c.P, c.V, c.F, c.Lst)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("%+v: %v %v, want %s", c, got, err, c.want)
		}
	}
}
