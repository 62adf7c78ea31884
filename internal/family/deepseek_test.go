package family

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// dsArgs are Megatron-LM arguments of a small DeepSeek-V3-shaped model
// (as Megatron's parse_args stores them): 3 layers, the first dense.
func dsArgs(kv ...any) Args {
	a := with(llamaArgs(), "group_query_attention", false, "num_query_groups", nil, "num_layers", int64(3),
		"multi_latent_attention", true, "qk_layernorm", true, "q_lora_rank", int64(6), "kv_lora_rank", int64(4),
		"qk_head_dim", int64(4), "qk_pos_emb_head_dim", int64(2), "v_head_dim", int64(3), "rope_type", "rope",
		"rotary_scaling_factor", 1.0, "mscale", 1.0, "mscale_all_dim", 0.0,
		"num_experts", int64(4), "moe_router_topk", int64(2), "moe_ffn_hidden_size", int64(5),
		"moe_shared_expert_intermediate_size", int64(10), "moe_layer_freq", []any{int64(0), int64(1), int64(1)},
		"moe_router_score_function", "sigmoid", "moe_router_enable_expert_bias", true, "moe_router_topk_scaling_factor", 2.5,
		"moe_router_num_groups", int64(2), "moe_router_group_topk", int64(1))
	return with(a, kv...)
}

// TestDeepseekFromArgs: Megatron's MLA and DeepSeek routing arguments read
// as the deepseek_v3 config, and every option that changes the math and
// that DeepseekV3ForCausalLM does not compute refused by name; what is read
// goes back to the same arguments (MegatronArgs).
func TestDeepseekFromArgs(t *testing.T) {
	base := Config{MLA: true, QLoraRank: 6, KVLoraRank: 4, QKNopeDim: 4, QKRopeDim: 2, VHeadDim: 3, HeadDim: 6, DenseLayers: 1,
		ScoreFunc: "sigmoid", ExpertBias: true, TopKScale: 2.5, Groups: 2, GroupTopK: 1, Experts: 4, TopK: 2, MoEFFN: 5, SharedFFN: 10, NormTopK: true}
	mod := func(f func(c *Config)) Config { c := base; f(&c); return c }
	cases := []struct {
		name string
		args Args
		err  string
		want Config
	}{
		{"deepseek", dsArgs(), "", base},
		{"no groups, no scaling, all MoE", dsArgs("moe_router_num_groups", nil, "moe_router_group_topk", nil, "moe_router_topk_scaling_factor", nil, "moe_layer_freq", int64(1)),
			"", mod(func(c *Config) { c.Groups, c.GroupTopK, c.TopKScale, c.DenseLayers = 0, 0, 1, 0 })},
		{"yarn by default", dsArgs("rope_type", nil, "rotary_scaling_factor", 40.0, "mscale", 0.707, "mscale_all_dim", 0.707), "",
			mod(func(c *Config) {
				c.RopeScaling = &RopeScaling{Type: "yarn", Factor: 40, OriginalMaxPE: 4096, BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDim: 0.707}
			})},
		{"yarn factor 1 is rope", dsArgs("rope_type", "yarn"), "", base},
		{"top-1 keeps its weight", dsArgs("moe_router_topk", int64(1), "moe_router_num_groups", nil, "moe_router_group_topk", nil), "",
			mod(func(c *Config) { c.TopK, c.NormTopK, c.Groups, c.GroupTopK = 1, false, 0, 0 })},
		{"no q lora", dsArgs("q_lora_rank", nil), "q_lora_rank is None", Config{}},
		{"no qk layernorm", dsArgs("qk_layernorm", false), "qk_layernorm not set", Config{}},
		{"softmax router", dsArgs("moe_router_score_function", "softmax"), "moe_router_score_function \"softmax\"", Config{}},
		{"no expert bias", dsArgs("moe_router_enable_expert_bias", false), "moe_router_enable_expert_bias not set", Config{}},
		{"group top-k", dsArgs("moe_router_topk", int64(4)), "moe_router_group_topk 1 at top-4", Config{}},
		{"interleaved layer pattern", dsArgs("moe_layer_freq", []any{int64(1), int64(0), int64(1)}), "moe_layer_freq", Config{}},
		{"every 2nd layer", dsArgs("moe_layer_freq", int64(2)), "one MoE layer every N layers", Config{}},
		{"all dense", dsArgs("moe_layer_freq", []any{int64(0), int64(0), int64(0)}), "first_k_dense_replace 3 of 3", Config{}},
		{"shared gate", dsArgs("moe_shared_expert_gate", true), "moe_shared_expert_gate", Config{}},
		{"shared size", dsArgs("moe_shared_expert_intermediate_size", int64(7)), "moe_shared_expert_intermediate_size 7", Config{}},
		{"no shared expert", dsArgs("moe_shared_expert_intermediate_size", nil), "moe_shared_expert_intermediate_size 0", Config{}},
		{"rotary interleaved", dsArgs("rotary_interleaved", true), "rotary_interleaved", Config{}},
		{"llama3 scaling", dsArgs("use_rope_scaling", true), "Megatron's MLA ignores it", Config{}},
		{"latent cache", dsArgs("cache_mla_latents", true), "cache_mla_latents", Config{}},
		{"fused down projections", dsArgs("mla_down_proj_fusion", true), "mla_down_proj_fusion", Config{}},
		{"mtp", dsArgs("mtp_num_layers", int64(1)), "mtp_num_layers", Config{}},
		{"biases", dsArgs("add_bias_linear", true), "linear biases", Config{}},
		{"dense MLA", dsArgs("num_experts", nil), "without num_experts", Config{}},
		{"capacity", dsArgs("moe_expert_capacity_factor", 1.0), "moe_expert_capacity_factor", Config{}},
		{"sigmoid without MLA", moeArgs("moe_router_score_function", "sigmoid"), "needs multi_latent_attention", Config{}},
		{"yarn without MLA", moeArgs("rotary_scaling_factor", 40.0), "rotary_scaling_factor", Config{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fromArgsCase(t, tc.args, tc.err)
			if c == nil {
				return
			}
			if c.Family != "deepseek_v3" || c.QueryGroups != c.Heads {
				t.Fatalf("family %s, %d query groups", c.Family, c.QueryGroups)
			}
			if got := dsFields(c); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
			back, err := FromArgs(Args(c.MegatronArgs()))
			if err != nil {
				t.Fatalf("MegatronArgs read back: %v", err)
			}
			back.Vocab = c.Vocab
			if !reflect.DeepEqual(back, c) {
				t.Fatalf("MegatronArgs read back as\n%+v\nnot\n%+v", back, c)
			}
		})
	}
}

