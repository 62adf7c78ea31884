package testkit

import (
	"os"
	"testing"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// FlipState rewrites the atomic state file path after flip changed its
// bytes; off is where the tensor's data starts. Tests corrupt a state this
// way to see that the damage is caught.
func FlipState(t *testing.T, path string, flip func(b []byte, off int64)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := torchfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	root, ok := f.Root.(*pyobj.Dict)
	if !ok {
		t.Fatalf("%s: root is %T, not a dict", path, f.Root)
	}
	pv, _ := root.Get("param")
	tv, ok := pv.(*torchfile.Tensor)
	if !ok {
		t.Fatalf("%s: param is %T, not a tensor", path, pv)
	}
	off := tv.FileOffset()
	f.Close()
	flip(b, off)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
