package family

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Config is a model's geometry and every option that changes its math, in
// one vocabulary for all frameworks. The manifest records it (ucp.json
// source.model); MoE families add fields (zero when absent).
type Config struct {
	Family       string `json:"family"`
	Hidden       int64  `json:"hidden_size"`
	FFN          int64  `json:"ffn_hidden_size"`
	Layers       int64  `json:"num_layers"`
	Heads        int64  `json:"num_attention_heads"`
	QueryGroups  int64  `json:"num_query_groups"`
	HeadDim      int64  `json:"head_dim"`
	Vocab        int64  `json:"vocab_size"`                             // the true vocabulary (embedding rows without padding)
	VocabDivisor int64  `json:"make_vocab_size_divisible_by,omitempty"` // Megatron's padding rule
	MaxPositions int64  `json:"max_position_embeddings"`
	// Norm is "RMSNorm"; NormEps its epsilon. LayerNorm1p: Megatron's
	// apply_layernorm_1p, norm weights stored minus one.
	Norm        string  `json:"normalization"`
	NormEps     float64 `json:"norm_epsilon"`
	LayerNorm1p bool    `json:"apply_layernorm_1p,omitempty"`
	RopeTheta   float64 `json:"rotary_base"`
	// RopeScaling is HF's rope_scaling (llama3 or linear), nil for none.
	RopeScaling       *RopeScaling `json:"rope_scaling,omitempty"`
	RotaryInterleaved bool         `json:"rotary_interleaved,omitempty"`
	RotaryPercent     float64      `json:"rotary_percent"`
	Tied              bool         `json:"tie_word_embeddings"`
	QKVBias           bool         `json:"qkv_bias,omitempty"`
	OutBias           bool         `json:"attn_out_bias,omitempty"`
	MLPBias           bool         `json:"mlp_bias,omitempty"`
	QKNorm            bool         `json:"qk_norm,omitempty"`
	Activation        string       `json:"activation"` // "swiglu" (SiLU-gated)
	// Mixture of experts (moe.go; zero for dense families): routed
	// experts, top-k, the experts' FFN, a shared expert's FFN and its
	// sigmoid gate, and whether the k routing probabilities are
	// renormalised (HF norm_topk_prob; Megatron: not moe_router_pre_softmax).
	Experts    int64 `json:"num_experts,omitempty"`
	TopK       int64 `json:"moe_router_topk,omitempty"`
	MoEFFN     int64 `json:"moe_ffn_hidden_size,omitempty"`
	SharedFFN  int64 `json:"moe_shared_expert_intermediate_size,omitempty"`
	SharedGate bool  `json:"moe_shared_expert_gate,omitempty"`
	NormTopK   bool  `json:"norm_topk_prob,omitempty"`
	// DeepSeek-V3 (deepseek.go; zero elsewhere): multi-latent attention
	// (q_lora_rank 0: no query LoRA, HF q_proj), leading dense layers
	// (first_k_dense_replace), and the sigmoid router with its correction
	// bias, scaling factor and expert groups (0: none).
	MLA         bool    `json:"multi_latent_attention,omitempty"`
	QLoraRank   int64   `json:"q_lora_rank,omitempty"`
	KVLoraRank  int64   `json:"kv_lora_rank,omitempty"`
	QKNopeDim   int64   `json:"qk_head_dim,omitempty"`
	QKRopeDim   int64   `json:"qk_pos_emb_head_dim,omitempty"`
	VHeadDim    int64   `json:"v_head_dim,omitempty"`
	DenseLayers int64   `json:"first_k_dense_replace,omitempty"`
	ScoreFunc   string  `json:"moe_router_score_function,omitempty"` // "" is softmax
	ExpertBias  bool    `json:"moe_router_enable_expert_bias,omitempty"`
	TopKScale   float64 `json:"moe_router_topk_scaling_factor,omitempty"`
	Groups      int64   `json:"moe_router_num_groups,omitempty"`
	GroupTopK   int64   `json:"moe_router_group_topk,omitempty"`
	// Unsupported lists what a Hugging Face config asks for that the
	// Megatron model cannot compute (sliding windows, other rope types):
	// exporting it back to HF is exact, writing Megatron is refused.
	Unsupported []string `json:"unsupported,omitempty"`
}

