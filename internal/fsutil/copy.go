package fsutil

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// CopyBufSize is the buffer a Copier allocates when it has none. Small on
// purpose: it is reused for every piece and stays in the CPU's cache.
// Measured on Linux 6.18 (ext4, 2 cores, a VM): copying 1 GB through a
// 256 KiB buffer cost 0.5-0.6 s of system time, through 1 MiB 1.1-3.2 s
// and through 64 MiB 2.4-3.0 s.
const CopyBufSize = 256 << 10

// copyPiece is how much one copy_file_range call of a hashed copy moves
// before the same bytes are read back for the CRC: small enough that they
// are still in the CPU's cache when they are hashed.
const copyPiece = 1 << 20

// Copier copies byte ranges between open files in the kernel
// (copy_file_range: no user-space copy, and a server-side or reflink copy
// on filesystems that offer one), falling back to pread and pwrite through
// its buffer when the kernel refuses (another filesystem, an old kernel, a
// file type it does not support). With a CRC, each piece copied in the
// kernel is read back through the buffer and hashed while it is still in
// the CPU's cache: on Linux 6.18 (ext4) that cost 0.5-0.8 s of system time
// per GB against 2.4-3.2 s for pread + hash + pwrite through a large
// buffer, and about what copy_file_range alone costs.
// One Copier per goroutine: it owns its buffer, which it reuses.
type Copier struct {
	Buf []byte
	// kernel copies in the kernel (nil: copy_file_range where built in);
	// it returns errKernelUnsupported when the fallback must be used.
	kernel   func(dst *os.File, dstOff int64, src *os.File, srcOff int64, n int) (int, error)
	noKernel bool // the kernel refused once: do not ask again
	// Last is the CRC-32 of the bytes the last successful CopyRangeCRC
	// copied: the source's bytes, which a reader that verifies files
	// from what it reads can count as read (atomic.State.Record).
	Last uint32
	// Blocks, when set by the caller, are the block CRC-32s of the file
	// the next copies read (an atomic state file's tensor data): a
	// CopyRangeCRC inside them is copied in the kernel and its CRC made
	// from them, reading back only the partial blocks at its ends. The
	// copied bytes are then not read by ucp: a source byte corrupted on
	// disk gives an output record whose CRC-32 disagrees with its data,
	// which ucp verify and Python's zipfile catch but torch.load does not
	// (atomic/FORMAT.md, "block_crc32"); callers that must vouch for the
	// bytes (atomic.ReaderOptions.Verify) leave it nil.
	Blocks *BlockCRCs
}

// errKernelUnsupported means the in-kernel copy is not available for
// these files; the bytes must be copied through the buffer.
var errKernelUnsupported = errors.New("in-kernel copy not supported")

// CopyRangeCRC copies n bytes of src at srcOff to dst at dstOff and
// returns the CRC-32 (IEEE) of the bytes copied: read back as they are
// copied, or made from c.Blocks when they describe the range.
func (c *Copier) CopyRangeCRC(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) (uint32, error) {
	var crc uint32
	var err error
	if c.Blocks.covers(src, srcOff, n) {
		if _, err = c.copyRange(dst, dstOff, src, srcOff, n, bigPiece, false); err == nil {
			if crc, err = c.rangeCRC(c.Blocks, srcOff, n); err != nil {
				err = fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
			}
		}
	} else {
		crc, err = c.copyRange(dst, dstOff, src, srcOff, n, copyPiece, true)
	}
	if err == nil {
		c.Last = crc
	}
	return crc, err
}

// bigPiece is one copy_file_range call of a copy that is not read back:
// on Linux 6.18 (ext4) 1 MiB calls cost 10-20% more system time than
// calls of 8 MiB or more.
const bigPiece = 64 << 20

// CopyRange copies n bytes of src at srcOff to dst at dstOff, in the
// kernel where it can, without hashing them: for bytes whose CRC is known
// (a whole zip record of the source).
func (c *Copier) CopyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n int64) error {
	_, err := c.copyRange(dst, dstOff, src, srcOff, n, bigPiece, false)
	return err
}

// copyRange copies in the kernel in calls of at most piece bytes, each
// read back and hashed when hash is set (the CRC is then of every byte),
// and through the buffer where the kernel refuses (always hashed there).
func (c *Copier) copyRange(dst *os.File, dstOff int64, src *os.File, srcOff, n, piece int64, hash bool) (uint32, error) {
	kernel := c.kernel
	if kernel == nil {
		kernel = kernelCopy
	}
	var crc uint32
	for n > 0 && !c.noKernel {
		k, err := kernel(dst, dstOff, src, srcOff, int(min(n, piece)))
		if errors.Is(err, errKernelUnsupported) {
			c.noKernel = true
			break
		}
		if err != nil {
			return 0, fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
		}
		if k == 0 {
			return 0, fmt.Errorf("copying %s to %s: %s ends before byte %d: %w", src.Name(), dst.Name(), src.Name(), srcOff+n, io.ErrUnexpectedEOF)
		}
		if hash {
			if crc, err = c.hash(crc, src, srcOff, int64(k)); err != nil {
				return 0, fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
			}
		}
		n, srcOff, dstOff = n-int64(k), srcOff+int64(k), dstOff+int64(k)
	}
	return c.copyBuffered(crc, dst, dstOff, src, srcOff, n)
}

// hash extends crc with n bytes of f at off, read through the buffer.
func (c *Copier) hash(crc uint32, f *os.File, off, n int64) (uint32, error) {
	if len(c.Buf) == 0 {
		c.Buf = make([]byte, CopyBufSize)
	}
	for n > 0 {
		b := c.Buf[:min(n, int64(len(c.Buf)))]
		if _, err := f.ReadAt(b, off); err != nil {
			return 0, err
		}
		crc = crc32.Update(crc, crc32.IEEETable, b)
		n, off = n-int64(len(b)), off+int64(len(b))
	}
	return crc, nil
}

func (c *Copier) copyBuffered(crc uint32, dst *os.File, dstOff int64, src *os.File, srcOff, n int64) (uint32, error) {
	if len(c.Buf) == 0 {
		c.Buf = make([]byte, CopyBufSize)
	}
	for n > 0 {
		b := c.Buf[:min(n, int64(len(c.Buf)))]
		if _, err := src.ReadAt(b, srcOff); err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%s ends before byte %d: %w", src.Name(), srcOff+int64(len(b)), io.ErrUnexpectedEOF)
			}
			return 0, fmt.Errorf("copying %s to %s: %w", src.Name(), dst.Name(), err)
		}
		crc = crc32.Update(crc, crc32.IEEETable, b)
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

// WriteAt writes p at off: on Linux through a pipe (vmsplice and splice,
// see splice_linux.go), elsewhere or where the kernel refuses with pwrite
// in pieces of at most WriteChunk bytes.
func WriteAt(f *os.File, p []byte, off int64) error { return writeAt(f, p, off) }

func pwriteChunks(f *os.File, p []byte, off int64) error {
	for len(p) > 0 {
		n := min(len(p), WriteChunk)
		if _, err := f.WriteAt(p[:n], off); err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}
