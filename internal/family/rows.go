package family

import (
	"fmt"
)

// Name templates of the dense decoder (FAMILIES.md cites each framework).
const (
	hfL     = "model.layers.{L}."
	titanL  = "layers.{L}."
	coreL   = "decoder.layers.{L}."
	legacyL = "language_model.encoder.layers.{L}."
)

func names(hf, titan, core, te, legacy string) [numNamings]string {
	return [numNamings]string{HF: hf, Titan: titan, Core: core, CoreTE: te, Legacy: legacy}
}

func qkvBias(c *Config) bool  { return c.QKVBias }
func outBias(c *Config) bool  { return c.OutBias }
func mlpBias(c *Config) bool  { return c.MLPBias }
func qkNorm(c *Config) bool   { return c.QKNorm }
func untied(c *Config) bool   { return !c.Tied }
func noTitan(r []Role) []Role { return mapRoles(r, func(x *Role) { x.Names[Titan] = "" }) }
func mapRoles(r []Role, f func(*Role)) []Role {
	out := make([]Role, len(r))
	for i := range r {
		out[i] = r[i]
		f(&out[i])
	}
	return out
}

// denseRoles are the parameters of a Llama-style decoder (GQA attention
// with RoPE, SwiGLU MLP, RMSNorm), in the order transformers' state dict
// lists them (module registration order: attention, MLP, then the two
// norms of the layer). Megatron-core's TE spec fuses the two pre-norms into
// linear_qkv and linear_fc1 as layer_norm_weight; legacy Megatron calls the
// final norm final_norm (older releases final_layernorm). Megatron-DeepSpeed
// pipeline names are PipeNames' business; its non-pipeline names are the
// legacy ones.
func denseRoles() []Role {
	return []Role{
		{Name: "embed", Scope: Global, TP: Vocab, Names: names("model.embed_tokens.weight", "tok_embeddings.weight",
			"embedding.word_embeddings.weight", "embedding.word_embeddings.weight", "language_model.embedding.word_embeddings.weight")},
		{Name: "q_proj", Scope: Layer, TP: Column, Fuse: QKV, Part: 0, Names: names(hfL+"self_attn.q_proj.weight", titanL+"attention.wq.weight|"+titanL+"attention.qkv_linear.wq.weight",
			coreL+"self_attention.linear_qkv.weight", coreL+"self_attention.linear_qkv.weight", legacyL+"self_attention.query_key_value.weight")},
		{Name: "q_bias", Scope: Layer, TP: Column, Fuse: QKV, Part: 0, When: qkvBias, Names: names(hfL+"self_attn.q_proj.bias", "",
			coreL+"self_attention.linear_qkv.bias", coreL+"self_attention.linear_qkv.bias", legacyL+"self_attention.query_key_value.bias")},
		{Name: "k_proj", Scope: Layer, TP: Column, Fuse: QKV, Part: 1, Names: names(hfL+"self_attn.k_proj.weight", titanL+"attention.wk.weight|"+titanL+"attention.qkv_linear.wk.weight",
			coreL+"self_attention.linear_qkv.weight", coreL+"self_attention.linear_qkv.weight", legacyL+"self_attention.query_key_value.weight")},
		{Name: "k_bias", Scope: Layer, TP: Column, Fuse: QKV, Part: 1, When: qkvBias, Names: names(hfL+"self_attn.k_proj.bias", "",
			coreL+"self_attention.linear_qkv.bias", coreL+"self_attention.linear_qkv.bias", legacyL+"self_attention.query_key_value.bias")},
		{Name: "v_proj", Scope: Layer, TP: Column, Fuse: QKV, Part: 2, Names: names(hfL+"self_attn.v_proj.weight", titanL+"attention.wv.weight|"+titanL+"attention.qkv_linear.wv.weight",
			coreL+"self_attention.linear_qkv.weight", coreL+"self_attention.linear_qkv.weight", legacyL+"self_attention.query_key_value.weight")},
		{Name: "v_bias", Scope: Layer, TP: Column, Fuse: QKV, Part: 2, When: qkvBias, Names: names(hfL+"self_attn.v_proj.bias", "",
			coreL+"self_attention.linear_qkv.bias", coreL+"self_attention.linear_qkv.bias", legacyL+"self_attention.query_key_value.bias")},
		{Name: "o_proj", Scope: Layer, TP: Row, Names: names(hfL+"self_attn.o_proj.weight", titanL+"attention.wo.weight",
			coreL+"self_attention.linear_proj.weight", coreL+"self_attention.linear_proj.weight", legacyL+"self_attention.dense.weight")},
		{Name: "o_bias", Scope: Layer, TP: Replicated, When: outBias, Names: names(hfL+"self_attn.o_proj.bias", "",
			coreL+"self_attention.linear_proj.bias", coreL+"self_attention.linear_proj.bias", legacyL+"self_attention.dense.bias")},
		{Name: "q_norm", Scope: Layer, TP: Replicated, Norm: true, When: qkNorm, Names: names(hfL+"self_attn.q_norm.weight", titanL+"attention.q_norm.weight",
			coreL+"self_attention.q_layernorm.weight", coreL+"self_attention.q_layernorm.weight", "")},
		{Name: "k_norm", Scope: Layer, TP: Replicated, Norm: true, When: qkNorm, Names: names(hfL+"self_attn.k_norm.weight", titanL+"attention.k_norm.weight",
			coreL+"self_attention.k_layernorm.weight", coreL+"self_attention.k_layernorm.weight", "")},
		{Name: "gate_proj", Scope: Layer, TP: Column, Fuse: GateUp, Part: 0, Names: names(hfL+"mlp.gate_proj.weight", titanL+"feed_forward.w1.weight",
			coreL+"mlp.linear_fc1.weight", coreL+"mlp.linear_fc1.weight", legacyL+"mlp.dense_h_to_4h.weight")},
		{Name: "gate_bias", Scope: Layer, TP: Column, Fuse: GateUp, Part: 0, When: mlpBias, Names: names(hfL+"mlp.gate_proj.bias", "",
			coreL+"mlp.linear_fc1.bias", coreL+"mlp.linear_fc1.bias", legacyL+"mlp.dense_h_to_4h.bias")},
		{Name: "up_proj", Scope: Layer, TP: Column, Fuse: GateUp, Part: 1, Names: names(hfL+"mlp.up_proj.weight", titanL+"feed_forward.w3.weight",
			coreL+"mlp.linear_fc1.weight", coreL+"mlp.linear_fc1.weight", legacyL+"mlp.dense_h_to_4h.weight")},
		{Name: "up_bias", Scope: Layer, TP: Column, Fuse: GateUp, Part: 1, When: mlpBias, Names: names(hfL+"mlp.up_proj.bias", "",
			coreL+"mlp.linear_fc1.bias", coreL+"mlp.linear_fc1.bias", legacyL+"mlp.dense_h_to_4h.bias")},
		{Name: "down_proj", Scope: Layer, TP: Row, Names: names(hfL+"mlp.down_proj.weight", titanL+"feed_forward.w2.weight",
			coreL+"mlp.linear_fc2.weight", coreL+"mlp.linear_fc2.weight", legacyL+"mlp.dense_4h_to_h.weight")},
		{Name: "down_bias", Scope: Layer, TP: Replicated, When: mlpBias, Names: names(hfL+"mlp.down_proj.bias", "",
			coreL+"mlp.linear_fc2.bias", coreL+"mlp.linear_fc2.bias", legacyL+"mlp.dense_4h_to_h.bias")},
		{Name: "attn_norm", Scope: Layer, TP: Replicated, Norm: true, Names: names(hfL+"input_layernorm.weight", titanL+"attention_norm.weight",
			coreL+"input_layernorm.weight", coreL+"self_attention.linear_qkv.layer_norm_weight", legacyL+"input_layernorm.weight")},
		{Name: "mlp_norm", Scope: Layer, TP: Replicated, Norm: true, Names: names(hfL+"post_attention_layernorm.weight", titanL+"ffn_norm.weight",
			coreL+"pre_mlp_layernorm.weight", coreL+"mlp.linear_fc1.layer_norm_weight", legacyL+"post_attention_layernorm.weight")},
		{Name: "final_norm", Scope: Global, TP: Replicated, Norm: true, Names: names("model.norm.weight", "norm.weight",
			"decoder.final_layernorm.weight", "decoder.final_layernorm.weight", "language_model.encoder.final_norm.weight|language_model.encoder.final_layernorm.weight")},
		{Name: "lm_head", Scope: Global, TP: Vocab, When: untied, Names: names("lm_head.weight", "output.weight|lm_head.weight",
			"output_layer.weight", "output_layer.weight", "language_model.output_layer.weight")},
	}
}

