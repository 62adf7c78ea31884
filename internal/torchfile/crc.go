package torchfile

import (
	"fmt"
	"hash/crc32"
	"sort"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// Piece is a byte range of a record that has been written, with its CRC.
type Piece struct {
	Off, Len int64
	CRC      uint32
}

// NewPiece returns the Piece for p written at off.
func NewPiece(off int64, p []byte) Piece {
	return Piece{Off: off, Len: int64(len(p)), CRC: crc32.ChecksumIEEE(p)}
}

// CombinePieces checks that pieces tile [0, size) exactly once and returns
// the CRC of the whole range.
func CombinePieces(pieces []Piece, size int64) (uint32, error) {
	ps := append([]Piece(nil), pieces...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].Off < ps[j].Off })
	var crc uint32
	var at int64
	for _, p := range ps {
		if p.Len == 0 {
			continue
		}
		if p.Off != at {
			if p.Off < at {
				return 0, fmt.Errorf("bytes [%d, %d) were written twice", p.Off, min(at, p.Off+p.Len))
			}
			return 0, fmt.Errorf("bytes [%d, %d) were never written", at, p.Off)
		}
		crc = fsutil.CRC32Combine(crc, p.CRC, p.Len)
		at += p.Len
	}
	if at != size {
		return 0, fmt.Errorf("bytes [%d, %d) were never written", at, size)
	}
	return crc, nil
}
