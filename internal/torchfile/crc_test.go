package torchfile

import (
	"hash/crc32"
	"math/rand"
	"testing"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// crc32Combine of the CRCs of A and B is the CRC of A||B, for lengths of
// B from 0 to beyond 4 GiB's bit patterns (checked on real bytes up to
// 1 MiB; the zero-run cases against hashing the zeros).
func TestCRC32Combine(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, c := range []struct{ a, b int }{{0, 0}, {1, 0}, {0, 1}, {3, 5}, {100, 1}, {7, 4096}, {1 << 20, 12345}, {5, 1<<20 + 3}} {
		buf := make([]byte, c.a+c.b)
		rng.Read(buf)
		want := crc32.ChecksumIEEE(buf)
		got := fsutil.CRC32Combine(crc32.ChecksumIEEE(buf[:c.a]), crc32.ChecksumIEEE(buf[c.a:]), int64(c.b))
		if got != want {
			t.Errorf("A %d bytes, B %d bytes: %08x, want %08x", c.a, c.b, got, want)
		}
	}
	// Long zero runs: combining with B = n zero bytes must equal hashing them.
	for _, n := range []int{1, 255, 256, 65537, 3 << 20} {
		zeros := make([]byte, n)
		a := []byte("prefix")
		want := crc32.ChecksumIEEE(append(append([]byte{}, a...), zeros...))
		if got := fsutil.CRC32Combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(zeros), int64(n)); got != want {
			t.Errorf("%d zero bytes: %08x, want %08x", n, got, want)
		}
	}
}
