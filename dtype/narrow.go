package dtype

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// FromFloat32 writes float32 values as little-endian elements of type to
// into dst (len(src)*to.Size() bytes), exactly as torch's .to(dtype) does
// on the CPU: bfloat16 and float16 round to nearest even; a NaN becomes
// 0xFFFF in bfloat16 (the vectorised cast torch's tensors take, not c10's
// scalar 0x7FC0) and sign|0x7E00 in float16. Only float32, bfloat16 and
// float16 are supported.
func FromFloat32(dst []byte, src []float32, to DType) error {
	es := to.Size()
	if to != Float32 && to != BFloat16 && to != Float16 {
		return fmt.Errorf("cannot convert float32 to %v", to)
	}
	if len(dst) < es*len(src) {
		return fmt.Errorf("destination holds %d bytes, need %d", len(dst), es*len(src))
	}
	le := binary.LittleEndian
	switch to {
	case Float32:
		for i, f := range src {
			le.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	case BFloat16:
		for i, f := range src {
			le.PutUint16(dst[2*i:], BFloat16Bits(f))
		}
	case Float16:
		for i, f := range src {
			le.PutUint16(dst[2*i:], Float16Bits(f))
		}
	}
	return nil
}

// BFloat16Bits rounds f to bfloat16 as a torch CPU tensor cast does
// (c10's round_to_nearest_even; NaN 0xFFFF as ATen's cvtfp32_bf16).
func BFloat16Bits(f float32) uint16 {
	if f != f {
		return 0xFFFF
	}
	u := math.Float32bits(f)
	return uint16((u + (u>>16)&1 + 0x7FFF) >> 16)
}

// Float16Bits rounds f to IEEE half precision, to nearest even, as
// c10's fp16_ieee_from_fp32_value does (NaN: sign | 0x7E00).
func Float16Bits(f float32) uint16 {
	if f != f {
		return uint16(math.Float32bits(f)>>16)&0x8000 | 0x7E00
	}
	return float16.Fromfloat32(f).Bits()
}
