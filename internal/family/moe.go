package family

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Mixture-of-experts rows (FAMILIES.md, "Mixture of experts"): every
// layer's MLP is a routed MoE block (Megatron's moe_layer_freq 1; HF's
// decoder_sparse_step 1 and no mlp_only_layers). Routing that the two
// sides compute alike: softmax scores, top-k on the logits; Megatron
// without moe_router_pre_softmax renormalises the k probabilities (HF's
// norm_topk_prob, always on in Mixtral), with it keeps them as the full
// softmax gave them (norm_topk_prob false).

const (
	mixL = hfL + "block_sparse_moe."
	qmoL = hfL + "mlp."
	mcL  = coreL + "mlp."
)

// moeAttnRoles are the dense decoder's roles without its MLP (the MoE
// block replaces it); the MLP norm of a MoE layer is pre_mlp_layernorm in
// both megatron-core specs (no fused linear follows it).
func moeAttnRoles() []Role {
	var out []Role
	for _, r := range noTitan(denseRoles()) {
		switch r.Name {
		case "gate_proj", "gate_bias", "up_proj", "up_bias", "down_proj", "down_bias":
			continue
		case "mlp_norm":
			r.Names[CoreTE] = r.Names[Core]
		}
		r.Names[Legacy] = ""
		out = append(out, r)
	}
	return out
}

// moeRoles: the router, then per expert gate/up (Megatron: one fc1
// [gate; up] per expert) and down; local names are SequentialMLP's,
// TE names TEGroupedMLP's (weight<E> suffix). gate, up and down are the
// HF names of the expert's three linears.
func moeRoles(router, expert, gate, up, down string) []Role {
	return []Role{
		{Name: "router", Scope: Layer, TP: Replicated, Names: names(router, "", mcL+"router.weight", mcL+"router.weight", "")},
		{Name: "expert_gate", Scope: Expert, TP: Column, Fuse: GateUp, Part: 0, Names: names(expert+gate, "",
			mcL+"experts.local_experts.{E}.linear_fc1.weight", mcL+"experts.linear_fc1.weight{E}", "")},
		{Name: "expert_up", Scope: Expert, TP: Column, Fuse: GateUp, Part: 1, Names: names(expert+up, "",
			mcL+"experts.local_experts.{E}.linear_fc1.weight", mcL+"experts.linear_fc1.weight{E}", "")},
		{Name: "expert_down", Scope: Expert, TP: Row, Names: names(expert+down, "",
			mcL+"experts.local_experts.{E}.linear_fc2.weight", mcL+"experts.linear_fc2.weight{E}", "")},
	}
}

// sharedRoles: Qwen2-MoE's shared expert (Megatron's shared_experts,
// fc1 [gate; up] of moe_shared_expert_intermediate_size rows each) and
// its sigmoid gate (moe_shared_expert_gate).
func sharedRoles() []Role {
	return []Role{
		{Name: "shared_gate", Scope: Layer, TP: Column, Fuse: GateUp, Part: 0, Names: names(qmoL+"shared_expert.gate_proj.weight", "",
			mcL+"shared_experts.linear_fc1.weight", mcL+"shared_experts.linear_fc1.weight", "")},
		{Name: "shared_up", Scope: Layer, TP: Column, Fuse: GateUp, Part: 1, Names: names(qmoL+"shared_expert.up_proj.weight", "",
			mcL+"shared_experts.linear_fc1.weight", mcL+"shared_experts.linear_fc1.weight", "")},
		{Name: "shared_down", Scope: Layer, TP: Row, Names: names(qmoL+"shared_expert.down_proj.weight", "",
			mcL+"shared_experts.linear_fc2.weight", mcL+"shared_experts.linear_fc2.weight", "")},
		{Name: "shared_expert_gate", Scope: Layer, TP: Replicated, Names: names(qmoL+"shared_expert_gate.weight", "",
			mcL+"shared_experts.gate_weight", mcL+"shared_experts.gate_weight", "")},
	}
}

// withMoE inserts the MoE roles after o_proj's (and q/k norms'), where the
// MLP was: transformers' module order (attention, MLP, norms).
func withMoE(attn []Role, moe ...[]Role) []Role {
	var out []Role
	for _, r := range attn {
		if r.Name == "attn_norm" {
			for _, m := range moe {
				out = append(out, m...)
			}
		}
		out = append(out, r)
	}
	return out
}

