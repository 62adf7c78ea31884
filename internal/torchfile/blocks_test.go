package torchfile

import (
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// TestRuns: pieces cut at block ends (as a writer with a BlockSize makes
// them) merge into runs of contiguous bytes whose block CRC-32s cut back
// into parts that, from several writers, give each block's CRC-32; a piece
// across a block end leaves its run without block CRC-32s, overlapping
// pieces stay in separate runs, and damaged block CRC-32s are refused.
func TestRuns(t *testing.T) {
	const block, n = 100, 450
	data := make([]byte, n)
	rng := rand.New(rand.NewPCG(28, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	piece := func(off, end int64) Piece { return NewPiece(off, data[off:end]) }
	// cut is what blobFile.cuts makes of a write of [off, end).
	cut := func(off, end int64) []Piece {
		var ps []Piece
		for off < end {
			k := min(end, (off/block+1)*block)
			ps = append(ps, piece(off, k))
			off = k
		}
		return ps
	}
	var want []uint32
	for k := int64(0); k < n; k += block {
		want = append(want, crc32.ChecksumIEEE(data[k:min(k+block, n)]))
	}

	// Writer A: [0, 130) in two writes, and [310, 450); B: [130, 310).
	a := append(append(cut(30, 130), cut(0, 30)...), cut(310, n)...)
	b := cut(130, 310)
	var parts []Piece
	runs := 0
	for _, w := range [][]Piece{a, b} {
		for _, r := range Runs(w, block) {
			runs++
			if r.CRC != crc32.ChecksumIEEE(data[r.Off:r.Off+r.Len]) {
				t.Errorf("run [%d, %d): CRC %08x", r.Off, r.Off+r.Len, r.CRC)
			}
			ps, err := r.Parts(block)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, ps...)
		}
	}
	if runs != 3 {
		t.Errorf("%d runs, want 3", runs)
	}
	if got := CombineBlocks(parts, n, block); !slices.Equal(got, want) {
		t.Errorf("blocks %x, want %x", got, want)
	}

	if rs := Runs([]Piece{piece(0, 50), piece(50, 250), piece(250, 260)}, block); len(rs) != 1 || rs[0].Blocks != nil || rs[0].Len != 260 {
		t.Errorf("a piece across block ends: runs %+v, want one without block CRC-32s", rs)
	}
	if rs := Runs([]Piece{piece(0, 50), piece(40, 60)}, block); len(rs) != 2 {
		t.Errorf("overlapping pieces: runs %+v, want 2", rs)
	}

	r := Runs(cut(130, 310), block)[0]
	for _, c := range []struct {
		name string
		edit func(r *Run)
		want string
	}{
		{"a block CRC changed", func(r *Run) { r.Blocks[1] ^= 1 }, "combine to"},
		{"the range's CRC changed", func(r *Run) { r.CRC ^= 1 }, "combine to"},
		{"a block CRC missing", func(r *Run) { r.Blocks = r.Blocks[1:] }, "2 block CRC-32s for the 3 blocks"},
		{"no bytes", func(r *Run) { r.Len = 0 }, "not a byte range"},
		{"negative offset", func(r *Run) { r.Off = -1 }, "not a byte range"},
	} {
		d := Run{Piece: r.Piece, Blocks: slices.Clone(r.Blocks)}
		c.edit(&d)
		if _, err := d.Parts(block); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}
