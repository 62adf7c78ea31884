package fsutil

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopyRangeBlocks copies ranges of a file whose block CRCs are known:
// the bytes land exactly, the CRC is hash/crc32's of the bytes, the whole
// blocks inside a range are not read (a byte changed in one after the
// block CRCs were taken does not change the CRC, one in a partial end
// block does), a range outside the blocks or of another file is read back
// as before, and Check refuses block CRCs that are not the record's.
func TestCopyRangeBlocks(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	const start, size, length = 100, 4096, 10*4096 + 123
	data := make([]byte, start+length+50)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	srcPath := filepath.Join(dir, "src")
	if err := os.WriteFile(srcPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := os.OpenFile(srcPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	b := &BlockCRCs{File: src, Start: start, Len: length, Size: size}
	for k := int64(0); k*size < length; k++ {
		b.CRCs = append(b.CRCs, crc32.ChecksumIEEE(data[start+k*size:start+min((k+1)*size, length)]))
	}
	if err := b.Check(crc32.ChecksumIEEE(data[start : start+length])); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []*BlockCRCs{
		{File: src, Start: start, Len: length, Size: size, CRCs: b.CRCs[1:]},
		{File: src, Start: start, Len: length, Size: size, CRCs: append([]uint32{b.CRCs[0] ^ 1}, b.CRCs[1:]...)},
	} {
		if err := bad.Check(crc32.ChecksumIEEE(data[start : start+length])); err == nil || !strings.Contains(err.Error(), srcPath) {
			t.Errorf("bad block CRCs: %v", err)
		}
	}
	type rng2 struct{ off, n int64 }
	cases := []rng2{{start, length}, {start, 0}, {start + 1, 10}, {start + size, size}, {start + size - 1, 2},
		{start + 3, length - 3}, {start, 5*size + 7}, {start + length - 1, 1}, {start + 2*size, length - 2*size}}
	for range 50 {
		off := start + rng.Int64N(length)
		cases = append(cases, rng2{off, rng.Int64N(start + length - off + 1)})
	}
	dstPath := filepath.Join(dir, "dst")
	dst, err := os.Create(dstPath)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	for _, cp := range []*Copier{{Blocks: b}, {Blocks: b, kernel: func(*os.File, int64, *os.File, int64, int) (int, error) { return 0, errKernelUnsupported }}} {
		for _, c := range cases {
			crc, err := cp.CopyRangeCRC(dst, 7, src, c.off, c.n)
			if err != nil {
				t.Fatal(err)
			}
			want := data[c.off : c.off+c.n]
			if crc != crc32.ChecksumIEEE(want) || cp.Last != crc {
				t.Errorf("range [%d, +%d): crc %08x, want %08x", c.off, c.n, crc, crc32.ChecksumIEEE(want))
			}
			got := make([]byte, c.n)
			if _, err := dst.ReadAt(got, 7); c.n > 0 && err != nil || !bytes.Equal(got, want) {
				t.Errorf("range [%d, +%d): copied bytes differ (%v)", c.off, c.n, err)
			}
		}
	}
	// Change byte 5 of block 3 on disk, keeping the old block CRCs.
	at := int64(start + 3*size + 5)
	if _, err := src.WriteAt([]byte{data[at] ^ 0xff}, at); err != nil {
		t.Fatal(err)
	}
	cp := &Copier{Blocks: b}
	if crc, err := cp.CopyRangeCRC(dst, 0, src, start+size-10, 4*size); err != nil || crc != crc32.ChecksumIEEE(data[start+size-10:start+5*size-10]) {
		t.Errorf("block 3 was read: %08x %v", crc, err)
	}
	if crc, _ := cp.CopyRangeCRC(dst, 0, src, start+3*size+1, 3*size); crc == crc32.ChecksumIEEE(data[start+3*size+1:start+6*size+1]) {
		t.Error("partial head block 3 was not read")
	}
	// Another file, or a range beyond the blocks: read back.
	data[at] ^= 0xff // as on disk now
	for _, c := range []rng2{{0, start + 10}, {start + length - 5, 20}, {start + 3*size, size + 1}} {
		if c.off == start+3*size {
			cp.Blocks = &BlockCRCs{File: dst, Start: b.Start, Len: b.Len, Size: b.Size, CRCs: b.CRCs} // another file's
		}
		if crc, err := cp.CopyRangeCRC(dst, 0, src, c.off, c.n); err != nil || crc != crc32.ChecksumIEEE(data[c.off:c.off+c.n]) {
			t.Errorf("range [%d, +%d) outside the blocks: %08x %v", c.off, c.n, crc, err)
		}
	}
}
