package megatron

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// distWriteCases are sources (legacy torch fixtures, "dist/<case>" torch_dist
// ones) written as torch_dist at new degrees.
var distWriteCases = []struct {
	fixture string
	o       DistOptions
}{
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}}},
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
	{"dist/core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2}, Core: Core015}},
	{"dist/core0_14_tp2_dp4_fp32_fsms", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}}},
	{"dist/core0_19_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, LastStageLayers: 0}}},
	{"tp2_gqa_swiglu", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 1}}},
	{"tp1_pp1", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
	{"tp4_gqa_qkvbias", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}}},
	{"tp1_pp4_untied", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 3, DP: 1, FirstStageLayers: 2}}},
	{"dist/core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}, OptimSharding: DPReshardable}},
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 3}, OptimSharding: DPReshardable, Core: Core018}},
	{"dist/core0_19_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}, OptimSharding: DPReshardable}},
	{"tp2_gqa_swiglu", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2}, OptimSharding: DPReshardable}},
	{"tp4_gqa_qkvbias", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 3}, OptimSharding: DPReshardable}},
	// A real TP 2 x PP 2 tied source (saved with args) to one rank and to dp_reshardable at DP 2.
	{"dist/core0_19_tp2_pp2_tied_bf16_dprs_args", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}}},
	{"dist/core0_19_tp2_pp2_tied_bf16_dprs_args", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 2}, OptimSharding: DPReshardable}},
	// MoE (real core 0.19 SequentialMLP, 4 experts): EP 2 -> 1, 1 -> 2, 1 -> 4 at expert TP 1,
	// expert TP 2 at TP 1, with PP 2, as core 0.15 and 0.18.
	{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}}},
	{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}}},
	{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}}},
	{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 4, ETP: 1}, Core: Core018}},
	{"dist/core0_19_moe_tp2_ep2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4, EP: 2, ETP: 2}}},
	{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 2, EP: 2}, Core: Core015}},
	// MoE as dp_reshardable: experts in the dense buffers (EP 1), in the expert optimizer's
	// buckets over expert-DP (EP 2, 4), at expert TP 1 (expert domains U x EP).
	{"dist/core0_19_moe_tp2_ep2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}, OptimSharding: DPReshardable}},
	{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2, EP: 2}, OptimSharding: DPReshardable}},
	{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 4, EP: 4, ETP: 1}, OptimSharding: DPReshardable}},
	{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, EP: 1, ETP: 1}, OptimSharding: DPReshardable, Core: Core018}},
	// A real bf16 Float16Module run with 4 query groups (one DDP buffer) to TP 4 and to DP 4.
	{"dist/core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 4, PP: 1, DP: 1}, OptimSharding: DPReshardable}},
	{"dist/core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}, OptimSharding: DPReshardable}},
	{"dist/core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 4, PP: 1, DP: 2}}},
	// Virtual pipeline (model chunks) and uneven splits, both optimizer formats.
	{"dist/core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 1}}},
	{"dist/core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, VPP: 2, DP: 2}, OptimSharding: DPReshardable}},
	{"pp2_vpp2_distopt", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, VPP: 2, DP: 3}, OptimSharding: DPReshardable, Core: Core018}},
	{"pp2_vpp2_distopt", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 4, DP: 1}, OptimSharding: DPReshardable}},
	{"tp1_pp4_untied", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 3, DP: 2, FirstStageLayers: 2}, OptimSharding: DPReshardable}},
	{"tp2_gqa_swiglu", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2, LastStageLayers: 1}, OptimSharding: DPReshardable}},
	// Chunks split over many write tasks (CRCs combined), two workers.
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 1}, Workers: 2, taskBytes: 100}},
	{"dist/core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}, OptimSharding: DPReshardable, Workers: 3, taskBytes: 64}},
}

// TestDistWriteRoundTrip: atomic -> torch_dist (ReshardDist) -> atomic
// (IndexDist, this package's torch_dist reader) holds every state of every
// parameter bit for bit, at the written degrees.
func TestDistWriteRoundTrip(t *testing.T) {
	atomics := map[string]string{}
	for i, c := range distWriteCases {
		if _, ok := atomics[c.fixture]; !ok {
			atomics[c.fixture] = convertFixture(t, c.fixture)
		}
		t.Run(fmt.Sprintf("%d_%s_tp%d_pp%d_vpp%d_dp%d_core%s_%s", i, c.fixture, c.o.TP, c.o.PP, c.o.VPP, c.o.DP, c.o.Core, c.o.OptimSharding), func(t *testing.T) {
			a := atomics[c.fixture]
			save := writeDist(t, a, c.o)
			tbl := indexDist(t, save, Options{})
			if d := tbl.Degrees; d.TP != c.o.TP || d.PP != c.o.PP {
				t.Errorf("degrees %+v, want TP %d PP %d", d, c.o.TP, c.o.PP)
			}
			sameAtomicStates(t, a, testkit.Convert(t, tbl, 2), true)
		})
	}
}

