//go:build unix

package atomic

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// flock takes an advisory lock on the open file or folder f without
// waiting: exclusive, or shared when shared is set. It reports false when
// another live process holds a conflicting lock. The kernel drops the lock
// when the holder exits, however it exits (kill -9 included), so a lock
// is held by a live process or by nobody: a file that exists proves
// nothing.
func flock(f *os.File, shared bool) (bool, error) {
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
