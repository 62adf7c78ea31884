package megatron

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
)

func indexDist(t *testing.T, dir string, o Options) *fragment.Table {
	t.Helper()
	return validated(t, IndexDist, dir, o)
}

// TestDistFixtures converts every torch_dist checkpoint written by real
// megatron-core and compares it bit for bit with the truth gathered from
// the live run, with ucp's reader and with real torch.
func TestDistFixtures(t *testing.T) {
	testkit.ConvertCases(t, "megatron_dist", 3, func(t *testing.T, dir string) *fragment.Table {
		if !DetectDist(dir) {
			t.Error("DetectDist is false")
		}
		if Detect(dir) {
			t.Error("the legacy Detect accepts a torch_dist folder")
		}
		return indexDist(t, dir, Options{VocabSize: 50})
	}, func(t *testing.T, tbl *fragment.Table, tp string) {
		tr, err := testkit.Load(tp)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		checkPatterns(t, tbl, tr)
		checkDistDegrees(t, tbl, tr)
	})
}

// distCase is a torch_dist fixture's checkpoint folder.
func distCase(c string) string { return testkit.Fixture("megatron_dist", c, "checkpoint") }

// The two optimizer formats of one training state (the generator runs the
// same seeded steps for both) give byte-identical atomic tensors.
func TestDistReshardableFormatsAgree(t *testing.T) {
	pairs := 0
	for _, c := range testkit.Cases(t, "megatron_dist", 3) {
		full, ok := strings.CutSuffix(c, "_dprs")
		if !ok {
			continue
		}
		full += "_fullrs"
		if _, err := os.Stat(distCase(full)); err != nil {
			continue
		}
		pairs++
		t.Run(c, func(t *testing.T) {
			o := Options{VocabSize: 50}
			a := testkit.ReadTree(t, filepath.Join(testkit.Convert(t, indexDist(t, distCase(c), o), 2), "zero"))
			b := testkit.ReadTree(t, filepath.Join(testkit.Convert(t, indexDist(t, distCase(full), o), 2), "zero"))
			n := 0
			for name, want := range b {
				if filepath.Base(name) == "optimizer_state.pt" {
					continue // param groups: the same values, pickled from different objects
				}
				n++
				if got, ok := a[name]; !ok {
					t.Errorf("%s: only in the fully_reshardable conversion", name)
				} else if !bytes.Equal(got, want) {
					t.Errorf("%s differs between dp_reshardable and fully_reshardable", name)
				}
			}
			if len(a) != len(b) || n == 0 {
				t.Errorf("dp_reshardable gives %d files, fully_reshardable %d", len(a), len(b))
			}
		})
	}
	if pairs < 2 {
		t.Fatalf("found %d dp_reshardable/fully_reshardable pairs, want at least 2", pairs)
	}
}

