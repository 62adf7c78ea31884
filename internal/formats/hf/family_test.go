package hf

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/safetensors"
)

// exportF32 exports r with opt (float32) and returns the tensors by name
// and config.json.
func exportF32(t *testing.T, r *atomic.Reader, opt Options) (map[string][]float32, map[string]any) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "hf")
	opt.DType, opt.NoSync = dtype.Float32, true
	if _, err := Export(context.Background(), r, dst, opt); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dst, SafetensorsName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, n := range f.Names() {
		tt, _ := f.Tensor(n)
		b, err := f.ReadTensor(tt)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		out[n] = v
	}
	var cfg map[string]any
	b, err := os.ReadFile(filepath.Join(dst, ConfigName))
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil && opt.Arch != ArchNone {
		t.Fatal(err)
	}
	return out, cfg
}

// withModel runs f with the manifest's model config changed by mod.
func withModel(t *testing.T, r *atomic.Reader, mod func(c *family.Config)) func() {
	c, err := r.Model()
	if err != nil {
		t.Fatal(err)
	}
	old := r.Manifest.Source.Model
	mod(c)
	r.Manifest.Source.Model = c
	return func() { r.Manifest.Source.Model = old }
}

// TestExportCarriedOptions: each Megatron option that changes the math
// and that the family expresses is carried: apply_layernorm_1p (+1 in
// fp32 on every norm, nothing else changed), rotary_interleaved (each q/k
// head's rows from adjacent-pair order), rope scaling (config.json), and
// --arch auto is the recorded family.
func TestExportCarriedOptions(t *testing.T) {
	r := atomicOf(t, "tp2_gqa_swiglu")
	base, baseCfg := exportF32(t, r, Options{Arch: "llama"})
	auto, _ := exportF32(t, r, Options{Arch: ArchAuto})
	for n, v := range base {
		if !equalF32(auto[n], v) {
			t.Errorf("auto and llama differ at %s", n)
		}
	}
	if baseCfg["architectures"].([]any)[0] != "LlamaForCausalLM" || baseCfg["rope_scaling"] != nil {
		t.Errorf("config %v", baseCfg)
	}
	c, _ := r.Model()

	restore := withModel(t, r, func(c *family.Config) { c.LayerNorm1p = true })
	onep, _ := exportF32(t, r, Options{Arch: ArchAuto})
	restore()
	norms := 0
	for n, v := range base {
		w := onep[n]
		isNorm := strings.HasSuffix(n, "layernorm.weight") || n == "model.norm.weight"
		for i := range v {
			want := v[i]
			if isNorm {
				want = v[i] + 1
			}
			if w[i] != want {
				t.Fatalf("1p: %s[%d] = %v, want %v", n, i, w[i], want)
			}
		}
		if isNorm {
			norms++
		}
	}
	if norms != int(2*c.Layers+1) {
		t.Errorf("1p: %d norms", norms)
	}

	restore = withModel(t, r, func(c *family.Config) { c.RotaryInterleaved = true })
	inter, _ := exportF32(t, r, Options{Arch: ArchAuto})
	restore()
	d, hidden := int(c.HeadDim), int(c.Hidden)
	for n, v := range base {
		w := inter[n]
		if !strings.HasSuffix(n, "q_proj.weight") && !strings.HasSuffix(n, "k_proj.weight") {
			if !equalF32(w, v) {
				t.Errorf("interleaved changed %s", n)
			}
			continue
		}
		// The source's rows are in interleaved order: HF row i of a head
		// is its row 2i, row d/2+i its row 2i+1.
		for h := 0; h < len(v)/hidden/d; h++ {
			for i := 0; i < d; i++ {
				from := 2 * i
				if i >= d/2 {
					from = 2*(i-d/2) + 1
				}
				got, want := w[(h*d+i)*hidden:(h*d+i+1)*hidden], v[(h*d+from)*hidden:(h*d+from+1)*hidden]
				if !equalF32(got, want) {
					t.Fatalf("%s head %d row %d is not source row %d", n, h, i, from)
				}
			}
		}
	}

	restore = withModel(t, r, func(c *family.Config) {
		c.RopeScaling = &family.RopeScaling{Type: "llama3", Factor: 32, LowFreq: 1, HighFreq: 4, OriginalMaxPE: 8192}
	})
	_, cfg := exportF32(t, r, Options{Arch: ArchAuto})
	restore()
	rs, _ := cfg["rope_scaling"].(map[string]any)
	if rs["rope_type"] != "llama3" || rs["factor"] != 32.0 || rs["low_freq_factor"] != 1.0 || rs["high_freq_factor"] != 4.0 || rs["original_max_position_embeddings"] != 8192.0 {
		t.Errorf("rope_scaling %v", cfg["rope_scaling"])
	}

	_, cfg = exportF32(t, r, Options{Arch: "mistral"})
	if cfg["architectures"].([]any)[0] != "MistralForCausalLM" || cfg["sliding_window"] != nil {
		t.Errorf("mistral config %v", cfg)
	}
	if _, ok := cfg["sliding_window"]; !ok {
		t.Error("mistral config has no sliding_window: null (its default is 4096)")
	}
	plain, _ := exportF32(t, r, Options{Arch: ArchNone})
	if _, ok := plain["decoder.layers.0.self_attention.linear_qkv.weight"]; !ok {
		t.Error("--arch none renamed the tensors")
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestExportRefusals: an option no family computes, or one the named
// family does not, is refused by name and nothing is written.
func TestExportRefusals(t *testing.T) {
	r := atomicOf(t, "tp2_gqa_swiglu")
	cases := []struct {
		name string
		arch string
		mod  func(c *family.Config)
		args map[string]any // replaces the recorded args, model unset
		want string
	}{
		{"rotary percent", ArchAuto, func(c *family.Config) { c.RotaryPercent = 0.5 }, nil, "rotary_percent 0.5"},
		{"squared relu", ArchAuto, func(c *family.Config) { c.Activation = "squared_relu" }, nil, "activation squared_relu"},
		{"qk norm as llama", "llama", func(c *family.Config) { c.QKNorm = true }, nil, "qk_layernorm"},
		{"no qk norm as qwen3", "qwen3", func(c *family.Config) {}, nil, "qk_layernorm not set"},
		{"rope scaling as mistral", "mistral", func(c *family.Config) { c.RopeScaling = &family.RopeScaling{Type: "llama3", Factor: 8} }, nil, "rope_scaling"},
		{"args rotary percent", ArchAuto, nil, map[string]any{"rotary_percent": 0.5}, "rotary_percent 0.5"},
		{"args squared relu", ArchAuto, nil, map[string]any{"swiglu": false, "squared_relu": true}, "squared_relu"},
		{"args post-norm", ArchAuto, nil, map[string]any{"apply_residual_connection_post_layernorm": true}, "apply_residual_connection_post_layernorm"},
		{"args learned positions", "llama", nil, map[string]any{"position_embedding_type": "learned_absolute"}, "learned_absolute"},
		{"no args", ArchAuto, nil, map[string]any{"__none__": true}, "records no model family or training arguments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			oldModel, oldArgs := r.Manifest.Source.Model, r.Manifest.Source.Args
			defer func() { r.Manifest.Source.Model, r.Manifest.Source.Args = oldModel, oldArgs }()
			if tc.mod != nil {
				withModel(t, r, tc.mod)
			} else {
				r.Manifest.Source.Model = nil
				if _, ok := tc.args["__none__"]; ok {
					r.Manifest.Source.Args = nil
				} else {
					a := map[string]any{}
					for k, v := range oldArgs {
						a[k] = v
					}
					for k, v := range tc.args {
						a[k] = v
					}
					r.Manifest.Source.Args = a
				}
			}
			dst := filepath.Join(t.TempDir(), "hf")
			_, err := Export(context.Background(), r, dst, Options{Arch: tc.arch, NoSync: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if tc.arch == ArchAuto && tc.mod == nil && tc.name != "args rotary percent" && !strings.Contains(err.Error(), "--arch") {
				t.Errorf("the error does not name --arch: %v", err)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Errorf("%s written", dst)
			}
		})
	}
}
