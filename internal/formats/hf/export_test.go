package hf

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/megatron"
	"github.com/ucp-project/ucp/internal/safetensors"
	"github.com/ucp-project/ucp/internal/testkit"
)

// atomicOf converts a Megatron fixture and opens the atomic checkpoint.
func atomicOf(t *testing.T, c string) *atomic.Reader {
	t.Helper()
	tbl, err := megatron.Index(context.Background(), testkit.Fixture("megatron", c, "checkpoint"), megatron.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := testkit.ConvertOpen(t, tbl, 2, atomic.ReaderOptions{Verify: true})
	return r
}

// hfCase is one export checked by testdata/check/check_hf.py.
type hfCase struct {
	Dir    string         `json:"dir"`
	Truth  string         `json:"truth"`
	Format string         `json:"format"`
	DType  string         `json:"dtype"`
	Arch   string         `json:"arch"`
	Params string         `json:"params"`
	Config map[string]any `json:"config"`
}

// TestExportRealLoaders exports Megatron fixtures (GQA 8 heads / 2 groups,
// SwiGLU, RMSNorm, vocabulary padded 100 -> 128; same_tp2_pp2 untied with
// TE names, tp2_gqa_swiglu tied with local names) as Hugging Face folders
// and has the real safetensors package and torch.load(weights_only=True)
// of torch 2.x load every file: the tensors must equal the truth cast with
// torch and, for --arch llama, split by hand; config.json must hold the
// model's numbers.
func TestExportRealLoaders(t *testing.T) {
	work := t.TempDir()
	cfg := map[string]any{"max_position_embeddings": 16.0, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
	type run struct {
		fixture string
		opt     Options
		c       hfCase
	}
	runs := []run{
		{"same_tp2_pp2", Options{Arch: "llama", DType: dtype.BFloat16, MaxShard: 600},
			hfCase{Format: "safetensors", DType: "bfloat16", Arch: "llama", Config: cfg}},
		{"same_tp2_pp2", Options{Arch: "llama"}, // default dtype: the training dtype (bf16)
			hfCase{Format: "safetensors", DType: "bfloat16", Arch: "llama", Config: cfg}},
		{"tp2_gqa_swiglu", Options{Arch: "llama", DType: dtype.Float16},
			hfCase{Format: "safetensors", DType: "float16", Arch: "llama", Config: cfg}},
		{"tp2_gqa_swiglu", Options{Arch: "llama", Torch: true, DType: dtype.Float32, MaxShard: 1000},
			hfCase{Format: "torch", DType: "float32", Arch: "llama", Config: cfg}},
		{"tp2_gqa_swiglu", Options{}, // default dtype: fp16, the training dtype
			hfCase{Format: "safetensors", DType: "float16"}},
		{"same_tp2_pp2", Options{Torch: true, DType: dtype.BFloat16, Params: regexp.MustCompile(`layers\.1\.`)},
			hfCase{Format: "torch", DType: "bfloat16", Params: `layers\.1\.`}},
	}
	readers := map[string]*atomic.Reader{}
	var cases []hfCase
	for i, x := range runs {
		r := readers[x.fixture]
		if r == nil {
			r = atomicOf(t, x.fixture)
			readers[x.fixture] = r
			b, err := os.ReadFile(testkit.Fixture("megatron", x.fixture, "truth.pt"))
			if err == nil {
				err = os.WriteFile(filepath.Join(work, x.fixture+".pt"), b, 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		x.c.Dir = filepath.Base(t.Name()) + "-" + string(rune('a'+i))
		x.c.Truth = x.fixture + ".pt"
		x.opt.Memory = 4096 // below one worker's buffers: one worker
		x.opt.NoSync = true
		st, err := Export(context.Background(), r, filepath.Join(work, x.c.Dir), x.opt)
		if err != nil {
			t.Fatalf("%s: %v", x.fixture, err)
		}
		if st.DType.String() != x.c.DType {
			t.Errorf("%s: exported %v, want %s", x.c.Dir, st.DType, x.c.DType)
		}
		if x.opt.MaxShard > 0 && st.Files < 2 {
			t.Errorf("%s: max shard %d gave %d file(s)", x.c.Dir, x.opt.MaxShard, st.Files)
		}
		cases = append(cases, x.c)
	}
	b, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "cases.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := testkit.Torch2(t, work, filepath.Join(testkit.RepoRoot(), "testdata", "check", "check_hf.py"), "cases.json")
	t.Log(strings.TrimSpace(out))
}

// The plain export read back with ucp's own reader equals the atomic
// tensors cast with dtype.FromFloat32 (runs without the torch 2.x chroot),
// and the progress reported adds up to the total announced.
func TestExportPlainReadBack(t *testing.T) {
	r := atomicOf(t, "tp2_gqa_swiglu")
	dst := filepath.Join(t.TempDir(), "hf")
	var mu sync.Mutex
	var total, read, written int64
	progress := func(t, r, w int64) {
		mu.Lock()
		total, read, written = total+t, read+r, written+w
		mu.Unlock()
	}
	st, err := Export(context.Background(), r, dst, Options{DType: dtype.BFloat16, NoSync: true, Memory: 1000, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if read+written != total || written != st.TensorBytes {
		t.Errorf("progress read %d, wrote %d bytes of %d announced; the tensors have %d", read, written, total, st.TensorBytes)
	}
	f, err := safetensors.Open(filepath.Join(dst, SafetensorsName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Names()) != len(r.Params()) || st.Tensors != len(r.Params()) || st.Files != 1 {
		t.Fatalf("%d tensors in the file, %d in stats, %d parameters", len(f.Names()), st.Tensors, len(r.Params()))
	}
	for _, p := range r.Params() {
		tt, ok := f.Tensor(p.Name)
		if !ok {
			t.Fatalf("no tensor %s", p.Name)
		}
		got, err := f.ReadTensor(tt)
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.OpenState(p.Name, "fp32")
		if err != nil {
			t.Fatal(err)
		}
		src := make([]byte, 4*s.Numel())
		if err := s.ReadRange(0, s.Numel(), src); err != nil {
			t.Fatal(err)
		}
		s.Close()
		want := make([]byte, 2*s.Numel())
		if err := dtype.FromFloat32(want, src, dtype.BFloat16); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) || tt.DType != dtype.BFloat16 {
			t.Errorf("%s differs", p.Name)
		}
	}
	if _, err := os.Stat(dst + atomic.PartialSuffix); !os.IsNotExist(err) {
		t.Errorf("%s.partial left behind", dst)
	}
}

// Bad input gives a clear error and leaves neither DST nor DST.partial.
func TestExportErrors(t *testing.T) {
	r := atomicOf(t, "tp2_gqa_swiglu")
	legacy := atomicOf(t, "legacy_tp2_pp2")
	// Trained with --moe-router-enable-expert-bias (a non-zero expert_bias
	// buffer) and softmax routing: mixtral and qwen*_moe have no bias in
	// their top-k, so the routing would change (deepseek_v3 needs MLA).
	bias := atomicOf(t, "moe_ep2")
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing")
	if err := os.MkdirAll(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		r    *atomic.Reader
		dst  string
		opt  Options
		want string
	}{
		{"unknown arch", r, "a", Options{Arch: "gpt5"}, `unknown model family "gpt5" (known: llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3)`},
		{"not a family", legacy, "b", Options{Arch: "llama"}, "args.normalization is LayerNorm: the families llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3 use RMSNorm; --arch llama names the family only"},
		{"auto not a family", legacy, "b2", Options{Arch: ArchAuto}, "none of the known families"},
		{"expert bias auto", bias, "eb1", Options{Arch: ArchAuto}, "args.moe_router_enable_expert_bias is true (a routing bias"},
		{"expert bias mixtral", bias, "eb2", Options{Arch: "mixtral"}, "args.moe_router_enable_expert_bias is true (a routing bias"},
		{"expert bias qwen3_moe", bias, "eb3", Options{Arch: "qwen3_moe"}, "args.moe_router_enable_expert_bias is true (a routing bias"},
		{"expert bias deepseek_v3 without MLA", bias, "eb4", Options{Arch: "deepseek_v3"}, "args.moe_router_enable_expert_bias is true (a routing bias"},
		{"shard below every tensor", r, "c", Options{MaxShard: 10}, "below every tensor"},
		{"existing dst", r, "existing", Options{}, "already exists (use --force"},
		{"int dtype", r, "d", Options{DType: dtype.Int8}, "cannot export int8"},
		{"no params", r, "e", Options{Params: regexp.MustCompile(`^nothing$`)}, "no parameter to export"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(dir, c.dst)
			_, err := Export(context.Background(), c.r, dst, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if _, err := os.Stat(dst + atomic.PartialSuffix); !os.IsNotExist(err) {
				t.Errorf("%s.partial exists", dst)
			}
			if _, err := os.Stat(dst); c.dst != "existing" && !os.IsNotExist(err) {
				t.Errorf("%s exists", dst)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"5GB": 5e9, "5GiB": 5 << 30, "10MB": 1e7, "3MiB": 3 << 20, "7kB": 7000, "7kb": 875,
		"8Gb": 1e9, "100": 100, "2KiB": 2048} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1.5GB", "GB", "-1", "0", "5 GB", "5TB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q): no error", in)
		}
	}
}

// packShards follows huggingface_hub: stable greedy packing, an oversize
// tensor alone in its own shard without closing the current one.
func TestPackShards(t *testing.T) {
	mk := func(sizes ...int64) []*Tensor {
		var out []*Tensor
		for i, s := range sizes {
			out = append(out, &Tensor{Name: string(rune('a' + i)), DType: dtype.Uint8, Shape: []int64{s}})
		}
		return out
	}
	cases := []struct {
		sizes []int64
		max   int64
		want  string
	}{
		{[]int64{1, 2, 3}, 10, "abc"},
		{[]int64{4, 4, 4}, 8, "ab|c"},
		{[]int64{4, 20, 4, 1}, 8, "b|ac|d"},
		{[]int64{8, 8}, 8, "a|b"},
		{[]int64{3, 6, 2}, 8, "a|bc"},
	}
	for _, c := range cases {
		shards, err := packShards(mk(c.sizes...), c.max)
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, s := range shards {
			var p string
			for _, x := range s {
				p += x.Name
			}
			parts = append(parts, p)
		}
		if got := strings.Join(parts, "|"); got != c.want {
			t.Errorf("%v at %d: %s, want %s", c.sizes, c.max, got, c.want)
		}
	}
}
