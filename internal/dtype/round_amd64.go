package dtype

import "golang.org/x/sys/cpu"

// narrowBF16AVX2 rounds n float32 elements of src to bfloat16 in dst, 16
// at a time (n a multiple of 16), as BFloat16Bits does (round_amd64.s).
//
//go:noescape
func narrowBF16AVX2(dst, src *byte, n int)

// narrowBF16Wide converts as many whole groups of 16 elements as the CPU's
// vector unit takes (none without AVX2) and returns how many it converted.
func narrowBF16Wide(dst, src []byte, n int) int {
	if !cpu.X86.HasAVX2 || n < 16 {
		return 0
	}
	k := n &^ 15
	_ = src[4*k-1]
	_ = dst[2*k-1]
	narrowBF16AVX2(&dst[0], &src[0], k)
	return k
}