func writeDist(t *testing.T, a string, o DistOptions) string {
	t.Helper()
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	save := filepath.Join(t.TempDir(), "save")
	o.NoSync = true
	if _, err := ReshardDist(context.Background(), r, save, o); err != nil {
		t.Fatal(err)
	}
	return save
}

// TestDistWriteRefused: unknown cores and sharding types are refused
// before anything is written.
func TestDistWriteRefused(t *testing.T) {
	a := convertFixture(t, "tp2_gqa_swiglu")
	moe := convertFixture(t, "dist/core0_19_moe_tp2_fp32_dprs")
	grouped := convertFixture(t, "moe_groupedmlp_tp2_ep2_distopt")
	for _, c := range []struct {
		o    DistOptions
		want string
		src  string // "" : a
	}{
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}, Core: "0.16"}, "--megatron-core \"0.16\"", ""},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}, OptimSharding: "fully_sharded_bucket_space"}, "--dist-optim-sharding", ""},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 3, PP: 1, DP: 1}}, "does not divide", ""},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 2, EP: 2}}, "the model has no experts", ""},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 3, EP: 3}}, "--ep 3 does not divide the 4 experts", moe},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, EP: 2}}, "expert parallel 2 x expert tensor parallel 2 does not divide the 2 ranks", moe},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1, ETP: 3}}, "expert tensor parallel 3 does not divide", moe},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}}, "GroupedMLP (weight1/weight2)", grouped},
	} {
		src := a
		if c.src != "" {
			src = c.src
		}
		r, err := atomic.OpenReader(src, atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "save")
		_, err = ReshardDist(context.Background(), r, dst, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s was created", dst)
		}
	}
}

