package testkit

import (
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Resave writes the torch file at path again after edit changed its
// decoded root (tensors become blobs holding their bytes), for tests that
// break one pickled value of a real fixture.
func Resave(tb testing.TB, path string, edit func(root pyobj.Value) pyobj.Value) {
	tb.Helper()
	f, err := torchfile.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	root, err := f.WithBytes(f.Root, pyobj.DefaultLimits(), 0)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	if err := torchfile.Save(path, edit(root)); err != nil {
		tb.Fatal(err)
	}
}

// BreakFile copies the checkpoint folder src, re-saves the one file named
// name in it (at any depth below src's tag folders) after edit, and returns
// the copy.
func BreakFile(tb testing.TB, src, name string, edit func(root pyobj.Value) pyobj.Value) string {
	tb.Helper()
	dir := CopyTree(tb, src)
	paths, _ := filepath.Glob(filepath.Join(dir, "*", name))
	if len(paths) != 1 {
		tb.Fatalf("%s: %d files named %s", src, len(paths), name)
	}
	Resave(tb, paths[0], edit)
	return dir
}
