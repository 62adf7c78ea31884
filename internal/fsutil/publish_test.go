package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func readOne(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// WriteDir publishes a complete folder, replaces an existing one only by
// renaming it aside (nothing named dst is ever half-deleted) and leaves dst
// as it was when filling fails.
func TestWriteDir(t *testing.T) {
	dir := t.TempDir()
	dst, tmp := filepath.Join(dir, "dst"), filepath.Join(dir, "dst.partial")
	fill := func(v string) func(string) error {
		return func(tmp string) error { return os.WriteFile(filepath.Join(tmp, "f"), []byte(v), 0o644) }
	}
	for _, tc := range []struct {
		name    string
		replace bool
		fill    func(string) error
		wantErr bool
		want    string
	}{
		{"new", false, fill("one"), false, "one"},
		{"exists without replace", false, fill("two"), true, "one"},
		{"replace", true, fill("three"), false, "three"},
		{"fill fails", true, func(tmp string) error {
			fill("half")(tmp)
			return errors.New("disk full")
		}, true, "three"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteDir(tmp, dst, tc.replace, true, tc.fill)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got := readOne(t, dst); got != tc.want {
				t.Errorf("dst holds %q, want %q", got, tc.want)
			}
			for _, p := range []string{tmp, dst + OldSuffix} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s is left behind (%v)", p, err)
				}
			}
		})
	}
}

// A run killed after renaming dst aside leaves dst.ucp-old; the next
// replacement takes its place and removes it.
func TestReplaceDirStaleOld(t *testing.T) {
	dir := t.TempDir()
	dst, tmp := filepath.Join(dir, "dst"), filepath.Join(dir, "dst.partial")
	for _, p := range []string{dst, dst + OldSuffix, tmp} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "f"), []byte(filepath.Base(p)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, err := ReplaceDir(tmp, dst, true)
	if err != nil {
		t.Fatal(err)
	}
	if old != dst+OldSuffix || readOne(t, old) != "dst" {
		t.Errorf("old = %q, want %s holding the replaced dst", old, dst+OldSuffix)
	}
	if got := readOne(t, dst); got != "dst.partial" {
		t.Errorf("dst holds %q, want the new folder", got)
	}
}
