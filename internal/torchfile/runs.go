package torchfile

import (
	"fmt"
	"math"
	"sort"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// Run is a contiguous byte range of a payload that one writer filled, with
// its CRC-32 and, in order, the CRC-32 of its part of each block it touches
// (nil when a piece inside it crossed a block end, as a copy with a known
// CRC may). A node of a multi-node conversion records its pieces of a
// shared file as runs, so that the finalizer can make each block's CRC-32
// from the runs of all nodes without reading the file (atomic/PROTOCOL.md).
type Run struct {
	Piece
	Blocks []uint32
}

// Runs merges pieces (those of a writer with a BlockSize of block, cut at
// its multiples) into runs of contiguous bytes. Overlapping pieces stay in
// separate runs, so that CombinePieces still reports them.
func Runs(pieces []Piece, block int64) []Run {
	ps := append([]Piece(nil), pieces...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Off < ps[j].Off })
	var out []Run
	var cut []bool // per run: every piece inside one block
	for _, p := range ps {
		if p.Len == 0 {
			continue
		}
		if n := len(out); n == 0 || out[n-1].Off+out[n-1].Len != p.Off {
			out = append(out, Run{Piece: Piece{Off: p.Off}})
			cut = append(cut, true)
		}
		k := len(out) - 1
		r := &out[k]
		r.CRC = fsutil.CRC32Combine(r.CRC, p.CRC, p.Len)
		r.Len += p.Len
		switch {
		case !cut[k]:
		case p.Off/block != (p.Off+p.Len-1)/block:
			cut[k], r.Blocks = false, nil
		case len(r.Blocks) > 0 && p.Off%block != 0: // the block the run's last piece ended in
			last := len(r.Blocks) - 1
			r.Blocks[last] = fsutil.CRC32Combine(r.Blocks[last], p.CRC, p.Len)
		default:
			r.Blocks = append(r.Blocks, p.CRC)
		}
	}
	return out
}

// Parts returns the run cut at the multiples of block, one piece per
// Blocks entry, after checking that they are as many as the blocks the run
// touches and that they combine to the run's CRC-32.
func (r Run) Parts(block int64) ([]Piece, error) {
	if r.Off < 0 || r.Len <= 0 || r.Len > math.MaxInt64-r.Off {
		return nil, fmt.Errorf("bytes [%d, %d+%d): not a byte range", r.Off, r.Off, r.Len)
	}
	end := r.Off + r.Len
	if want := (end-1)/block - r.Off/block + 1; int64(len(r.Blocks)) != want {
		return nil, fmt.Errorf("bytes [%d, %d): %d block CRC-32s for the %d blocks they touch", r.Off, end, len(r.Blocks), want)
	}
	out := make([]Piece, len(r.Blocks))
	var crc uint32
	off := r.Off
	for i, c := range r.Blocks {
		n := min(end, (off/block+1)*block) - off
		out[i] = Piece{Off: off, Len: n, CRC: c}
		crc = fsutil.CRC32Combine(crc, c, n)
		off += n
	}
	if crc != r.CRC {
		return nil, fmt.Errorf("bytes [%d, %d): the block CRC-32s combine to %08x, but the range's CRC-32 is %08x", r.Off, end, crc, r.CRC)
	}
	return out, nil
}
