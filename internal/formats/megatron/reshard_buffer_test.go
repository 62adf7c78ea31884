package megatron

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestReshardExpertBias: checkpoints whose router has the persistent fp32
// expert_bias buffer of --moe-router-enable-expert-bias, trained in bf16
// (moe_ep2, generated; core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local, written by
// real megatron-core 0.19 with the sigmoid router it requires), written by
// both Megatron writers at a new TP / PP / EP read back equal to the
// fixture's truth bit for bit, expert_bias included and still float32;
// every rank file holding a router holds its buffer in float32 and no
// optimizer holds it.
func TestReshardExpertBias(t *testing.T) {
	const real = "dist/core0_19_moe_tp2_ep2_ebias_bf16_fullrs_local"
	cases := []struct {
		fixture string
		o       DistOptions
		dist    bool
		dirs    []string
	}{
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, EP: 1}}, false, []string{"mp_rank_00", "mp_rank_01"}},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}}, false, []string{"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"}},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2, EP: 2, DistOptimizer: true}}, false, nil},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1, DistOptimizer: true}}, false, nil},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}}, true, nil},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}, OptimSharding: DPReshardable}, true, nil},
		{"moe_ep2", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 4, EP: 4, ETP: 1}, OptimSharding: DPReshardable, Core: Core018}, true, nil},
		{real, DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1, EP: 1}}, false, []string{"mp_rank_00"}},
		{real, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 2, EP: 2, DistOptimizer: true}}, false, nil},
		{real, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}}, true, nil},
		{real, DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 4, EP: 2}, OptimSharding: DPReshardable}, true, nil},
	}
	atomics := map[string]string{}
	for _, c := range cases {
		if _, ok := atomics[c.fixture]; !ok {
			atomics[c.fixture] = convertFixture(t, c.fixture)
		}
		a, o := atomics[c.fixture], c.o.ReshardOptions
		truth := filepath.Join(testkit.Fixture("megatron", c.fixture), "truth.pt")
		if name, ok := strings.CutPrefix(c.fixture, "dist/"); ok {
			truth = filepath.Join(testkit.Fixture("megatron_dist", name), "truth.pt")
		}
		t.Run(fmt.Sprintf("%s/dist%v_tp%d_pp%d_dp%d_ep%d_etp%d_distopt%v_%s", c.fixture, c.dist, o.TP, o.PP, o.DP, o.EP, o.ETP, o.DistOptimizer, c.o.OptimSharding), func(t *testing.T) {
			var back string
			if c.dist {
				save := writeDist(t, a, c.o)
				checkDistBuffer(t, iterDir(t, save))
				back = testkit.Convert(t, indexDist(t, save, Options{}), 2)
			} else {
				save := reshardAtomic(t, a, o)
				checkLegacyBuffer(t, iterDir(t, save), c.dirs, o.DistOptimizer)
				back = testkit.Convert(t, index(t, save, Options{}), 2)
			}
			testkit.Check(t, back, truth)
			m, err := atomic.ReadManifest(back)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, p := range m.Params {
				if isBuffer(p.Name) {
					n++
					if !p.Frozen || p.DType != "float32" {
						t.Errorf("%s read back frozen %v, dtype %q; want a frozen float32 buffer", p.Name, p.Frozen, p.DType)
					}
				}
			}
			if n != 2 {
				t.Errorf("%d expert_bias buffers read back, want 2 (one per layer)", n)
			}
		})
	}
}

// iterDir is the iteration folder the tracker of save names.
func iterDir(t *testing.T, save string) string {
	t.Helper()
	it := strings.TrimSpace(string(readBytes(t, filepath.Join(save, trackerFile))))
	return filepath.Join(save, fmt.Sprintf("iter_%07s", it))
}

