package family

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func moeArgs(kv ...any) Args {
	return with(with(llamaArgs(), "num_experts", int64(4), "moe_router_topk", int64(2), "moe_ffn_hidden_size", int64(6)), kv...)
}

func TestMoEFromArgs(t *testing.T) {
	cases := []struct {
		name   string
		args   Args
		family string
		err    string
		want   Config // the MoE fields
	}{
		{"mixtral", moeArgs(), "mixtral", "", Config{Experts: 4, TopK: 2, MoEFFN: 6, NormTopK: true}},
		{"mixtral default top-k and expert ffn", moeArgs("moe_router_topk", nil, "moe_ffn_hidden_size", nil), "mixtral", "", Config{Experts: 4, TopK: 2, MoEFFN: 12, NormTopK: true}},
		{"qwen3_moe", moeArgs("qk_layernorm", true, "moe_router_pre_softmax", true), "qwen3_moe", "", Config{Experts: 4, TopK: 2, MoEFFN: 6}},
		{"qwen2_moe", moeArgs("add_qkv_bias", true, "moe_shared_expert_intermediate_size", int64(10), "moe_shared_expert_gate", true),
			"qwen2_moe", "", Config{Experts: 4, TopK: 2, MoEFFN: 6, SharedFFN: 10, SharedGate: true, NormTopK: true}},
		{"mixtral pre-softmax", moeArgs("moe_router_pre_softmax", true), "", "moe_router_pre_softmax", Config{}},
		{"ungated shared expert", moeArgs("add_qkv_bias", true, "moe_shared_expert_intermediate_size", int64(10)), "", "moe_shared_expert_gate false", Config{}},
		{"capacity", moeArgs("moe_expert_capacity_factor", 1.0), "", "moe_expert_capacity_factor", Config{}},
		{"expert bias", moeArgs("moe_router_enable_expert_bias", true), "", "moe_router_enable_expert_bias", Config{}},
		{"sigmoid", moeArgs("moe_router_score_function", "sigmoid"), "", "moe_router_score_function is sigmoid", Config{}},
		{"sinkhorn", moeArgs("moe_router_load_balancing_type", "sinkhorn"), "", "sinkhorn", Config{}},
		{"sinkhorn in core 0.19's list", moeArgs("moe_router_load_balancing_type", []any{"sinkhorn"}), "", "[sinkhorn]", Config{}},
		{"aux loss list", moeArgs("moe_router_load_balancing_type", []any{"aux_loss"}), "mixtral", "", Config{Experts: 4, TopK: 2, MoEFFN: 6, NormTopK: true}},
		{"load balancing not strings", moeArgs("moe_router_load_balancing_type", []any{int64(1)}), "", "moe_router_load_balancing_type holds 1", Config{}},
		{"layer freq", moeArgs("moe_layer_freq", []any{int64(0), int64(1)}), "", "moe_layer_freq", Config{}},
		{"scaling", moeArgs("moe_router_topk_scaling_factor", 2.5), "", "moe_router_topk_scaling_factor", Config{}},
		{"groups", moeArgs("moe_router_num_groups", int64(2)), "", "moe_router_num_groups", Config{}},
		{"top-k above experts", moeArgs("moe_router_topk", int64(5)), "", "top-5", Config{}},
		{"expert biases", moeArgs("add_bias_linear", true), "", "linear biases", Config{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fromArgsCase(t, tc.args, tc.err)
			if c == nil {
				return
			}
			got := Config{Experts: c.Experts, TopK: c.TopK, MoEFFN: c.MoEFFN, SharedFFN: c.SharedFFN, SharedGate: c.SharedGate, NormTopK: c.NormTopK}
			if c.Family != tc.family || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("%s %+v, want %s %+v", c.Family, got, tc.family, tc.want)
			}
			back, err := FromArgs(Args(c.MegatronArgs()))
			if err != nil {
				t.Fatalf("MegatronArgs read back: %v", err)
			}
			if back.Family != c.Family || back.Experts != c.Experts || back.TopK != c.TopK || back.MoEFFN != c.MoEFFN || back.NormTopK != c.NormTopK || back.SharedFFN != c.SharedFFN {
				t.Fatalf("MegatronArgs read back as %+v", back)
			}
		})
	}
}

