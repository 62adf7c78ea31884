package dcp

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/ucp-project/ucp/internal/testkit"
)

// transformCase copies fixture c and passes every item through enc, as
// torch >= 2.7's FileSystemWriter does with _extensions, recording desc
// as the item's transform_descriptors.
func transformCase(t *testing.T, c, desc string, enc func([]byte) []byte) string {
	t.Helper()
	dir := copyCase(t, c)
	rewrite(t, dir, func(md *Metadata) {
		byFile := map[string][]int{}
		for i, s := range md.Storage {
			byFile[s.Info.RelativePath] = append(byFile[s.Info.RelativePath], i)
		}
		for name, idx := range byFile {
			sort.Slice(idx, func(a, b int) bool { return md.Storage[idx[a]].Info.Offset < md.Storage[idx[b]].Info.Offset })
			src, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			for _, i := range idx {
				in := &md.Storage[i].Info
				z := enc(src[in.Offset : in.Offset+in.Length])
				in.Offset, in.Length, in.Transforms = int64(len(out)), int64(len(z)), []string{desc}
				out = append(out, z...)
			}
			if err := os.WriteFile(filepath.Join(dir, name), out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	return dir
}

func zstdEncode(t *testing.T) func([]byte) []byte {
	e, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	return func(b []byte) []byte { return e.EncodeAll(b, nil) }
}

func rot13Encode(b []byte) []byte {
	out, _ := readAllRot13(b)
	return out
}

func readAllRot13(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(rot13{bytes.NewReader(b)})
	return buf.Bytes(), err
}

// Items compressed with zstd (or the rot13 test transform) convert to the
// same values as the plain fixture, and the decoded items are removed when
// the table is closed.
func TestTransformedItems(t *testing.T) {
	for _, tc := range []struct{ c, desc string }{
		{"fsdp2_w4", "stream.zstd/1"},
		{"torchtitan_w2", "stream.zstd/1"},
		{"multifile_w2_t3", "stream.zstd/1"},
		{"ddp_w3", "stream.rot13/1"},
	} {
		t.Run(tc.c+"/"+tc.desc, func(t *testing.T) {
			enc := rot13Encode
			if strings.HasPrefix(tc.desc, "stream.zstd") {
				enc = zstdEncode(t)
			}
			dir := transformCase(t, tc.c, tc.desc, enc)
			tbl, err := Index(context.Background(), dir, Options{Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(tbl.Scratch) != 1 {
				t.Fatalf("scratch folders %v, want one", tbl.Scratch)
			}
			tr := loadTruth(t, tc.c)
			dst := testkit.Convert(t, tbl, 2)
			testkit.Check(t, dst, tr.Path)
			checkBuffers(t, tr, tbl, dst)
			checkSteps(t, tr, tbl, dst)
			checkExtra(t, tr, dst)
			scratch := tbl.Scratch[0]
			if err := tbl.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(scratch); !os.IsNotExist(err) {
				t.Errorf("%s still exists after Close: %v", scratch, err)
			}
		})
	}
}

// Bad transformed items: clear errors naming the file and the key, and no
// decoded item left behind.
func TestTransformErrors(t *testing.T) {
	const w = "model.layers.0.attn.wqkv.weight"
	tests := []struct {
		name   string
		change func(md *Metadata)
		want   []string
	}{
		{"truncated zstd stream", func(md *Metadata) {
			storageOf(t, md, w, []int64{5, 0}).Info.Length -= 9
		}, []string{"__1_0.distcp", w, "stream.zstd/1", "truncated"}},
		{"zstd stream cut to its header", func(md *Metadata) {
			storageOf(t, md, w, []int64{0, 0}).Info.Length = 6
		}, []string{"__0_0.distcp", w, "truncated"}},
		{"not zstd", func(md *Metadata) {
			storageOf(t, md, w, []int64{0, 0}).Info.Offset += 3
		}, []string{"__0_0.distcp", w, "stream.zstd/1"}},
		{"unknown transform", func(md *Metadata) {
			storageOf(t, md, w, []int64{0, 0}).Info.Transforms = []string{"stream.lz4/1"}
		}, []string{"__0_0.distcp", `unsupported stream transform "stream.lz4/1"`}},
		{"zstd version 2", func(md *Metadata) {
			storageOf(t, md, w, []int64{0, 0}).Info.Transforms = []string{"stream.zstd/2"}
		}, []string{"__0_0.distcp", `"stream.zstd/2"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			dir := transformCase(t, "fsdp2_w2", "stream.zstd/1", zstdEncode(t))
			rewrite(t, dir, tc.change)
			_, err := Index(context.Background(), dir, Options{Workers: 1})
			wantError(t, err, tc.want...)
			left, _ := filepath.Glob(filepath.Join(tmp, "ucp-dcp-decoded-*"))
			if len(left) != 0 {
				t.Errorf("decoded items left behind: %v", left)
			}
		})
	}
}
