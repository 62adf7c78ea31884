package megatron

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func fixtureCopy(t *testing.T, c string) (root, iter string) {
	root = testkit.CopyTree(t, testkit.Fixture("megatron", c, "checkpoint"))
	return root, filepath.Join(root, "iter_0000010")
}

// rewrite re-saves a torch file after edit changed its decoded root;
// tensors become blobs holding their bytes.
func rewrite(t *testing.T, path string, edit func(root pyobj.Value) pyobj.Value) {
	t.Helper()
	testkit.Resave(t, path, edit)
}

func wantError(t *testing.T, dir string, o Options, parts ...string) {
	t.Helper()
	_, err := Index(context.Background(), dir, o)
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}

func modelDict(t *testing.T, root pyobj.Value) *pyobj.Dict {
	t.Helper()
	d := root.(*pyobj.Dict)
	m, _ := d.Get("model")
	return m.(*pyobj.Dict)
}

func argsOf(root pyobj.Value) *pyobj.Dict {
	a, _ := root.(*pyobj.Dict).Get("args")
	return a.(*pyobj.Object).State.(*pyobj.Dict)
}

func TestMissingFiles(t *testing.T) {
	t.Run("rank folder", func(t *testing.T) {
		root, iter := fixtureCopy(t, "tp2_dp2_distopt")
		if err := os.RemoveAll(filepath.Join(iter, "mp_rank_01")); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, iter, "missing folder mp_rank_01", "tensor parallel 2")
	})
	t.Run("pipeline folder", func(t *testing.T) {
		root, iter := fixtureCopy(t, "tp1_pp4_untied")
		if err := os.RemoveAll(filepath.Join(iter, "mp_rank_00_002")); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, "missing folder mp_rank_00_002")
	})
	t.Run("distrib_optim.pt", func(t *testing.T) {
		root, iter := fixtureCopy(t, "tp2_dp2_distopt")
		p := filepath.Join(iter, "mp_rank_01", "distrib_optim.pt")
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, p, "missing distrib_optim.pt")
	})
	t.Run("model_optim_rng.pt", func(t *testing.T) {
		root, iter := fixtureCopy(t, "tp1_pp2")
		if err := os.Remove(filepath.Join(iter, "mp_rank_00_001", "model_optim_rng.pt")); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, filepath.Join(iter, "mp_rank_00_001"), "no model_optim_rng.pt")
	})
	t.Run("truncated", func(t *testing.T) {
		root, iter := fixtureCopy(t, "tp1_pp2")
		p := filepath.Join(iter, "mp_rank_00_001", "model_optim_rng.pt")
		if err := os.Truncate(p, 1000); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, p)
	})
	t.Run("optimizer", func(t *testing.T) {
		wantRankError(t, "mp_rank_01", func(r pyobj.Value) { r.(*pyobj.Dict).Delete("optimizer") }, "no optimizer state")
	})
}

// wantRankError edits the model_optim_rng.pt of rank (its folder) in a
// copy of novocab_tp2 and wants Index to refuse the checkpoint, naming
// the file and saying want.
func wantRankError(t *testing.T, rank string, edit func(r pyobj.Value), want string) {
	t.Helper()
	root, iter := fixtureCopy(t, "novocab_tp2")
	p := filepath.Join(iter, rank, "model_optim_rng.pt")
	rewrite(t, p, func(r pyobj.Value) pyobj.Value {
		edit(r)
		return r
	})
	wantError(t, root, Options{}, p, want)
}