// dsFields are the MLA and MoE fields of c.
func dsFields(c *Config) Config {
	return Config{MLA: c.MLA, QLoraRank: c.QLoraRank, KVLoraRank: c.KVLoraRank, QKNopeDim: c.QKNopeDim, QKRopeDim: c.QKRopeDim,
		VHeadDim: c.VHeadDim, HeadDim: c.HeadDim, DenseLayers: c.DenseLayers, ScoreFunc: c.ScoreFunc, ExpertBias: c.ExpertBias,
		TopKScale: c.TopKScale, Groups: c.Groups, GroupTopK: c.GroupTopK, Experts: c.Experts, TopK: c.TopK, MoEFFN: c.MoEFFN,
		SharedFFN: c.SharedFFN, NormTopK: c.NormTopK, RopeScaling: c.RopeScaling}
}

// golden compares got with testdata/name (rewritten by -update).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n%s", path, got)
	}
}

// dsConfig is dsArgs' config.
func dsConfig(t *testing.T, kv ...any) *Config {
	t.Helper()
	c, err := FromArgs(dsArgs(kv...))
	if err != nil {
		t.Fatal(err)
	}
	c.Vocab = 10
	return c
}

// dsParams are the parameters of a megatron-core model of c (local or TE
// spec), in module order, with their shapes.
func dsParams(c *Config, n Naming) []Param {
	f, _ := Get(c.Family)
	var out []Param
	seen := map[string]bool{}
	add := func(r Role, l, e int) {
		name := r.NameIn(n, l, e)
		if seen[name] {
			return
		}
		seen[name] = true
		out = append(out, Param{name, dsShape(c, f, r)})
	}
	for _, r := range f.Present(c) {
		if r.Scope == Global && r.Name != "final_norm" && r.Name != "lm_head" {
			add(r, -1, -1)
		}
	}
	for l := 0; l < int(c.Layers); l++ {
		for _, r := range f.Present(c) {
			switch {
			case !r.At(c, l) || r.Scope == Global:
			case r.Scope == Expert:
				for e := 0; e < int(c.Experts); e++ {
					add(r, l, e)
				}
			default:
				add(r, l, -1)
			}
		}
	}
	for _, r := range f.Present(c) {
		if r.Name == "final_norm" || r.Name == "lm_head" {
			add(r, -1, -1)
		}
	}
	return out
}

