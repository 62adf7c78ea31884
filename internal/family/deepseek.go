package family

import (
	"fmt"
	"math"
	"slices"
)

// DeepSeek-V3 (FAMILIES.md, "DeepSeek-V3"): multi-latent attention, the
// first first_k_dense_replace layers with a dense SwiGLU MLP, the others a
// MoE block of routed experts, shared experts and a sigmoid router with a
// score-correction bias. transformers v4.57.1 models/deepseek_v3;
// megatron-core core_v0.19.0 transformer/multi_latent_attention.py,
// models/gpt/gpt_layer_specs.py (MLA local and TE specs), transformer/moe/
// {router,moe_utils}.py.

const (
	dsAttn = hfL + "self_attn."
	dsMLP  = hfL + "mlp."
	mcAttn = coreL + "self_attention."
)

func qLora(c *Config) bool             { return c.QLoraRank > 0 }
func noQLora(c *Config) bool           { return c.QLoraRank == 0 }
func denseLayer(c *Config, l int) bool { return int64(l) < c.DenseLayers }
func moeLayer(c *Config, l int) bool   { return int64(l) >= c.DenseLayers }
func mla(hf, local, te string) [numNamings]string {
	return names(dsAttn+hf, "", mcAttn+local, mcAttn+te, "")
}

