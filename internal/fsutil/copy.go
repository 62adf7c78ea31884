package fsutil

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// CopyBufSize is the buffer a Copier allocates when it has none: big
// enough that a range costs few system calls.
const CopyBufSize = WriteChunk

// Copier copies byte ranges between open files. Without a CRC it copies
// in the kernel (copy_file_range: no user-space copy, and a server-side or
// reflink copy on filesystems that offer one), falling back to pread and
// pwrite through its buffer when the kernel refuses (another filesystem,
// an old kernel, a file type it does not support). With a CRC it always
// goes through the buffer: the bytes must pass through user space to be
// hashed, and hashing them on the way costs less than reading them back.
// One Copier per goroutine: it owns its buffer, which it reuses.
type Copier struct {
	Buf []byte
	// kernel copies in the kernel (nil: copy_file_range where built in);
	// it returns errKernelUnsupported when the fallback must be used.
	kernel   func(dst *os.File, dstOff int64, src *os.File, srcOff int64, n int) (int, error)
	noKernel bool // the kernel refused once: do not ask again
}

// errKernelUnsupported means the in-kernel copy is not available for
// these files; the bytes must be copied through the buffer.
var errKernelUnsupported = errors.New("in-kernel copy not supported")

// CopyRange copies n bytes of src at srcOff to dst at dstOff.
func (c *Copier) CopyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	kernel := c.kernel
	if kernel == nil {
		kernel = kernelCopy
	}
	for n > 0 && !c.noKernel {
		k, err := kernel(dst, dstOff, src, srcOff, int(min(n, 1<<30)))
		if errors.Is(err, errKernelUnsupported) {
			c.noKernel = true
			break
		}
		if err != nil {
			return fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
		}
		if k == 0 {
			return fmt.Errorf("copying %s to %s: %s ends before byte %d: %w", src.Name(), dst.Name(), src.Name(), srcOff+n, io.ErrUnexpectedEOF)
		}
		n, srcOff, dstOff = n-int64(k), srcOff+int64(k), dstOff+int64(k)
	}
	_, err := c.copyBuffered(dst, dstOff, src, srcOff, n, false)
	return err
}

// CopyRangeCRC copies like CopyRange through the buffer and returns the
// CRC-32 (IEEE) of the bytes copied.
func (c *Copier) CopyRangeCRC(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) (uint32, error) {
	return c.copyBuffered(dst, dstOff, src, srcOff, n, true)
}

func (c *Copier) copyBuffered(dst *os.File, dstOff int64, src *os.File, srcOff, n int64, hash bool) (uint32, error) {
	if len(c.Buf) == 0 {
		c.Buf = make([]byte, CopyBufSize)
	}
	var crc uint32
	for n > 0 {
		b := c.Buf[:min(n, int64(len(c.Buf)))]
		if _, err := src.ReadAt(b, srcOff); err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%s ends before byte %d: %w", src.Name(), srcOff+int64(len(b)), io.ErrUnexpectedEOF)
			}
			return 0, fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
		}
		if hash {
			crc = crc32.Update(crc, crc32.IEEETable, b)
		}
		if _, err := dst.WriteAt(b, dstOff); err != nil {
			return 0, fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
		}
		n, srcOff, dstOff = n-int64(len(b)), srcOff+int64(len(b)), dstOff+int64(len(b))
	}
	return crc, nil
}

// WriteChunk is the largest single write: measured on Linux 6.18 (ext4,
// 2 cores), buffered writes of 4 MiB or more from user memory cost 3-4x
// the system time of 1 MiB writes (the page cache's large-folio path),
// which made ucp's writes cost several times those of cp.
const WriteChunk = 1 << 20

// WriteAt writes p at off in pieces of at most WriteChunk bytes.
func WriteAt(f *os.File, p []byte, off int64) error {
	for len(p) > 0 {
		n := min(len(p), WriteChunk)
		if _, err := f.WriteAt(p[:n], off); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}
