package fsutil

import "golang.org/x/sys/unix"

// FSInfo returns the bytes an unprivileged user may still write on the
// file system of dir and the longest name it takes.
func FSInfo(dir string) (free int64, nameMax int, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	nameMax = int(st.Namelen)
	if nameMax <= 0 {
		nameMax = 255
	}
	return int64(st.Bavail) * int64(st.Bsize), nameMax, nil
}
