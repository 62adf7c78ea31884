package fsutil

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRC32Combine: combining the CRCs of A and B gives hash/crc32's CRC
// of A||B, for random bytes and random lengths of A and B, 0 included,
// for zero runs (the CRC of zeros is not 0) and for many pieces combined
// in sequence as the block CRCs of a copied range are.
func TestCRC32Combine(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 3<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	lens := []int{0, 1, 2, 3, 4, 7, 8, 255, 256, 4096, 65537, 1 << 20, 3<<20 - 5}
	for range 200 {
		lens = append(lens, rng.IntN(len(buf)))
	}
	for i, la := range lens {
		lb := lens[(i*7+3)%len(lens)]
		if la+lb > len(buf) {
			lb = len(buf) - la
		}
		a, b := buf[:la], buf[la:la+lb]
		want := crc32.ChecksumIEEE(buf[:la+lb])
		if got := CRC32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), int64(lb)); got != want {
			t.Errorf("A %d bytes, B %d bytes: %08x, want %08x", la, lb, got, want)
		}
	}
	for _, n := range []int{1, 255, 65537, 3 << 20} {
		zeros := make([]byte, n)
		want := crc32.ChecksumIEEE(append([]byte("prefix"), zeros...))
		if got := CRC32Combine(crc32.ChecksumIEEE([]byte("prefix")), crc32.ChecksumIEEE(zeros), int64(n)); got != want {
			t.Errorf("%d zero bytes: %08x, want %08x", n, got, want)
		}
	}
	// Random cuts of the buffer, combined left to right from the empty CRC.
	for range 20 {
		var crc uint32
		for at := 0; at < len(buf); {
			n := min(rng.IntN(1<<20), len(buf)-at) // 0 included
			crc = CRC32Combine(crc, crc32.ChecksumIEEE(buf[at:at+n]), int64(n))
			at += n
		}
		if want := crc32.ChecksumIEEE(buf); crc != want {
			t.Fatalf("pieces: %08x, want %08x", crc, want)
		}
	}
}