// TestDistWriteTorchDCP reads written folders with real torch 2.6
// torch.distributed.checkpoint (_load_state_dict no_dist) and compares
// every tensor with the source fixture's live truth
// (testdata/check/check_megatron_dist_dcp.py). No Megatron source needed.
func TestDistWriteTorchDCP(t *testing.T) {
	cases := []struct {
		fixture string
		o       DistOptions
	}{
		{"core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}}},
		{"core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
		{"core0_14_tp2_dp4_fp32_fsms", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}, Core: Core019}},
		{"core0_19_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 1}, Core: Core015}},
		// TP 4: vocabulary padded to 128, 4 query groups split 4 ways.
		{"core0_19_g4_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 4, PP: 1, DP: 1}}},
	}
	root := t.TempDir()
	var dirs []string
	for i, c := range cases {
		dir := filepath.Join(root, fmt.Sprintf("case%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := atomic.OpenReader(convertFixture(t, "dist/"+c.fixture), atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.o.NoSync = true
		if _, err := ReshardDist(context.Background(), r, filepath.Join(dir, "checkpoint"), c.o); err != nil {
			t.Fatal(err)
		}
		truth, err := os.ReadFile(testkit.Fixture("megatron_dist", c.fixture, "truth.pt"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "truth.pt"), truth, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tp"), []byte(fmt.Sprint(c.o.TP)), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Base(dir))
	}
	out := testkit.Torch2(t, root, filepath.Join(testkit.RepoRoot(), "testdata", "check", "check_megatron_dist_dcp.py"), dirs...)
	if n := strings.Count(out, "\nok ") + map[bool]int{true: 1}[strings.HasPrefix(out, "ok ")]; n != len(cases) {
		t.Fatalf("%d of %d cases passed:\n%s", n, len(cases), out)
	}
}

// TestDistWriteDPReshardableLayout: written at the source's own degrees,
// the dp_reshardable optimizer keys of a real-core fp32 fixture (one DDP
// buffer, as a Float16Module-wrapped run has) come out as megatron-core
// saved them: the same keys, global sizes and chunks (DDP's bucket layout
// re-derived, padding pieces included) and the same byte items.
func TestDistWriteDPReshardableLayout(t *testing.T) {
	for _, c := range []struct {
		fixture string
		core    string
		dp, ep  int
	}{
		{"core0_19_tp2_fp32_dprs", Core019, 1, 1},
		{"core0_18_tp2_fp32_dprs", Core018, 1, 1},
		// bf16 wrapped in Float16Module (one buffer of bf16 parameters), DP 2.
		{"core0_19_g4_tp2_dp2_bf16_dprs", Core019, 2, 1},
		// MoE: experts in the dense buffers (EP 1), and in the expert
		// optimizer's own buffers over expert-DP (EP 2: chained_0/chained_1).
		{"core0_19_moe_tp2_fp32_dprs", Core019, 1, 1},
		{"core0_19_moe_tp2_ep2_fp32_dprs", Core019, 2, 2},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			a := convertFixture(t, "dist/"+c.fixture)
			save := writeDist(t, a, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: c.dp, EP: c.ep}, Core: c.core, OptimSharding: DPReshardable})
			want := optimizerEntries(t, filepath.Join(testkit.Fixture("megatron_dist", c.fixture, "checkpoint"), "iter_0000002"))
			got := optimizerEntries(t, filepath.Join(save, "iter_0000002"))
			if len(want) == 0 {
				t.Fatal("the fixture has no optimizer.distributed keys")
			}
			for k, w := range want {
				if g, ok := got[k]; !ok {
					t.Errorf("%s: not written", k)
				} else if g != w {
					t.Errorf("%s:\n got %s\nwant %s", k, g, w)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("%s: written, not in the fixture", k)
				}
			}
		})
	}
}

// optimizerEntries describes the optimizer.distributed entries of a
// torch_dist folder's .metadata: size and sorted chunks, or "bytes".
func optimizerEntries(t *testing.T, dir string) map[string]string {
	t.Helper()
	md, err := dcp.ReadMetadata(filepath.Join(dir, dcp.MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range md.Entries {
		if !strings.HasPrefix(e.Key, "optimizer.distributed.") && !strings.Contains(e.Key, ".optimizer.distributed.") {
			continue
		}
		if e.Bytes {
			info, ok := md.Lookup(e.Key, nil, false)
			if !ok {
				t.Fatalf("%s: no storage", e.Key)
			}
			f, err := os.Open(filepath.Join(dir, info.RelativePath))
			if err != nil {
				t.Fatal(err)
			}
			tf, err := torchfile.Read(io.NewSectionReader(f, info.Offset, info.Length), info.Length, e.Key)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			out[e.Key] = deepRepr(tf.Root)
			continue
		}
		var cs []string
		for _, ch := range e.Chunks {
			cs = append(cs, fmt.Sprint(ch.Offsets, ch.Sizes))
		}
		sort.Strings(cs)
		out[e.Key] = fmt.Sprintf("%v %v %v", e.DType, e.Size, cs)
	}
	return out
}

// deepRepr renders a decoded value with every container's contents.
func deepRepr(v pyobj.Value) string {
	switch x := v.(type) {
	case *pyobj.List:
		parts := make([]string, len(x.Items))
		for i, e := range x.Items {
			parts[i] = deepRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case pyobj.Tuple:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = deepRepr(e)
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case *pyobj.Dict:
		parts := make([]string, x.Len())
		for i := range parts {
			k, e := x.Item(i)
			parts[i] = deepRepr(k) + ": " + deepRepr(e)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return pyobj.Repr(v)
}

// TestDistWriteTasksSameBytes: rank files written as many small tasks by
// several workers (CRCs of ranges combined) are byte for byte the files of
// one task per chunk.
func TestDistWriteTasksSameBytes(t *testing.T) {
	a := convertFixture(t, "dist/core0_19_tp2_dp2_bf16_dprs")
	for _, sh := range []string{FullyReshardable, DPReshardable} {
		one := writeDist(t, a, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 2}, OptimSharding: sh, Workers: 1})
		many := writeDist(t, a, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 2}, OptimSharding: sh, Workers: 4, taskBytes: 40})
		for r := 0; r < 4; r++ {
			name := filepath.Join("iter_0000002", fmt.Sprintf("__%d_0.distcp", r))
			x, err := os.ReadFile(filepath.Join(one, name))
			if err != nil {
				t.Fatal(err)
			}
			y, err := os.ReadFile(filepath.Join(many, name))
			if err != nil {
				t.Fatal(err)
			}
			if len(x) == 0 || string(x) != string(y) {
				t.Errorf("%s %s: %d bytes with one task per chunk, %d with many, differing", sh, name, len(x), len(y))
			}
		}
	}
}

// TestDistWriteMoECommon: the common state of an MoE target as Megatron's
// training loop writes it: a ChainedOptimizer's {0: dense, 1: expert}
// param groups (is_expert_parallel False / True, the expert group derived
// from an EP 1 source's dense one) exactly when the experts are
// expert-parallel, and the content_metadata load_checkpoint reads.
func TestDistWriteMoECommon(t *testing.T) {
	for _, c := range []struct {
		fixture string
		o       DistOptions
		experts []bool // is_expert_parallel of the groups, per sub-optimizer
	}{
		{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}}, []bool{false, true}},
		{"dist/core0_19_moe_tp2_ep2_fp32_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}}, []bool{false}},
		{"dist/core0_19_moe_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, ETP: 1}, Core: Core018}, []bool{false, true}},
		{"dist/core0_19_moe_tp2_ep2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 2}, OptimSharding: DPReshardable}, []bool{false, true}},
		{"dist/core0_19_moe_tp2_ep2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2, EP: 1}, OptimSharding: DPReshardable}, []bool{false}},
	} {
		t.Run(fmt.Sprintf("%s_ep%d_etp%d_%s", c.fixture, c.o.EP, c.o.ETP, c.o.OptimSharding), func(t *testing.T) {
			save := writeDist(t, convertFixture(t, c.fixture), c.o)
			r := testkit.ConvertOpen(t, indexDist(t, save, Options{}), 2, atomic.ReaderOptions{})
			ev, err := r.Load(atomic.ExtraState)
			if err != nil {
				t.Fatal(err)
			}
			extra := ev.(*pyobj.Dict)
			sharding := c.o.OptimSharding
			if sharding == "" {
				sharding = FullyReshardable
			}
			cm, _ := extra.Get("content_metadata")
			want := fmt.Sprintf(`{"distrib_optim_sharding_type": "%s", `, sharding)
			if sharding == FullyReshardable {
				want += `"distrib_optim_fully_reshardable_mem_efficient": False, `
			}
			want += `"singleton_local_shards": False, "chained_optim_avoid_prefix": True}`
			if got := deepRepr(cm); got != want {
				t.Errorf("content_metadata %s, want %s", got, want)
			}
			ov, _ := extra.Get("optimizer")
			opt := ov.(*pyobj.Dict)
			subs := []*pyobj.Dict{opt}
			if len(c.experts) > 1 {
				if keys := deepRepr(&pyobj.List{Items: opt.Keys()}); keys != "[0, 1]" {
					t.Fatalf("chained optimizer keys %s, want [0, 1]", keys)
				}
				subs = nil
				for _, k := range opt.Keys() {
					v, _ := opt.Get(k)
					subs = append(subs, v.(*pyobj.Dict))
				}
			}
			if len(subs) != len(c.experts) {
				t.Fatalf("%d sub-optimizers in the common state, want %d", len(subs), len(c.experts))
			}
			for i, want := range c.experts {
				if st, _ := subs[i].Get("param_state_sharding_type"); st != sharding {
					t.Errorf("sub-optimizer %d: param_state_sharding_type %v", i, st)
				}
				if sharding == DPReshardable {
					// The groups are the domains' optimizer/shard_0_1 items
					// (TestDistWriteDPReshardableLayout); nothing else is common.
					if subs[i].Len() != 1 {
						t.Errorf("sub-optimizer %d: %s, want the sharding type only", i, deepRepr(subs[i]))
					}
					continue
				}
				in, _ := subs[i].Get("optimizer")
				gv, _ := in.(*pyobj.Dict).Get("param_groups")
				for _, g := range gv.(*pyobj.List).Items {
					if e, _ := g.(*pyobj.Dict).Get("is_expert_parallel"); e != want {
						t.Errorf("sub-optimizer %d: a group with is_expert_parallel %v, want %v", i, e, want)
					}
				}
				if st, _ := subs[i].Get("param_state_sharding_type"); st != sharding {
					t.Errorf("sub-optimizer %d: param_state_sharding_type %v", i, st)
				}
			}
		})
	}
}

// TestDistWriteCommonLikeFixture: the optimizer part of the common state ucp
// writes in a core's layout equals that core's own save of the same run
// (real-core fixtures at their own degrees, read back alike): core 0.15's
// load asserts param_state_sharding_type, which a 0.15 write once left out.
func TestDistWriteCommonLikeFixture(t *testing.T) {
	for _, c := range []struct {
		fixture string
		core    string
	}{
		{"dist/core0_15_tp2_dp2_bf16_fullrs", Core015},
		{"dist/core0_18_tp2_dp2_bf16_fullrs", Core018},
	} {
		t.Run(c.core, func(t *testing.T) {
			optimizerOf := func(a string) string {
				r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ev, err := r.Load(atomic.ExtraState)
				if err != nil {
					t.Fatal(err)
				}
				ov, ok := ev.(*pyobj.Dict).Get("optimizer")
				if !ok {
					t.Fatalf("%s: no optimizer in the common state", a)
				}
				return deepRepr(ov)
			}
			a := convertFixture(t, c.fixture)
			save := writeDist(t, a, DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}, Core: c.core})
			got := optimizerOf(testkit.Convert(t, indexDist(t, save, Options{}), 2))
			if want := optimizerOf(a); got != want {
				t.Errorf("common optimizer state\n got %s\nwant %s", got, want)
			}
			if !strings.Contains(got, `"param_state_sharding_type": "fully_reshardable"`) {
				t.Errorf("no param_state_sharding_type in %s", got)
			}
		})
	}
}
