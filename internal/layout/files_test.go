package layout_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestFiles writes the two TP ranks' files of the TP 2 fixture (every
// parameter's shard in float32, copied in the kernel, and in bfloat16,
// converted) through Files, several workers sharing both files, and each
// file alone with WriteFile: the files must be byte-identical, absent
// under their names until Flush, and Abort must leave nothing.
func TestFiles(t *testing.T) {
	r := tp2Atomic(t)
	ctx := context.Background()
	// rank builds rank tp's file contents (fresh blobs each call).
	rank := func(tp int) (pyobj.Value, []layout.StateFill) {
		root := pyobj.NewDict(pyobj.PlainDict)
		var fills []layout.StateFill
		for _, p := range r.Params() {
			st, meta := openFP32(t, r, p.Name)
			shape := st.Shape
			st.Close()
			sh, err := layout.TPShard(meta, shape, 2, tp, 0)
			if err != nil {
				t.Fatal(err)
			}
			n := torchfile.Numel(sh.Shape)
			for _, dt := range []dtype.DType{dtype.Float32, dtype.BFloat16} {
				b := &torchfile.Blob{DType: dt, Shape: sh.Shape}
				root.Set(fmt.Sprintf("%s.%v", p.Name, dt), b)
				fills = append(fills, layout.StateFill{Blob: b, Pieces: []layout.StatePiece{
					{Param: p.Name, State: "fp32", Shard: sh, N: n}}})
			}
		}
		return root, fills
	}
	alone, together := t.TempDir(), t.TempDir()
	for tp := range 2 {
		root, fills := rank(tp)
		if _, err := layout.WriteFile(ctx, r, filepath.Join(alone, fmt.Sprint(tp)), root, fills, layout.WriteOptions{Workers: 1}); err != nil {
			t.Fatal(err)
		}
	}
	b := layout.NewFiles(r, layout.WriteOptions{Workers: 3})
	for tp := range 2 {
		root, fills := rank(tp)
		if _, err := b.Add(ctx, filepath.Join(together, fmt.Sprint(tp)), root, fills); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(together, "0")); err == nil {
		t.Fatal("a file is in place before Flush")
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for tp := range 2 {
		want, err := os.ReadFile(filepath.Join(alone, fmt.Sprint(tp)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(together, fmt.Sprint(tp)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("rank %d written with another file differs from it written alone", tp)
		}
	}
	aborted := t.TempDir()
	b = layout.NewFiles(r, layout.WriteOptions{})
	root, fills := rank(0)
	if _, err := b.Add(ctx, filepath.Join(aborted, "0"), root, fills); err != nil {
		t.Fatal(err)
	}
	b.Abort()
	if left, _ := os.ReadDir(aborted); len(left) != 0 {
		t.Fatalf("Abort left %d files", len(left))
	}
}

// TestFilesCommitFails: the first batch's files commit in the background
// while the second batch is written. When a commit fails (here the rename
// onto a non-empty folder in the file's place), Flush returns that error
// naming the file, the files after it in its batch and every file of the
// later batch are removed, and no temporary file is left.
func TestFilesCommitFails(t *testing.T) {
	r := tp2Atomic(t)
	ctx := context.Background()
	p := r.Params()[0]
	st, meta := openFP32(t, r, p.Name)
	shape := st.Shape
	st.Close()
	sh, err := layout.TPShard(meta, shape, 2, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	file := func() (pyobj.Value, []layout.StateFill) {
		b := &torchfile.Blob{DType: dtype.Float32, Shape: sh.Shape}
		return pyobj.DictOf("w", b), []layout.StateFill{{Blob: b, Pieces: []layout.StatePiece{
			{Param: p.Name, State: "fp32", Shard: sh, N: torchfile.Numel(sh.Shape)}}}}
	}
	for _, bad := range []int{0, 2, 5} { // first of the first batch, inside it, in the second batch
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, fmt.Sprint(bad), "x"), 0o755); err != nil {
				t.Fatal(err)
			}
			b := layout.NewFiles(r, layout.WriteOptions{Workers: 1})
			for i := range 6 { // 4 files make a batch: 0-3 commit in the background while 4-5 are written
				root, fills := file()
				if _, err := b.Add(ctx, filepath.Join(dir, fmt.Sprint(i)), root, fills); err != nil {
					t.Fatal(err)
				}
			}
			err := b.Flush(ctx)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, fmt.Sprint(bad))) {
				t.Fatalf("Flush: %v, want an error naming file %d", err, bad)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range ents {
				got = append(got, e.Name())
			}
			// files before the bad one in its batch and earlier batches stay committed
			var want []string
			for i := range 6 {
				if i == bad || (i < bad && (i/4 < bad/4 || i < bad)) {
					want = append(want, fmt.Sprint(i))
				}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("left %v, want %v", got, want)
			}
		})
	}
}