// ffnOf is the FFN size of a fused gate/up role: the experts', the shared
// expert's or the dense MLP's.
func (c *Config) ffnOf(r Role) int64 {
	switch {
	case strings.HasPrefix(r.Name, "expert_"):
		return c.MoEFFN
	case strings.HasPrefix(r.Name, "shared_"):
		return c.SharedFFN
	}
	return c.FFN
}

// WithFFNOf is c with FFN the size of role r's gate/up (FusedRows of an
// expert's or the shared expert's fc1).
func (c *Config) WithFFNOf(r Role) *Config {
	cc := *c
	cc.FFN = c.ffnOf(r)
	return &cc
}

// moeCheck refuses what every MoE row here shares.
func moeCheck(f *Family, c *Config) error {
	switch {
	case c.Experts <= 0 || c.TopK <= 0 || c.TopK > c.Experts || c.MoEFFN <= 0:
		return fmt.Errorf("%s: %d experts, top-%d, expert FFN %d: not a mixture of experts", f.HFArch, c.Experts, c.TopK, c.MoEFFN)
	case c.MLPBias:
		return fmt.Errorf("add_bias_linear: %s's experts have no biases", f.HFArch)
	}
	return nil
}

// mixtral: transformers models/mixtral (MixtralForCausalLM): experts
// w1 (gate), w3 (up), w2 (down), top-k renormalised, no biases;
// intermediate_size is the experts' FFN.
func mixtral() *Family {
	f := &Family{Name: "mixtral", HFArch: "MixtralForCausalLM", HFModelType: "mixtral",
		Roles: withMoE(moeAttnRoles(), moeRoles(mixL+"gate.weight", mixL+"experts.{E}.", "w1.weight", "w3.weight", "w2.weight"))}
	f.Check = func(c *Config) error {
		switch {
		case c.QKNorm:
			return fmt.Errorf("qk_layernorm: %s has no q/k norms (qwen3_moe has them)", f.HFArch)
		case c.QKVBias || c.OutBias:
			return fmt.Errorf("linear biases (add_bias_linear or add_qkv_bias): %s has none", f.HFArch)
		case c.SharedFFN > 0:
			return fmt.Errorf("moe_shared_expert_intermediate_size %d: %s has no shared expert (qwen2_moe has one)", c.SharedFFN, f.HFArch)
		case !c.NormTopK:
			return fmt.Errorf("moe_router_pre_softmax: %s renormalises the top-k probabilities (Megatron without moe_router_pre_softmax)", f.HFArch)
		}
		return moeCheck(f, c)
	}
	f.ToHF = func(c *Config) (map[string]any, error) {
		m := hfCommon(f, c)
		m["intermediate_size"] = c.MoEFFN
		m["num_local_experts"] = c.Experts
		m["num_experts_per_tok"] = c.TopK
		m["sliding_window"] = nil
		m["router_jitter_noise"] = 0.0
		m["output_router_logits"] = false
		return m, nil
	}
	f.FromHF = func(m map[string]any, c *Config) error {
		a := Args(m)
		var ok bool
		if c.Experts, ok = a.int("num_local_experts"); !ok {
			return fmt.Errorf("no num_local_experts")
		}
		if c.TopK, ok = a.int("num_experts_per_tok"); !ok {
			return fmt.Errorf("no num_experts_per_tok")
		}
		c.MoEFFN, c.NormTopK = c.FFN, true
		if w, ok := m["sliding_window"]; ok && w != nil {
			c.Unsupported = append(c.Unsupported, fmt.Sprintf("sliding_window %v", w))
		}
		return nil
	}
	return f
}

// qwenMoE reads the fields Qwen2-MoE and Qwen3-MoE share; layers that are
// not MoE (decoder_sparse_step, mlp_only_layers) are not rows here.
func qwenMoEFromHF(m map[string]any, c *Config) error {
	a := Args(m)
	var ok bool
	if c.Experts, ok = a.int("num_experts"); !ok {
		return fmt.Errorf("no num_experts")
	}
	if c.TopK, ok = a.int("num_experts_per_tok"); !ok {
		return fmt.Errorf("no num_experts_per_tok")
	}
	if c.MoEFFN, ok = a.int("moe_intermediate_size"); !ok {
		return fmt.Errorf("no moe_intermediate_size")
	}
	var err error
	if c.NormTopK, err = a.bool("norm_topk_prob"); err != nil {
		return err
	}
	if s, ok := a.int("decoder_sparse_step"); ok && s != 1 {
		return fmt.Errorf("decoder_sparse_step %d: dense MLP layers between MoE layers are not mapped (every layer must be MoE)", s)
	}
	// A list from JSON ([]any) or from qwenMoEToHF ([]int).
	switch l := m["mlp_only_layers"].(type) {
	case nil:
	case []any, []int:
		if reflect.ValueOf(l).Len() > 0 {
			return fmt.Errorf("mlp_only_layers %v: dense MLP layers are not mapped (every layer must be MoE)", l)
		}
	default:
		return fmt.Errorf("mlp_only_layers is %v, not a list", l)
	}
	return qwenWindow(m, c)
}