// RopeScaling is config.json's rope_scaling.
type RopeScaling struct {
	Type          string  `json:"rope_type"` // "llama3", "linear" or "yarn" (deepseek_v3)
	Factor        float64 `json:"factor"`
	LowFreq       float64 `json:"low_freq_factor,omitempty"`
	HighFreq      float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPE int64   `json:"original_max_position_embeddings,omitempty"`
	// YaRN (Megatron's MLA YarnRotaryEmbedding, HF rope_type yarn).
	BetaFast     float64 `json:"beta_fast,omitempty"`
	BetaSlow     float64 `json:"beta_slow,omitempty"`
	MScale       float64 `json:"mscale,omitempty"`
	MScaleAllDim float64 `json:"mscale_all_dim,omitempty"`
}

// Megatron's llama3 scaling constants: RotaryEmbedding._apply_scaling
// (NVIDIA/Megatron-LM megatron/core/models/common/embeddings/
// rotary_pos_embedding.py, commit d98e8a64) takes only the factor from
// args (rope_scaling_factor, default 8); the rest are its defaults.
const (
	megatronLowFreq  = 1.0
	megatronHighFreq = 4.0
	megatronOrigMax  = 8192
)

// Args reads a scalar argument map (Megatron-LM or Megatron-DeepSpeed
// args as the manifest records them: ints may be float64 after JSON).
type Args map[string]any

func (a Args) has(k string) bool { _, ok := a[k]; return ok }

func (a Args) int(names ...string) (int64, bool) {
	for _, n := range names {
		switch v := a[n].(type) {
		case int64:
			return v, true
		case int:
			return int64(v), true
		case float64:
			if v == math.Trunc(v) {
				return int64(v), true
			}
		}
	}
	return 0, false
}

func (a Args) float(names ...string) (float64, bool) {
	for _, n := range names {
		switch v := a[n].(type) {
		case int64:
			return float64(v), true
		case int:
			return float64(v), true
		case float64:
			return v, true
		}
	}
	return 0, false
}

func (a Args) bool(name string) (bool, error) {
	x, ok := a[name]
	if !ok || x == nil {
		return false, nil
	}
	switch b := x.(type) {
	case bool:
		return b, nil
	}
	return false, fmt.Errorf("args.%s is %v, not a bool", name, x)
}

func (a Args) str(name string) (string, bool) {
	switch s := a[name].(type) {
	case string:
		return s, true
	}
	return "", false
}

// hfScaling returns config.json's rope_scaling, nil when absent or null;
// any other value than an object is an error (a scaling is never ignored).
func hfScaling(m map[string]any) (map[string]any, error) {
	switch rs := m["rope_scaling"].(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return rs, nil
	default:
		return nil, fmt.Errorf("config.json: rope_scaling is %v, not an object", rs)
	}
}

// refusedArgs are Megatron options that change the math and that no
// family here can express: set to anything but their default, the export
// is refused with the option's name.
var refusedArgs = []struct {
	name string
	off  func(v any) bool // true when the value is the harmless default
	why  string
}{
	{"apply_residual_connection_post_layernorm", isFalse, "residuals taken after the norm"},
	{"qk_l2_norm", isFalse, "L2-normalised queries and keys"},
	{"attention_output_gate", isFalse, "a gated attention output"},
	{"heterogeneous_layers_config_path", isNone, "heterogeneous layers"},
	{"window_size", isNone, "sliding-window attention"},
	{"softmax_scale", isNone, "a non-default softmax scale"},
	{"mtp_num_layers", isZero, "multi-token-prediction layers"},
	{"no_rope_freq", isNone, "layers without RoPE"},
}

func isFalse(v any) bool { return v == nil || v == false }
func isNone(v any) bool  { return v == nil }
func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case int64:
		return x == 0
	case float64:
		return x == 0
	}
	return false
}
func isOne(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case int64:
		return x == 1
	case float64:
		return x == 1
	}
	return false
}