// deepseekRoles: megatron-core's MLA names local (its q/kv norms are
// modules of their own, q_layernorm and kv_layernorm) and TE (fused into
// the up projections as layer_norm_weight; the input norm is not fused in
// the MLA TE spec). The local spec's down projections are column-parallel
// (ColumnParallelLinear, output gathered), the TE spec's duplicated on every
// rank (TELinear parallel_mode 'duplicated'). kv_a_proj_with_mqa and
// linear_kv_down_proj are the same rows [kv_lora_rank; qk_pos_emb_head_dim]:
// both split the output in that order. The RoPE rows need no permutation:
// Megatron's MLA (apply_rotary_pos_emb with mla_rotary_interleaved) and HF
// with rope_interleave take the rotary dims in adjacent pairs alike.
func deepseekRoles() []Role {
	var embed, final, head, o, attnNorm Role
	for _, r := range denseRoles() {
		r.Names[Titan], r.Names[Legacy] = "", ""
		switch r.Name {
		case "embed":
			embed = r
		case "final_norm":
			final = r
		case "lm_head":
			head = r
		case "o_proj":
			o = r
		case "attn_norm":
			attnNorm = r
			attnNorm.Names[CoreTE] = attnNorm.Names[Core]
		}
	}
	dense := func(r Role) Role { r.Layers = denseLayer; return r }
	moe := func(r Role) Role { r.Layers = moeLayer; return r }
	roles := []Role{embed,
		{Name: "q_proj", Scope: Layer, TP: Column, When: noQLora, Names: mla("q_proj.weight", "linear_q_proj.weight", "linear_q_proj.weight")},
		{Name: "q_down", Scope: Layer, TP: Column, TEReplicated: true, When: qLora, Names: mla("q_a_proj.weight", "linear_q_down_proj.weight", "linear_q_down_proj.weight")},
		{Name: "q_down_norm", Scope: Layer, TP: Replicated, Norm: true, When: qLora, Names: mla("q_a_layernorm.weight", "q_layernorm.weight", "linear_q_up_proj.layer_norm_weight")},
		{Name: "q_up", Scope: Layer, TP: Column, When: qLora, Names: mla("q_b_proj.weight", "linear_q_up_proj.weight", "linear_q_up_proj.weight")},
		{Name: "kv_down", Scope: Layer, TP: Column, TEReplicated: true, Names: mla("kv_a_proj_with_mqa.weight", "linear_kv_down_proj.weight", "linear_kv_down_proj.weight")},
		{Name: "kv_down_norm", Scope: Layer, TP: Replicated, Norm: true, Names: mla("kv_a_layernorm.weight", "kv_layernorm.weight", "linear_kv_up_proj.layer_norm_weight")},
		{Name: "kv_up", Scope: Layer, TP: Column, Names: mla("kv_b_proj.weight", "linear_kv_up_proj.weight", "linear_kv_up_proj.weight")},
		o,
		dense(Role{Name: "gate_proj", Scope: Layer, TP: Column, Fuse: GateUp, Part: 0, Names: names(dsMLP+"gate_proj.weight", "", mcL+"linear_fc1.weight", mcL+"linear_fc1.weight", "")}),
		dense(Role{Name: "up_proj", Scope: Layer, TP: Column, Fuse: GateUp, Part: 1, Names: names(dsMLP+"up_proj.weight", "", mcL+"linear_fc1.weight", mcL+"linear_fc1.weight", "")}),
		dense(Role{Name: "down_proj", Scope: Layer, TP: Row, Names: names(dsMLP+"down_proj.weight", "", mcL+"linear_fc2.weight", mcL+"linear_fc2.weight", "")}),
	}
	// DeepseekV3MoE registers experts, gate (weight, e_score_correction_bias), shared_experts.
	experts := moeRoles(dsMLP+"gate.weight", dsMLP+"experts.{E}.", "gate_proj.weight", "up_proj.weight", "down_proj.weight")
	for _, r := range experts[1:] {
		roles = append(roles, moe(r))
	}
	roles = append(roles, moe(experts[0]),
		moe(Role{Name: "router_bias", Scope: Layer, TP: Replicated, Names: names(dsMLP+"gate.e_score_correction_bias", "", mcL+"router.expert_bias", mcL+"router.expert_bias", "")}),
		moe(Role{Name: "shared_gate", Scope: Layer, TP: Column, Fuse: GateUp, Part: 0, Names: names(dsMLP+"shared_experts.gate_proj.weight", "",
			mcL+"shared_experts.linear_fc1.weight", mcL+"shared_experts.linear_fc1.weight", "")}),
		moe(Role{Name: "shared_up", Scope: Layer, TP: Column, Fuse: GateUp, Part: 1, Names: names(dsMLP+"shared_experts.up_proj.weight", "",
			mcL+"shared_experts.linear_fc1.weight", mcL+"shared_experts.linear_fc1.weight", "")}),
		moe(Role{Name: "shared_down", Scope: Layer, TP: Row, Names: names(dsMLP+"shared_experts.down_proj.weight", "",
			mcL+"shared_experts.linear_fc2.weight", mcL+"shared_experts.linear_fc2.weight", "")}),
		attnNorm,
		// The MLP norm: TE fuses it into a dense layer's linear_fc1, not
		// into a MoE layer (pre_mlp_layernorm in both specs).
		dense(Role{Name: "mlp_norm", Scope: Layer, TP: Replicated, Norm: true, Names: names(hfL+"post_attention_layernorm.weight", "",
			coreL+"pre_mlp_layernorm.weight", mcL+"linear_fc1.layer_norm_weight", "")}),
		moe(Role{Name: "moe_norm", Scope: Layer, TP: Replicated, Norm: true, Names: names(hfL+"post_attention_layernorm.weight", "",
			coreL+"pre_mlp_layernorm.weight", coreL+"pre_mlp_layernorm.weight", "")}),
		final, head)
	return roles
}

func deepseekV3() *Family {
	f := &Family{Name: "deepseek_v3", HFArch: "DeepseekV3ForCausalLM", HFModelType: "deepseek_v3", Roles: deepseekRoles()}
	f.Check = func(c *Config) error { return deepseekCheck(f, c) }
	f.ToHF = func(c *Config) (map[string]any, error) { return deepseekToHF(f, c), nil }
	f.FromHF = deepseekFromHF
	return f
}