func refuseIf(cond bool, format string, a ...any) error {
	if cond {
		return fmt.Errorf(format, a...)
	}
	return nil
}

// llama: transformers models/llama (LlamaForCausalLM); torchtitan
// models/llama3 (complex RoPE: interleaved rows). attention_bias puts a
// bias on q, k, v and o alike; mlp_bias on gate, up and down.
func llama() *Family {
	f := &Family{Name: "llama", HFArch: "LlamaForCausalLM", HFModelType: "llama", TitanInterleaved: true, Roles: denseRoles()}
	f.Check = func(c *Config) error {
		if err := refuseIf(c.QKNorm, "qk_layernorm: %s has no q/k norms (qwen3 has them)", f.HFArch); err != nil {
			return err
		}
		return refuseIf(c.QKVBias != c.OutBias, "add_qkv_bias without add_bias_linear: %s's attention_bias puts a bias on q, k, v and o alike (qwen2 has q/k/v biases only)", f.HFArch)
	}
	f.ToHF = func(c *Config) (map[string]any, error) {
		m := hfCommon(f, c)
		m["attention_bias"] = c.QKVBias
		m["mlp_bias"] = c.MLPBias
		return m, nil
	}
	f.FromHF = func(m map[string]any, c *Config) error {
		var err error
		if c.QKVBias, err = Args(m).bool("attention_bias"); err != nil {
			return err
		}
		c.OutBias = c.QKVBias
		c.MLPBias, err = Args(m).bool("mlp_bias")
		return err
	}
	return f
}