// FromArgs reads the model's config from Megatron-LM or Megatron-DeepSpeed
// training arguments and picks its family: qwen3 with qk_layernorm, qwen2
// with add_qkv_bias only, else llama (mistral is llama's math with a
// sliding window; name it with --arch). The vocabulary (Vocab) is the
// caller's: the embedding's unpadded rows. Options that change the math
// and that no family expresses are refused by name.
func FromArgs(a Args) (*Config, error) {
	if err := a.checkTypes("args"); err != nil {
		return nil, err
	}
	c := &Config{Norm: "RMSNorm", Activation: "swiglu", RotaryPercent: 1}
	for _, step := range []func(Args, *Config) error{geometryFromArgs, moeFromArgs, refuseArgs, normFromArgs, ropeFromArgs, biasFromArgs, mlaFromArgs} {
		if err := step(a, c); err != nil {
			return nil, err
		}
	}
	switch {
	case c.Experts > 0:
		c.Family = moeFamily(c)
	case c.QKNorm:
		c.Family = "qwen3"
	case c.QKVBias && !c.OutBias && !c.MLPBias:
		c.Family = "qwen2"
	default:
		c.Family = "llama"
	}
	return c, nil
}

// geometryFromArgs reads the sizes: layers, heads, query groups, hidden,
// FFN, positions and the vocabulary divisor.
func geometryFromArgs(a Args, c *Config) error {
	var ok bool
	if c.Layers, ok = a.int("num_layers"); !ok || c.Layers <= 0 {
		return fmt.Errorf("args have no num_layers")
	}
	if c.Heads, ok = a.int("num_attention_heads"); !ok || c.Heads <= 0 {
		return fmt.Errorf("args have no num_attention_heads")
	}
	if c.Hidden, ok = a.int("hidden_size"); !ok || c.Hidden <= 0 {
		return fmt.Errorf("args have no hidden_size")
	}
	c.QueryGroups = c.Heads
	gqa, err := a.bool("group_query_attention")
	if err != nil {
		return err
	}
	if gqa {
		if c.QueryGroups, ok = a.int("num_query_groups"); !ok {
			return fmt.Errorf("args have group_query_attention but no num_query_groups")
		}
	} else if n, ok := a.int("num_key_value_heads"); ok && n > 0 { // Megatron-DeepSpeed
		c.QueryGroups = n
	}
	if c.QueryGroups <= 0 || c.Heads%c.QueryGroups != 0 {
		return fmt.Errorf("%d attention heads do not split into %d query groups", c.Heads, c.QueryGroups)
	}
	if c.HeadDim, ok = a.int("kv_channels"); !ok || c.HeadDim <= 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.FFN, ok = a.int("ffn_hidden_size"); !ok || c.FFN <= 0 {
		return fmt.Errorf("args have no ffn_hidden_size")
	}
	if c.MaxPositions, ok = a.int("max_position_embeddings", "seq_length"); !ok {
		return fmt.Errorf("args have no max_position_embeddings")
	}
	c.VocabDivisor, _ = a.int("make_vocab_size_divisible_by")
	return nil
}

// refuseArgs refuses the Megatron options that no family computes.
func refuseArgs(a Args, c *Config) error {
	for _, r := range refusedArgs {
		if v, ok := a[r.name]; ok && !r.off(v) {
			return fmt.Errorf("args.%s is %v (%s): no Hugging Face model of the families %s computes it", r.name, v, r.why, strings.Join(Names(), ", "))
		}
	}
	return nil
}

// normFromArgs reads the normalization and the MLP activation.
func normFromArgs(a Args, c *Config) error {
	// Normalization: Megatron-LM "RMSNorm", Megatron-DeepSpeed "rmsnorm";
	// unrecorded means the LayerNorm of releases before RMSNorm.
	norm, ok := a.str("normalization")
	if !ok {
		return fmt.Errorf("args record no normalization (Megatron's default is LayerNorm): the families %s use RMSNorm", strings.Join(Names(), ", "))
	}
	if !strings.EqualFold(norm, "RMSNorm") {
		return fmt.Errorf("args.normalization is %s: the families %s use RMSNorm", norm, strings.Join(Names(), ", "))
	}
	if c.NormEps, ok = a.float("norm_epsilon", "layernorm_epsilon"); !ok {
		c.NormEps = 1e-5
	}
	var err error
	if c.LayerNorm1p, err = a.bool("apply_layernorm_1p"); err != nil {
		return err
	}
	sw, err := a.bool("swiglu")
	if err != nil {
		return err
	}
	if !sw {
		act := "gelu"
		if sq, _ := a.bool("squared_relu"); sq {
			act = "squared_relu"
		}
		return fmt.Errorf("the MLP activation is %s (args.swiglu is not set): the families %s use SiLU-gated MLPs (SwiGLU) and Hugging Face has no %s counterpart of them", act, strings.Join(Names(), ", "), act)
	}
	return nil
}

