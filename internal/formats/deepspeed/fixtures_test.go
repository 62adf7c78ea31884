package deepspeed

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func TestFixtures(t *testing.T) {
	testkit.ConvertCases(t, "deepspeed", 10, func(t *testing.T, dir string) *fragment.Table {
		tbl, err := Index(context.Background(), dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}, nil)
}

// TestMegatronPatterns checks the patterns the Megatron-DeepSpeed TP case
// is classified into, from its universal_checkpoint_info.
func TestMegatronPatterns(t *testing.T) {
	dir := testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")
	tbl, err := Index(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fragment.Kind{
		"language_model.embedding.word_embeddings.weight":                       fragment.ShardV,
		"language_model.embedding.position_embeddings.weight":                   fragment.Replicate,
		"language_model.encoder.layers.0.self_attention.query_key_value.weight": fragment.ShardNC,
		"language_model.encoder.layers.0.self_attention.dense.weight":           fragment.ShardH,
		"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight":              fragment.ShardNC,
		"language_model.encoder.layers.0.input_layernorm.weight":                fragment.Replicate,
	}
	for name, k := range want {
		p := tbl.Param(name)
		if p == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if got, _ := fragment.Classify(p); got != k {
			t.Errorf("%s: %v, want %v", name, got, k)
		}
	}
	if tbl.Degrees.TP != 2 || tbl.Degrees.DP != 2 {
		t.Errorf("degrees %+v", tbl.Degrees)
	}
	emb := tbl.Param("language_model.embedding.word_embeddings.weight")
	if emb.Info.VocabSize != 43 || emb.Shape[0] != 43 || fragment.PaddingElems(emb.States[0]) == 0 {
		t.Errorf("vocabulary: %+v shape %v", emb.Info, emb.Shape)
	}
}

func TestMissingTensorParallelRank(t *testing.T) {
	d := testkit.CopyTree(t, testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"))
	tag, _ := os.ReadFile(filepath.Join(d, "latest"))
	if err := os.Remove(filepath.Join(d, strings.TrimSpace(string(tag)), "mp_rank_01_model_states.pt")); err != nil {
		t.Fatal(err)
	}
	_, err := Index(context.Background(), d, Options{})
	if err == nil || !strings.Contains(err.Error(), "missing rank file mp_rank_01_model_states.pt") {
		t.Fatalf("error %v", err)
	}
}

// TestModelStatesGainUniversalInfo: a checkpoint saved without
// universal_checkpoint_info converts without any flag, and its model states
// are written again with the info added and every tensor unchanged.
func TestModelStatesGainUniversalInfo(t *testing.T) {
	ckpt := testkit.Fixture("deepspeed", "hf_z2_bf16_nouci_dp2", "checkpoint")
	tbl, err := Index(context.Background(), ckpt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := testkit.Convert(t, tbl, 2)
	tag, _ := os.ReadFile(filepath.Join(ckpt, "latest"))
	src, err := torchfile.Open(filepath.Join(ckpt, strings.TrimSpace(string(tag)), "mp_rank_00_model_states.pt"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := torchfile.Open(filepath.Join(dst, "mp_rank_00_model_states.pt"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	uci, err := pyobj.Path(out.Root, "universal_checkpoint_info", "universal_checkpoint_version")
	if err != nil || uci != 0.2 {
		t.Fatalf("universal_checkpoint_info: %v %v", uci, err)
	}
	srcMod, _ := pyobj.Path(src.Root, "module")
	outMod, _ := pyobj.Path(out.Root, "module")
	sd, od := srcMod.(*pyobj.Dict), outMod.(*pyobj.Dict)
	if sd.Len() == 0 || sd.Len() != od.Len() {
		t.Fatalf("module has %d tensors, the source %d", od.Len(), sd.Len())
	}
	for i := 0; i < sd.Len(); i++ {
		k, sv := sd.Item(i)
		ov, _ := od.Get(k)
		a, err1 := src.ReadTensor(sv.(*torchfile.Tensor))
		b, err2 := out.ReadTensor(ov.(*torchfile.Tensor))
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Errorf("module[%v] differs from the source (%v %v)", k, err1, err2)
		}
	}
	// Real torch reads the rewritten file (its pickle holds DeepSpeed-free
	// values only: dicts, sets, tensors).
	py := testkit.Python(t)
	script := `import sys, torch
d = torch.load(sys.argv[1], map_location="cpu")
s = torch.load(sys.argv[2], map_location="cpu")
assert d["universal_checkpoint_info"] == {"universal_checkpoint_version": 0.2}, d["universal_checkpoint_info"]
assert list(d["module"].keys()) == list(s["module"].keys())
for k in s["module"]:
    assert torch.equal(d["module"][k], s["module"][k]), k
print("ok")`
	res, err := exec.Command(py, "-c", script, filepath.Join(dst, "mp_rank_00_model_states.pt"),
		filepath.Join(ckpt, strings.TrimSpace(string(tag)), "mp_rank_00_model_states.pt")).CombinedOutput()
	if err != nil {
		t.Fatalf("torch: %v\n%s", err, res)
	}
}
