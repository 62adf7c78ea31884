package atomic

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWritePointer: a pointer is written, reported as changed or already
// right, and never made to name a folder that does not exist.
func TestWritePointer(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ptr := filepath.Join(dir, LatestUniversal)
	steps := []struct {
		name, want, err string
	}{
		{"a", "wrote " + ptr + " naming a", ""},
		{"a", ptr + " already names a", ""},
		{"b", "changed " + ptr + " from a to b", ""},
		{"gone", "", "is not a folder"},
	}
	for _, s := range steps {
		p, err := WritePointer(ptr, s.name, filepath.Join(dir, s.name), true)
		if s.err != "" {
			if err == nil || !strings.Contains(err.Error(), s.err) {
				t.Errorf("%s: err %v, want %q", s.name, err, s.err)
			}
		} else if err != nil || p.String() != s.want {
			t.Errorf("%s: %q, %v; want %q", s.name, p.String(), err, s.want)
		}
	}
	if b, err := os.ReadFile(ptr); err != nil || string(b) != "b" {
		t.Errorf("the pointer holds %q (%v), want b", b, err)
	}
	if got := LatestUniversalOf(filepath.Join(dir, "x") + "/"); got != ptr {
		t.Errorf("LatestUniversalOf = %s", got)
	}
}