// ropeFromArgs reads the rotary embedding: base, percent, layout and
// scaling.
func ropeFromArgs(a Args, c *Config) error {
	// Position embeddings: Megatron-LM position_embedding_type 'rope';
	// Megatron-DeepSpeed use_rotary_position_embeddings.
	if pe, ok := a.str("position_embedding_type"); ok {
		if pe != "rope" {
			return fmt.Errorf("args.position_embedding_type is %s: the families %s use RoPE", pe, strings.Join(Names(), ", "))
		}
	} else if rot, _ := a.bool("use_rotary_position_embeddings"); !rot {
		return fmt.Errorf("args record neither position_embedding_type rope nor use_rotary_position_embeddings: the families %s use RoPE", strings.Join(Names(), ", "))
	}
	var ok bool
	if c.RopeTheta, ok = a.float("rotary_base", "rope_theta"); !ok {
		c.RopeTheta = 10000
	}
	if p, ok := a.float("rotary_percent"); ok {
		c.RotaryPercent = p
	}
	var err error
	if c.RotaryInterleaved, err = a.bool("rotary_interleaved"); err != nil {
		return err
	}
	scaling, err := a.bool("use_rope_scaling")
	if err != nil {
		return err
	}
	if scaling {
		f, ok := a.float("rope_scaling_factor")
		if !ok {
			f = 8 // Megatron's default (arguments.py --rope-scaling-factor)
		}
		c.RopeScaling = &RopeScaling{Type: "llama3", Factor: f, LowFreq: megatronLowFreq, HighFreq: megatronHighFreq, OriginalMaxPE: megatronOrigMax}
	}
	if f, ok := a.float("rotary_seq_len_interpolation_factor"); ok && f != 1 {
		if c.RopeScaling != nil {
			return fmt.Errorf("args set both use_rope_scaling and rotary_seq_len_interpolation_factor %v: no Hugging Face rope_scaling does both", f)
		}
		// Positions divided by f: HF's linear rope_type divides inv_freq by f.
		c.RopeScaling = &RopeScaling{Type: "linear", Factor: f}
	}
	return nil
}

// biasFromArgs reads the tied embeddings, the linear biases and the q/k
// norms.
func biasFromArgs(a Args, c *Config) error {
	untie, err := a.bool("untie_embeddings_and_output_weights")
	if err != nil {
		return err
	}
	c.Tied = !untie
	biasLinear := true // Megatron-LM's default; --disable-bias-linear clears it
	if a.has("add_bias_linear") {
		if biasLinear, err = a.bool("add_bias_linear"); err != nil {
			return err
		}
	}
	qkvBias, err := a.bool("add_qkv_bias")
	if err != nil {
		return err
	}
	c.QKVBias = biasLinear || qkvBias
	c.OutBias, c.MLPBias = biasLinear, biasLinear
	c.QKNorm, err = a.bool("qk_layernorm")
	return err
}

// Check refuses a config that the family's HF model cannot compute
// exactly, naming the option; the family comes from c.Family.
func (c *Config) Check() error {
	f, err := Get(c.Family)
	if err != nil {
		return err
	}
	if c.Heads <= 0 || c.QueryGroups <= 0 || c.Heads%c.QueryGroups != 0 || c.HeadDim <= 0 || c.Hidden <= 0 || c.FFN <= 0 || c.Layers <= 0 {
		return fmt.Errorf("%s: incomplete geometry (hidden %d, ffn %d, layers %d, heads %d, query groups %d, head dim %d)",
			c.Family, c.Hidden, c.FFN, c.Layers, c.Heads, c.QueryGroups, c.HeadDim)
	}
	if c.RotaryPercent != 1 {
		return fmt.Errorf("rotary_percent %v: %s rotates whole heads (its Hugging Face model has no partial_rotary_factor)", c.RotaryPercent, f.HFArch)
	}
	if c.Activation != "swiglu" {
		return fmt.Errorf("activation %s: %s uses SwiGLU", c.Activation, f.HFArch)
	}
	if c.Norm != "RMSNorm" {
		return fmt.Errorf("normalization %s: %s uses RMSNorm", c.Norm, f.HFArch)
	}
	return f.Check(c)
}