// deepseekCheck refuses, by option name, what DeepseekV3ForCausalLM does
// not compute as Megatron does.
func deepseekCheck(f *Family, c *Config) error {
	switch {
	case !c.MLA:
		return fmt.Errorf("multi_latent_attention not set: %s uses multi-latent attention", f.HFArch)
	case c.KVLoraRank <= 0 || c.QKNopeDim <= 0 || c.QKRopeDim <= 0 || c.VHeadDim <= 0 || c.QKRopeDim%2 != 0:
		return fmt.Errorf("%s: kv_lora_rank %d, qk_head_dim %d, qk_pos_emb_head_dim %d (even), v_head_dim %d: incomplete multi-latent attention",
			f.HFArch, c.KVLoraRank, c.QKNopeDim, c.QKRopeDim, c.VHeadDim)
	case !c.QKNorm:
		return fmt.Errorf("qk_layernorm not set: %s always normalises the compressed q and kv (q_a_layernorm, kv_a_layernorm), Megatron's MLA only with qk_layernorm", f.HFArch)
	case c.QueryGroups != c.Heads:
		return fmt.Errorf("%d query groups for %d heads: %s's MLA has a key and value per head (num_key_value_heads = num_attention_heads)", c.QueryGroups, c.Heads, f.HFArch)
	case c.QKVBias || c.OutBias || c.MLPBias:
		return fmt.Errorf("linear biases (add_bias_linear or add_qkv_bias): Megatron's MLA down projections have none; %s's attention_bias is not mapped", f.HFArch)
	case c.RotaryInterleaved:
		return fmt.Errorf("rotary_interleaved: Megatron's MLA would rotate the pairs again after taking them apart; %s does not", f.HFArch)
	case c.RopeScaling != nil && c.RopeScaling.Type != "yarn":
		return fmt.Errorf("rope scaling %s: %s's MLA takes yarn only", c.RopeScaling.Type, f.HFArch)
	case c.ScoreFunc != "sigmoid":
		return fmt.Errorf("moe_router_score_function %q: %s routes with sigmoid scores", c.ScoreFunc, f.HFArch)
	case !c.ExpertBias:
		return fmt.Errorf("moe_router_enable_expert_bias not set: %s's router always adds e_score_correction_bias", f.HFArch)
	case c.SharedGate:
		return fmt.Errorf("moe_shared_expert_gate: %s's shared experts have no gate", f.HFArch)
	case c.SharedFFN <= 0 || c.MoEFFN <= 0 || c.SharedFFN%c.MoEFFN != 0:
		return fmt.Errorf("moe_shared_expert_intermediate_size %d: %s's shared experts are n_shared_experts (>= 1) x moe_intermediate_size %d", c.SharedFFN, f.HFArch, c.MoEFFN)
	case c.DenseLayers < 0 || c.DenseLayers >= c.Layers:
		return fmt.Errorf("first_k_dense_replace %d of %d layers: %s needs MoE layers after the dense ones", c.DenseLayers, c.Layers, f.HFArch)
	case c.Groups < 0 || c.GroupTopK < 0 || c.Groups > 0 && c.Experts%c.Groups != 0:
		return fmt.Errorf("%d expert groups for %d experts", c.Groups, c.Experts)
	}
	return moeCheck(f, c)
}

// groupCheck: HF picks groups by the sum of each group's top 2 scores,
// Megatron by the sum of its top topk/group_topk (moe_utils.py
// group_limited_topk): the same when that is 2.
func groupCheck(c *Config) error {
	if c.Groups == 0 && c.GroupTopK == 0 {
		return nil
	}
	switch {
	case c.Groups <= 1 || c.GroupTopK <= 0 || c.GroupTopK > c.Groups || c.Experts%c.Groups != 0:
		return fmt.Errorf("moe_router_num_groups %d, moe_router_group_topk %d for %d experts: not a group-limited routing", c.Groups, c.GroupTopK, c.Experts)
	case c.TopK != 2*c.GroupTopK:
		return fmt.Errorf("moe_router_group_topk %d at top-%d: Megatron scores a group by its top %d/%d experts, DeepseekV3ForCausalLM by its top 2", c.GroupTopK, c.TopK, c.TopK, c.GroupTopK)
	}
	return nil
}