func qwenMoEToHF(f *Family, c *Config) map[string]any {
	m := qwenToHF(f, c)
	m["num_experts"] = c.Experts
	m["num_experts_per_tok"] = c.TopK
	m["moe_intermediate_size"] = c.MoEFFN
	m["norm_topk_prob"] = c.NormTopK
	m["decoder_sparse_step"] = 1
	m["mlp_only_layers"] = []int{}
	m["output_router_logits"] = false
	return m
}

// qwen3_moe: transformers models/qwen3_moe (Qwen3MoeForCausalLM): qwen3's
// attention (q/k norms, attention_bias on q, k, v and o), mlp.gate router,
// experts gate_proj/up_proj/down_proj, no shared expert.
func qwen3MoE() *Family {
	f := &Family{Name: "qwen3_moe", HFArch: "Qwen3MoeForCausalLM", HFModelType: "qwen3_moe",
		Roles: withMoE(moeAttnRoles(), moeRoles(qmoL+"gate.weight", qmoL+"experts.{E}.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"))}
	f.Check = qwen3Check(f, func(c *Config) error {
		if c.SharedFFN > 0 {
			return fmt.Errorf("moe_shared_expert_intermediate_size %d: %s has no shared expert (qwen2_moe has one)", c.SharedFFN, f.HFArch)
		}
		return moeCheck(f, c)
	})
	f.ToHF = qwen3ToHF(f, qwenMoEToHF)
	f.FromHF = qwen3FromHF(qwenMoEFromHF)
	return f
}

// qwen2_moe: transformers models/qwen2_moe (Qwen2MoeForCausalLM): qwen2's
// attention (q/k/v biases, qkv_bias), routed experts plus a shared expert
// scaled by sigmoid(shared_expert_gate(x)) (Megatron's
// moe_shared_expert_gate).
func qwen2MoE() *Family {
	f := &Family{Name: "qwen2_moe", HFArch: "Qwen2MoeForCausalLM", HFModelType: "qwen2_moe",
		Roles: withMoE(moeAttnRoles(), moeRoles(qmoL+"gate.weight", qmoL+"experts.{E}.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"), sharedRoles())}
	f.Check = func(c *Config) error {
		switch {
		case c.QKNorm:
			return fmt.Errorf("qk_layernorm: %s has no q/k norms (qwen3_moe has them)", f.HFArch)
		case c.OutBias:
			return fmt.Errorf("add_bias_linear: %s has no bias on o_proj or the experts", f.HFArch)
		case c.SharedFFN <= 0 || !c.SharedGate:
			return fmt.Errorf("%s has a shared expert with a sigmoid gate (moe_shared_expert_intermediate_size %d, moe_shared_expert_gate %v)", f.HFArch, c.SharedFFN, c.SharedGate)
		}
		return moeCheck(f, c)
	}
	f.ToHF = func(c *Config) (map[string]any, error) {
		m := qwenMoEToHF(f, c)
		m["qkv_bias"] = c.QKVBias
		m["shared_expert_intermediate_size"] = c.SharedFFN
		return m, nil
	}
	f.FromHF = func(m map[string]any, c *Config) error {
		a := Args(m)
		c.QKVBias = true
		if v, ok := m["qkv_bias"]; ok {
			b, isBool := v.(bool)
			if !isBool {
				return fmt.Errorf("qkv_bias is %v", v)
			}
			c.QKVBias = b
		}
		var ok bool
		if c.SharedFFN, ok = a.int("shared_expert_intermediate_size"); !ok || c.SharedFFN <= 0 {
			return fmt.Errorf("no shared_expert_intermediate_size")
		}
		c.SharedGate = true
		return qwenMoEFromHF(m, c)
	}
	return f
}