// rewriteMeta changes the decoded .metadata of a copied folder.
func rewriteMeta(t *testing.T, dir string, change func(md *dcp.Metadata)) {
	t.Helper()
	path := filepath.Join(dir, dcp.MetadataFile)
	md, err := dcp.ReadMetadata(path)
	if err != nil {
		t.Fatal(err)
	}
	change(md)
	b, err := md.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func entry(t *testing.T, md *dcp.Metadata, key string) *dcp.Entry {
	t.Helper()
	for _, e := range md.Entries {
		if e.Key == key {
			return e
		}
	}
	t.Fatalf("no key %q", key)
	return nil
}

// Broken torch_dist folders give errors naming the file and the key.
func TestDistBadInput(t *testing.T) {
	const c = "core0_19_tp2_pp2_tied_bf16_dprs"
	const qkv = "decoder.layers.self_attention.linear_qkv.weight"
	cases := []struct {
		name   string
		damage func(t *testing.T, iter string)
		want   []string
	}{
		{"missing distcp", func(t *testing.T, iter string) {
			if err := os.Remove(filepath.Join(iter, "__1_0.distcp")); err != nil {
				t.Fatal(err)
			}
		}, []string{"__1_0.distcp"}},
		{"hole", func(t *testing.T, iter string) {
			rewriteMeta(t, iter, func(md *dcp.Metadata) {
				e := entry(t, md, qkv)
				e.Chunks = e.Chunks[1:]
			})
		}, []string{"iter_0000002", qkv, "chunks cover"}},
		{"overlap", func(t *testing.T, iter string) {
			rewriteMeta(t, iter, func(md *dcp.Metadata) {
				e := entry(t, md, qkv)
				// Grow the first chunk's box into its neighbour's rows.
				e.Chunks[0].Sizes[1] += 2
				e.Chunks = e.Chunks[:len(e.Chunks)-1]
			})
		}, []string{"iter_0000002", qkv, "overlap"}},
		{"bucket layout", func(t *testing.T, iter string) {
			rewriteMeta(t, iter, func(md *dcp.Metadata) {
				var keep []*dcp.Entry
				for _, e := range md.Entries {
					if e.Key != "decoder.final_layernorm.bias" {
						keep = append(keep, e)
					}
				}
				md.Entries = keep
			})
		}, []string{"dp_group_idx_2", "per_bucket_numel_unpadded", ".distcp"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := testkit.CopyTree(t, distCase(c))
			tc.damage(t, filepath.Join(dir, "iter_0000002"))
			wantDistError(t, dir, tc.want...)
		})
	}
}

// Chunk metadata whose sizes lack the prepended layer axis that the
// offsets have (seen in the wild) reads as if the sizes had a leading 1.
func TestDistShortChunkSizes(t *testing.T) {
	const c = "core0_19_tp2_fp32_dprs"
	o := Options{VocabSize: 50}
	want := testkit.ReadTree(t, testkit.Convert(t, indexDist(t, distCase(c), o), 1))
	dir := testkit.CopyTree(t, distCase(c))
	n := 0
	rewriteMeta(t, filepath.Join(dir, "iter_0000002"), func(md *dcp.Metadata) {
		for _, e := range md.Entries {
			if _, stacked := stackedRest(e.Key); stacked {
				for i := range e.Chunks {
					e.Chunks[i].Sizes = e.Chunks[i].Sizes[1:]
					n++
				}
			}
		}
	})
	if n == 0 {
		t.Fatal("no stacked chunks")
	}
	got := testkit.ReadTree(t, testkit.Convert(t, indexDist(t, dir, o), 1))
	if len(got) != len(want) {
		t.Fatalf("%d files, want %d", len(got), len(want))
	}
	for name, w := range want {
		if !bytes.Equal(got[name], w) {
			t.Errorf("%s differs", name)
		}
	}
}

// checkDistDegrees compares TP (always known) and PP and DP (known from
// args or the bucketed optimizer state) with the run's.
func checkDistDegrees(t *testing.T, tbl *fragment.Table, tr *testkit.Truth) {
	t.Helper()
	dv, _ := tr.Root.Get("degrees")
	d, ok := dv.(*pyobj.Dict)
	if !ok {
		t.Fatal("truth has no degrees")
	}
	want := map[string]int{}
	for _, k := range []string{"tp", "pp", "dp"} {
		v, _ := d.Get(k)
		n, _ := pyobj.Int(v)
		want[k] = int(n)
	}
	g := tbl.Degrees
	if g.TP != want["tp"] || (g.PP != 0 && g.PP != want["pp"]) || (g.DP != 0 && g.DP != want["dp"]) {
		t.Errorf("degrees TP %d PP %d DP %d, the run had TP %d PP %d DP %d", g.TP, g.PP, g.DP, want["tp"], want["pp"], want["dp"])
	}
}

// wantDistError indexes the torch_dist folder dir and wants an error that
// says every string of want.
func wantDistError(t *testing.T, dir string, want ...string) {
	t.Helper()
	_, err := IndexDist(context.Background(), dir, Options{Workers: 1})
	if err == nil {
		t.Fatal("no error")
	}
	t.Log(err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}
