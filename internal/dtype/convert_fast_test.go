package dtype

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/x448/float16"
)

// TestWidenEveryHalf checks the fast bfloat16 and float16 loops against the
// definition on all 65536 bit patterns, NaN payloads and signed zeros
// included, at every length 0..9 (the four-element loop and its tail) and
// on the whole range at once.
func TestWidenEveryHalf(t *testing.T) {
	src := make([]byte, 2<<16)
	for h := 0; h < 1<<16; h++ {
		binary.LittleEndian.PutUint16(src[2*h:], uint16(h))
	}
	want := map[DType]func(h uint16) uint32{
		BFloat16: func(h uint16) uint32 { return uint32(h) << 16 },
		Float16:  func(h uint16) uint32 { return math.Float32bits(float16.Frombits(h).Float32()) },
	}
	for _, dt := range []DType{BFloat16, Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			check := func(in []byte) {
				n := len(in) / 2
				dst := make([]byte, 4*n+4)
				binary.LittleEndian.PutUint32(dst[4*n:], 0xdeadbeef)
				if err := ToFloat32(dst[:4*n], in, dt); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < n; i++ {
					h := binary.LittleEndian.Uint16(in[2*i:])
					if got, w := binary.LittleEndian.Uint32(dst[4*i:]), want[dt](h); got != w {
						t.Fatalf("n=%d: %#04x widened to %#08x, want %#08x", n, h, got, w)
					}
				}
				if binary.LittleEndian.Uint32(dst[4*n:]) != 0xdeadbeef {
					t.Fatalf("n=%d: wrote past the end", n)
				}
			}
			check(src)
			for n := 0; n <= 9; n++ {
				for start := 0; start+n <= 1<<16; start += 4099 {
					check(src[2*start : 2*(start+n)])
				}
			}
		})
	}
}

func benchmarkWiden(b *testing.B, dt DType) {
	const n = 1 << 20
	src := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(0x3c00+i%0x3000))
	}
	dst := make([]byte, 4*n)
	b.SetBytes(2 * n)
	for b.Loop() {
		if err := ToFloat32(dst, src, dt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWidenBFloat16(b *testing.B) { benchmarkWiden(b, BFloat16) }
func BenchmarkWidenFloat16(b *testing.B)  { benchmarkWiden(b, Float16) }

// TestNarrowBFloat16Lengths checks the four-at-a-time rounding against the
// element rule at every length 0-9 and offset (the tail loop), and that
// nothing is written past the end.
func TestNarrowBFloat16Lengths(t *testing.T) {
	src := make([]byte, 4*4099)
	for i := range 4099 {
		binary.LittleEndian.PutUint32(src[4*i:], uint32(i)*0x9e3779b9) // NaNs, ties and subnormals among them
	}
	for n := 0; n <= 9; n++ {
		for start := 0; start+n <= 4099; start += 37 {
			dst := make([]byte, 2*n+2)
			binary.LittleEndian.PutUint16(dst[2*n:], 0xbeef)
			if err := FromFloat32(dst[:2*n], src[4*start:4*(start+n)], BFloat16); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				u := binary.LittleEndian.Uint32(src[4*(start+i):])
				if got, want := binary.LittleEndian.Uint16(dst[2*i:]), BFloat16Bits(u); got != want {
					t.Fatalf("n=%d: %#08x rounded to %#04x, want %#04x", n, u, got, want)
				}
			}
			if binary.LittleEndian.Uint16(dst[2*n:]) != 0xbeef {
				t.Fatalf("n=%d: wrote past the end", n)
			}
		}
	}
}

func BenchmarkNarrowBFloat16(b *testing.B) {
	const n = 1 << 20
	src := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(src[4*i:], uint32(0x3f800000+i*77))
	}
	dst := make([]byte, 2*n)
	b.SetBytes(4 * n)
	for b.Loop() {
		if err := FromFloat32(dst, src, BFloat16); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNarrowBFloat16Wide checks the vector path (16 at a time where the
// CPU has it) against the element rule: every sign, exponent and top
// mantissa bits (all 2^16 high halves) with the low halves that decide
// the rounding (ties, either side of them, zero, all ones), which covers
// ±0, subnormals, the largest finite values that round to Inf, ±Inf and
// every NaN class; at lengths and offsets that leave tails for the
// four-at-a-time and element loops; and that nothing is written past the
// end.
func TestNarrowBFloat16Wide(t *testing.T) {
	lows := []uint32{0x0000, 0x0001, 0x4000, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xc000, 0xfffe, 0xffff}
	n := 1 << 16 * len(lows)
	src := make([]byte, 4*n)
	for hi := range uint32(1 << 16) {
		for k, lo := range lows {
			binary.LittleEndian.PutUint32(src[4*(int(hi)*len(lows)+k):], hi<<16|lo)
		}
	}
	check := func(start, m int) {
		t.Helper()
		dst := make([]byte, 2*m+2)
		binary.LittleEndian.PutUint16(dst[2*m:], 0xbeef)
		if err := FromFloat32(dst[:2*m], src[4*start:4*(start+m)], BFloat16); err != nil {
			t.Fatal(err)
		}
		for i := range m {
			u := binary.LittleEndian.Uint32(src[4*(start+i):])
			if got, want := binary.LittleEndian.Uint16(dst[2*i:]), BFloat16Bits(u); got != want {
				t.Fatalf("start %d, length %d: %#08x rounded to %#04x, want %#04x", start, m, u, got, want)
			}
		}
		if binary.LittleEndian.Uint16(dst[2*m:]) != 0xbeef {
			t.Fatalf("start %d, length %d: wrote past the end", start, m)
		}
	}
	check(0, n)
	for m := 15; m <= 53; m++ {
		for _, start := range []int{0, 1, 3, 4, 7, 16, len(lows)*0x7f7f + 5} { // the last: the largest finite values, +Inf and NaNs
			check(start, m)
		}
	}
}
