package fsutil

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Writes from user memory go to the page cache through a pipe: vmsplice
// lends the buffer's pages to the pipe (no copy) and splice moves them
// into the file, where the kernel copies them with its own memcpy. On
// Linux 6.18 in this project's VMs (ext4, 2 cores) a pwrite of 1 GB from a
// large or cold buffer cost 2.4-3.0 s of system time against 0.5-1.0 s
// this way (copy_from_user into the page cache is the slow step); see
// README, Performance.

// spliceMin is the smallest write worth the two extra system calls.
const spliceMin = 64 << 10

// pipeSize is the capacity asked of each pipe (the default maximum an
// unprivileged process may set, /proc/sys/fs/pipe-max-size).
const pipeSize = 1 << 20

// spliceOff is set once the kernel refused vmsplice or splice into a
// regular file: every later write goes straight to pwrite.
var spliceOff atomic.Bool

// pipes is a free list of empty pipes, one taken per write in progress,
// so that concurrent writers never share one. Bounded: a pipe beyond
// maxFreePipes is closed when returned.
var pipes struct {
	mu   sync.Mutex
	free [][2]int
}

const maxFreePipes = 64

func getPipe() ([2]int, error) {
	pipes.mu.Lock()
	if n := len(pipes.free); n > 0 {
		p := pipes.free[n-1]
		pipes.free = pipes.free[:n-1]
		pipes.mu.Unlock()
		return p, nil
	}
	pipes.mu.Unlock()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return p, err
	}
	_, _ = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeSize) // a smaller pipe only costs calls
	return p, nil
}

func putPipe(p [2]int) {
	pipes.mu.Lock()
	if len(pipes.free) < maxFreePipes {
		pipes.free = append(pipes.free, p)
		pipes.mu.Unlock()
		return
	}
	pipes.mu.Unlock()
	closePipe(p)
}

func closePipe(p [2]int) {
	unix.Close(p[0])
	unix.Close(p[1])
}

// writeAt writes p at off: through a pipe when it is big enough and the
// kernel allows it, else with pwrite in pieces of WriteChunk.
func writeAt(f *os.File, p []byte, off int64) error {
	if len(p) >= spliceMin && !spliceOff.Load() {
		done, err := spliceWrite(f, p, off)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errKernelUnsupported) {
			return &os.PathError{Op: "splice", Path: f.Name(), Err: err}
		}
		p, off = p[done:], off+int64(done)
	}
	return pwriteChunks(f, p, off)
}

// spliceWrite writes p at off through a pipe and returns how many bytes
// reached the file. errKernelUnsupported asks for pwrite of the rest.
func spliceWrite(f *os.File, p []byte, off int64) (int, error) {
	pp, err := getPipe()
	if err != nil {
		return 0, errKernelUnsupported
	}
	fd := int(f.Fd())
	done := 0
	for done < len(p) {
		rest := p[done:]
		iov := []unix.Iovec{{Base: &rest[0]}}
		iov[0].SetLen(len(rest))
		k, err := unix.Vmsplice(pp[1], iov, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			closePipe(pp)
			spliceOff.Store(true)
			return done, errKernelUnsupported
		}
		// The pipe holds references to p's pages until they are spliced
		// out: drain it fully before p may change or the pipe is reused.
		for left := k; left > 0; {
			m, err := unix.Splice(pp[0], nil, fd, &off, left, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil || m <= 0 {
				closePipe(pp) // it may still hold bytes: never reuse it
				if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
					spliceOff.Store(true)
					return done, errKernelUnsupported
				}
				return done, err
			}
			left -= int(m)
			done += int(m)
		}
	}
	putPipe(pp)
	return done, nil
}
