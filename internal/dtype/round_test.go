package dtype

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
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
			checkTorch(t, out, 2, c.want, fmt.Sprintf(".to(%v)", c.dt))
		})
	}
}
