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

// PublishDir makes the complete folder tmp appear as dst: tmp is synced,
// dst removed first when replace is set, tmp renamed, and the parent
// synced. On an error before the rename, tmp is left for the caller to
// remove.
func PublishDir(tmp, dst string, replace, noSync bool) error {
	if !noSync {
		if err := SyncDir(tmp); err != nil {
			return err
		}
	}
	if replace {
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	if !noSync {
		return SyncDir(filepath.Dir(dst))
	}
	return nil
}
