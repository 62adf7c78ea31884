package torchfile

import (
	"fmt"
	"hash/crc32"
	"sort"
)

// crc32Combine returns the CRC-32 (IEEE) of A||B from crcA, crcB and len(B),
// so that pieces of one record written concurrently by several reducers
// still give the record's real CRC. This is zlib's crc32_combine: apply
// len(B) zero bytes to crcA through the GF(2) matrix of the CRC register.
func crc32Combine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	var even, odd [32]uint32
	odd[0] = 0xedb88320 // the reflected polynomial: the operator for one zero bit
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2MatrixSquare(even[:], odd[:]) // two zero bits
	gf2MatrixSquare(odd[:], even[:]) // four zero bits
	for {
		gf2MatrixSquare(even[:], odd[:]) // one zero byte first, then doubling
		if lenB&1 != 0 {
			crcA = gf2MatrixTimes(even[:], crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
		gf2MatrixSquare(odd[:], even[:])
		if lenB&1 != 0 {
			crcA = gf2MatrixTimes(odd[:], crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

func gf2MatrixTimes(mat []uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2MatrixSquare(square, mat []uint32) {
	for n := 0; n < 32; n++ {
		square[n] = gf2MatrixTimes(mat, mat[n])
	}
}

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
		crc = crc32Combine(crc, p.CRC, p.Len)
		at += p.Len
	}
	if at != size {
		return 0, fmt.Errorf("bytes [%d, %d) were never written", at, size)
	}
	return crc, nil
}
