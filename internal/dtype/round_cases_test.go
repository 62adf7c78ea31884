package dtype

import "testing"

// The expected bits are those torch 1.13 and 2.6 give for
// torch.tensor([x], dtype=torch.float32).to(dtype).view(torch.int16);
// the Python package's tests compare every value of the loaded tensors
// with torch's own casts as well.
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
		{0x477FE000, 0x4780, 0x7BFF}, // 65504: fp16 max
		{0x33800000, 0x3380, 0x0001}, // 2^-24: the smallest fp16 subnormal
		{0x33800001, 0x3380, 0x0001}, // just above: smallest subnormal
		{0x00000001, 0x0000, 0x0000}, // float32 subnormal
		{0x80000000, 0x8000, 0x8000}, // -0
		{0x7F800000, 0x7F80, 0x7C00}, // Inf
		{0x7FC00000, 0xFFFF, 0x7E00}, // NaN
		{0xFFC00000, 0xFFFF, 0xFE00}, // -NaN
	}
	for _, c := range cases {
		if got := BFloat16Bits(c.bits); got != c.bf16 {
			t.Errorf("bf16(%08x) = %04x, want %04x", c.bits, got, c.bf16)
		}
		if got := Float16Bits(c.bits); got != c.fp16 {
			t.Errorf("fp16(%08x) = %04x, want %04x", c.bits, got, c.fp16)
		}
	}
}