// dsShape is the shape of role r's tensor (the fused one in Megatron).
func dsShape(c *Config, f *Family, r Role) []int64 {
	H := c.Hidden
	switch r.Name {
	case "embed", "lm_head":
		return []int64{c.Vocab, H}
	case "q_proj":
		return []int64{c.Heads * c.HeadDim, H}
	case "q_down":
		return []int64{c.QLoraRank, H}
	case "q_down_norm":
		return []int64{c.QLoraRank}
	case "q_up":
		return []int64{c.Heads * c.HeadDim, c.QLoraRank}
	case "kv_down":
		return []int64{c.KVLoraRank + c.QKRopeDim, H}
	case "kv_down_norm":
		return []int64{c.KVLoraRank}
	case "kv_up":
		return []int64{c.Heads * (c.QKNopeDim + c.VHeadDim), c.KVLoraRank}
	case "o_proj":
		return []int64{H, c.Heads * c.VHeadDim}
	case "router":
		return []int64{c.Experts, H}
	case "router_bias":
		return []int64{c.Experts}
	case "gate_proj", "up_proj", "expert_gate", "expert_up", "shared_gate", "shared_up":
		return []int64{2 * c.ffnOf(r), H}
	case "down_proj", "expert_down", "shared_down":
		return []int64{H, c.ffnOf(r)}
	}
	return []int64{H} // norms
}

// TestDeepseekNames: a megatron-core DeepSeek-V3 state dict (local and TE
// names) resolves to every role once and maps to DeepseekV3ForCausalLM's
// names and pieces (golden: testdata/deepseek_v3_names.golden); the HF
// names resolve back to the same roles; a MoE name on a dense layer, a
// missing expert and the other spec's norm names are refused.
func TestDeepseekNames(t *testing.T) {
	c := dsConfig(t)
	var b strings.Builder
	for _, n := range []Naming{Core, CoreTE} {
		src, err := Resolve(c, dsParams(c, n), "megatron")
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		ts, err := src.Unfused(HF)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "# %s -> hf\n", n)
		var hf []Param
		for _, x := range ts {
			fmt.Fprintf(&b, "%s %v <-", x.Name, x.Shape)
			for _, p := range x.Pieces {
				fmt.Fprintf(&b, " %s[%d:%d]", p.Param, p.Start, p.Start+p.Len)
			}
			b.WriteByte('\n')
			hf = append(hf, Param{x.Name, x.Shape})
		}
		back, err := Resolve(c, hf, "hf")
		if err != nil {
			t.Fatalf("hf names: %v", err)
		}
		if back.Naming != HF || !reflect.DeepEqual(keys(back.byRole), keys(src.byRole)) {
			t.Fatalf("hf names resolve to other roles")
		}
	}
	golden(t, "deepseek_v3_names.golden", []byte(b.String()))

	good := dsParams(c, Core)
	cases := []struct {
		name   string
		params []Param
		err    string
	}{
		{"router on the dense layer", append(append([]Param{}, good...), Param{"decoder.layers.0.mlp.router.weight", []int64{4, 8}}), "not at layer 0"},
		{"dense MLP on a MoE layer", append(append([]Param{}, good...), Param{"decoder.layers.2.mlp.linear_fc1.weight", []int64{24, 8}}), "not at layer 2"},
		{"missing expert", drop(good, "decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight"), "expert_down of layer 2 expert 3"},
		{"missing correction bias", drop(good, "decoder.layers.1.mlp.router.expert_bias"), "router_bias of layer 1"},
		{"expert beyond the config", append(append([]Param{}, good...), Param{"decoder.layers.1.mlp.experts.local_experts.4.linear_fc2.weight", []int64{8, 5}}), "expert 4 of layer 1"},
	}
	for _, tc := range cases {
		if _, err := Resolve(c, tc.params, "megatron"); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	// Without q LoRA the HF model has q_proj (and Megatron linear_q_proj).
	nq := dsConfig(t)
	nq.QLoraRank = 0
	ps := dsParams(nq, HF)
	if ps[1].Name != "model.layers.0.self_attn.q_proj.weight" {
		t.Fatalf("no q LoRA: %v", ps[1])
	}
	if _, err := Resolve(nq, ps, "hf"); err != nil {
		t.Fatal(err)
	}
}

func drop(ps []Param, name string) []Param {
	var out []Param
	for _, p := range ps {
		if p.Name != name {
			out = append(out, p)
		}
	}
	return out
}

