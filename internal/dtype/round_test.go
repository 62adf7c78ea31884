package dtype

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"testing"
)

type castFixture struct {
	Lows     []uint32    `json:"lows"`
	BFloat16 torchExpect `json:"bfloat16"`
	Float16  torchExpect `json:"float16"`
}

// TestFromFloat32MatchesTorch compares FromFloat32 with torch's
// Tensor.to(bfloat16 / float16) bit for bit on every float32 high half
// with tie, near-tie and exact low halves (testdata/gen/torch_fixtures.py).
func TestFromFloat32MatchesTorch(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(convertDir, "cast.json"))
	if err != nil {
		t.Fatalf("%v (run /usr/bin/python3 testdata/gen/torch_fixtures.py)", err)
	}
	var fx castFixture
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Lows) == 0 {
		t.Fatal("cast.json lists no low halves")
	}
	var all, noNaN []byte
	for hi := uint32(0); hi < 1<<16; hi++ {
		for _, lo := range fx.Lows {
			u := hi<<16 | lo
			all = binary.LittleEndian.AppendUint32(all, u)
			if !math.IsNaN(float64(math.Float32frombits(u))) {
				noNaN = binary.LittleEndian.AppendUint32(noNaN, u)
			}
		}
	}
	for _, c := range []struct {
		dt   DType
		in   []byte
		want torchExpect
	}{{BFloat16, all, fx.BFloat16}, {Float16, noNaN, fx.Float16}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			n := len(c.in) / 4
			if n != c.want.N {
				t.Fatalf("%d inputs, fixture has %d", n, c.want.N)
			}
			out := make([]byte, 2*n)
			if err := FromFloat32(out, c.in, c.dt); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(out)
			if hex.EncodeToString(sum[:]) == c.want.SHA256 {
				return
			}
			for i, want := range c.want.ChunkCRC32 {
				chunk := out[i*2*4096 : min(len(out), (i+1)*2*4096)]
				if got := fmt.Sprintf("%08x", crc32.ChecksumIEEE(chunk)); got != want {
					t.Fatalf("elements [%d, %d) differ from torch's .to(%v)", i*4096, (i+1)*4096, c.dt)
				}
			}
			t.Fatalf("output differs from torch (sha256 %x)", sum)
		})
	}
}

// TestFromFloat32Special pins the NaN results torch 2.6 gives on x86
// (bfloat16: 0xffff for every NaN; float16: quiet, sign and top payload
// bits kept) and a few readable values.
func TestFromFloat32Special(t *testing.T) {
	cases := []struct {
		in       uint32
		bf, half uint16
	}{
		{0x7fa00001, 0xffff, 0x7f00},
		{0xffa00001, 0xffff, 0xff00},
		{0x7fffffff, 0xffff, 0x7fff},
		{0x7fc00000, 0xffff, 0x7e00},
		{0x3f808000, 0x3f80, 0x3c04}, // 1.00390625: bfloat16 tie to even
		{0x477ff000, 0x4780, 0x7c00}, // 65520: float16 tie to Inf
		{0x477fefff, 0x4780, 0x7bff},
		{0x33000000, 0x3300, 0x0000}, // 2^-25: half of the smallest subnormal, to even (0)
		{0x33000001, 0x3300, 0x0001},
		{0x80000000, 0x8000, 0x8000},
	}
	for _, c := range cases {
		src := binary.LittleEndian.AppendUint32(nil, c.in)
		for _, x := range []struct {
			dt   DType
			want uint16
		}{{BFloat16, c.bf}, {Float16, c.half}} {
			dst := make([]byte, 2)
			if err := FromFloat32(dst, src, x.dt); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint16(dst); got != x.want {
				t.Errorf("%v(%#08x) = %#04x, want %#04x", x.dt, c.in, got, x.want)
			}
		}
	}
	if err := FromFloat32(make([]byte, 4), make([]byte, 4), Int8); err == nil {
		t.Error("int8: no error")
	}
}
