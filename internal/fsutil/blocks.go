package fsutil

import (
	"fmt"
	"os"
)

// BlockCRCs are the CRC-32s (IEEE) of the bytes [Start, Start+Len) of File
// in blocks of Size bytes from Start, the last one shorter when Size does
// not divide Len: what an atomic checkpoint records of each state file's
// tensor data (atomic/FORMAT.md, "block_crc32"). With them a range copied
// in the kernel has its CRC without reading the range back.
type BlockCRCs struct {
	File             *os.File
	Start, Len, Size int64
	CRCs             []uint32
}

// Check refuses block CRCs that do not describe Len bytes in Size blocks,
// or whose combination is not want (the record's CRC-32 from the file's
// zip central directory): a sidecar that does not belong to the file.
func (b *BlockCRCs) Check(want uint32) error {
	if b.Size <= 0 || b.Len < 0 || int64(len(b.CRCs)) != (b.Len+b.Size-1)/b.Size {
		return fmt.Errorf("%s: %d block CRC-32s for %d bytes in blocks of %d", b.File.Name(), len(b.CRCs), b.Len, b.Size)
	}
	if got := b.combine(0, int64(len(b.CRCs))); got != want {
		return fmt.Errorf("%s: the block CRC-32s combine to %08x, but the record's CRC-32 is %08x (the file changed or the manifest is not its own)", b.File.Name(), got, want)
	}
	return nil
}

// blockLen is the length of block k.
func (b *BlockCRCs) blockLen(k int64) int64 { return min(b.Size, b.Len-k*b.Size) }

// combine returns the CRC of blocks [from, to).
func (b *BlockCRCs) combine(from, to int64) uint32 {
	var crc uint32
	for k := from; k < to; k++ {
		crc = CRC32Combine(crc, b.CRCs[k], b.blockLen(k))
	}
	return crc
}

// covers reports whether the blocks describe bytes [off, off+n) of f.
func (b *BlockCRCs) covers(f *os.File, off, n int64) bool {
	return b != nil && b.File == f && off >= b.Start && n >= 0 && off+n <= b.Start+b.Len
}

// rangeCRC returns the CRC-32 of bytes [off, off+n) of the file from the
// block CRCs: the whole blocks inside combined, the partial head and tail
// blocks' bytes read through c's buffer and hashed.
func (c *Copier) rangeCRC(b *BlockCRCs, off, n int64) (uint32, error) {
	rel, end := off-b.Start, off-b.Start+n
	first, last := (rel+b.Size-1)/b.Size, end/b.Size // whole blocks [first, last)
	if first >= last {                               // no whole block: hash it all
		return c.hash(0, b.File, off, n)
	}
	crc, err := c.hash(0, b.File, off, first*b.Size-rel)
	if err != nil {
		return 0, err
	}
	crc = CRC32Combine(crc, b.combine(first, last), (last-first)*b.Size)
	tail := end - last*b.Size
	t, err := c.hash(0, b.File, b.Start+last*b.Size, tail)
	if err != nil {
		return 0, err
	}
	return CRC32Combine(crc, t, tail), nil
}