func TestTracker(t *testing.T) {
	root, iter := fixtureCopy(t, "tp1_pp1")
	tracker := filepath.Join(root, "latest_checkpointed_iteration.txt")
	for _, c := range []struct{ content, want string }{
		{"ten", "neither an iteration number nor 'release'"},
		{"20\n", "names iteration 20"},
		{"release", "names iteration release"},
	} {
		if err := os.WriteFile(tracker, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		wantError(t, root, Options{}, tracker, c.want)
		if Detect(root) {
			t.Errorf("tracker %q: Detect is true", c.content)
		}
	}
	// The iteration folder itself, or a tag, still work.
	for _, c := range []struct {
		path string
		o    Options
	}{{iter, Options{}}, {root, Options{Tag: "10"}}, {root, Options{Tag: "iter_0000010"}}} {
		tbl, err := Index(context.Background(), c.path, c.o)
		if err != nil {
			t.Fatalf("%s %+v: %v", c.path, c.o, err)
		}
		if tbl.Tag != "iter_0000010" || len(tbl.Params) != 28 {
			t.Errorf("%s %+v: tag %q, %d params", c.path, c.o, tbl.Tag, len(tbl.Params))
		}
	}
	wantError(t, root, Options{Tag: "11"}, "iteration \"11\"")
}

func TestNotMegatron(t *testing.T) {
	ds := testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")
	if Detect(ds) {
		t.Error("a Megatron-DeepSpeed checkpoint is detected as Megatron-LM")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "latest_checkpointed_iteration.txt"), []byte("5"), 0o644); err != nil {
		t.Fatal(err)
	}
	iter := filepath.Join(dir, "iter_0000005")
	if err := os.MkdirAll(iter, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(iter, "metadata.json"), []byte(`{"sharded_backend": "torch_dist"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if Detect(dir) {
		t.Error("a torch_dist checkpoint is detected")
	}
	wantError(t, dir, Options{}, iter, "torch_dist")
}

func TestMissingArgs(t *testing.T) {
	for _, c := range []struct{ attr, want string }{
		{"swiglu", `args has no attribute "swiglu"`},
		{"num_layers", `args has no attribute "num_layers"`},
		{"padded_vocab_size", `args has no attribute "padded_vocab_size"`},
		{"tensor_model_parallel_size", `args has no attribute "tensor_model_parallel_size"`},
	} {
		t.Run(c.attr, func(t *testing.T) {
			wantRankError(t, "mp_rank_00", func(r pyobj.Value) { argsOf(r).Delete(c.attr) }, c.want)
		})
	}
	t.Run("args", func(t *testing.T) {
		wantRankError(t, "mp_rank_00", func(r pyobj.Value) { r.(*pyobj.Dict).Delete("args") }, "no 'args'")
	})
}

// TestInconsistentShapes: one TP rank's shard of a row-parallel weight
// (and its optimizer state) has another width.
func TestInconsistentShapes(t *testing.T) {
	root, iter := fixtureCopy(t, "novocab_tp2")
	p := filepath.Join(iter, "mp_rank_01", "model_optim_rng.pt")
	half := func(v pyobj.Value) pyobj.Value {
		b := v.(*torchfile.Blob)
		return torchfile.NewBlob(b.DType, []int64{b.Shape[0], b.Shape[1] / 2}, b.Data[:len(b.Data)/2])
	}
	rewrite(t, p, func(r pyobj.Value) pyobj.Value {
		m := modelDict(t, r)
		k := "decoder.layers.1.mlp.linear_fc2.weight"
		v, _ := m.Get(k)
		m.Set(k, half(v))
		// Its optimizer state: id 9 of param group 0 (the 10th 2-D weight).
		sub, _ := r.(*pyobj.Dict).Get("optimizer")
		inner, _ := sub.(*pyobj.Dict).Get("optimizer")
		st, _ := inner.(*pyobj.Dict).Get("state")
		s9, _ := st.(*pyobj.Dict).Get(int64(9))
		for _, name := range []string{"exp_avg", "exp_avg_sq"} {
			v, _ := s9.(*pyobj.Dict).Get(name)
			s9.(*pyobj.Dict).Set(name, half(v))
		}
		mains, _ := sub.(*pyobj.Dict).Get("fp32_from_fp16_params")
		g0 := mains.(*pyobj.List).Items[0].(*pyobj.List)
		g0.Items[9] = half(g0.Items[9])
		return r
	})
	wantError(t, root, Options{}, p, "decoder.layers.1.mlp.linear_fc2.weight", "equal shapes")
}

// TestUnknownLayout: a TP-split parameter whose name says nothing of its
// split must not be guessed.
func TestUnknownLayout(t *testing.T) {
	root, iter := fixtureCopy(t, "novocab_tp2")
	for _, d := range []string{"mp_rank_00", "mp_rank_01"} {
		rewrite(t, filepath.Join(iter, d, "model_optim_rng.pt"), func(r pyobj.Value) pyobj.Value {
			m := modelDict(t, r)
			out := pyobj.NewDict(m.Kind)
			for i := 0; i < m.Len(); i++ {
				k, v := m.Item(i)
				out.Set(strings.Replace(k.(string), "mlp.linear_fc2.weight", "mlp.mystery.weight", 1), v)
			}
			r.(*pyobj.Dict).Set("model", out)
			return r
		})
	}
	wantError(t, root, Options{}, "decoder.layers.0.mlp.mystery.weight", "unknown tensor-parallel layout")
}

func TestDistribLayoutMismatch(t *testing.T) {
	root, iter := fixtureCopy(t, "tp2_dp2_distopt")
	// Another bucket size moves the unaligned bucket ends.
	p := filepath.Join(iter, "mp_rank_00", "model_optim_rng.pt")
	rewrite(t, p, func(r pyobj.Value) pyobj.Value {
		argsOf(r).Set("ddp_bucket_size", int64(1000))
		return r
	})
	wantError(t, root, Options{}, filepath.Join(iter, "mp_rank_00", "distrib_optim.pt"), "numel_unpadded is", "no known bucket layout")
}

func TestVocabularySize(t *testing.T) {
	dir := testkit.Fixture("megatron", "novocab_tp2", "checkpoint")
	emb := "embedding.word_embeddings.weight"
	tbl := index(t, dir, Options{})
	if p := tbl.Param(emb); p.Shape[0] != 256 || p.Info.VocabSize != 0 {
		t.Errorf("without a vocabulary size: shape %v, info %+v", p.Shape, p.Info)
	}
	if len(tbl.Notes) != 1 || !strings.Contains(tbl.Notes[0], "vocabulary padding kept") {
		t.Errorf("notes %q", tbl.Notes)
	}
	tbl = index(t, dir, Options{VocabSize: 100})
	if p := tbl.Param(emb); p.Shape[0] != 100 || p.Info.VocabSize != 100 || p.Info.PaddedVocab != 256 {
		t.Errorf("with --vocab-size 100: shape %v, info %+v", p.Shape, p.Info)
	}
	if len(tbl.Notes) != 1 || !strings.Contains(tbl.Notes[0], "from --vocab-size") {
		t.Errorf("notes %q", tbl.Notes)
	}
	wantError(t, dir, Options{VocabSize: 300}, "exceeds the 256 padded rows")
	wantError(t, testkit.Fixture("megatron", "tp1_pp1", "checkpoint"), Options{VocabSize: 99}, "contradicts args.vocab_size 100")
}

// TestNoMainParams: without fp32_from_fp16_params the fp32 state comes
// from the 16-bit weights, with a note.
func TestNoMainParams(t *testing.T) {
	root, iter := fixtureCopy(t, "tp1_pp2")
	for _, d := range []string{"mp_rank_00_000", "mp_rank_00_001"} {
		rewrite(t, filepath.Join(iter, d, "model_optim_rng.pt"), func(r pyobj.Value) pyobj.Value {
			o, _ := r.(*pyobj.Dict).Get("optimizer")
			o.(*pyobj.Dict).Delete("fp32_from_fp16_params")
			return r
		})
	}
	tbl := index(t, root, Options{})
	if len(tbl.Notes) != 2 || !strings.Contains(tbl.Notes[0]+tbl.Notes[1], "fp32 comes from the 16-bit model weights") {
		t.Errorf("notes %q", tbl.Notes)
	}
	for _, p := range tbl.Params {
		for _, f := range p.State("fp32").Frags {
			if f.Src.DType() != dtype.BFloat16 || filepath.Base(f.Src.Path) != modelFile {
				t.Fatalf("%s: fp32 from %s %v", p.Name, f.Src.Path, f.Src.DType())
			}
		}
	}
}
