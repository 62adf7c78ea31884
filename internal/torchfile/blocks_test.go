package torchfile

import (
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fsutil"
)

// TestWriterBlockCRCs: with a BlockSize, pieces written (WriteAt) and
// copied (CopyFrom) across block ends give each block's CRC-32 of the
// payload; a piece copied with a known CRC (CopyFromCRC) across a block
// end leaves the blob without block CRCs, and so does no BlockSize.
func TestWriterBlockCRCs(t *testing.T) {
	dir := t.TempDir()
	const block, n = 1000, 4*1000 + 321
	data := make([]byte, n)
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	srcPath := filepath.Join(dir, "src")
	if err := os.WriteFile(srcPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(srcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var want []uint32
	for k := 0; k < n; k += block {
		want = append(want, crc32.ChecksumIEEE(data[k:min(k+block, n)]))
	}
	for _, c := range []struct {
		name      string
		blockSize int64
		knownCRC  bool // [1500, 2600) copied with its CRC known
		ok        bool
	}{{"blocks", block, false, true}, {"known CRC across a block end", block, true, false}, {"no block size", 0, false, false}} {
		t.Run(c.name, func(t *testing.T) {
			w, err := Create(filepath.Join(dir, "out.pt"), NewBlob(dtype.Uint8, []int64{n}, nil))
			if err != nil {
				t.Fatal(err)
			}
			w.BlockSize = c.blockSize
			var cp fsutil.Copier
			steps := []func() error{
				func() error { return w.WriteAt(0, data[:1500], 0) },
				func() error { return w.CopyFrom(&cp, 0, src, 2600, 2600, n-2600) },
			}
			if c.knownCRC {
				steps = append(steps, func() error {
					return w.CopyFromCRC(&cp, 0, src, 1500, 1500, 1100, crc32.ChecksumIEEE(data[1500:2600]))
				})
			} else {
				steps = append(steps, func() error { return w.CopyFrom(&cp, 0, src, 1500, 1500, 1100) })
			}
			for _, s := range steps {
				if err := s(); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Commit(); err != nil {
				t.Fatal(err)
			}
			got := w.BlockCRCs(0)
			if !c.ok {
				if got != nil {
					t.Fatalf("block CRCs %x, want none", got)
				}
				return
			}
			if len(got) != len(want) {
				t.Fatalf("%d block CRCs, want %d", len(got), len(want))
			}
			for k := range want {
				if got[k] != want[k] {
					t.Errorf("block %d: %08x, want %08x", k, got[k], want[k])
				}
			}
		})
	}
}