// mistral: transformers models/mistral (MistralForCausalLM): Llama's math
// with an optional sliding window (written null) and no biases.
func mistral() *Family {
	f := &Family{Name: "mistral", HFArch: "MistralForCausalLM", HFModelType: "mistral", Roles: noTitan(denseRoles())}
	f.Check = func(c *Config) error {
		switch {
		case c.QKNorm:
			return fmt.Errorf("qk_layernorm: %s has no q/k norms (qwen3 has them)", f.HFArch)
		case c.QKVBias || c.OutBias || c.MLPBias:
			return fmt.Errorf("linear biases (add_bias_linear or add_qkv_bias): %s has none", f.HFArch)
		case c.RopeScaling != nil:
			return fmt.Errorf("rope scaling (%s): %s's configuration has no rope_scaling", c.RopeScaling.Type, f.HFArch)
		}
		return nil
	}
	f.ToHF = func(c *Config) (map[string]any, error) {
		m := hfCommon(f, c)
		delete(m, "rope_scaling")
		m["sliding_window"] = nil
		return m, nil
	}
	f.FromHF = func(m map[string]any, c *Config) error {
		if w, ok := m["sliding_window"]; !ok || w != nil {
			c.Unsupported = append(c.Unsupported, fmt.Sprintf("sliding_window %v", w))
		}
		return nil
	}
	return f
}

// qwenWindow reads Qwen's use_sliding_window.
func qwenWindow(m map[string]any, c *Config) error {
	w, err := Args(m).bool("use_sliding_window")
	if err != nil {
		return err
	}
	if w {
		c.Unsupported = append(c.Unsupported, "use_sliding_window")
	}
	return nil
}

