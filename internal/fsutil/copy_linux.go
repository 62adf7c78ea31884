package fsutil

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// kernelCopy is one copy_file_range(2) call. The errors that mean "not
// for these files" (across filesystems before Linux 5.19, filesystems or
// file types without support, seccomp filters, old kernels) ask for the
// fallback, as Go's own io.Copy does.
func kernelCopy(dst *os.File, dstOff int64, src *os.File, srcOff int64, n int) (int, error) {
	for {
		k, err := unix.CopyFileRange(int(src.Fd()), &srcOff, int(dst.Fd()), &dstOff, n, 0)
		switch {
		case err == nil:
			return k, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP),
			errors.Is(err, unix.EINVAL), errors.Is(err, unix.EPERM), errors.Is(err, unix.EBADF),
			errors.Is(err, unix.EIO), errors.Is(err, unix.ETXTBSY):
			return 0, errKernelUnsupported
		}
		return 0, err
	}
}