func keys(m map[roleKey]string) []roleKey {
	var out []roleKey
	for k := range m {
		out = append(out, k)
	}
	sortKeys(out)
	return out
}

func sortKeys(k []roleKey) {
	for i := range k {
		for j := i + 1; j < len(k); j++ {
			if fmt.Sprint(k[j]) < fmt.Sprint(k[i]) {
				k[i], k[j] = k[j], k[i]
			}
		}
	}
}

// TestDeepseekHFConfig: the config.json written for export (golden:
// testdata/deepseek_v3_config.golden.json) reads back as the config it came
// from, with and without yarn; what Megatron does not compute is recorded
// and refused by name for a Megatron target; what ucp does not map is an
// error naming the field.
func TestDeepseekHFConfig(t *testing.T) {
	c := dsConfig(t)
	m, err := c.ToHF()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.MarshalIndent(m, "", "  ")
	golden(t, "deepseek_v3_config.golden.json", append(js, '\n'))
	var dec map[string]any
	if err := json.Unmarshal(js, &dec); err != nil {
		t.Fatal(err)
	}
	for _, y := range []*RopeScaling{nil, {Type: "yarn", Factor: 40, OriginalMaxPE: 4096, BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDim: 0.707}} {
		cc := *c
		cc.RopeScaling = y
		m, err := cc.ToHF()
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(m)
		var dec map[string]any
		_ = json.Unmarshal(js, &dec)
		back, err := FromHF(dec)
		if err != nil {
			t.Fatal(err)
		}
		want := cc
		want.VocabDivisor = 0
		if !reflect.DeepEqual(*back, want) {
			t.Errorf("yarn %v:\n got %+v\nwant %+v", y != nil, *back, want)
		}
		if err := back.MegatronCheck(); err != nil {
			t.Errorf("MegatronCheck: %v", err)
		}
	}
	set := func(kv ...any) map[string]any {
		out := map[string]any{}
		for k, v := range dec {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(string)] = kv[i+1]
		}
		return out
	}
	yarn := func(kv ...any) map[string]any {
		rs := map[string]any{"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096.0, "beta_fast": 32.0, "beta_slow": 1.0}
		for i := 0; i < len(kv); i += 2 {
			rs[kv[i].(string)] = kv[i+1]
		}
		return set("rope_scaling", rs)
	}
	cases := []struct {
		name        string
		m           map[string]any
		err         string // FromHF's error
		unsupported string // else MegatronCheck's
	}{
		{"yarn without mscale", yarn(), "", ""},
		{"no q lora", set("q_lora_rank", nil), "", "q_lora_rank null"},
		{"rope not interleaved", set("rope_interleave", false), "", "rope_interleave false"},
		{"norm_topk_prob false", set("norm_topk_prob", false), "", "norm_topk_prob false"},
		{"group top-3", set("n_group", 4.0, "topk_group", 3.0), "", "n_group 4, topk_group 3"},
		{"yarn mscale alone", yarn("mscale", 0.707), "", "mscale 0.707 with mscale_all_dim 0"},
		{"yarn attention factor", yarn("mscale", 1.0, "mscale_all_dim", 1.0, "attention_factor", 1.2), "", "attention_factor"},
		{"yarn not truncated", yarn("truncate", false), "", "truncate false"},
		{"attention bias", set("attention_bias", true), "attention_bias true", ""},
		{"mtp", set("num_nextn_predict_layers", 1.0), "num_nextn_predict_layers 1: the multi-token-prediction layers (model.layers.3.*", ""},
		{"no shared experts", set("n_shared_experts", 0.0), "n_shared_experts", ""},
		{"all dense", set("first_k_dense_replace", 3.0), "first_k_dense_replace", ""},
		{"grouped kv", set("num_key_value_heads", 2.0), "num_key_value_heads 2", ""},
		{"string rank", set("kv_lora_rank", "4"), "kv_lora_rank is 4 (string)", ""},
	}
	for _, tc := range cases {
		c, err := FromHF(tc.m)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if err := c.MegatronCheck(); tc.unsupported == "" && err != nil || tc.unsupported != "" && (err == nil || !strings.Contains(err.Error(), tc.unsupported)) {
			t.Errorf("%s: MegatronCheck %v, want %q", tc.name, err, tc.unsupported)
		}
		if _, err := c.ToHF(); err != nil {
			t.Errorf("%s: HF export %v", tc.name, err)
		}
	}
}
