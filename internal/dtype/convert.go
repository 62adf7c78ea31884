package dtype

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// ToFloat32 converts little-endian elements of type from in src into
// little-endian float32 elements in dst, exactly as torch's .float() does:
// bfloat16 and float16 widen exactly (NaN payloads kept), float64 and
// integers round to nearest even, bool becomes 0 or 1.
// dst must hold len(src)/from.Size()*4 bytes.
func ToFloat32(dst, src []byte, from DType) error {
	es := from.Size()
	if es == 0 {
		return fmt.Errorf("cannot convert %v to float32", from)
	}
	if len(src)%es != 0 {
		return fmt.Errorf("%d bytes is not a whole number of %v elements", len(src), from)
	}
	n := len(src) / es
	if len(dst) < 4*n {
		return fmt.Errorf("destination holds %d bytes, need %d", len(dst), 4*n)
	}
	dst = dst[:4*n]
	le := binary.LittleEndian
	switch from {
	case Float32:
		copy(dst, src)
	case BFloat16:
		bfloat16ToFloat32(dst, src, n)
	case Float16:
		float16ToFloat32(dst, src, n)
	case Float64:
		for i := 0; i < n; i++ {
			f := float32(math.Float64frombits(le.Uint64(src[8*i:])))
			le.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	case Int8:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(int8(src[i]))))
		}
	case Uint8:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(src[i])))
		}
	case Bool:
		for i := 0; i < n; i++ {
			var f float32
			if src[i] != 0 {
				f = 1
			}
			le.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	case Int16:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(int16(le.Uint16(src[2*i:])))))
		}
	case Uint16:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(le.Uint16(src[2*i:]))))
		}
	case Int32:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(int32(le.Uint32(src[4*i:])))))
		}
	case Uint32:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(le.Uint32(src[4*i:]))))
		}
	case Int64:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(int64(le.Uint64(src[8*i:])))))
		}
	case Uint64:
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(float32(le.Uint64(src[8*i:]))))
		}
	case Float8E4M3FN, Float8E5M2, Float8E4M3FNUZ, Float8E5M2FNUZ:
		f8 := float8Formats[from]
		for i := 0; i < n; i++ {
			le.PutUint32(dst[4*i:], math.Float32bits(f8.decode(src[i])))
		}
	default:
		return fmt.Errorf("cannot convert %v to float32", from)
	}
	return nil
}

// float8 describes an 8-bit float layout: 1 sign bit, expBits, manBits.
type float8 struct {
	expBits, manBits uint
	bias             int
	ieee             bool // all-ones exponent is Inf/NaN (e5m2)
	fnuz             bool // 0x80 is the only NaN, no negative zero, no Inf
}

var float8Formats = map[DType]float8{
	Float8E4M3FN:   {4, 3, 7, false, false},
	Float8E5M2:     {5, 2, 15, true, false},
	Float8E4M3FNUZ: {4, 3, 8, false, true},
	Float8E5M2FNUZ: {5, 2, 16, false, true},
}

func (f float8) decode(b byte) float32 {
	if f.fnuz && b == 0x80 {
		return float32(math.NaN())
	}
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	expMask := byte(1)<<f.expBits - 1
	manMask := byte(1)<<f.manBits - 1
	e := (b >> f.manBits) & expMask
	m := b & manMask
	switch {
	case f.ieee && e == expMask:
		if m == 0 {
			return sign * float32(math.Inf(1))
		}
		return float32(math.NaN())
	case !f.ieee && !f.fnuz && e == expMask && m == manMask:
		return float32(math.NaN()) // e4m3fn: S.1111.111 is NaN, no Inf
	case e == 0:
		return sign * float32(math.Ldexp(float64(m), 1-f.bias-int(f.manBits)))
	}
	return sign * float32(math.Ldexp(float64(uint(m)|1<<f.manBits), int(e)-f.bias-int(f.manBits)))
}

// Float32s decodes little-endian float32 bytes (as written by ToFloat32).
func Float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// Float32Bytes encodes float32 values as little-endian bytes.
func Float32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
	}
	return out
}

// bfloat16ToFloat32 widens n elements: bfloat16 is the upper half of a
// float32, so four elements (one 64-bit load) become two 64-bit stores of
// shifted halves; no per-element calls or byte stores.
func bfloat16ToFloat32(dst, src []byte, n int) {
	le := binary.LittleEndian
	i := 0
	for ; i+4 <= n; i += 4 {
		v := le.Uint64(src[2*i : 2*i+8 : 2*i+8])
		d := dst[4*i : 4*i+16 : 4*i+16]
		le.PutUint64(d[0:8], (v&0xffff)<<16|(v&0xffff0000)<<32)
		le.PutUint64(d[8:16], (v>>16)&0xffff0000|v&0xffff000000000000)
	}
	for ; i < n; i++ {
		le.PutUint32(dst[4*i:], uint32(le.Uint16(src[2*i:]))<<16)
	}
}

// float16ToFloat32 widens n IEEE half elements exactly. Normal numbers
// (almost all of a checkpoint) are rebiased with shifts and one add; zeros,
// subnormals, infinities and NaNs (payload kept) take the exact library path.
func float16ToFloat32(dst, src []byte, n int) {
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		h := uint32(le.Uint16(src[2*i : 2*i+2 : 2*i+2]))
		var u uint32
		if e := h & 0x7c00; e != 0 && e != 0x7c00 {
			u = (h&0x8000)<<16 | ((h&0x7fff)<<13 + 0x38000000)
		} else {
			u = math.Float32bits(float16.Frombits(uint16(h)).Float32())
		}
		le.PutUint32(dst[4*i:4*i+4:4*i+4], u)
	}
}
