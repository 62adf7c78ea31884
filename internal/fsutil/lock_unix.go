//go:build unix

package fsutil

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Flock takes an advisory lock on the open file or folder f without
// waiting: exclusive, or shared when shared is set. It reports false when
// another live process holds a conflicting lock. The kernel drops the lock
// when the holder exits, however it exits (kill -9 included), so a lock
// is held by a live process or by nobody: a file that exists proves
// nothing.
func Flock(f *os.File, shared bool) (bool, error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

// openDir opens the folder path for locking without following a symbolic
// link at path itself (O_NOFOLLOW: ELOOP) or opening anything but a
// folder (O_DIRECTORY: ENOTDIR), so the check cannot race with the open.
func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, NotDirError(path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// inode returns the file's inode number.
func inode(st os.FileInfo) uint64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return uint64(s.Ino)
	}
	return 0
}