// checkLegacyBuffer checks every rank file of a --ckpt-format torch save:
// each model chunk holding a layer's router holds its expert_bias as a
// float32 tensor, and the non-distributed optimizer holds one parameter
// per other model tensor.
func checkLegacyBuffer(t *testing.T, iter string, dirs []string, distOpt bool) {
	t.Helper()
	ents, err := os.ReadDir(iter)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if dirs != nil && strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("rank folders %v, want %v", got, dirs)
	}
	biases := 0
	for _, d := range got {
		f, err := torchfile.Open(filepath.Join(iter, d, modelFile))
		if err != nil {
			t.Fatal(err)
		}
		root := f.Root.(*pyobj.Dict)
		mv, _ := root.Get("model")
		md, ok := mv.(*pyobj.Dict)
		if !ok {
			f.Close()
			t.Fatalf("%s: model is %s", d, pyobj.TypeName(mv))
		}
		tensors, routers, here := 0, 0, 0
		for _, k := range md.Keys() {
			name := k.(string)
			v, _ := md.Get(k)
			tt, isT := v.(*torchfile.Tensor)
			if !isT {
				continue
			}
			switch {
			case isBuffer(name):
				here++
				if tt.DType != dtype.Float32 {
					t.Errorf("%s: %s is %v, want float32", d, name, tt.DType)
				}
			default:
				tensors++
				if strings.HasSuffix(name, ".mlp.router.weight") {
					routers++
					if tt.DType != dtype.BFloat16 {
						t.Errorf("%s: %s is %v, want the training dtype bfloat16", d, name, tt.DType)
					}
				}
			}
		}
		if here != routers || routers == 0 {
			t.Errorf("%s: %d routers and %d expert_bias buffers, want one buffer per router", d, routers, here)
		}
		biases += here
		if !distOpt {
			ov, _ := root.Get("optimizer")
			if n := optimizerParams(t, ov); n != tensors {
				t.Errorf("%s: the optimizer holds %d parameters, the model %d besides the expert_bias buffers", d, n, tensors)
			}
		}
		f.Close()
	}
	if biases == 0 {
		t.Error("no expert_bias written")
	}
}

// optimizerParams counts the parameter ids of a saved Megatron optimizer
// state: a ChainedOptimizer's list, Float16Optimizer's 'optimizer', a torch
// state dict's param_groups.
func optimizerParams(t *testing.T, v pyobj.Value) int {
	t.Helper()
	switch x := v.(type) {
	case *pyobj.List:
		n := 0
		for _, it := range x.Items {
			n += optimizerParams(t, it)
		}
		return n
	case *pyobj.Dict:
		if inner, ok := x.Get("optimizer"); ok {
			return optimizerParams(t, inner)
		}
		gv, _ := x.Get("param_groups")
		groups, ok := gv.(*pyobj.List)
		if !ok {
			t.Fatalf("optimizer state without param_groups: %s", pyobj.Repr(v))
		}
		n := 0
		for _, g := range groups.Items {
			pv, _ := g.(*pyobj.Dict).Get("params")
			ids, ok := pv.(*pyobj.List)
			if !ok {
				t.Fatalf("a param group without params: %s", pyobj.Repr(g))
			}
			n += len(ids.Items)
		}
		return n
	}
	t.Fatalf("optimizer state is %s", pyobj.TypeName(v))
	return 0
}

// checkDistBuffer checks a torch_dist save's .metadata: the stacked
// decoder.layers.mlp.router.expert_bias [layers, experts] in float32, and
// no optimizer key for it.
func checkDistBuffer(t *testing.T, iter string) {
	t.Helper()
	md, err := dcp.ReadMetadata(filepath.Join(iter, dcp.MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	const key = "decoder.layers.mlp.router.expert_bias"
	e, ok := md.Entry(key)
	if !ok {
		t.Fatalf("no %s key", key)
	}
	if e.DType != dtype.Float32 || !torchfile.SameShape(e.Size, []int64{2, 4}) {
		t.Errorf("%s is %v%v, want float32 [2 4]", key, e.DType, e.Size)
	}
	for _, x := range md.Entries {
		if x.Key != key && strings.Contains(x.Key, "expert_bias") {
			t.Errorf("%s: the expert_bias buffer in the optimizer", x.Key)
		}
	}
}

// TestReshardFrozenRefused: frozen parameters other than the router's
// expert_bias are refused by name, before anything is written.
func TestReshardFrozenRefused(t *testing.T) {
	a := testkit.CopyTree(t, convertFixture(t, "moe_ep2"))
	// Mark the router weight frozen as a fine-tuning run would.
	m, err := atomic.ReadManifest(a)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.Params {
		if m.Params[i].Name == "decoder.layers.1.mlp.router.weight" {
			m.Params[i].Frozen = true
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, atomic.ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "save")
	for _, dist := range []bool{false, true} {
		o := ReshardOptions{TP: 1, PP: 1, DP: 2, EP: 2}
		if dist {
			_, err = ReshardDist(context.Background(), r, dst, DistOptions{ReshardOptions: o})
		} else {
			_, err = Reshard(context.Background(), r, dst, o)
		}
		if want := "frozen parameter or buffer decoder.layers.1.mlp.router.weight"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("torch_dist %v: error %v, want one saying %q", dist, err, want)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("torch_dist %v: %s was created", dist, dst)
		}
	}
}
