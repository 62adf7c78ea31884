package layout

import (
	"fmt"
	"os"
	"sync"

	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Regions is a Sink over tensor payloads a caller placed in files it
// opened: the torch.save streams of DCP rank files, one per chunk, many to
// a file. Region i is its n bytes at off of f. Writes to disjoint ranges
// may run at once; it keeps each range's CRC-32 so that CRC gives a
// region's once every byte of it was written.
type Regions struct {
	regs   []region
	files  map[*os.File]int // each file's index, in order of first Add
	mu     sync.Mutex
	pieces [][]torchfile.Piece
	// Writeback starts the writeback of every range once written, so that
	// the final sync of a large file finds most of it on disk.
	Writeback bool
}

type region struct {
	f      *os.File
	off, n int64
}

// Add places a region of n bytes at off of f and returns its index.
func (g *Regions) Add(f *os.File, off, n int64) int {
	if g.files == nil {
		g.files = map[*os.File]int{}
	}
	if _, ok := g.files[f]; !ok {
		g.files[f] = len(g.files)
	}
	g.regs = append(g.regs, region{f: f, off: off, n: n})
	g.pieces = append(g.pieces, nil)
	return len(g.regs) - 1
}

// FileOf is the index of region i's file: WriteFills has the workers
// write different files at once.
func (g *Regions) FileOf(i int) int {
	if i < 0 || i >= len(g.regs) {
		return -1
	}
	return g.files[g.regs[i].f]
}

func (g *Regions) check(i int, off, n int64) (region, error) {
	if i < 0 || i >= len(g.regs) {
		return region{}, fmt.Errorf("no region %d", i)
	}
	r := g.regs[i]
	if off < 0 || n < 0 || off+n > r.n {
		return region{}, fmt.Errorf("%s: %d bytes at %d outside a region of %d bytes at %d", r.f.Name(), n, off, r.n, r.off)
	}
	return r, nil
}

func (g *Regions) record(i int, p torchfile.Piece) {
	g.mu.Lock()
	g.pieces[i] = append(g.pieces[i], p)
	g.mu.Unlock()
}

// WriteAt writes p at byte off of region i.
func (g *Regions) WriteAt(i int, p []byte, off int64) error {
	r, err := g.check(i, off, int64(len(p)))
	if err != nil {
		return err
	}
	if err := fsutil.WriteAt(r.f, p, r.off+off); err != nil {
		return fmt.Errorf("%s: %w", r.f.Name(), err)
	}
	g.written(r, off, int64(len(p)))
	g.record(i, torchfile.NewPiece(off, p))
	return nil
}

// CopyFrom copies n bytes of src at srcOff to byte off of region i in the
// kernel through c, the CRC taken on the way (read back, or made from the
// source's block CRC-32s in c.Blocks: atomic/FORMAT.md, "block_crc32").
func (g *Regions) CopyFrom(c *fsutil.Copier, i int, src *os.File, srcOff, off, n int64) error {
	r, err := g.check(i, off, n)
	if err != nil {
		return err
	}
	crc, err := c.CopyRangeCRC(r.f, r.off+off, src, srcOff, n)
	if err != nil {
		return err
	}
	g.written(r, off, n)
	g.record(i, torchfile.Piece{Off: off, Len: n, CRC: crc})
	return nil
}

// written starts the writeback of n bytes at off of region r when asked.
func (g *Regions) written(r region, off, n int64) {
	if g.Writeback {
		fsutil.StartWriteback(r.f, r.off+off, n)
	}
}

// CRC is the CRC-32 (IEEE) of region i, an error unless its bytes were
// each written exactly once.
func (g *Regions) CRC(i int) (uint32, error) {
	if i < 0 || i >= len(g.regs) {
		return 0, fmt.Errorf("no region %d", i)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	crc, err := torchfile.CombinePieces(g.pieces[i], g.regs[i].n)
	if err != nil {
		return 0, fmt.Errorf("%s: region at %d: %w", g.regs[i].f.Name(), g.regs[i].off, err)
	}
	return crc, nil
}
