#include "textflag.h"

// Constants of narrowBF16AVX2, each broadcast to the eight lanes.
DATA bf16const<>+0(SB)/4, $0x7fffffff  // |x| mask
DATA bf16const<>+4(SB)/4, $0x7f800000  // +Inf: |x| above it is a NaN
DATA bf16const<>+8(SB)/4, $0x00007fff  // half an ulp, less one
DATA bf16const<>+12(SB)/4, $0x00000001 // the kept lowest bit
GLOBL bf16const<>(SB), RODATA|NOPTR, $16

// func narrowBF16AVX2(dst, src *byte, n int)
// Rounds n float32 (n a multiple of 16) to bfloat16 as BFloat16Bits does:
// r = (x + 0x7fff + (x>>16)&1) >> 16 (no carry leaves a lane unless x is a
// NaN), and 0xffff for a NaN (its lane is set to all ones before the
// shift). The sixteen 32-bit results of two loads are packed to 16 bits
// (VPACKUSDW, values <= 0xffff: no saturation) and put back in order
// (VPERMQ: the pack interleaves the 128-bit halves).
TEXT ·narrowBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTD bf16const<>+0(SB), Y10
	VPBROADCASTD bf16const<>+4(SB), Y11
	VPBROADCASTD bf16const<>+8(SB), Y12
	VPBROADCASTD bf16const<>+12(SB), Y13

loop:
	CMPQ CX, $16
	JB   done
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1

	VPSRLD   $16, Y0, Y2
	VPAND    Y13, Y2, Y2
	VPADDD   Y12, Y0, Y3
	VPADDD   Y2, Y3, Y3
	VPAND    Y10, Y0, Y4
	VPCMPGTD Y11, Y4, Y4
	VPOR     Y4, Y3, Y3
	VPSRLD   $16, Y3, Y3

	VPSRLD   $16, Y1, Y5
	VPAND    Y13, Y5, Y5
	VPADDD   Y12, Y1, Y6
	VPADDD   Y5, Y6, Y6
	VPAND    Y10, Y1, Y7
	VPCMPGTD Y11, Y7, Y7
	VPOR     Y7, Y6, Y6
	VPSRLD   $16, Y6, Y6

	VPACKUSDW Y6, Y3, Y8
	VPERMQ    $0xd8, Y8, Y8
	VMOVDQU   Y8, (DI)

	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JMP  loop

done:
	VZEROUPPER
	RET
