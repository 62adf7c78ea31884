package dtype

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
)

// convertDir holds torch's own .float() results, written by
// testdata/gen/torch_fixtures.py with torch 1.13.
const convertDir = "../../testdata/fixtures/torch"

type torchExpect struct {
	N          int      `json:"n"`
	SHA256     string   `json:"sha256"`
	ChunkCRC32 []string `json:"chunk_crc32"`
}

type convertFixture struct {
	Float16All  torchExpect `json:"float16_all"`
	BFloat16All torchExpect `json:"bfloat16_all"`
	Float64Bin  torchExpect `json:"float64_bin"`
	Int64Bin    torchExpect `json:"int64_bin"`
	Explicit    []struct {
		DType string `json:"dtype"`
		In    string `json:"in"`
		Out   string `json:"out"`
	} `json:"explicit"`
}

func readConvertFixture(t *testing.T) convertFixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(convertDir, "convert.json"))
	if err != nil {
		t.Fatalf("%v (run /usr/bin/python3 testdata/gen/torch_fixtures.py)", err)
	}
	var fx convertFixture
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	return fx
}

// TestToFloat32MatchesTorch compares ToFloat32 with torch's Tensor.float()
// bit for bit: every float16 and bfloat16 bit pattern, and thousands of
// float64 and int64 values chosen to hit rounding ties, subnormals,
// overflow and NaN payloads.
func TestToFloat32MatchesTorch(t *testing.T) {
	fx := readConvertFixture(t)
	all16 := make([]byte, 2*65536)
	for i := 0; i < 65536; i++ {
		binary.LittleEndian.PutUint16(all16[2*i:], uint16(i))
	}
	readBin := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(convertDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		dt   DType
		in   []byte
		want torchExpect
	}{
		{"float16 all patterns", Float16, all16, fx.Float16All},
		{"bfloat16 all patterns", BFloat16, all16, fx.BFloat16All},
		{"float64 edge and random", Float64, readBin("convert_float64.bin"), fx.Float64Bin},
		{"int64 edge and random", Int64, readBin("convert_int64.bin"), fx.Int64Bin},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := len(c.in) / c.dt.Size()
			if n != c.want.N {
				t.Fatalf("%d inputs, fixture has %d", n, c.want.N)
			}
			out := make([]byte, 4*n)
			if err := ToFloat32(out, c.in, c.dt); err != nil {
				t.Fatal(err)
			}
			checkTorch(t, out, 4, c.want, ".float()")
		})
	}
}

// TestToFloat32TorchExplicit shows element-level differences for the
// curated special values (NaN payloads, -0, subnormals, ties, overflow).
func TestToFloat32TorchExplicit(t *testing.T) {
	fx := readConvertFixture(t)
	if len(fx.Explicit) != 4 {
		t.Fatalf("%d explicit cases, want 4", len(fx.Explicit))
	}
	for _, c := range fx.Explicit {
		dt, ok := FromTorchName(c.DType)
		if !ok {
			t.Fatalf("unknown dtype %q", c.DType)
		}
		in, _ := hex.DecodeString(c.In)
		want, _ := hex.DecodeString(c.Out)
		got := make([]byte, len(in)/dt.Size()*4)
		if err := ToFloat32(got, in, dt); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(got, want) {
			continue
		}
		es := dt.Size()
		for i := 0; i < len(in)/es; i++ {
			g := binary.LittleEndian.Uint32(got[4*i:])
			w := binary.LittleEndian.Uint32(want[4*i:])
			if g != w {
				t.Errorf("%s %x: got %08x, torch %08x", c.DType, in[i*es:(i+1)*es], g, w)
			}
		}
	}
}

// checkTorch compares out (elements of es bytes) with torch's output of
// the fixture, pointing at the first differing chunk of 4096 elements.
func checkTorch(t *testing.T, out []byte, es int, want torchExpect, op string) {
	t.Helper()
	sum := sha256.Sum256(out)
	if hex.EncodeToString(sum[:]) == want.SHA256 {
		return
	}
	for i, w := range want.ChunkCRC32 {
		chunk := out[i*es*4096 : min(len(out), (i+1)*es*4096)]
		if got := fmt.Sprintf("%08x", crc32.ChecksumIEEE(chunk)); got != w {
			t.Fatalf("elements [%d, %d) differ from torch's %s", i*4096, (i+1)*4096, op)
		}
	}
	t.Fatalf("output differs from torch's %s (sha256 %x)", op, sum)
}
