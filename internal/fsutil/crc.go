package fsutil

// CRC32Combine returns the CRC-32 (IEEE) of A||B from crcA = CRC(A),
// crcB = CRC(B) and len(B), without the bytes: pieces of one record written
// or copied separately still give the record's CRC, and the CRC of a range
// copied in the kernel can be made from the CRCs of its blocks. This is
// zlib's crc32_combine (1.2.12 and later): the CRC is linear over GF(2), so
// CRC(A||B) = CRC(A)·x^(8·len(B)) mod P xor CRC(B) (the register's initial
// and final inversion cancel out); x^(8·len(B)) mod P is built from a table
// of x^(2^k) mod P, a few dozen multiplications per call, where the matrix
// method (zlib before 1.2.12) squares 32x32 matrices log2(len(B)) times.
func CRC32Combine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	return multModP(x2nModP(uint64(lenB), 3), crcA) ^ crcB
}

// crcPoly is the CRC-32 (IEEE) polynomial, reflected.
const crcPoly = 0xedb88320

// multModP returns a·b modulo the polynomial (reflected bit order: the
// most significant bit is x^0).
func multModP(a, b uint32) uint32 {
	m := uint32(1) << 31
	var p uint32
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		m >>= 1
		if m == 0 {
			break // a == 0
		}
		if b&1 != 0 {
			b = b>>1 ^ crcPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2nTable[k] is x^(2^k) modulo the polynomial.
var x2nTable = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// x2nModP returns x^(n·2^k) modulo the polynomial.
func x2nModP(n uint64, k uint) uint32 {
	p := uint32(1) << 31 // x^0
	for n != 0 {
		if n&1 != 0 {
			p = multModP(x2nTable[k&31], p)
		}
		n >>= 1
		k++
	}
	return p
}
