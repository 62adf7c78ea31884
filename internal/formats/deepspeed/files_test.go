package deepspeed

import (
	"os"
	"path/filepath"
	"testing"
)

// TestScanListsOnce: one Scan lists a folder once, so Detect, the
// registry's partly-claimed check and Index see one listing (a file
// removed after the first look is still in it); a fresh Scan lists again.
func TestScanListsOnce(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "mp_rank_00_model_states.pt")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Scan{}
	if !s.Detect(dir) || s.DetectZero3(dir) {
		t.Fatal("a folder with mp_rank_00_model_states.pt is ZeRO-1/2")
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	if files, err := s.Files(dir, ""); err != nil || len(files.Model) != 1 || len(s.dirs) != 1 {
		t.Fatalf("the second look listed again: %v %v, %d listings", files, err, len(s.dirs))
	}
	if new(Scan).Detect(dir) {
		t.Fatal("a fresh Scan did not list the folder again")
	}
}