// mlaFromArgs reads multi-latent attention and picks deepseek_v3.
func mlaFromArgs(a Args, c *Config) error {
	on, err := a.bool("multi_latent_attention")
	if err != nil {
		return err
	}
	if !on {
		if v, ok := a["rotary_scaling_factor"]; ok && !isOne(v) {
			return fmt.Errorf("args.rotary_scaling_factor is %v (YaRN rotary scaling, read by multi-latent attention only): no Hugging Face model of the families %v computes it without it", v, Names())
		}
		return nil
	}
	if c.Experts <= 0 {
		return fmt.Errorf("args.multi_latent_attention without num_experts: deepseek_v3 is a mixture of experts (dense MLA models are not mapped)")
	}
	c.MLA, c.QueryGroups = true, c.Heads
	if v, ok := a["q_lora_rank"]; ok && v != nil {
		if c.QLoraRank, ok = a.int("q_lora_rank"); !ok || c.QLoraRank <= 0 {
			return fmt.Errorf("args.q_lora_rank is %v", v)
		}
	} else {
		return fmt.Errorf("args.q_lora_rank is None: megatron-core 0.19 builds linear_q_proj with a layer norm fused in front (TE spec, qk_layernorm) or refuses it (local spec); DeepseekV3ForCausalLM's q_proj has none")
	}
	for _, x := range []struct {
		dst *int64
		k   string
		def int64
	}{{&c.KVLoraRank, "kv_lora_rank", 32}, {&c.QKNopeDim, "qk_head_dim", 128}, {&c.QKRopeDim, "qk_pos_emb_head_dim", 64}, {&c.VHeadDim, "v_head_dim", 128}} {
		var ok bool
		if *x.dst, ok = a.int(x.k); !ok {
			*x.dst = x.def // arguments.py defaults
		}
	}
	c.HeadDim = c.QKNopeDim + c.QKRopeDim
	if c.RopeScaling != nil {
		return fmt.Errorf("args set %s rope scaling with multi_latent_attention: Megatron's MLA ignores it (rope_type, rotary_scaling_factor)", c.RopeScaling.Type)
	}
	for _, k := range []string{"cache_mla_latents", "mla_down_proj_fusion"} {
		if on, err := a.bool(k); err != nil || on {
			return fmt.Errorf("args.%s is set: %v", k, orNot(err, "a layout of the MLA weights not mapped"))
		}
	}
	// MLATransformerConfig: rope_type None is yarn; factor 1 is plain RoPE
	// (YarnRotaryEmbedding mixes identical frequencies, mscale 1).
	rt, ok := a.str("rope_type")
	if !ok {
		rt = "yarn"
	}
	f, ok := a.float("rotary_scaling_factor")
	if !ok {
		f = 1
	}
	if rt == "yarn" && f != 1 {
		s := &RopeScaling{Type: "yarn", Factor: f, OriginalMaxPE: 4096, BetaFast: 32, BetaSlow: 1, MScale: 1}
		// The command line sets none of these MLATransformerConfig fields
		// but mscale; args that hold them (yaml) give them.
		if v, ok := a.int("original_max_position_embeddings"); ok {
			s.OriginalMaxPE = v
		}
		for _, x := range []struct {
			dst *float64
			k   string
		}{{&s.BetaFast, "beta_fast"}, {&s.BetaSlow, "beta_slow"}, {&s.MScale, "mscale"}, {&s.MScaleAllDim, "mscale_all_dim"}} {
			if v, ok := a.float(x.k); ok {
				*x.dst = v
			}
		}
		c.RopeScaling = s
	} else if rt != "yarn" && rt != "rope" {
		return fmt.Errorf("args.rope_type is %s: rope or yarn", rt)
	}
	return nil
}

func orNot(err error, why string) string {
	if err != nil {
		return err.Error()
	}
	return why
}

