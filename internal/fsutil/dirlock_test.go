//go:build unix

package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LockDir is exclusive (a second lock, even from this process through
// another open, is refused with ErrLocked), released on Close, and never
// follows a link or opens a file at dir (issue 26 faults 1 and 2).
func TestLockDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "dst.partial")
	l, err := LockDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockDir(dir, false); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	if _, err := LockDir(dir, true); !errors.Is(err, ErrLocked) {
		t.Fatalf("shared lock beside an exclusive one: %v, want ErrLocked", err)
	}
	l.Close()
	l, err = LockDir(dir, false)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	l.Close()
	other := t.TempDir()
	for name, make := range map[string]func(p string) error{
		"link":     func(p string) error { return os.Symlink(other, p) },
		"dangling": func(p string) error { return os.Symlink(filepath.Join(other, "nowhere"), p) },
		"file":     func(p string) error { return os.WriteFile(p, []byte("x"), 0o644) },
	} {
		p := filepath.Join(t.TempDir(), "dst.partial")
		if err := make(p); err != nil {
			t.Fatal(err)
		}
		if _, err := LockDir(p, false); err == nil || !strings.Contains(err.Error(), "refusing to use") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
		if _, err := os.Stat(filepath.Join(other, "nowhere")); !os.IsNotExist(err) {
			t.Errorf("%s: the link's target was created", name)
		}
		if err := WriteDir(p, filepath.Join(filepath.Dir(p), "dst"), true, true, func(string) error { return nil }); err == nil {
			t.Errorf("%s: WriteDir through it succeeded", name)
		}
	}
}

// WriteDir refuses while another holder has the lock, and leaves its
// folder alone.
func TestWriteDirLocked(t *testing.T) {
	dir := t.TempDir()
	tmp, dst := filepath.Join(dir, "dst.partial"), filepath.Join(dir, "dst")
	l, err := LockDir(tmp, false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.WriteFile(filepath.Join(tmp, "theirs"), []byte("x"), 0o644)
	err = WriteDir(tmp, dst, true, true, func(string) error { t.Error("filled while locked"); return nil })
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "theirs")); err != nil {
		t.Errorf("the holder's file is gone: %v", err)
	}
}
