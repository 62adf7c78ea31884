package dcp

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// copyCase copies a fixture's checkpoint folder so a test can break it.
func copyCase(t *testing.T, c string) string {
	t.Helper()
	return testkit.CopyTree(t, testkit.Fixture("dcp", c, "checkpoint"))
}

// rewrite changes the decoded metadata of a folder and pickles it again.
func rewrite(t *testing.T, dir string, change func(md *Metadata)) {
	t.Helper()
	path := filepath.Join(dir, MetadataFile)
	md, err := ReadMetadata(path)
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

// storageOf returns the storage entry of a key's chunk (or bytes item).
func storageOf(t *testing.T, md *Metadata, fqn string, offset []int64) *StorageEntry {
	t.Helper()
	for i := range md.Storage {
		s := &md.Storage[i]
		if s.Index.FQN == fqn && s.Index.HasOffset == (offset != nil) && torchfile.SameShape(s.Index.Offset, offset) {
			return s
		}
	}
	t.Fatalf("no storage entry for %s %v", fqn, offset)
	return nil
}

func entryOf(t *testing.T, md *Metadata, key string) *Entry {
	t.Helper()
	e, ok := md.Entry(key)
	if !ok {
		t.Fatalf("no entry %s", key)
	}
	return e
}

// Every kind of damage is an error that names the file and the key.
func TestCorruptCheckpoints(t *testing.T) {
	const w = "model.layers.0.attn.wqkv.weight" // [9 4] in chunks [0 0]+[5 4] and [5 0]+[4 4]
	tests := []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"truncated .metadata", func(t *testing.T, d string) {
			p := filepath.Join(d, MetadataFile)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
		}, []string{".metadata", "not a DCP .metadata pickle", "truncated"}},
		{"empty .metadata", func(t *testing.T, d string) {
			os.WriteFile(filepath.Join(d, MetadataFile), nil, 0o644)
		}, []string{".metadata", "not a DCP .metadata pickle"}},
		{"not a Metadata", func(t *testing.T, d string) {
			b, _ := pyobj.Marshal(pyobj.DictOf("state_dict_metadata", pyobj.NewDict(pyobj.PlainDict)), nil)
			os.WriteFile(filepath.Join(d, MetadataFile), b, 0o644)
		}, []string{".metadata", "not a torch.distributed.checkpoint Metadata"}},
		{"no .metadata", func(t *testing.T, d string) {
			os.Rename(filepath.Join(d, MetadataFile), filepath.Join(d, MetadataFile+".tmp"))
		}, []string{"the save did not finish"}},
		{"item range past EOF", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, w, []int64{5, 0}).Info.Length = 1 << 20 })
		}, []string{"__1_0.distcp", w, "reaches past the end"}},
		{"item offset past EOF", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, w, []int64{0, 0}).Info.Offset = 1 << 40 })
		}, []string{"__0_0.distcp", w, "reaches past the end"}},
		{"item range not an item", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, w, []int64{0, 0}).Info.Offset += 7 })
		}, []string{"__0_0.distcp", w}},
		{"chunk out of bounds", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { entryOf(t, md, w).Chunks[1].Sizes = []int64{5, 4} })
		}, []string{".metadata", w, "chunk 1", "outside the tensor"}},
		{"chunk of wrong rank", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { entryOf(t, md, w).Chunks[1].Sizes = []int64{4} })
		}, []string{".metadata", w, "chunk 1", "dims"}},
		{"overlapping chunks", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) {
				e := entryOf(t, md, w)
				e.Chunks[1].Offsets = []int64{4, 0}
				e.Chunks[1].Sizes = []int64{5, 4}
				storageOf(t, md, w, []int64{5, 0}).Index.Offset = []int64{4, 0}
			})
		}, []string{w, "overlap"}},
		{"chunks leave a hole", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) {
				e := entryOf(t, md, w)
				e.Chunks = e.Chunks[:1]
			})
		}, []string{w, "cover 20 of the 36 elements"}},
		{"item shape differs from its chunk", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) {
				e := entryOf(t, md, w)
				e.Size = []int64{9, 5}
				e.Chunks = append(e.Chunks, Chunk{Offsets: []int64{0, 4}, Sizes: []int64{9, 1}})
				s := *storageOf(t, md, w, []int64{5, 0})
				s.Index.Offset = []int64{0, 4}
				md.Storage = append(md.Storage, s)
			})
		}, []string{"__1_0.distcp", w, "has shape [4 4], but its chunk has sizes [9 1]"}},
		{"missing .distcp", func(t *testing.T, d string) {
			os.Remove(filepath.Join(d, "__1_0.distcp"))
		}, []string{"__1_0.distcp", "data file is missing"}},
		{"wrong dtype", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { entryOf(t, md, w).DType = dtype.BFloat16 })
		}, []string{"__0_0.distcp", w, "float32, but the metadata says bfloat16"}},
		{"missing MetadataIndex", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) {
				s := storageOf(t, md, w, []int64{5, 0})
				s.Index.FQN = "model.gone"
			})
		}, []string{".metadata", "no MetadataIndex", w}},
		{"missing bytes MetadataIndex", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, "step", nil).Index.HasOffset = true })
		}, []string{".metadata", `MetadataIndex("step")`}},
		{"plain item marked zstd", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, w, []int64{0, 0}).Info.Transforms = []string{"stream.zstd/1"} })
		}, []string{"__0_0.distcp", w, "stream.zstd/1", "magic number mismatch"}},
		{"path outside the folder", func(t *testing.T, d string) {
			rewrite(t, d, func(md *Metadata) { storageOf(t, md, w, []int64{0, 0}).Info.RelativePath = "../__0_0.distcp" })
		}, []string{w, "not a file name inside the checkpoint folder"}},
		{"unknown dtype", func(t *testing.T, d string) {
			p := filepath.Join(d, MetadataFile)
			b, _ := os.ReadFile(p)
			// Same length, so the pickle stays well formed.
			b = []byte(strings.Replace(string(b), "bfloat16", "bfloat99", 1))
			os.WriteFile(p, b, 0o644)
		}, []string{".metadata", "dtype torch.bfloat99 is not supported"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := copyCase(t, "fsdp2_w2")
			tc.break_(t, d)
			_, err := Index(context.Background(), d, Options{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// A replica whose bytes differ from the placed copy fails the conversion;
// identical replicas pass.
func TestReplicaCopies(t *testing.T) {
	d := copyCase(t, "fsdp2_w2")
	const buf = "model.layers.0.attn.rope_freqs" // whole, stored once in __1_0.distcp
	md, err := ReadMetadata(filepath.Join(d, MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	s := storageOf(t, md, buf, []int64{0})
	item, err := os.ReadFile(filepath.Join(d, s.Info.RelativePath))
	if err != nil {
		t.Fatal(err)
	}
	item = item[s.Info.Offset : s.Info.Offset+s.Info.Length]
	// A second rank saved its own copy into its file (no dedup): as
	// per-rank metadata files of a save without collectives describe it.
	f0 := filepath.Join(d, "__0_0.distcp")
	b0, _ := os.ReadFile(f0)
	copyAt := int64(len(b0))
	os.WriteFile(f0, append(b0, item...), 0o644)
	os.Remove(filepath.Join(d, MetadataFile))
	split := func(rank int, at int64) *Metadata {
		m := &Metadata{PlannerData: md.PlannerData, PlannerOrder: md.PlannerOrder, byKey: map[string]*Entry{}, storage: map[string]int{}}
		for _, e := range md.Entries {
			c := *e
			c.Chunks = nil
			for _, ch := range e.Chunks {
				si, _ := md.Lookup(e.Key, ch.Offsets, true)
				if e.Key == buf || si.RelativePath == "__"+string(rune('0'+rank))+"_0.distcp" {
					c.Chunks = append(c.Chunks, ch)
				}
			}
			if e.Bytes && rank != 1 {
				continue
			}
			m.Entries = append(m.Entries, &c)
		}
		for _, st := range md.Storage {
			if st.Index.FQN == buf {
				st.Info.RelativePath, st.Info.Offset = "__"+string(rune('0'+rank))+"_0.distcp", at
				if rank == 1 {
					st.Info.Offset = s.Info.Offset
				}
				m.Storage = append(m.Storage, st)
			} else if st.Info.RelativePath == "__"+string(rune('0'+rank))+"_0.distcp" {
				m.Storage = append(m.Storage, st)
			}
		}
		return m
	}
	for rank := 0; rank < 2; rank++ {
		b, err := split(rank, copyAt).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "__"+string(rune('0'+rank))+".metadata"), b, 0o644)
	}
	tbl, err := Index(context.Background(), d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := tbl.Param("layers.0.attn.rope_freqs")
	if p == nil || len(p.States[0].Shards) != 2 || p.States[0].Frags[1].Src.Path == p.States[0].Frags[0].Src.Path {
		t.Fatalf("the buffer is not a replica in two files: %+v", p)
	}
	dst := testkit.Convert(t, tbl, 2)
	testkit.Check(t, dst, testkit.Fixture("dcp", "fsdp2_w2", "truth.pt"))

	// Flip a byte of the copy's data (the last bytes of the float32 payload
	// sit right before the zip tail; change one inside the payload).
	b0, _ = os.ReadFile(f0)
	ck, err := Open(context.Background(), d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range ck.Tensors {
		if tt.Key == buf {
			for _, ch := range tt.Chunks {
				if strings.HasPrefix(ch.Item, "__0_0") {
					b0[ch.Ref.T.FileOffset()] ^= 0x40
				}
			}
		}
	}
	os.WriteFile(f0, b0, 0o644)
	tbl, err = Index(context.Background(), d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := convertErr(t, tbl); err == nil || !strings.Contains(err.Error(), "replica 1 differs") {
		t.Errorf("differing replica: %v", err)
	}
}

// convertErr converts a table, returning the reducers' error.
func convertErr(t *testing.T, tbl *fragment.Table) (string, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "atomic")
	plan, err := mapreduce.NewPlan(tbl, mapreduce.PlanOptions{Nodes: 1, Cores: 2})
	if err != nil {
		return "", err
	}
	w, err := mapreduce.Create(dst, plan, atomic.Options{})
	if err != nil {
		return "", err
	}
	if _, err := mapreduce.Run(context.Background(), plan, w, mapreduce.Options{Workers: 2, CheckReplicas: true}); err != nil {
		w.Abort()
		return "", err
	}
	if _, err := w.FinishNode(); err != nil {
		return "", err
	}
	_, err = mapreduce.Finalize(plan, w)
	return dst, err
}