// MegatronCheck refuses a config that a Megatron-LM GPTModel cannot
// compute (what a Hugging Face config asked for beyond it).
func (c *Config) MegatronCheck() error {
	if len(c.Unsupported) > 0 {
		return fmt.Errorf("the %s model uses %s, which Megatron-LM's GPTModel does not compute", c.Family, strings.Join(c.Unsupported, ", "))
	}
	return c.Check()
}

// MegatronArgs are the Megatron-LM arguments of the model (names as
// megatron/training/arguments.py stores them), for a checkpoint written
// without a Megatron source.
func (c *Config) MegatronArgs() map[string]any {
	a := map[string]any{
		"num_layers":                          c.Layers,
		"hidden_size":                         c.Hidden,
		"ffn_hidden_size":                     c.FFN,
		"num_attention_heads":                 c.Heads,
		"group_query_attention":               c.QueryGroups != c.Heads,
		"num_query_groups":                    c.QueryGroups,
		"kv_channels":                         c.HeadDim,
		"max_position_embeddings":             c.MaxPositions,
		"normalization":                       "RMSNorm",
		"norm_epsilon":                        c.NormEps,
		"apply_layernorm_1p":                  c.LayerNorm1p,
		"swiglu":                              true,
		"position_embedding_type":             "rope",
		"rotary_base":                         c.RopeTheta,
		"rotary_percent":                      c.RotaryPercent,
		"rotary_interleaved":                  c.RotaryInterleaved,
		"use_rope_scaling":                    false,
		"untie_embeddings_and_output_weights": !c.Tied,
		"add_bias_linear":                     c.OutBias,
		"add_qkv_bias":                        c.QKVBias,
		"qk_layernorm":                        c.QKNorm,
		"vocab_size":                          c.Vocab,
	}
	if s := c.RopeScaling; s != nil {
		switch s.Type {
		case "llama3":
			a["use_rope_scaling"] = true
			a["rope_scaling_factor"] = s.Factor
		case "linear":
			a["rotary_seq_len_interpolation_factor"] = s.Factor
		}
	}
	if c.VocabDivisor > 0 {
		a["make_vocab_size_divisible_by"] = c.VocabDivisor
	}
	c.moeMegatronArgs(a)
	return a
}

// hfCommon writes the config.json fields every family here shares, as
// the transformers configuration classes name them.
func hfCommon(f *Family, c *Config) map[string]any {
	m := map[string]any{
		"architectures":           []string{f.HFArch},
		"model_type":              f.HFModelType,
		"hidden_size":             c.Hidden,
		"intermediate_size":       c.FFN,
		"num_hidden_layers":       c.Layers,
		"num_attention_heads":     c.Heads,
		"num_key_value_heads":     c.QueryGroups,
		"head_dim":                c.HeadDim,
		"vocab_size":              c.Vocab,
		"rms_norm_eps":            c.NormEps,
		"rope_theta":              c.RopeTheta,
		"max_position_embeddings": c.MaxPositions,
		"tie_word_embeddings":     c.Tied,
		"hidden_act":              "silu",
		"rope_scaling":            nil,
	}
	if s := c.RopeScaling; s != nil {
		rs := map[string]any{"rope_type": s.Type, "factor": s.Factor}
		switch s.Type {
		case "llama3":
			rs["low_freq_factor"] = s.LowFreq
			rs["high_freq_factor"] = s.HighFreq
			rs["original_max_position_embeddings"] = s.OriginalMaxPE
		case "yarn":
			rs["original_max_position_embeddings"] = s.OriginalMaxPE
			rs["beta_fast"] = s.BetaFast
			rs["beta_slow"] = s.BetaSlow
			rs["mscale"] = s.MScale
			rs["mscale_all_dim"] = s.MScaleAllDim
		}
		m["rope_scaling"] = rs
	}
	return m
}

