package family

import (
	"fmt"
	"math"
	"sort"
)

// The arguments and config.json fields the families read, by the type they
// must have. Args.int, float and str treat an absent field as absent;
// checkTypes runs first so that a field of the wrong type (a string "32",
// a fractional layer count) is an error naming it, never read as absent.
var (
	intFields = []string{"decoder_sparse_step", "first_k_dense_replace", "kv_lora_rank", "moe_router_group_topk",
		"moe_router_num_groups", "n_group", "n_routed_experts", "n_shared_experts", "num_nextn_predict_layers",
		"original_max_position_embeddings", "q_lora_rank", "qk_head_dim", "qk_nope_head_dim", "qk_pos_emb_head_dim",
		"qk_rope_head_dim", "topk_group", "v_head_dim", "ffn_hidden_size", "head_dim", "hidden_size", "intermediate_size",
		"kv_channels", "make_vocab_size_divisible_by", "max_position_embeddings", "moe_ffn_hidden_size",
		"moe_intermediate_size", "moe_router_topk", "moe_shared_expert_intermediate_size", "num_attention_heads",
		"num_experts", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads", "num_layers",
		"num_local_experts", "num_query_groups", "seq_length", "shared_expert_intermediate_size", "vocab_size"}
	floatFields = []string{"beta_fast", "beta_slow", "moe_router_topk_scaling_factor", "mscale", "mscale_all_dim",
		"routed_scaling_factor", "rotary_scaling_factor", "layernorm_epsilon", "norm_epsilon", "rms_norm_eps", "rope_scaling_factor", "rope_theta",
		"rotary_base", "rotary_percent", "rotary_seq_len_interpolation_factor"}
	strFields = []string{"hidden_act", "model_type", "moe_router_score_function", "normalization",
		"position_embedding_type"}
	// strListFields may be a string or a list of strings (core 0.19 saves
	// moe_router_load_balancing_type as a list).
	strListFields = []string{"moe_router_load_balancing_type"}
)

// checkTypes refuses a known field whose value has the wrong type; where
// names the source (training arguments or config.json).
func (a Args) checkTypes(where string) error {
	var bad []string
	for _, k := range intFields {
		switch v := a[k].(type) {
		case nil, int64, int:
		case float64:
			if v != math.Trunc(v) {
				bad = append(bad, fmt.Sprintf("%s is %v, not an integer", k, v))
			}
		default:
			bad = append(bad, fmt.Sprintf("%s is %v (%T), not an integer", k, v, v))
		}
	}
	for _, k := range floatFields {
		switch v := a[k].(type) {
		case nil, int64, int, float64:
		default:
			bad = append(bad, fmt.Sprintf("%s is %v (%T), not a number", k, v, v))
		}
	}
	for _, k := range strFields {
		switch v := a[k].(type) {
		case nil, string:
		default:
			bad = append(bad, fmt.Sprintf("%s is %v (%T), not a string", k, v, v))
		}
	}
	for _, k := range strListFields {
		if _, err := a.strs(k); err != nil {
			bad = append(bad, err.Error())
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("%s: %s", where, bad[0])
	}
	return nil
}

// strs reads a field that is a string or a list of strings.
func (a Args) strs(name string) ([]string, error) {
	switch v := a[name].(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, len(v))
		for i, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("%s holds %v (%T), not a string", name, x, x)
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s is %v (%T), not a string or a list of strings", name, a[name], a[name])
}
