package family

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func llamaArgs() Args {
	return Args{
		"num_layers": int64(2), "hidden_size": int64(8), "ffn_hidden_size": int64(12), "num_attention_heads": int64(4),
		"group_query_attention": true, "num_query_groups": int64(2), "max_position_embeddings": int64(64),
		"normalization": "RMSNorm", "norm_epsilon": 1e-6, "swiglu": true, "position_embedding_type": "rope",
		"rotary_base": int64(500000), "untie_embeddings_and_output_weights": true, "add_bias_linear": false,
	}
}

func with(a Args, kv ...any) Args {
	out := Args{}
	for k, v := range a {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func TestFromArgs(t *testing.T) {
	cases := []struct {
		name    string
		args    Args
		family  string
		err     string // FromArgs or Check error substring
		inspect func(c *Config) string
	}{
		{"llama", llamaArgs(), "llama", "", func(c *Config) string {
			if c.HeadDim != 2 || c.QueryGroups != 2 || c.Tied || c.RopeTheta != 500000 || c.RopeScaling != nil {
				return fmt.Sprintf("%+v", c)
			}
			return ""
		}},
		{"json floats", with(llamaArgs(), "num_layers", 2.0, "hidden_size", 8.0), "llama", "", nil},
		{"qwen2", with(llamaArgs(), "add_qkv_bias", true), "qwen2", "", nil},
		{"qwen3", with(llamaArgs(), "qk_layernorm", true, "kv_channels", int64(4)), "qwen3", "", func(c *Config) string {
			if c.HeadDim != 4 {
				return "head dim"
			}
			return ""
		}},
		{"bias linear is llama attention_bias + mlp_bias", with(llamaArgs(), "add_bias_linear", true), "llama", "", func(c *Config) string {
			if !c.QKVBias || !c.OutBias || !c.MLPBias {
				return "biases"
			}
			return ""
		}},
		{"rope scaling", with(llamaArgs(), "use_rope_scaling", true, "rope_scaling_factor", 32.0), "llama", "", func(c *Config) string {
			want := RopeScaling{Type: "llama3", Factor: 32, LowFreq: 1, HighFreq: 4, OriginalMaxPE: 8192}
			if c.RopeScaling == nil || *c.RopeScaling != want {
				return fmt.Sprintf("%+v", c.RopeScaling)
			}
			return ""
		}},
		{"rope scaling default factor", with(llamaArgs(), "use_rope_scaling", true), "llama", "", func(c *Config) string {
			if c.RopeScaling == nil || c.RopeScaling.Factor != 8 {
				return "factor"
			}
			return ""
		}},
		{"linear interpolation", with(llamaArgs(), "rotary_seq_len_interpolation_factor", 2.0), "llama", "", func(c *Config) string {
			if c.RopeScaling == nil || c.RopeScaling.Type != "linear" || c.RopeScaling.Factor != 2 {
				return "linear"
			}
			return ""
		}},
		{"interleaved", with(llamaArgs(), "rotary_interleaved", true), "llama", "", func(c *Config) string {
			if !c.RotaryInterleaved {
				return "interleaved"
			}
			return ""
		}},
		{"1p", with(llamaArgs(), "apply_layernorm_1p", true), "llama", "", func(c *Config) string {
			if !c.LayerNorm1p {
				return "1p"
			}
			return ""
		}},
		{"rotary percent", with(llamaArgs(), "rotary_percent", 0.5), "", "rotary_percent 0.5", nil},
		{"squared relu", with(llamaArgs(), "swiglu", false, "squared_relu", true), "", "squared_relu", nil},
		{"gelu", with(llamaArgs(), "swiglu", false), "", "gelu", nil},
		{"layernorm", with(llamaArgs(), "normalization", "LayerNorm"), "", "LayerNorm", nil},
		{"no normalization", with(llamaArgs(), "normalization", nil), "", "record no normalization", nil},
		{"learned positions", with(llamaArgs(), "position_embedding_type", "learned_absolute"), "", "learned_absolute", nil},
		{"post-norm residual", with(llamaArgs(), "apply_residual_connection_post_layernorm", true), "", "apply_residual_connection_post_layernorm", nil},
		{"mla", with(llamaArgs(), "multi_latent_attention", true), "", "multi_latent_attention", nil},
		{"both scalings", with(llamaArgs(), "use_rope_scaling", true, "rotary_seq_len_interpolation_factor", 2.0), "", "rotary_seq_len_interpolation_factor", nil},
		{"qk norm and qkv bias only", with(llamaArgs(), "qk_layernorm", true, "add_qkv_bias", true), "", "add_qkv_bias without add_bias_linear", nil},
		{"bad groups", with(llamaArgs(), "num_query_groups", int64(3)), "", "do not split", nil},
		{"megatron-deepspeed", with(llamaArgs(), "group_query_attention", nil, "num_query_groups", nil, "num_key_value_heads", int64(2),
			"position_embedding_type", nil, "use_rotary_position_embeddings", true, "normalization", "rmsnorm", "rotary_base", nil, "rope_theta", 10000.0), "llama", "", func(c *Config) string {
			if c.QueryGroups != 2 || c.RopeTheta != 10000 {
				return "mds"
			}
			return ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fromArgsCase(t, tc.args, tc.err)
			if c == nil {
				return
			}
			if c.Family != tc.family {
				t.Fatalf("family %s, want %s", c.Family, tc.family)
			}
			if tc.inspect != nil {
				if msg := tc.inspect(c); msg != "" {
					t.Fatal(msg)
				}
			}
		})
	}
}

// TestFamilyChecks: forcing a family on a config it cannot compute is
// refused with the option's name.
func TestFamilyChecks(t *testing.T) {
	base, err := FromArgs(llamaArgs())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		family string
		mod    func(c *Config)
		err    string
	}{
		{"llama", func(c *Config) { c.QKNorm = true }, "qk_layernorm"},
		{"llama", func(c *Config) { c.QKVBias = true }, "add_qkv_bias"},
		{"mistral", func(c *Config) { c.QKVBias = true }, "biases"},
		{"mistral", func(c *Config) { c.RopeScaling = &RopeScaling{Type: "llama3", Factor: 8} }, "rope scaling"},
		{"qwen2", func(c *Config) {}, "add_qkv_bias not set"},
		{"qwen3", func(c *Config) {}, "qk_layernorm not set"},
		{"qwen3", func(c *Config) { c.QKNorm, c.MLPBias, c.QKVBias, c.OutBias = true, true, true, true }, "MLP biases"},
		{"nope", func(c *Config) {}, "unknown model family"},
	}
	for _, tc := range cases {
		c := *base
		c.Family = tc.family
		tc.mod(&c)
		if err := c.Check(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.family, err, tc.err)
		}
	}
}