// deepseekRoutingFromArgs reads the DeepSeek router: leading dense layers
// from moe_layer_freq, sigmoid scores, the expert bias, the scaling factor
// and the expert groups. Megatron's sigmoid router renormalises the top-k
// weights whenever k > 1 (moe_router_pre_softmax plays no part).
func deepseekRoutingFromArgs(a Args, c *Config) error {
	layers, _ := a.int("num_layers")
	k, err := denseLead(a["moe_layer_freq"], layers)
	if err != nil {
		return err
	}
	c.DenseLayers = k
	c.ScoreFunc = "softmax"
	if s, ok := a.str("moe_router_score_function"); ok {
		c.ScoreFunc = s
	}
	c.NormTopK = c.TopK > 1
	if c.ExpertBias, err = a.bool("moe_router_enable_expert_bias"); err != nil {
		return err
	}
	c.TopKScale = 1
	if v, ok := a.float("moe_router_topk_scaling_factor"); ok {
		c.TopKScale = v
	}
	c.Groups, _ = a.int("moe_router_num_groups")
	c.GroupTopK, _ = a.int("moe_router_group_topk")
	if c.GroupTopK == 0 {
		c.Groups = 0 // Megatron routes by groups only with moe_router_group_topk
	}
	return groupCheck(c)
}

// denseLead reads moe_layer_freq as leading dense layers: 1, or a list
// [0]*k + [1]*(layers-k).
func denseLead(v any, layers int64) (int64, error) {
	if v == nil || isOne(v) {
		return 0, nil
	}
	var pat []int64
	switch l := v.(type) {
	case []any:
		for _, x := range l {
			n, ok := Args{"x": x}.int("x")
			if !ok {
				return 0, fmt.Errorf("args.moe_layer_freq is %v: not a list of 0 and 1", v)
			}
			pat = append(pat, n)
		}
	case []int64:
		pat = l
	default:
		return 0, fmt.Errorf("args.moe_layer_freq is %v: one MoE layer every N layers is not mapped (deepseek_v3: leading dense layers, then MoE layers)", v)
	}
	k := int64(slices.Index(pat, 1))
	if k < 0 {
		k = int64(len(pat))
	}
	ok := int64(len(pat)) == layers
	for i, x := range pat {
		want := int64(1)
		if int64(i) < k {
			want = 0
		}
		ok = ok && x == want
	}
	if !ok {
		return 0, fmt.Errorf("args.moe_layer_freq is %v: deepseek_v3 maps leading dense layers followed by MoE layers only ([0]*k + [1]*(num_layers-k) over %d layers)", v, layers)
	}
	return k, nil
}

// deepseekMegatronArgs adds the MLA and DeepSeek routing arguments.
func (c *Config) deepseekMegatronArgs(a map[string]any) {
	a["multi_latent_attention"] = true
	a["group_query_attention"] = false
	a["num_query_groups"] = int64(1)      // arguments.py's default, unused without GQA
	a["kv_channels"] = c.Hidden / c.Heads // Megatron's default; MLA does not read it
	a["q_lora_rank"] = nil
	if c.QLoraRank > 0 {
		a["q_lora_rank"] = c.QLoraRank
	}
	a["kv_lora_rank"] = c.KVLoraRank
	a["qk_head_dim"] = c.QKNopeDim
	a["qk_pos_emb_head_dim"] = c.QKRopeDim
	a["v_head_dim"] = c.VHeadDim
	a["rope_type"] = "rope"
	a["rotary_scaling_factor"] = 1.0
	if s := c.RopeScaling; s != nil && s.Type == "yarn" {
		a["rope_type"] = "yarn"
		a["rotary_scaling_factor"] = s.Factor
		a["original_max_position_embeddings"] = s.OriginalMaxPE
		a["beta_fast"] = s.BetaFast
		a["beta_slow"] = s.BetaSlow
		a["mscale"] = s.MScale
		a["mscale_all_dim"] = s.MScaleAllDim
	}
	a["use_rope_scaling"] = false
	delete(a, "rotary_seq_len_interpolation_factor")
	a["moe_layer_freq"] = int64(1)
	if c.DenseLayers > 0 {
		pat := make([]any, c.Layers)
		for i := range pat {
			pat[i] = int64(1)
			if int64(i) < c.DenseLayers {
				pat[i] = int64(0)
			}
		}
		a["moe_layer_freq"] = pat
	}
	a["moe_router_score_function"] = c.ScoreFunc
	a["moe_router_pre_softmax"] = false
	a["moe_router_enable_expert_bias"] = c.ExpertBias
	a["moe_router_topk_scaling_factor"] = nil
	if c.TopKScale != 1 {
		a["moe_router_topk_scaling_factor"] = c.TopKScale
	}
	a["moe_router_num_groups"], a["moe_router_group_topk"] = nil, nil
	if c.GroupTopK > 0 {
		a["moe_router_num_groups"], a["moe_router_group_topk"] = c.Groups, c.GroupTopK
	}
}