// moeFromArgs reads Megatron's MoE arguments (megatron/core/transformer/
// transformer_config.py field names; --num-experts is args.num_experts)
// and refuses the routing options no family here computes. With
// multi_latent_attention (deepseek_v3) the DeepSeek routing options are
// read instead (deepseekRoutingFromArgs).
func moeFromArgs(a Args, c *Config) error {
	n, _ := a.int("num_experts")
	if n <= 0 {
		return nil
	}
	c.Experts = n
	c.TopK = 2 // TransformerConfig's default
	if k, ok := a.int("moe_router_topk"); ok {
		c.TopK = k
	}
	c.MoEFFN = c.FFN
	if f, ok := a.int("moe_ffn_hidden_size"); ok && f > 0 {
		c.MoEFFN = f
	}
	c.SharedFFN, _ = a.int("moe_shared_expert_intermediate_size")
	var err error
	if c.SharedGate, err = a.bool("moe_shared_expert_gate"); err != nil {
		return err
	}
	pre, err := a.bool("moe_router_pre_softmax")
	if err != nil {
		return err
	}
	c.NormTopK = !pre
	mla, err := a.bool("multi_latent_attention")
	if err != nil {
		return err
	}
	lb, err := a.strs("moe_router_load_balancing_type")
	if err != nil {
		return fmt.Errorf("args.%w", err)
	}
	if slices.Contains(lb, "sinkhorn") {
		return fmt.Errorf("args.moe_router_load_balancing_type is %v: Megatron routes its training tokens by Sinkhorn, Hugging Face by top-k", a["moe_router_load_balancing_type"])
	}
	type refusal struct {
		name string
		off  func(any) bool
		why  string
	}
	refused := []refusal{
		{"moe_expert_capacity_factor", isNone, "an expert capacity (tokens dropped)"},
		{"moe_input_jitter_eps", isNone, "input jitter"},
		{"moe_latent_size", isNone, "latent MoE"},
	}
	families := moeNames()
	if mla {
		families = []string{"deepseek_v3"}
		if err := deepseekRoutingFromArgs(a, c); err != nil {
			return err
		}
	} else {
		if fr, ok := a["moe_layer_freq"]; ok && fr != nil && !isOne(fr) {
			return fmt.Errorf("args.moe_layer_freq is %v: dense MLP layers between MoE layers are not mapped (every layer must be MoE; deepseek_v3's leading dense layers need multi_latent_attention)", fr)
		}
		if s, ok := a.str("moe_router_score_function"); ok && s != "softmax" {
			return fmt.Errorf("args.moe_router_score_function is %s: the MoE families %s route with softmax (deepseek_v3's sigmoid router needs multi_latent_attention)", s, strings.Join(moeNames(), ", "))
		}
		refused = append(refused,
			refusal{"moe_router_enable_expert_bias", isFalse, "a routing bias (deepseek_v3, with multi_latent_attention)"},
			refusal{"moe_router_topk_scaling_factor", isNone, "scaled routing weights"},
			refusal{"moe_router_num_groups", isNone, "group-limited routing"},
			refusal{"moe_router_group_topk", isNone, "group-limited routing"})
	}
	for _, r := range refused {
		if v, ok := a[r.name]; ok && !r.off(v) {
			return fmt.Errorf("args.%s is %v (%s): the MoE families %s do not compute it", r.name, v, r.why, strings.Join(families, ", "))
		}
	}
	return nil
}

// moeFamily picks the MoE row of a config read from Megatron args.
func moeFamily(c *Config) string {
	switch {
	case c.MLA:
		return "deepseek_v3"
	case c.SharedFFN > 0:
		return "qwen2_moe"
	case c.QKNorm:
		return "qwen3_moe"
	}
	return "mixtral"
}

func moeNames() []string { return []string{"mixtral", "qwen2_moe", "qwen3_moe"} }

// moeMegatronArgs adds the MoE arguments to MegatronArgs.
func (c *Config) moeMegatronArgs(a map[string]any) {
	if c.Experts <= 0 {
		return
	}
	a["num_experts"] = c.Experts
	a["moe_router_topk"] = c.TopK
	a["moe_ffn_hidden_size"] = c.MoEFFN
	a["moe_router_pre_softmax"] = !c.NormTopK
	a["moe_router_score_function"] = "softmax"
	a["moe_layer_freq"] = int64(1)
	a["moe_shared_expert_intermediate_size"] = nil // Megatron's default: no shared expert
	a["moe_shared_expert_gate"] = c.SharedGate
	if c.SharedFFN > 0 {
		a["moe_shared_expert_intermediate_size"] = c.SharedFFN
	}
	if c.MLA {
		c.deepseekMegatronArgs(a)
	}
}