// hfRead fills c from the config.json fields every family shares.
func hfRead(m map[string]any, c *Config) error {
	a := Args(m)
	var ok bool
	need := func(dst *int64, k string) error {
		if *dst, ok = a.int(k); !ok || *dst <= 0 {
			return fmt.Errorf("config.json has no %s", k)
		}
		return nil
	}
	for _, x := range []struct {
		dst *int64
		k   string
	}{{&c.Hidden, "hidden_size"}, {&c.FFN, "intermediate_size"}, {&c.Layers, "num_hidden_layers"},
		{&c.Heads, "num_attention_heads"}, {&c.Vocab, "vocab_size"}} {
		if err := need(x.dst, x.k); err != nil {
			return err
		}
	}
	if c.QueryGroups, ok = a.int("num_key_value_heads"); !ok || c.QueryGroups <= 0 {
		c.QueryGroups = c.Heads
	}
	if c.HeadDim, ok = a.int("head_dim"); !ok || c.HeadDim <= 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.MaxPositions, ok = a.int("max_position_embeddings"); !ok {
		return fmt.Errorf("config.json has no max_position_embeddings")
	}
	if c.NormEps, ok = a.float("rms_norm_eps"); !ok {
		return fmt.Errorf("config.json has no rms_norm_eps")
	}
	if c.RopeTheta, ok = a.float("rope_theta"); !ok {
		c.RopeTheta = 10000
	}
	c.Tied = true // PretrainedConfig's default
	if v, ok := m["tie_word_embeddings"]; ok {
		switch b := v.(type) {
		case bool:
			c.Tied = b
		default:
			return fmt.Errorf("config.json: tie_word_embeddings is %v", v)
		}
	}
	act, _ := a.str("hidden_act")
	if act != "silu" && act != "swish" {
		return fmt.Errorf("config.json: hidden_act %q: Megatron's SwiGLU is SiLU-gated", act)
	}
	if v, ok := m["partial_rotary_factor"]; ok && v != nil && v != 1.0 {
		c.Unsupported = append(c.Unsupported, fmt.Sprintf("partial_rotary_factor %v", v))
	}
	rs, err := hfScaling(m)
	if err != nil {
		return err
	}
	if rs != nil {
		t, _ := Args(rs).str("rope_type")
		if t == "" {
			t, _ = Args(rs).str("type")
		}
		f, _ := Args(rs).float("factor")
		s := &RopeScaling{Type: t, Factor: f}
		switch t {
		case "llama3":
			s.LowFreq, _ = Args(rs).float("low_freq_factor")
			s.HighFreq, _ = Args(rs).float("high_freq_factor")
			s.OriginalMaxPE, _ = Args(rs).int("original_max_position_embeddings")
			if s.LowFreq != megatronLowFreq || s.HighFreq != megatronHighFreq || s.OriginalMaxPE != megatronOrigMax {
				c.Unsupported = append(c.Unsupported, fmt.Sprintf("llama3 rope_scaling with low_freq_factor %v, high_freq_factor %v, original_max_position_embeddings %d (Megatron fixes 1, 4, 8192)",
					s.LowFreq, s.HighFreq, s.OriginalMaxPE))
			}
		case "linear":
		case "yarn":
			if c.Family == "deepseek_v3" {
				yarnFromHF(Args(rs), c, s)
			} else {
				c.Unsupported = append(c.Unsupported, `rope_scaling type "yarn"`)
			}
		case "default":
			s = nil
		default:
			c.Unsupported = append(c.Unsupported, fmt.Sprintf("rope_scaling type %q", t))
		}
		c.RopeScaling = s
	}
	return nil
}

// FromHF reads a config.json (decoded) into the family's config.
func FromHF(m map[string]any) (*Config, error) {
	if err := Args(m).checkTypes("config.json"); err != nil {
		return nil, err
	}
	mt, _ := Args(m).str("model_type")
	f, err := ByHFModelType(mt)
	if err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c := &Config{Family: f.Name, Norm: "RMSNorm", Activation: "swiglu", RotaryPercent: 1}
	if err := hfRead(m, c); err != nil {
		return nil, err
	}
	if err := f.FromHF(m, c); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	sort.Strings(c.Unsupported)
	return c, nil
}

// ToHF returns the config.json fields of c's family.
func (c *Config) ToHF() (map[string]any, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	f, _ := Get(c.Family)
	return f.ToHF(c)
}
