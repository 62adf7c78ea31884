//go:build linux

package mapreduce

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// maxIovecs is the kernel's IOV_MAX: the most buffers one preadv fills.
const maxIovecs = 1024

// preadRuns fills bufs in order from f's bytes at off with preadv: a
// fragment's runs land straight in their places of the output buffer,
// with no staging buffer and no copy in user space. bufs is consumed;
// errors do not name the file (the caller does).
func preadRuns(f *os.File, off int64, bufs [][]byte) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for len(bufs) > 0 {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Preadv(int(fd), bufs[:min(len(bufs), maxIovecs)], off)
			return rerr != unix.EINTR
		}); err != nil {
			return err
		}
		if rerr != nil {
			return fmt.Errorf("preadv at offset %d: %w", off, rerr)
		}
		if n <= 0 {
			return fmt.Errorf("preadv at offset %d: %w", off, io.ErrUnexpectedEOF)
		}
		off += int64(n)
		for n > 0 {
			if k := len(bufs[0]); n >= k {
				n -= k
				bufs = bufs[1:]
			} else {
				bufs[0], n = bufs[0][n:], 0
			}
		}
	}
	return nil
}