// moeParams are the atomic names a megatron-core Mixtral-shaped model has
// (local spec: SequentialMLP; te: TEGroupedMLP), experts at their global
// numbers.
func moeParams(c *Config, te bool, skip string) []Param {
	ps := []Param{{"embedding.word_embeddings.weight", []int64{10, 8}}}
	for l := 0; l < int(c.Layers); l++ {
		L := fmt.Sprintf("decoder.layers.%d.", l)
		ps = append(ps, Param{L + "input_layernorm.weight", []int64{8}},
			Param{L + "self_attention.linear_qkv.weight", []int64{16, 8}},
			Param{L + "self_attention.linear_proj.weight", []int64{8, 8}},
			Param{L + "pre_mlp_layernorm.weight", []int64{8}},
			Param{L + "mlp.router.weight", []int64{c.Experts, 8}})
		for e := 0; e < int(c.Experts); e++ {
			fc1 := fmt.Sprintf("%smlp.experts.local_experts.%d.linear_fc1.weight", L, e)
			fc2 := fmt.Sprintf("%smlp.experts.local_experts.%d.linear_fc2.weight", L, e)
			if te {
				fc1, fc2 = fmt.Sprintf("%smlp.experts.linear_fc1.weight%d", L, e), fmt.Sprintf("%smlp.experts.linear_fc2.weight%d", L, e)
			}
			if fc1 != skip {
				ps = append(ps, Param{fc1, []int64{2 * c.MoEFFN, 8}})
			}
			ps = append(ps, Param{fc2, []int64{8, c.MoEFFN}})
		}
	}
	return append(ps, Param{"decoder.final_layernorm.weight", []int64{8}}, Param{"output_layer.weight", []int64{10, 8}})
}

func TestMoEResolveUnfused(t *testing.T) {
	c, err := FromArgs(moeArgs("num_experts", int64(3)))
	if err != nil {
		t.Fatal(err)
	}
	c.Vocab = 10
	for _, te := range []bool{false, true} {
		src, err := Resolve(c, moeParams(c, te, ""), "megatron")
		if err != nil {
			t.Fatal(err)
		}
		ts, err := src.Unfused(HF)
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]Tensor{}
		var order []string
		for _, x := range ts {
			byName[x.Name] = x
			order = append(order, x.Name)
		}
		// 1 + 2 x (q, k, v, o, gate, 3 x (w1, w2, w3), 2 norms) + 2
		if len(ts) != 1+2*(5+9+2)+2 {
			t.Fatalf("%d tensors: %v", len(ts), order)
		}
		fc1 := "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"
		if te {
			fc1 = "decoder.layers.1.mlp.experts.linear_fc1.weight2"
		}
		w1, w3 := byName["model.layers.1.block_sparse_moe.experts.2.w1.weight"], byName["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
		if fmt.Sprint(w1.Pieces) != fmt.Sprintf("[{%s 0 48}]", fc1) || fmt.Sprint(w3.Pieces) != fmt.Sprintf("[{%s 48 48}]", fc1) || fmt.Sprint(w1.Shape) != "[6 8]" {
			t.Errorf("te %v: w1 %+v, w3 %+v", te, w1, w3)
		}
		if _, ok := byName["model.layers.0.block_sparse_moe.gate.weight"]; !ok {
			t.Errorf("no router: %v", order)
		}
		// Experts in global order within the layer, after the router.
		i := 0
		for i < len(order) && order[i] != "model.layers.0.block_sparse_moe.gate.weight" {
			i++
		}
		want := []string{"model.layers.0.block_sparse_moe.experts.0.w1.weight", "model.layers.0.block_sparse_moe.experts.0.w3.weight",
			"model.layers.0.block_sparse_moe.experts.0.w2.weight", "model.layers.0.block_sparse_moe.experts.1.w1.weight"}
		if i+5 > len(order) || strings.Join(order[i+1:i+5], " ") != strings.Join(want, " ") {
			t.Errorf("order after the router: %v", order[i+1:])
		}
	}
	// A missing expert is named; an expert beyond the config's is refused.
	if _, err := Resolve(c, moeParams(c, false, "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"), "megatron"); err == nil ||
		!strings.Contains(err.Error(), "expert_gate of layer 1 expert 2") {
		t.Errorf("missing expert: %v", err)
	}
	more := *c
	more.Experts = 4
	extra := moeParams(&more, false, "")
	if _, err := Resolve(c, extra, "megatron"); err == nil || !strings.Contains(err.Error(), "is expert 3 of layer") {
		t.Errorf("extra expert: %v", err)
	}
}
