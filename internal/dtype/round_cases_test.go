package dtype

import (
	"encoding/binary"
	"testing"
)

// The expected bits are those torch 1.13 and 2.6 give for
// torch.tensor([x], dtype=torch.float32).to(dtype).view(torch.int16) on
// x86 (bfloat16: 0xffff for every NaN; float16: quiet, sign and top
// payload bits kept); the Python package's tests compare every value of
// the loaded tensors with torch's own casts as well. Each case is checked
// through the scalar functions and through FromFloat32.
func TestFromFloat32(t *testing.T) {
	cases := []struct {
		bits       uint32 // float32 input
		bf16, fp16 uint16
	}{
		{0x3F800000, 0x3F80, 0x3C00}, // 1
		{0x3F808000, 0x3F80, 0x3C04}, // 1 + 2^-8: bf16 tie, even stays
		{0x3F818000, 0x3F82, 0x3C0C}, // tie, odd rounds up
		{0x3F808001, 0x3F81, 0x3C04}, // above the tie
		{0xC0490FDB, 0xC049, 0xC248}, // -pi
		{0x7F7FFFFF, 0x7F80, 0x7C00}, // max float: bf16 and fp16 overflow to Inf
		{0x477FF000, 0x4780, 0x7C00}, // 65520 rounds to fp16 Inf
		{0x477FEFFF, 0x4780, 0x7BFF}, // just below: fp16 max
		{0x477FE000, 0x4780, 0x7BFF}, // 65504: fp16 max
		{0x33000000, 0x3300, 0x0000}, // 2^-25: half of the smallest subnormal, to even (0)
		{0x33000001, 0x3300, 0x0001},
		{0x33800000, 0x3380, 0x0001}, // 2^-24: the smallest fp16 subnormal
		{0x33800001, 0x3380, 0x0001}, // just above: smallest subnormal
		{0x00000001, 0x0000, 0x0000}, // float32 subnormal
		{0x80000000, 0x8000, 0x8000}, // -0
		{0x7F800000, 0x7F80, 0x7C00}, // Inf
		{0x7FC00000, 0xFFFF, 0x7E00}, // NaN
		{0xFFC00000, 0xFFFF, 0xFE00}, // -NaN
		{0x7FA00001, 0xFFFF, 0x7F00}, // signalling NaN with a payload
		{0xFFA00001, 0xFFFF, 0xFF00},
		{0x7FFFFFFF, 0xFFFF, 0x7FFF},
	}
	for _, c := range cases {
		if got := BFloat16Bits(c.bits); got != c.bf16 {
			t.Errorf("bf16(%08x) = %04x, want %04x", c.bits, got, c.bf16)
		}
		if got := Float16Bits(c.bits); got != c.fp16 {
			t.Errorf("fp16(%08x) = %04x, want %04x", c.bits, got, c.fp16)
		}
		src := binary.LittleEndian.AppendUint32(nil, c.bits)
		for _, x := range []struct {
			dt   DType
			want uint16
		}{{BFloat16, c.bf16}, {Float16, c.fp16}} {
			dst := make([]byte, 2)
			if err := FromFloat32(dst, src, x.dt); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint16(dst); got != x.want {
				t.Errorf("FromFloat32 %v(%#08x) = %#04x, want %#04x", x.dt, c.bits, got, x.want)
			}
		}
	}
	if err := FromFloat32(make([]byte, 4), make([]byte, 4), Int8); err == nil {
		t.Error("int8: no error")
	}
}