// deepseekToHF writes DeepseekV3Config's fields. head_dim is left out:
// the class sets it to qk_rope_head_dim.
func deepseekToHF(f *Family, c *Config) map[string]any {
	m := hfCommon(f, c)
	delete(m, "head_dim")
	var q any
	if c.QLoraRank > 0 {
		q = c.QLoraRank
	}
	groups, gtop := c.Groups, c.GroupTopK
	if gtop == 0 {
		groups, gtop = 1, 1
	}
	for k, v := range map[string]any{
		"q_lora_rank": q, "kv_lora_rank": c.KVLoraRank, "qk_nope_head_dim": c.QKNopeDim, "qk_rope_head_dim": c.QKRopeDim,
		"v_head_dim": c.VHeadDim, "n_routed_experts": c.Experts, "num_experts_per_tok": c.TopK, "moe_intermediate_size": c.MoEFFN,
		"n_shared_experts": c.SharedFFN / c.MoEFFN, "routed_scaling_factor": c.TopKScale, "n_group": groups, "topk_group": gtop,
		"first_k_dense_replace": c.DenseLayers, "norm_topk_prob": c.NormTopK, "rope_interleave": true, "attention_bias": false,
		"num_nextn_predict_layers": 0,
	} {
		m[k] = v
	}
	return m
}