// simulate builds a fused tensor's row labels from FusedRows: "part:row".
func simulate(spans []Span) []string {
	var out []string
	for _, s := range spans {
		for i := int64(0); i < s.N; i++ {
			out = append(out, fmt.Sprintf("%d:%d", s.Part, s.Row+i))
		}
	}
	return out
}

func TestFusedRows(t *testing.T) {
	c := &Config{Heads: 4, QueryGroups: 2, HeadDim: 2, FFN: 4}
	cases := []struct {
		name           string
		fuse           Fuse
		stacked, inter bool
		T, t           int
		want           string
	}{
		{"grouped", QKV, false, false, 1, 0, "0:0 0:1 0:2 0:3 1:0 1:1 2:0 2:1 0:4 0:5 0:6 0:7 1:2 1:3 2:2 2:3"},
		{"grouped tp2 rank1", QKV, false, false, 2, 1, "0:4 0:5 0:6 0:7 1:2 1:3 2:2 2:3"},
		{"stacked", QKV, true, false, 1, 0, "0:0 0:1 0:2 0:3 0:4 0:5 0:6 0:7 1:0 1:1 1:2 1:3 2:0 2:1 2:2 2:3"},
		{"gate up tp2 rank0", GateUp, false, false, 2, 0, "0:0 0:1 1:0 1:1"},
	}
	for _, tc := range cases {
		spans, err := FusedRows(c, tc.fuse, tc.stacked, tc.inter, tc.T, tc.t)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(simulate(spans), " "); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	// Interleaved, one head of dim 4: Megatron rows are HF rows 0, 2, 1, 3
	// (adjacent pairs (0,1) rotate together as HF's (0, d/2)); v is not
	// reordered.
	c1 := &Config{Heads: 1, QueryGroups: 1, HeadDim: 4}
	spans, err := FusedRows(c1, QKV, false, true, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(simulate(spans), " "), "0:0 0:2 0:1 0:3 1:0 1:2 1:1 1:3 2:0 2:1 2:2 2:3"; got != want {
		t.Errorf("interleaved:\n got %s\nwant %s", got, want)
	}
	if _, err := FusedRows(c, QKV, false, false, 4, 0); err == nil || !strings.Contains(err.Error(), "query groups") {
		t.Errorf("tp 4 of 2 groups: %v", err)
	}
}

// TestPartRows: every part's rows, gathered from the fused tensor, come
// back in HF order, for every layout.
func TestPartRows(t *testing.T) {
	for _, c := range []*Config{{Heads: 4, QueryGroups: 2, HeadDim: 4, FFN: 6}, {Heads: 6, QueryGroups: 1, HeadDim: 2, FFN: 2}, {Heads: 2, QueryGroups: 2, HeadDim: 6, FFN: 4}} {
		for _, lay := range []struct{ stacked, inter bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			for _, fuse := range []Fuse{QKV, GateUp} {
				spans, err := FusedRows(c, fuse, lay.stacked, lay.inter, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				rows := simulate(spans)
				nparts := 3
				if fuse == GateUp {
					nparts = 2
				}
				for part := 0; part < nparts; part++ {
					var got []string
					for _, run := range PartRows(spans, part) {
						got = append(got, rows[run[0]:run[0]+run[1]]...)
					}
					var want []string
					for i := int64(0); i < PartRowCount(c, fuse, part); i++ {
						want = append(want, fmt.Sprintf("%d:%d", part, i))
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%+v %+v fuse %d part %d: %v", c, lay, fuse, part, got)
					}
				}
			}
		}
	}
}

func megatronParams(c *Config, te bool) []Param {
	H, d, G := c.Hidden, c.HeadDim, c.QueryGroups
	ps := []Param{{"embedding.word_embeddings.weight", []int64{c.Vocab, H}}}
	for l := 0; l < int(c.Layers); l++ {
		p := fmt.Sprintf("decoder.layers.%d.", l)
		norm1, norm2 := p+"input_layernorm.weight", p+"pre_mlp_layernorm.weight"
		if te {
			norm1, norm2 = p+"self_attention.linear_qkv.layer_norm_weight", p+"mlp.linear_fc1.layer_norm_weight"
		}
		ps = append(ps, Param{norm1, []int64{H}}, Param{p + "self_attention.linear_qkv.weight", []int64{(c.Heads + 2*G) * d, H}},
			Param{p + "self_attention.linear_proj.weight", []int64{H, c.Heads * d}}, Param{norm2, []int64{H}},
			Param{p + "mlp.linear_fc1.weight", []int64{2 * c.FFN, H}}, Param{p + "mlp.linear_fc2.weight", []int64{H, c.FFN}})
		if c.QKNorm {
			ps = append(ps, Param{p + "self_attention.q_layernorm.weight", []int64{d}}, Param{p + "self_attention.k_layernorm.weight", []int64{d}})
		}
		if c.QKVBias {
			ps = append(ps, Param{p + "self_attention.linear_qkv.bias", []int64{(c.Heads + 2*G) * d}})
		}
	}
	ps = append(ps, Param{"decoder.final_layernorm.weight", []int64{H}})
	if !c.Tied {
		ps = append(ps, Param{"output_layer.weight", []int64{c.Vocab, H}})
	}
	return ps
}

func TestResolveMegatron(t *testing.T) {
	for _, te := range []bool{false, true} {
		c, err := FromArgs(with(llamaArgs(), "qk_layernorm", true, "apply_layernorm_1p", true))
		if err != nil {
			t.Fatal(err)
		}
		c.Vocab = 10
		s, err := Resolve(c, megatronParams(c, te), "megatron")
		if err != nil {
			t.Fatal(err)
		}
		ts, err := s.Unfused(HF)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, x := range ts {
			got = append(got, fmt.Sprintf("%s%v%s", x.Name, x.Shape, map[bool]string{true: "+1"}[x.AddOne]))
		}
		want := "model.embed_tokens.weight[10 8] " +
			"model.layers.0.self_attn.q_proj.weight[8 8] model.layers.0.self_attn.k_proj.weight[4 8] model.layers.0.self_attn.v_proj.weight[4 8] " +
			"model.layers.0.self_attn.o_proj.weight[8 8] model.layers.0.self_attn.q_norm.weight[2]+1 model.layers.0.self_attn.k_norm.weight[2]+1 " +
			"model.layers.0.mlp.gate_proj.weight[12 8] model.layers.0.mlp.up_proj.weight[12 8] model.layers.0.mlp.down_proj.weight[8 12] " +
			"model.layers.0.input_layernorm.weight[8]+1 model.layers.0.post_attention_layernorm.weight[8]+1"
		if g := strings.Join(got[:12], " "); g != want {
			t.Errorf("te %v:\n got %s\nwant %s", te, g, want)
		}
		if got[len(got)-1] != "lm_head.weight[10 8]" || got[len(got)-2] != "model.norm.weight[8]+1" {
			t.Errorf("tail %v", got[len(got)-2:])
		}
		// q_proj of layer 0: group 0's two heads then group 1's (rows 0-3, 8-11 of 16 in the fused tensor).
		if p := ts[1].Pieces; len(p) != 2 || p[0] != (Piece{"decoder.layers.0.self_attention.linear_qkv.weight", 0, 32}) || p[1].Start != 8*8 {
			t.Errorf("q pieces %v", p)
		}
	}
}

func TestResolveErrors(t *testing.T) {
	c, err := FromArgs(llamaArgs())
	if err != nil {
		t.Fatal(err)
	}
	c.Vocab = 10
	good := megatronParams(c, false)
	cases := []struct {
		name   string
		params []Param
		err    string
	}{
		{"missing", good[:len(good)-1], "lacks 1 parameter(s) of the llama model: lm_head"},
		{"unknown", append(append([]Param{}, good...), Param{"decoder.layers.0.mystery.weight", []int64{1}}), "no role"},
		{"bias not in config", append(append([]Param{}, good...), Param{"decoder.layers.0.self_attention.linear_qkv.bias", []int64{16}}), "does not have"},
		{"mixed namings", append(append([]Param{}, good[1:]...), Param{"model.embed_tokens.weight", []int64{10, 8}}), "no role in the llama family under one naming"},
	}
	for _, tc := range cases {
		if _, err := Resolve(c, tc.params, "megatron"); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

// TestHFConfigRoundTrip: every family's config.json fields read back as
// the config they came from.
func TestHFConfigRoundTrip(t *testing.T) {
	base, err := FromArgs(llamaArgs())
	if err != nil {
		t.Fatal(err)
	}
	base.Vocab = 10
	mods := map[string]func(c *Config){
		"llama": func(c *Config) {
			c.RopeScaling = &RopeScaling{Type: "llama3", Factor: 8, LowFreq: 1, HighFreq: 4, OriginalMaxPE: 8192}
		},
		"mistral": func(c *Config) {},
		"qwen2":   func(c *Config) { c.QKVBias = true },
		"qwen3":   func(c *Config) { c.QKNorm = true; c.HeadDim = 6 },
		"mixtral": func(c *Config) { c.Experts, c.TopK, c.MoEFFN, c.NormTopK = 4, 2, c.FFN, true },
		"qwen2_moe": func(c *Config) {
			c.QKVBias, c.Experts, c.TopK, c.MoEFFN, c.SharedFFN, c.SharedGate = true, 4, 2, 6, 10, true
		},
		"qwen3_moe": func(c *Config) { c.QKNorm, c.HeadDim, c.Experts, c.TopK, c.MoEFFN, c.NormTopK = true, 6, 4, 1, 6, true },
		"deepseek_v3": func(c *Config) {
			c.QueryGroups, c.QKNorm, c.MLA, c.QLoraRank, c.KVLoraRank, c.QKNopeDim, c.QKRopeDim, c.VHeadDim, c.HeadDim = 4, true, true, 6, 4, 4, 2, 3, 6
			c.Experts, c.TopK, c.MoEFFN, c.SharedFFN, c.NormTopK, c.DenseLayers = 4, 2, 5, 10, true, 1
			c.ScoreFunc, c.ExpertBias, c.TopKScale, c.Groups, c.GroupTopK = "sigmoid", true, 2.5, 2, 1
		},
	}
	for _, f := range All() {
		c := *base
		c.Family = f.Name
		mods[f.Name](&c)
		m, err := c.ToHF()
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		back, err := FromHF(m)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		c.VocabDivisor = 0
		if !reflect.DeepEqual(*back, c) {
			t.Errorf("%s:\n got %+v\nwant %+v", f.Name, *back, c)
		}
	}
	if _, err := FromHF(map[string]any{"model_type": "gpt2"}); err == nil || !strings.Contains(err.Error(), "gpt2") {
		t.Errorf("gpt2: %v", err)
	}
	q := map[string]any{"model_type": "qwen2", "hidden_size": 8.0, "intermediate_size": 12.0, "num_hidden_layers": 2.0, "num_attention_heads": 4.0,
		"vocab_size": 10.0, "max_position_embeddings": 64.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "use_sliding_window": true}
	c, err := FromHF(q)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MegatronCheck(); err == nil || !strings.Contains(err.Error(), "use_sliding_window") {
		t.Errorf("sliding window: %v", err)
	}
}

// TestResolveTitan: torchtitan llama keys (old and new spellings) map to
// HF with each head's q/k rows taken from the complex-RoPE pair order.
func TestResolveTitan(t *testing.T) {
	c := &Config{Family: "llama", Hidden: 8, FFN: 4, Layers: 1, Heads: 2, QueryGroups: 1, HeadDim: 4, Vocab: 5,
		Norm: "RMSNorm", Activation: "swiglu", RotaryPercent: 1}
	for _, newer := range []bool{false, true} {
		q, out := "layers.0.attention.wq.weight", "output.weight"
		if newer {
			q, out = "layers.0.attention.qkv_linear.wq.weight", "lm_head.weight"
		}
		ps := []Param{{"tok_embeddings.weight", []int64{5, 8}}, {q, []int64{8, 8}}, {strings.Replace(q, "wq", "wk", 1), []int64{4, 8}},
			{strings.Replace(q, "wq", "wv", 1), []int64{4, 8}}, {"layers.0.attention.wo.weight", []int64{8, 8}},
			{"layers.0.feed_forward.w1.weight", []int64{4, 8}}, {"layers.0.feed_forward.w2.weight", []int64{8, 4}}, {"layers.0.feed_forward.w3.weight", []int64{4, 8}},
			{"layers.0.attention_norm.weight", []int64{8}}, {"layers.0.ffn_norm.weight", []int64{8}}, {"norm.weight", []int64{8}}, {out, []int64{5, 8}}}
		s, err := Resolve(c, ps, "dcp")
		if err != nil {
			t.Fatal(err)
		}
		if s.Naming != Titan || !s.Layout.Interleaved {
			t.Fatalf("naming %v layout %+v", s.Naming, s.Layout)
		}
		ts, err := s.Unfused(HF)
		if err != nil {
			t.Fatal(err)
		}
		var rows []int64
		for _, p := range ts[1].Pieces { // q_proj
			rows = append(rows, p.Start/8)
		}
		if want := []int64{0, 2, 1, 3, 4, 6, 5, 7}; !reflect.DeepEqual(rows, want) {
			t.Errorf("q rows %v, want %v", rows, want)
		}
		if ts[3].Name != "model.layers.0.self_attn.v_proj.weight" || len(ts[3].Pieces) != 1 {
			t.Errorf("v: %+v", ts[3])
		}
		if ts[len(ts)-1].Name != "lm_head.weight" {
			t.Errorf("last %s", ts[len(ts)-1].Name)
		}
	}
}

// TestHFConfigMalformed: a config.json value of the wrong type is an error
// naming the key, never read as absent.
func TestHFConfigMalformed(t *testing.T) {
	base := func(kv ...any) map[string]any {
		m := map[string]any{"model_type": "llama", "hidden_size": 8.0, "intermediate_size": 12.0, "num_hidden_layers": 2.0,
			"num_attention_heads": 4.0, "vocab_size": 10.0, "max_position_embeddings": 64.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	if _, err := FromHF(base()); err != nil {
		t.Fatalf("well-formed: %v", err)
	}
	for _, tc := range []struct {
		name string
		m    map[string]any
		want string
	}{
		{"rope_scaling str", base("rope_scaling", "llama3"), "rope_scaling is llama3, not an object"},
		{"rope_scaling list", base("rope_scaling", []any{8.0}), "rope_scaling is [8], not an object"},
		{"tie_word_embeddings str", base("tie_word_embeddings", "yes"), "tie_word_embeddings is yes"},
		{"mlp_only_layers str", base("model_type", "qwen2_moe", "num_experts", 4.0, "num_experts_per_tok", 2.0, "moe_intermediate_size", 6.0,
			"shared_expert_intermediate_size", 10.0, "mlp_only_layers", "0"), "mlp_only_layers is 0, not a list"},
		// Fields read as numbers or strings were taken as absent when of
		// another type (a default eps, theta or head count took their place).
		{"num_key_value_heads str", base("num_key_value_heads", "2"), "config.json: num_key_value_heads is 2 (string), not an integer"},
		{"layers fractional", base("num_hidden_layers", 2.5), "num_hidden_layers is 2.5, not an integer"},
		{"rope_theta str", base("rope_theta", "1e6"), "rope_theta is 1e6 (string), not a number"},
		{"hidden_act number", base("hidden_act", 1.0), "hidden_act is 1 (float64), not a string"},
	} {
		if _, err := FromHF(tc.m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// TestArgsTypes: Megatron arguments of the wrong type are refused by name.
func TestArgsTypes(t *testing.T) {
	for _, tc := range []struct {
		a    Args
		want string
	}{
		{Args{"num_layers": "2"}, "args: num_layers is 2 (string), not an integer"},
		{Args{"rotary_base": true}, "args: rotary_base is true (bool), not a number"},
		{Args{"normalization": 1.0}, "args: normalization is 1 (float64), not a string"},
	} {
		if _, err := FromArgs(tc.a); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.a, err, tc.want)
		}
	}
}

// fromArgsCase reads args as a family config and checks it; with wantErr
// it wants an error holding it and returns nil.
func fromArgsCase(t *testing.T, args Args, wantErr string) *Config {
	t.Helper()
	c, err := FromArgs(args)
	if err == nil {
		err = c.Check()
	}
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}
