package megatron

import (
	"reflect"
	"testing"
)

func TestComputeLayout(t *testing.T) {
	for _, c := range []struct {
		name     string
		params   []layoutParam
		bucket   int64
		rules    layoutRules
		buckets  []int
		starts   []int64
		unpadded []int64
	}{
		{
			// A [4,8], B [10], C [3,8] in one bucket: laid out in reverse order, each
			// start aligned to 64 elements (NOTES.md, distributed optimizer).
			name:   "aligned",
			params: []layoutParam{{numel: 32}, {numel: 10}, {numel: 24}},
			rules:  rulesHead, buckets: []int{0, 0, 0}, starts: []int64{128, 64, 0}, unpadded: []int64{160},
		},
		{
			name:   "unaligned",
			params: []layoutParam{{numel: 32}, {numel: 10}, {numel: 24}},
			rules:  rules07, buckets: []int{0, 0, 0}, starts: []int64{34, 24, 0}, unpadded: []int64{66},
		},
		{
			// Buckets close once they reach the size; the next one starts
			// at 0 of its own (bucket ends are padded in the buffer only).
			name:   "bucketed",
			params: []layoutParam{{numel: 50}, {numel: 70}, {numel: 30}, {numel: 100}},
			bucket: 100, rules: rulesHead,
			buckets: []int{2, 1, 1, 0}, starts: []int64{0, 64, 0, 0}, unpadded: []int64{100, 134, 50},
		},
		{
			// A shared embedding (first in named order, last in the walk)
			// closes the running bucket at the aligned start and gets its own.
			name:   "shared embedding",
			params: []layoutParam{{numel: 1248, shared: true}, {numel: 12}, {numel: 100}},
			rules:  rulesHead, buckets: []int{1, 0, 0}, starts: []int64{0, 128, 0}, unpadded: []int64{192, 1248},
		},
		{
			// Core 0.5: a bucket never closes on size with a single param.
			name:   "core 0.5",
			params: []layoutParam{{numel: 5}, {numel: 10}, {numel: 300}},
			bucket: 100, rules: rules05, buckets: []int{1, 0, 0}, starts: []int64{0, 300, 0}, unpadded: []int64{310, 5},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := computeLayout(c.params, c.bucket, c.rules)
			if !reflect.DeepEqual(got.bucket, c.buckets) || !reflect.DeepEqual(got.start, c.starts) || !reflect.DeepEqual(got.unpadded, c.unpadded) {
				t.Errorf("buckets %v starts %v unpadded %v; want %v %v %v", got.bucket, got.start, got.unpadded, c.buckets, c.starts, c.unpadded)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		local        string
		layer, exper int
		want         string
		kind         kind
	}{
		{"decoder.layers.0.self_attention.linear_qkv.weight", 3, 0, "decoder.layers.3.self_attention.linear_qkv.weight", kindQKV},
		{"language_model.encoder.layers.1.mlp.dense_h_to_4h.weight", 2, 0, "language_model.encoder.layers.3.mlp.dense_h_to_4h.weight", kindSwiGLU},
		{"decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight", 0, 2, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight", kindRow},
		{"decoder.layers.0.mlp.experts.linear_fc1.weight1", 2, 4, "decoder.layers.2.mlp.experts.linear_fc1.weight5", kindSwiGLU},
		{"decoder.layers.1.mlp.experts.weight1", 2, 4, "decoder.layers.3.mlp.experts.weight1", kindGrouped1},
		{"decoder.layers.0.mlp.experts.weight2", 0, 2, "decoder.layers.0.mlp.experts.weight2", kindGrouped2},
		{"decoder.layers.0.self_attention.linear_proj.bias", 1, 0, "decoder.layers.1.self_attention.linear_proj.bias", kindRep},
		{"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", 1, 0, "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", kindRep},
		{"decoder.final_layernorm.weight", 5, 0, "decoder.final_layernorm.weight", kindRep},
		{"output_layer.weight", 5, 0, "output_layer.weight", kindVocab},
		{"embedding.position_embeddings.weight", 0, 0, "embedding.position_embeddings.weight", kindRep},
		{"decoder.layers.0.mlp.router.weight", 0, 0, "decoder.layers.0.mlp.router.weight", kindRep},
		{"mtp.layers.0.eh_proj.weight", 0, 0, "mtp.layers.0.eh_proj.weight", kindUnknown},
		{"decoder.layers.0.self_attention.linear_q_up_proj.weight", 1, 0, "decoder.layers.1.self_attention.linear_q_up_proj.weight", kindCol},
		{"decoder.layers.0.self_attention.linear_kv_up_proj.weight", 1, 0, "decoder.layers.1.self_attention.linear_kv_up_proj.weight", kindCol},
		{"decoder.layers.0.self_attention.linear_q_proj.weight", 1, 0, "decoder.layers.1.self_attention.linear_q_proj.weight", kindCol},
		{"decoder.layers.0.self_attention.kv_layernorm.weight", 1, 0, "decoder.layers.1.self_attention.kv_layernorm.weight", kindRep},
		{"decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight", 1, 0, "decoder.layers.1.self_attention.linear_kv_up_proj.layer_norm_weight", kindRep},
		// MLA's down projections: by spec (mlaDownKind).
		{"decoder.layers.0.self_attention.linear_kv_down_proj.weight", 1, 0, "decoder.layers.1.self_attention.linear_kv_down_proj.weight", kindUnknown},
	} {
		if got := globalName(c.local, c.layer, c.exper); got != c.want {
			t.Errorf("globalName(%s, %d, %d) = %s, want %s", c.local, c.layer, c.exper, got, c.want)
		}
		if k := splitKind(c.local, true); k != c.kind {
			t.Errorf("%s: %v, want %v", c.local, k, c.kind)
		}
	}
	for _, c := range []struct {
		name  string
		local bool
		want  kind
	}{
		{"decoder.layers.0.self_attention.linear_q_down_proj.weight", true, kindCol},
		{"decoder.layers.0.self_attention.linear_kv_down_proj.weight", true, kindCol},
		{"decoder.layers.0.self_attention.linear_kv_down_proj.weight", false, kindRep},
		{"decoder.layers.0.self_attention.linear_qkv.weight", true, kindUnknown},
	} {
		if k := mlaDownKind(c.name, c.local); k != c.want {
			t.Errorf("mlaDownKind(%s, local %v) = %v, want %v", c.name, c.local, k, c.want)
		}
	}
}
