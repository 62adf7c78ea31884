package fsutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrLocked is wrapped by LockDir's error when another live process holds
// the folder's lock.
var ErrLocked = errors.New("locked by another live process")

// NotDirError is the refusal of a path ucp would write or remove as a
// folder that is a symbolic link or something other than a folder:
// following the link would write into, or empty, whatever it points to.
func NotDirError(path string) error {
	what := "not a folder"
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSymlink != 0 {
			what = "a symbolic link"
			if to, err := os.Readlink(path); err == nil {
				what += " to " + to
			}
		} else {
			what = kind(st.Mode())
			if st.Mode().IsRegular() {
				what = "a file"
			}
		}
	}
	return fmt.Errorf("refusing to use %s: it is %s, and ucp never follows links or replaces other files where it writes a folder; remove or rename it, or give another destination", path, what)
}

// CheckDirOrAbsent refuses each path that exists as anything but a real
// folder (a symbolic link included, wherever it points): the folders an
// output is built in, published as and renamed aside to (DST,
// DST.partial, DST.ucp-old).
func CheckDirOrAbsent(paths ...string) error {
	for _, p := range paths {
		st, err := os.Lstat(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return NotDirError(p)
		}
	}
	return nil
}

// CheckOutputDir refuses an output folder dst whose path, or a work
// folder beside it (dst+PartialSuffix, dst+OldSuffix), is a symbolic link
// or not a folder.
func CheckOutputDir(dst string) error {
	dst = filepath.Clean(dst)
	return CheckDirOrAbsent(dst, dst+PartialSuffix, dst+OldSuffix)
}

// PartialSuffix names the folder an output is built in before it is
// renamed to its name.
const PartialSuffix = ".partial"

// LockDir creates the folder dir if needed and flocks the folder itself
// (its inode, so the lock moves with a rename): exclusively, or shared
// for the nodes of one multi-node run. Every command that writes a
// folder locks its DST.partial this way, so two runs never write into
// one. dir must be a real folder: a symbolic link or a file there is
// refused, never followed. The kernel drops the lock when the holder
// exits, kill -9 included. It retries when the folder it locked was
// renamed or removed meanwhile.
func LockDir(dir string, shared bool) (*os.File, error) {
	for range 10 {
		if err := CheckDirOrAbsent(dir); err != nil {
			return nil, err
		}
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
				return nil, err
			}
			if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
				return nil, err
			}
		}
		d, err := openDir(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		ok, err := Flock(d, shared)
		if err != nil || !ok {
			d.Close()
			if err == nil {
				err = fmt.Errorf("another ucp run (convert, reshard or export) is writing %s: %w; wait for it to finish or stop it, then rerun",
					dir, ErrLocked)
			}
			return nil, err
		}
		// The folder locked must still be the one named dir.
		a, err1 := d.Stat()
		b, err2 := os.Lstat(dir)
		if err1 == nil && err2 == nil && os.SameFile(a, b) {
			return d, nil
		}
		d.Close()
	}
	return nil, fmt.Errorf("%s keeps changing under this process; is another run starting and stopping?", dir)
}

// ClearDir removes everything inside dir but dir itself (whose inode
// carries the lock). RemoveAll does not follow links inside it.
func ClearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