// qwen2: transformers models/qwen2 (Qwen2ForCausalLM): q/k/v always have
// biases (Megatron's add_qkv_bias), o and the MLP never.
func qwen2() *Family {
	f := &Family{Name: "qwen2", HFArch: "Qwen2ForCausalLM", HFModelType: "qwen2", Roles: noTitan(denseRoles())}
	f.Check = func(c *Config) error {
		switch {
		case c.QKNorm:
			return fmt.Errorf("qk_layernorm: %s has no q/k norms (qwen3 has them)", f.HFArch)
		case !c.QKVBias:
			return fmt.Errorf("no q/k/v biases (add_qkv_bias not set): %s always has them", f.HFArch)
		case c.OutBias || c.MLPBias:
			return fmt.Errorf("add_bias_linear: %s has no bias on o_proj or the MLP", f.HFArch)
		}
		return nil
	}
	f.ToHF = func(c *Config) (map[string]any, error) {
		return qwenToHF(f, c), nil
	}
	f.FromHF = func(m map[string]any, c *Config) error {
		c.QKVBias = true
		return qwenWindow(m, c)
	}
	return f
}

// qwen3: transformers models/qwen3 (Qwen3ForCausalLM): RMSNorm of each
// head's q and k (Megatron's qk_layernorm), head_dim free of hidden/heads;
// attention_bias puts a bias on q, k, v and o alike. torchtitan
// models/qwen3 uses the rotate-half RoPE layout, as HF.
func qwen3() *Family {
	f := &Family{Name: "qwen3", HFArch: "Qwen3ForCausalLM", HFModelType: "qwen3", Roles: denseRoles()}
	f.Check = qwen3Check(f, func(c *Config) error {
		return refuseIf(c.MLPBias, "add_bias_linear: %s has no MLP biases", f.HFArch)
	})
	f.ToHF = qwen3ToHF(f, qwenToHF)
	f.FromHF = qwen3FromHF(qwenWindow)
	return f
}

// qwenToHF writes the config.json fields the Qwen families share: hfCommon's
// and no sliding window.
func qwenToHF(f *Family, c *Config) map[string]any {
	m := hfCommon(f, c)
	m["use_sliding_window"] = false
	m["sliding_window"] = nil
	m["max_window_layers"] = c.Layers
	return m
}

// qwen3Check refuses what qwen3's attention (also qwen3_moe's) cannot
// hold, no q/k norms or biases on q/k/v but not o or the reverse, then
// checks the rest.
func qwen3Check(f *Family, rest func(*Config) error) func(*Config) error {
	return func(c *Config) error {
		switch {
		case !c.QKNorm:
			return fmt.Errorf("no q/k norms (qk_layernorm not set): %s always has them", f.HFArch)
		case c.QKVBias != c.OutBias:
			return fmt.Errorf("add_qkv_bias without add_bias_linear: %s's attention_bias puts a bias on q, k, v and o alike", f.HFArch)
		}
		return rest(c)
	}
}

// qwen3ToHF writes base's config.json fields and qwen3's attention_bias.
func qwen3ToHF(f *Family, base func(*Family, *Config) map[string]any) func(*Config) (map[string]any, error) {
	return func(c *Config) (map[string]any, error) {
		m := base(f, c)
		m["attention_bias"] = c.QKVBias
		return m, nil
	}
}

// qwen3FromHF reads what qwen3 and qwen3_moe share in config.json (q/k
// RMSNorm always, and attention_bias, which puts a bias on q, k, v and o
// alike), then the rest.
func qwen3FromHF(rest func(map[string]any, *Config) error) func(map[string]any, *Config) error {
	return func(m map[string]any, c *Config) error {
		c.QKNorm = true
		var err error
		if c.QKVBias, err = Args(m).bool("attention_bias"); err != nil {
			return err
		}
		c.OutBias = c.QKVBias
		return rest(m, c)
	}
}