// deepseekFromHF reads DeepseekV3Config's fields; what Megatron does not
// compute goes to Unsupported, what ucp does not map is an error.
func deepseekFromHF(m map[string]any, c *Config) error {
	a := Args(m)
	c.MLA, c.QKNorm, c.ScoreFunc, c.ExpertBias = true, true, "sigmoid", true
	unsupported := func(format string, x ...any) { c.Unsupported = append(c.Unsupported, fmt.Sprintf(format, x...)) }
	if v, ok := m["q_lora_rank"]; ok && v != nil {
		if c.QLoraRank, ok = a.int("q_lora_rank"); !ok || c.QLoraRank <= 0 {
			return fmt.Errorf("q_lora_rank is %v", v)
		}
	} else {
		unsupported("q_lora_rank null (megatron-core 0.19's MLA puts a norm in front of linear_q_proj or refuses it)")
	}
	for _, x := range []struct {
		dst *int64
		k   string
	}{{&c.KVLoraRank, "kv_lora_rank"}, {&c.QKNopeDim, "qk_nope_head_dim"}, {&c.QKRopeDim, "qk_rope_head_dim"}, {&c.VHeadDim, "v_head_dim"},
		{&c.Experts, "n_routed_experts"}, {&c.TopK, "num_experts_per_tok"}, {&c.MoEFFN, "moe_intermediate_size"}} {
		var ok bool
		if *x.dst, ok = a.int(x.k); !ok || *x.dst <= 0 {
			return fmt.Errorf("no %s", x.k)
		}
	}
	c.HeadDim = c.QKNopeDim + c.QKRopeDim
	if c.QueryGroups != c.Heads {
		return fmt.Errorf("num_key_value_heads %d differs from num_attention_heads %d: DeepseekV3's MLA has a key and value per head", c.QueryGroups, c.Heads)
	}
	shared, ok := a.int("n_shared_experts")
	if !ok || shared <= 0 {
		return fmt.Errorf("n_shared_experts is %v: shared experts (at least one) are mapped", m["n_shared_experts"])
	}
	c.SharedFFN = shared * c.MoEFFN
	if c.DenseLayers, ok = a.int("first_k_dense_replace"); !ok || c.DenseLayers < 0 || c.DenseLayers >= c.Layers {
		return fmt.Errorf("first_k_dense_replace is %v for %d layers", m["first_k_dense_replace"], c.Layers)
	}
	var err error
	if c.NormTopK, err = a.bool("norm_topk_prob"); err != nil {
		return err
	}
	if c.NormTopK != (c.TopK > 1) {
		unsupported("norm_topk_prob %v at num_experts_per_tok %d (Megatron's sigmoid router renormalises exactly when top-k > 1)", c.NormTopK, c.TopK)
	}
	if c.TopKScale, ok = a.float("routed_scaling_factor"); !ok {
		return fmt.Errorf("no routed_scaling_factor")
	}
	c.Groups, _ = a.int("n_group")
	c.GroupTopK, _ = a.int("topk_group")
	if c.Groups <= 1 && c.GroupTopK <= 1 {
		c.Groups, c.GroupTopK = 0, 0 // one group: every expert is a candidate
	} else if err := groupCheck(c); err != nil {
		unsupported("n_group %d, topk_group %d (%v)", c.Groups, c.GroupTopK, err)
	}
	if inter, err := a.bool("rope_interleave"); err != nil || (m["rope_interleave"] != nil && !inter) {
		if err != nil {
			return err
		}
		unsupported("rope_interleave false (Megatron's MLA takes the rotary dims in adjacent pairs)")
	}
	if bias, err := a.bool("attention_bias"); err != nil || bias {
		if err != nil {
			return err
		}
		return fmt.Errorf("attention_bias true: the biases of q_a_proj, kv_a_proj_with_mqa and o_proj are not mapped")
	}
	if n, ok := a.int("num_nextn_predict_layers"); ok && n > 0 {
		return fmt.Errorf("num_nextn_predict_layers %d: the multi-token-prediction layers (model.layers.%d.* and on) are not mapped; DeepseekV3ForCausalLM does not load them either", n, c.Layers)
	}
	return nil
}

// yarnFromHF reads a yarn rope_scaling; the differences between HF's and
// Megatron's YaRN (modeling_rope_utils.py _compute_yarn_parameters,
// yarn_rotary_pos_embedding.py) are Unsupported.
func yarnFromHF(rs Args, c *Config, s *RopeScaling) {
	s.OriginalMaxPE, _ = rs.int("original_max_position_embeddings")
	s.BetaFast, _ = rs.float("beta_fast")
	s.BetaSlow, _ = rs.float("beta_slow")
	var hasM bool
	if s.MScale, hasM = rs.float("mscale"); !hasM {
		s.MScale = 1
	}
	s.MScaleAllDim, _ = rs.float("mscale_all_dim")
	var bad []string
	if s.OriginalMaxPE == 0 {
		s.OriginalMaxPE = c.MaxPositions
	}
	if s.BetaFast == 0 {
		s.BetaFast = 32
	}
	if s.BetaSlow == 0 {
		s.BetaSlow = 1
	}
	if _, ok := rs["attention_factor"]; ok {
		bad = append(bad, "attention_factor")
	}
	if t, ok := rs["truncate"]; ok && t != true {
		bad = append(bad, "truncate false")
	}
	// HF: mscale/mscale_all_dim only when both are non-zero, else
	// get_mscale(factor); Megatron always the ratio.
	if !(hasM && s.MScale != 0 && s.MScaleAllDim != 0) && !(s.MScale == 1 && s.MScaleAllDim == 0) {
		bad = append(bad, fmt.Sprintf("mscale %v with mscale_all_dim %v", s.MScale, s.MScaleAllDim))
	}
	if s.Factor <= 1 || math.IsNaN(s.Factor) {
		bad = append(bad, fmt.Sprintf("factor %v", s.Factor))
	}
	for _, b := range bad {
		c.Unsupported = append(c.Unsupported, "yarn rope_scaling "+b)
	}
}
