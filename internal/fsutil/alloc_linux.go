package fsutil

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Presize gives f its final size. Where the filesystem supports it the
// blocks are reserved too (fallocate): the writes that follow find their
// extents ready, the file is laid out in one piece, and a full disk fails
// here rather than half-way through. Elsewhere it is a plain truncate.
func Presize(f *os.File, size int64) error {
	if size > 0 {
		err := unix.Fallocate(int(f.Fd()), 0, 0, size)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
		}
	}
	return f.Truncate(size)
}

// StartWriteback asks the kernel to start writing the dirty pages of
// [off, off+n) of f to disk without waiting for it, so that the final
// sync finds most of the work done. Failure is harmless (the sync still
// writes everything) and is ignored. Small writes are gathered into
// windows (writebackRange).
func StartWriteback(f *os.File, off, n int64) {
	if lo, hi := writebackRange(off, n); hi > lo {
		_ = unix.SyncFileRange(int(f.Fd()), lo, hi-lo, unix.SYNC_FILE_RANGE_WRITE)
	}
}
