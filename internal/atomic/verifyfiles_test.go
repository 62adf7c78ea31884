package atomic

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVerifyFiles: files cut into pieces shared by the workers give the
// same verdict as VerifyFile, piece sizes that divide a file or not, empty
// files, and each fault named with its file.
func TestVerifyFiles(t *testing.T) {
	dir := t.TempDir()
	content := map[string][]byte{
		"a": []byte(strings.Repeat("0123456789abcdef", 100)), // 1600 bytes
		"b": []byte("short"),
		"c": {},
		"d": []byte(strings.Repeat("x", 64)),
	}
	entryOf := func(name string, b []byte) FileEntry {
		return FileEntry{Path: name, Bytes: int64(len(b)), CRC32: fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))}
	}
	for name, b := range content {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flipped := append([]byte(nil), content["a"]...)
	flipped[999] ^= 1
	cases := []struct {
		name  string
		entry FileEntry
		want  string // "" when the file matches
	}{
		{"a", entryOf("a", content["a"]), ""},
		{"b", entryOf("b", content["b"]), ""},
		{"c", entryOf("c", content["c"]), ""},
		{"d", entryOf("d", content["d"]), ""},
		{"a", entryOf("a", flipped), "a: CRC-32"},
		{"a", entryOf("a", content["a"][:1599]), "a: 1600 bytes, but the manifest says 1599"},
		{"b", entryOf("b", []byte("longer!")), "b: 5 bytes, but the manifest says 7"},
		{"missing", entryOf("missing", nil), "missing: no such file"},
	}
	for _, piece := range []int64{1, 7, 64, 1 << 20} {
		for _, workers := range []int{1, 3} {
			var paths []string
			var entries []FileEntry
			for _, c := range cases {
				paths = append(paths, filepath.Join(dir, c.name))
				entries = append(entries, c.entry)
			}
			got := make([]string, len(cases))
			calls := make([]int, len(cases))
			err := verifyFiles(context.Background(), paths, entries, workers, piece, func(i int, err error) {
				calls[i]++ // each index is reported once, by one worker: no race on its slot
				if err != nil {
					got[i] = err.Error()
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range cases {
				if calls[i] != 1 {
					t.Errorf("piece %d, %d workers, case %d: reported %d times", piece, workers, i, calls[i])
				}
				switch {
				case c.want == "" && got[i] != "":
					t.Errorf("piece %d, %d workers, case %d: %s", piece, workers, i, got[i])
				case c.want != "" && !strings.Contains(got[i], c.want):
					t.Errorf("piece %d, %d workers, case %d: got %q, want it to contain %q", piece, workers, i, got[i], c.want)
				}
				// VerifyFile, the one-file check, agrees
				if verr := VerifyFile(paths[i], entries[i]); (verr == nil) != (got[i] == "") {
					t.Errorf("piece %d, case %d: VerifyFile says %v, VerifyFiles %q", piece, i, verr, got[i])
				}
			}
		}
	}
}

// TestVerifyFilesCancelled: a cancelled context stops the workers and is
// returned.
func TestVerifyFilesCancelled(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := VerifyFiles(ctx, []string{p}, []FileEntry{{Path: "f", Bytes: 4, CRC32: "00000000"}}, 2, func(int, error) {})
	if err != context.Canceled {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}
