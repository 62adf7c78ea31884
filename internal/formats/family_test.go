package formats

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/formats/hf"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/testkit"
)

// hfFolderTensors reads every tensor of a Hugging Face folder: name ->
// dtype, shape and raw bytes.
func hfFolderTensors(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no safetensors files (%v)", dir, err)
	}
	out := map[string]string{}
	for _, fn := range files {
		f, err := safetensors.Open(fn)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range f.Names() {
			tt, _ := f.Tensor(n)
			b, err := f.ReadTensor(tt)
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := out[n]; dup {
				t.Fatalf("%s: %s twice", dir, n)
			}
			out[n] = tt.DType.String() + string(must(json.Marshal(tt.Shape))) + string(b)
		}
		f.Close()
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	var m map[string]any
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHFFamilyRoundTrip: folders real transformers 4.57.1 wrote
// (testdata/gen/hf_family_fixtures.py; every family, sharded and not,
// fp32 and bf16, tied and untied) convert with the family recorded, and
// export back (--arch auto) to bit-identical tensors and the same
// config.json.
func TestHFFamilyRoundTrip(t *testing.T) {
	cases := testkit.Cases(t, "hf_family", 6)
	var listing struct {
		Cases map[string]struct{ Family, DType string }
	}
	b, err := os.ReadFile(testkit.Fixture("hf_family", "cases.json"))
	if err == nil {
		err = json.Unmarshal(b, &listing)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range cases {
		t.Run(name, func(t *testing.T) {
			src := testkit.Fixture("hf_family", name)
			tbl, err := Index(context.Background(), src, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tbl.Format != "hf" || tbl.Model == nil || tbl.Model.Family != listing.Cases[name].Family {
				t.Fatalf("format %s, model %+v; want family %s", tbl.Format, tbl.Model, listing.Cases[name].Family)
			}
			dir := testkit.Convert(t, tbl, 2)
			r, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			if m := r.Manifest.Source.Model; m == nil || m.Family != listing.Cases[name].Family {
				t.Fatalf("manifest model %+v", m)
			}
			out := filepath.Join(t.TempDir(), "hf")
			if _, err := hf.Export(context.Background(), r, out, hf.Options{Arch: hf.ArchAuto, NoSync: true, MaxShard: 2000}); err != nil {
				t.Fatal(err)
			}
			want, got := hfFolderTensors(t, src), hfFolderTensors(t, out)
			if len(want) != len(got) {
				t.Errorf("%d tensors, want %d", len(got), len(want))
			}
			for n, w := range want {
				if g, ok := got[n]; !ok {
					t.Errorf("no %s", n)
				} else if !bytes.Equal([]byte(g), []byte(w)) {
					t.Errorf("%s differs", n)
				}
			}
			wc, gc := readJSON(t, filepath.Join(src, "config.json")), readJSON(t, filepath.Join(out, "config.json"))
			if !reflect.DeepEqual(wc, gc) {
				t.Errorf("config.json:\n got %v\nwant %v", gc, wc)
			}
		})
	}
}

// TestHFFamilyBadConfig: a config.json naming a known family whose
// weights do not fit it is refused naming the file.
func TestHFFamilyBadConfig(t *testing.T) {
	dir := testkit.CopyTree(t, testkit.Fixture("hf_family", "qwen3_fp32"))
	m := readJSON(t, filepath.Join(dir, "config.json"))
	m["model_type"] = "llama" // qwen3's q/k norms have no llama role
	if err := os.WriteFile(filepath.Join(dir, "config.json"), must(json.Marshal(m)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Index(context.Background(), dir, "", Options{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("config.json says llama, but the weights are not that model's")) {
		t.Fatalf("error %v", err)
	}
	_ = dcp.HFConfigCopy
}

// TestHFMegatronRoundTrip: each transformers-written folder goes HF ->
// atomic -> Megatron-LM (reshard --to megatron at TP 2, TP 1 x PP 2 and
// TP 2 x PP 2; local and TE names; the MoE families also at EP 2 with
// TP 1 and TP 2 x PP 2, and at expert TP 1 with TP 2 x EP 4 x DP 2 and
// TP 2 x PP 2 x EP 2: every expert once, in the files Megatron's ranks
// load; --ckpt-format torch_dist for every family, the MoE ones at EP 1,
// EP 2, TP 2 x EP 2 x expert TP 1, PP 2 x EP 2 and TP 2 x PP 2 x EP 2) ->
// atomic (ucp's Megatron reader, family detected from the written args)
// -> HF, and must come back bit for bit with the same family config.
func TestHFMegatronRoundTrip(t *testing.T) {
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range testkit.Cases(t, "hf_family", 6) {
		src := testkit.Fixture("hf_family", name)
		tbl, err := Index(context.Background(), src, "", Options{})
		if err != nil {
			t.Fatal(err)
		}
		a := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
		want := hfFolderTensors(t, src)
		type degrees struct {
			tp, pp, ep, etp, dp int
			spec, format        string
		}
		degs := []degrees{{2, 1, 0, 0, 1, "local", ""}, {1, 2, 0, 0, 1, "te", ""}, {2, 2, 0, 0, 1, "te", ""}}
		if a.Manifest.Source.Model.Experts > 0 {
			degs = append(degs, degrees{1, 1, 2, 0, 2, "local", ""}, degrees{2, 2, 2, 0, 2, "te", ""}, degrees{2, 1, 4, 1, 2, "local", ""},
				degrees{2, 2, 2, 1, 1, "te", ""},
				// --ckpt-format torch_dist: the weights for fine-tuning, experts
				// on their global axis (EP 1, EP 2, TP 2 x EP 2 x expert TP 1,
				// PP 2; local and TE names).
				degrees{1, 1, 1, 0, 1, "local", "torch_dist"}, degrees{1, 1, 2, 0, 2, "local", "torch_dist"},
				degrees{2, 1, 2, 1, 1, "local", "torch_dist"}, degrees{1, 2, 2, 0, 2, "te", "torch_dist"},
				degrees{2, 2, 2, 2, 2, "te", "torch_dist"})
		} else {
			// --ckpt-format torch_dist: the weights for fine-tuning.
			degs = append(degs, degrees{2, 1, 0, 0, 1, "local", "torch_dist"}, degrees{1, 2, 0, 0, 1, "te", "torch_dist"},
				degrees{2, 2, 0, 0, 2, "local", "torch_dist"})
		}
		for _, deg := range degs {
			t.Run(strings.TrimSuffix(fmt.Sprintf("%s/tp%d_pp%d_ep%d_etp%d_%s_%s", name, deg.tp, deg.pp, deg.ep, deg.etp, deg.spec, deg.format), "_"), func(t *testing.T) {
				mg := filepath.Join(t.TempDir(), "megatron")
				o := ReshardOptions{TP: deg.tp, PP: deg.pp, EP: deg.ep, ETP: deg.etp, DP: deg.dp, Zero: -1, MegatronSpec: deg.spec, CkptFormat: deg.format, NoSync: true}
				if _, err := tg.Reshard(context.Background(), a, mg, o); err != nil {
					t.Fatal(err)
				}
				if o.EP == 4 {
					// Rank r of TP 2 x DP 2 loads TP rank r%2, EP rank r%4:
					// four of the eight (TP, EP) files (make check-moe loads
					// such files in megatron-core); read back below.
					got, err := filepath.Glob(filepath.Join(mg, "release", "mp_rank_*"))
					if err != nil {
						t.Fatal(err)
					}
					for i := range got {
						got[i] = filepath.Base(got[i])
					}
					if w := []string{"mp_rank_00_000", "mp_rank_00_002", "mp_rank_01_001", "mp_rank_01_003"}; !reflect.DeepEqual(got, w) {
						t.Fatalf("rank files %v, want %v", got, w)
					}
					// One EP rank's file missing: refused, naming it.
					cp := testkit.CopyTree(t, mg)
					if err := os.RemoveAll(filepath.Join(cp, "release", "mp_rank_01_003")); err != nil {
						t.Fatal(err)
					}
					if _, err := Index(context.Background(), cp, "", Options{}); err == nil || !strings.Contains(err.Error(), "missing folder mp_rank_01_003") {
						t.Fatalf("without mp_rank_01_003: %v", err)
					}
				}
				tb2, err := Index(context.Background(), mg, "", Options{})
				if err != nil {
					t.Fatal(err)
				}
				// Megatron's args cannot tell mistral from llama (the same
				// math): the way back names it.
				fam, arch := a.Manifest.Source.Model.Family, hf.ArchAuto
				if fam == "mistral" {
					fam, arch = "llama", "mistral"
				}
				wantFormat := "megatron"
				if deg.format != "" {
					wantFormat = deg.format
				}
				if tb2.Format != wantFormat || tb2.Model == nil || tb2.Model.Family != fam {
					t.Fatalf("read back as %s, model %+v", tb2.Format, tb2.Model)
				}
				wantC, gotC := *a.Manifest.Source.Model, *tb2.Model
				wantC.Family, wantC.VocabDivisor, gotC.VocabDivisor = fam, 0, 0
				if !reflect.DeepEqual(wantC, gotC) {
					t.Errorf("config read back from the written args:\n got %+v\nwant %+v", gotC, wantC)
				}
				b := testkit.ConvertOpen(t, tb2, 2, atomic.ReaderOptions{Verify: true})
				out := filepath.Join(t.TempDir(), "hf")
				dt := dtype.Float32
				if d, err := dtype.Parse(a.Manifest.Source.DType); err == nil {
					dt = d
				}
				if _, err := hf.Export(context.Background(), b, out, hf.Options{Arch: arch, DType: dt, NoSync: true}); err != nil {
					t.Fatal(err)
				}
				got := hfFolderTensors(t, out)
				if len(got) != len(want) {
					t.Errorf("%d tensors, want %d", len(got), len(want))
				}
				for n, w := range want {
					if g, ok := got[n]; !ok {
						t.Errorf("no %s", n)
					} else if g != w {
						t.Errorf("%s differs", n)
					}
				}
			})
		}
	}
}

// TestHFMegatronMoERefused: expert layouts Megatron cannot build are
// refused before anything is written, naming the option.
func TestHFMegatronMoERefused(t *testing.T) {
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string) *atomic.Reader { return openAtomic(t, testkit.Fixture("hf_family", name)) }
	moe, dense := open("mixtral_bf16_sharded"), open("qwen3_fp32")
	for _, c := range []struct {
		name string
		r    *atomic.Reader
		o    ReshardOptions
		want string
	}{
		{"ep not dividing experts", moe, ReshardOptions{TP: 1, EP: 3, DP: 3}, "--ep 3 does not divide the 4 experts"},
		{"expert tp not dividing ffn", moe, ReshardOptions{TP: 1, EP: 1, ETP: 5, DP: 5}, "--expert-tp 5 does not divide the 24 expert FFN size"},
		{"ranks", moe, ReshardOptions{TP: 1, EP: 2, DP: 1}, "does not divide the 1 ranks of a pipeline stage"},
		{"dense", dense, ReshardOptions{TP: 1, EP: 2, DP: 2}, "has no experts"},
		{"torch_dist dp_reshardable", moe, ReshardOptions{TP: 1, EP: 2, DP: 2, CkptFormat: "torch_dist", DistOptimSharding: "dp_reshardable"}, "--dist-optim-sharding dp_reshardable: the hf source has no optimizer state"},
		{"torch_dist ranks", moe, ReshardOptions{TP: 2, EP: 2, ETP: 2, DP: 1, CkptFormat: "torch_dist"}, "does not divide the 2 ranks of a pipeline stage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "mg")
			c.o.PP, c.o.Zero, c.o.NoSync = 1, -1, true
			_, err := tg.Reshard(context.Background(), c.r, dst, c.o)
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Fatalf("%s written (%v)", dst, err)
			}
		})
	}
}

// atomicFiles reads every file of an atomic checkpoint but its manifest
// (which names the source): relative path -> bytes.
func atomicFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == atomic.ManifestName {
			return err
		}
		b, err := os.ReadFile(p)
		out[must(filepath.Rel(dir, p))] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHFBinMatchesSafetensors: the torch.save layouts real transformers
// writes with safe_serialization=False (pytorch_model.bin; shards +
// pytorch_model.bin.index.json, tied lm_head.weight sharing the
// embedding's storage) of the very models of hf_family/<case>
// (testdata/gen/hf_family_fixtures.py --bin checks the safetensors
// sibling holds the live tensors) convert to the same atomic files, bit
// for bit, and export to the sibling's tensors.
func TestHFBinMatchesSafetensors(t *testing.T) {
	for _, name := range testkit.Cases(t, "hf_family_bin", 3) {
		t.Run(name, func(t *testing.T) {
			src, sib := testkit.Fixture("hf_family_bin", name), testkit.Fixture("hf_family", name)
			bins, _ := filepath.Glob(filepath.Join(src, "pytorch_model*.bin"))
			if sts, _ := filepath.Glob(filepath.Join(src, "*.safetensors")); len(bins) == 0 || len(sts) > 0 {
				t.Fatalf("%s: %d .bin and %d .safetensors files", src, len(bins), len(sts))
			}
			tb, err := Index(context.Background(), src, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			ts, err := Index(context.Background(), sib, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tb.Format != "hf" || tb.Model == nil || !reflect.DeepEqual(*tb.Model, *ts.Model) {
				t.Fatalf("format %s, model %+v; want hf, %+v", tb.Format, tb.Model, ts.Model)
			}
			db, ds := testkit.Convert(t, tb, 2), testkit.Convert(t, ts, 2)
			got, want := atomicFiles(t, db), atomicFiles(t, ds)
			if len(got) != len(want) {
				t.Errorf("%d atomic files, want %d", len(got), len(want))
			}
			for n, w := range want {
				if got[n] != w {
					t.Errorf("%s differs from the safetensors conversion's", n)
				}
			}
			r, err := atomic.OpenReader(db, atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "hf")
			if _, err := hf.Export(context.Background(), r, out, hf.Options{Arch: hf.ArchAuto, NoSync: true}); err != nil {
				t.Fatal(err)
			}
			if g, w := hfFolderTensors(t, out), hfFolderTensors(t, sib); !reflect.DeepEqual(g, w) {
				t.Errorf("the export's tensors differ from %s", sib)
			}
		})
	}
}

// TestHFBinBroken: a torch.save HF folder with a shard missing, or an
// index naming a tensor its file lacks, is refused naming the file.
func TestHFBinBroken(t *testing.T) {
	for _, c := range []struct {
		name    string
		breakIt func(dir string) error
		want    string
	}{
		{"missing shard", func(dir string) error {
			return os.Remove(filepath.Join(dir, "pytorch_model-00003-of-00006.bin"))
		}, "pytorch_model-00003-of-00006.bin: weights file is missing (pytorch_model.bin.index.json names it)"},
		{"unmapped tensor", func(dir string) error {
			p := filepath.Join(dir, dcp.HFBinIndexFile)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(p, bytes.Replace(b, []byte(`"model.norm.weight"`), []byte(`"model.extra.weight"`), 1), 0o644)
		}, "is not mapped to this file by pytorch_model.bin.index.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := testkit.CopyTree(t, testkit.Fixture("hf_family_bin", "llama_tied_bf16_sharded"))
			if err := c.breakIt(dir); err != nil {
				t.Fatal(err)
			}
			_, err := Index(context.Background(), dir, "", Options{})
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// TestHFRouterDType: a MoE folder whose routers are stored in float32
// beside bfloat16 weights (as DeepSeek-V3 keeps its router and correction
// bias) converts and exports back with each tensor in its own dtype,
// bit for bit.
func TestHFRouterDType(t *testing.T) {
	dir := testkit.CopyTree(t, testkit.Fixture("hf_family", "qwen3_moe_bf16"))
	fn := filepath.Join(dir, "model.safetensors")
	f, err := safetensors.Open(fn)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		DType   string  `json:"dtype"`
		Shape   []int64 `json:"shape"`
		Offsets [2]int  `json:"data_offsets"`
	}
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	routers := 0
	for _, n := range f.Names() {
		tt, _ := f.Tensor(n)
		b, err := f.ReadTensor(tt)
		if err != nil {
			t.Fatal(err)
		}
		dt := "BF16"
		if strings.HasSuffix(n, ".mlp.gate.weight") {
			// bfloat16 -> float32 is exact: the high half of the float32 bits.
			wide := make([]byte, 2*len(b))
			for i := 0; i+1 < len(b); i += 2 {
				wide[2*i+2], wide[2*i+3] = b[i], b[i+1]
			}
			b, dt = wide, "F32"
			routers++
		}
		header[n] = entry{dt, tt.Shape, [2]int{len(data), len(data) + len(b)}}
		data = append(data, b...)
	}
	f.Close()
	if routers == 0 {
		t.Fatal("no router in the fixture")
	}
	h := must(json.Marshal(header))
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	if err := os.WriteFile(fn, append(append(out, h...), data...), 0o644); err != nil {
		t.Fatal(err)
	}
	tbl, err := Index(context.Background(), dir, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	exp := filepath.Join(t.TempDir(), "hf")
	if _, err := hf.Export(context.Background(), r, exp, hf.Options{Arch: hf.ArchAuto, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	want, got := hfFolderTensors(t, dir), hfFolderTensors(t, exp)
	if len(got) != len(want) {
		t.Errorf("%d tensors, want %d", len(got), len(want))
	}
	for n, w := range want {
		if g := got[n]; g != w {
			t.Errorf("%s: dtype, shape or bytes differ (got %.12q, want %.12q)", n, g, w)
		}
	}
}

// TestTorchtitanLlama3: a torchtitan llama3 DCP checkpoint (real
// torchtitan v0.2.0 model code, real dcp.save; testdata/gen/torchtitan_fixtures.py)
// with its model named by --model-config exports to HF as torchtitan's own
// Llama3StateDictAdapter.to_hf writes it (q/k rows out of the complex-RoPE
// layout), bit for bit; so does its way through Megatron-LM (reshard --to
// megatron at TP 2 and TP 1 x PP 2, read back by ucp). Without the config
// the export is refused naming --model-config.
func TestTorchtitanLlama3(t *testing.T) {
	dir := testkit.Fixture("torchtitan", "llama3")
	truth := t.TempDir()
	if err := os.Link(filepath.Join(dir, "hf_truth.safetensors"), filepath.Join(truth, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	want := hfFolderTensors(t, truth)
	bare, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	rb := testkit.ConvertOpen(t, bare, 1, atomic.ReaderOptions{})
	if _, err := hf.Export(context.Background(), rb, filepath.Join(t.TempDir(), "x"), hf.Options{Arch: "llama", NoSync: true}); err == nil ||
		!bytes.Contains([]byte(err.Error()), []byte("--model-config")) {
		t.Fatalf("export without a model config: %v", err)
	}
	tbl, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), "", Options{ModelConfig: filepath.Join(dir, "config.json")})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Format != "dcp" || tbl.Model == nil || tbl.Model.Family != "llama" {
		t.Fatalf("format %s, model %+v", tbl.Format, tbl.Model)
	}
	a := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	check := func(t *testing.T, r *atomic.Reader) {
		out := filepath.Join(t.TempDir(), "hf")
		if _, err := hf.Export(context.Background(), r, out, hf.Options{Arch: hf.ArchAuto, DType: dtype.Float32, NoSync: true}); err != nil {
			t.Fatal(err)
		}
		got := hfFolderTensors(t, out)
		if len(got) != len(want) {
			t.Errorf("%d tensors, want %d", len(got), len(want))
		}
		for n, w := range want {
			if got[n] != w {
				t.Errorf("%s differs from torchtitan's to_hf", n)
			}
		}
		wc, gc := readJSON(t, filepath.Join(dir, "config.json")), readJSON(t, filepath.Join(out, "config.json"))
		if gc["torch_dtype"] != "float32" {
			t.Errorf("config.json torch_dtype %v", gc["torch_dtype"])
		}
		delete(gc, "torch_dtype") // LlamaConfig.save_pretrained of a bare config writes none
		if !reflect.DeepEqual(wc, gc) {
			t.Errorf("config.json:\n got %v\nwant %v", gc, wc)
		}
	}
	t.Run("hf", func(t *testing.T) { check(t, a) })
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	for _, deg := range []struct{ tp, pp int }{{2, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("megatron_tp%d_pp%d", deg.tp, deg.pp), func(t *testing.T) {
			mg := filepath.Join(t.TempDir(), "megatron")
			if _, err := tg.Reshard(context.Background(), a, mg, ReshardOptions{TP: deg.tp, PP: deg.pp, DP: 1, Zero: -1, NoSync: true}); err != nil {
				t.Fatal(err)
			}
			tb2, err := Index(context.Background(), mg, "", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tb2.Model == nil || tb2.Model.Family != "llama" || tb2.Model.RotaryInterleaved {
				t.Fatalf("read back: model %+v", tb2.Model)
			}
			b := testkit.ConvertOpen(t, tb2, 2, atomic.ReaderOptions{Verify: true})
			out := filepath.Join(t.TempDir(), "hf")
			if _, err := hf.Export(context.Background(), b, out, hf.Options{Arch: hf.ArchAuto, DType: dtype.Float32, NoSync: true}); err != nil {
				t.Fatal(err)
			}
			got := hfFolderTensors(t, out)
			for n, w := range want {
				if got[n] != w {
					t.Errorf("%s differs from torchtitan's to_hf", n)
				}
			}
		})
	}
}

// TestHFMegatronMoEDistKeys: real megatron-core 0.19's own torch_dist save
// of a small MoE model (testdata/fixtures/megatron_moe_hf: mixtral,
// qwen2_moe with a gated shared expert, deepseek_v3 with MLA, a dense
// first layer, shared experts and the expert bias; TP 1, EP 1, local
// spec) -> atomic -> HF -> atomic -> reshard --to megatron --ckpt-format
// torch_dist at TP 1 (local spec) must give Megatron's .metadata: every
// key (deepseek_v3's unstacked per-layer keys, the _extra_state items of
// every linear and expert), dtype (expert_bias float32), global shape and
// chunk; the vocabulary rows aside (the HF way drops Megatron's padding to
// 96 and the writer pads to 128), and the same atomic tensors read back.
func TestHFMegatronMoEDistKeys(t *testing.T) {
	tg, err := LookupTarget("megatron")
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		bytes  bool
		dt     dtype.DType
		size   []int64
		chunks []string
	}
	entries := func(dir string) map[string]entry {
		md, err := dcp.ReadMetadata(filepath.Join(dir, dcp.MetadataFile))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]entry{}
		for _, e := range md.Entries {
			if e.Key == "common_state/shard_0_1" {
				continue
			}
			x := entry{bytes: e.Bytes, dt: e.DType, size: e.Size}
			for _, c := range e.Chunks {
				x.chunks = append(x.chunks, fmt.Sprint(c.Offsets, c.Sizes))
			}
			if e.Key == "embedding.word_embeddings.weight" || e.Key == "output_layer.weight" {
				x.size, x.chunks = x.size[1:], nil // padded rows: 96 against 128
			}
			slices.Sort(x.chunks)
			out[e.Key] = x
		}
		return out
	}
	for _, name := range testkit.Cases(t, "megatron_moe_hf", 3) {
		t.Run(name, func(t *testing.T) {
			src := testkit.Fixture("megatron_moe_hf", name)
			a := openAtomic(t, src)
			h := filepath.Join(t.TempDir(), "hf")
			if _, err := hf.Export(context.Background(), a, h, hf.Options{Arch: hf.ArchAuto, NoSync: true}); err != nil {
				t.Fatal(err)
			}
			b := openAtomic(t, h)
			mg := filepath.Join(t.TempDir(), "mg")
			o := ReshardOptions{TP: 1, PP: 1, EP: 1, DP: 1, Zero: -1, MegatronSpec: "local", CkptFormat: "torch_dist", NoSync: true}
			if _, err := tg.Reshard(context.Background(), b, mg, o); err != nil {
				t.Fatal(err)
			}
			want, got := entries(filepath.Join(src, "iter_0000001")), entries(filepath.Join(mg, "release"))
			for k, w := range want {
				if g, ok := got[k]; !ok {
					t.Errorf("no key %s", k)
				} else if !reflect.DeepEqual(g, w) {
					t.Errorf("%s: %+v, Megatron's %+v", k, g, w)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("key %s, which Megatron does not save", k)
				}
			}
			// Every tensor read back as Megatron saved it (dtype, shape, bytes).
			c := openAtomic(t, mg)
			if len(c.Manifest.Params) != len(a.Manifest.Params) {
				t.Errorf("%d parameters read back, Megatron saved %d", len(c.Manifest.Params), len(a.Manifest.Params))
			}
			for _, pa := range a.Manifest.Params {
				pc, ok := c.Param(pa.Name)
				if !ok || len(pc.Files) == 0 || len(pa.Files) == 0 {
					t.Errorf("%s not read back", pa.Name)
					continue
				}
				wb, wdt, ws, err := testkit.ReadAtomicRaw(filepath.Join(a.Dir, pa.Files[0].Path))
				if err != nil {
					t.Fatal(err)
				}
				gb, gdt, gs, err := testkit.ReadAtomicRaw(filepath.Join(c.Dir, pc.Files[0].Path))
				if err != nil {
					t.Fatal(err)
				}
				if gdt != wdt || !slices.Equal(gs, ws) || !bytes.Equal(gb, wb) {
					t.Errorf("%s: %v %v differs from Megatron's %v %v", pa.Name, gdt, gs, wdt, ws)
				}
			}
		})
	}
}
