package torchfile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzRead: any input is read by Read, or rejected with an error naming
// the file; what is accepted can be walked and every tensor read within
// the file (never a panic, hang or allocation beyond the input's scale).
func FuzzRead(f *testing.F) {
	for _, dir := range []string{fixtureDir, corruptDir} {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.pt"))
		if len(paths) == 0 {
			f.Fatalf("no seeds in %s", dir)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tf, err := Read(bytes.NewReader(data), int64(len(data)), "fuzz.pt")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.pt: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			if strings.Contains(err.Error(), "malformed") {
				t.Fatalf("recovered from a panic: %v", err)
			}
			return
		}
		for _, st := range tf.Storages {
			if st.Offset < 0 || st.NBytes() < 0 || st.Offset+st.NBytes() > int64(len(data)) {
				t.Fatalf("storage %s at %d+%d outside the %d-byte file", st.Key, st.Offset, st.NBytes(), len(data))
			}
		}
		if err := walkAndRead(tf); err != nil && !strings.Contains(err.Error(), "values to walk") {
			t.Fatalf("reading an accepted file: %v", err)
		}
	})
}
