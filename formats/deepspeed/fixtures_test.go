package deepspeed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/truth"
	"github.com/ucp-project/ucp/patterns"
)

func TestFixtures(t *testing.T) {
	torch := truth.NewTorchBatch(t)
	for _, c := range truth.Cases(t, "deepspeed", 10) {
		t.Run(c, func(t *testing.T) {
			dir := truth.Fixture("deepspeed", c)
			tbl, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			dst := truth.Convert(t, tbl, 2)
			truth.Check(t, dst, filepath.Join(dir, "truth.pt"))
			torch.Add(t, c, dst, filepath.Join(dir, "truth.pt"), "")
		})
	}
	torch.Run(t)
}

// TestMegatronPatterns checks the patterns the Megatron-DeepSpeed TP case
// is classified into, from its universal_checkpoint_info.
func TestMegatronPatterns(t *testing.T) {
	dir := truth.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")
	tbl, err := Index(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]patterns.Kind{
		"language_model.embedding.word_embeddings.weight":                       patterns.ShardV,
		"language_model.embedding.position_embeddings.weight":                   patterns.Replicate,
		"language_model.encoder.layers.0.self_attention.query_key_value.weight": patterns.ShardNC,
		"language_model.encoder.layers.0.self_attention.dense.weight":           patterns.ShardH,
		"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight":              patterns.ShardNC,
		"language_model.encoder.layers.0.input_layernorm.weight":                patterns.Replicate,
	}
	for name, k := range want {
		p := tbl.Param(name)
		if p == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if got, _ := patterns.Classify(p); got != k {
			t.Errorf("%s: %v, want %v", name, got, k)
		}
	}
	if tbl.Degrees.TP != 2 || tbl.Degrees.DP != 2 {
		t.Errorf("degrees %+v", tbl.Degrees)
	}
	emb := tbl.Param("language_model.embedding.word_embeddings.weight")
	if emb.Info.VocabSize != 43 || emb.Shape[0] != 43 || patterns.PaddingElems(emb.States[0]) == 0 {
		t.Errorf("vocabulary: %+v shape %v", emb.Info, emb.Shape)
	}
}

func TestMissingTensorParallelRank(t *testing.T) {
	d := copyTree(t, truth.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"))
	tag, _ := os.ReadFile(filepath.Join(d, "latest"))
	if err := os.Remove(filepath.Join(d, strings.TrimSpace(string(tag)), "mp_rank_01_model_states.pt")); err != nil {
		t.Fatal(err)
	}
	_, err := Index(context.Background(), d, Options{})
	if err == nil || !strings.Contains(err.Error(), "missing rank file mp_rank_01_model_states.pt") {
		t.Fatalf("error %v", err)
	}
}
