// Package fsutil holds the file operations that make output appear whole
// or not at all: write through a temporary name, sync, rename.
package fsutil

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFileAtomic writes data to a temporary file beside path, syncs it
// (unless noSync) and renames it to path, so path is never half-written.
func WriteFileAtomic(path string, data []byte, noSync bool) error {
	f, err := CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && !noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// SyncDir makes a folder's entries (new names, renames) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// OpenReaderAt opens path and passes it to read as an io.ReaderAt of the
// file's size; on success it also returns the open file for the caller
// to close, on failure it closes the file itself.
func OpenReaderAt[T any](path string, read func(r io.ReaderAt, size int64, name string) (T, error)) (T, *os.File, error) {
	var zero T
	f, err := Open(path)
	if err != nil {
		return zero, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return zero, nil, err
	}
	v, err := read(f, st.Size(), path)
	if err != nil {
		f.Close()
		return zero, nil, err
	}
	return v, f, nil
}

// OldSuffix names the old dst while ReplaceDir replaces it: dst is renamed
// aside, the new folder renamed into place, and only then is the old one
// deleted, so a folder named dst is always complete, even after a kill.
const OldSuffix = ".ucp-old"

// ReplaceDir renames the complete folder tmp to dst. With replace, an
// existing dst is first renamed to dst+OldSuffix (put back if the second
// rename fails); the caller deletes the returned old path ("" when nothing
// was replaced) once dst is in place.
func ReplaceDir(tmp, dst string, replace bool) (old string, err error) {
	// Neither is followed if a link: renaming onto or removing through one
	// would replace or empty what it points to.
	if err := CheckDirOrAbsent(dst, dst+OldSuffix); err != nil {
		return "", err
	}
	if replace {
		if _, err := os.Lstat(dst); err == nil {
			old = dst + OldSuffix
			// A dst.ucp-old left by a run killed here was already replaced.
			if err := os.RemoveAll(old); err != nil {
				return "", err
			}
			if err := os.Rename(dst, old); err != nil {
				return "", err
			}
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		if old != "" {
			os.Rename(old, dst) // put the old folder back
		}
		return "", err
	}
	return old, nil
}

// PublishDir makes the complete folder tmp appear as dst: tmp is synced,
// renamed into place by ReplaceDir (an existing dst only with replace), the
// parent synced, and the replaced folder deleted. On an error before the
// rename, tmp is left for the caller to remove.
func PublishDir(tmp, dst string, replace, noSync bool) error {
	if !noSync {
		if err := SyncDir(tmp); err != nil {
			return err
		}
	}
	old, err := ReplaceDir(tmp, dst, replace)
	if err != nil {
		return err
	}
	if !noSync {
		if err := SyncDir(filepath.Dir(dst)); err != nil {
			return err
		}
	}
	if old != "" {
		if err := os.RemoveAll(old); err != nil {
			return fmt.Errorf("%s is complete, but the folder it replaced is left in %s: %w", dst, old, err)
		}
	}
	return nil
}

// WriteDir builds the folder dst in tmp: tmp is created and locked
// exclusively as convert locks DST.partial (LockDir: a second run into dst
// is refused while this one lives), emptied, filled by fill, and
// PublishDir puts it in place. On any error tmp is removed and dst is as
// it was. A symbolic link or a file at dst, tmp or dst+OldSuffix is
// refused, never followed.
func WriteDir(tmp, dst string, replace, noSync bool, fill func(tmp string) error) error {
	if err := CheckDirOrAbsent(dst, tmp, dst+OldSuffix); err != nil {
		return err
	}
	lock, err := LockDir(tmp, false)
	if err != nil {
		return err
	}
	defer lock.Close() // after the rename: the lock moves with the folder
	if err := ClearDir(tmp); err != nil {
		return err
	}
	if err := fill(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := PublishDir(tmp, dst, replace, noSync); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}
