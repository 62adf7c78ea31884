package diff

import (
	"math"
	"testing"
)

// TestCompareChunk pins the documented float policy.
func TestCompareChunk(t *testing.T) {
	nan1 := math.Float32frombits(0x7fc00000)
	nan2 := math.Float32frombits(0x7fc00001)
	inf := float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	cases := []struct {
		name         string
		a, b         float32
		rtol, atol   float64
		differ, nans int64
	}{
		{"same bits", 1.5, 1.5, 0, 0, 0, 0},
		{"one ulp, exact", 1, math.Nextafter32(1, 2), 0, 0, 1, 0},
		{"one ulp, rtol", 1, math.Nextafter32(1, 2), 1e-6, 0, 0, 0},
		{"-0 vs +0, exact", negZero, 0, 0, 0, 1, 0},
		{"-0 vs +0, atol", negZero, 0, 0, 1e-30, 0, 0},
		{"NaN same payload", nan1, nan1, 0, 0, 0, 0},
		{"NaN other payload, exact", nan1, nan2, 0, 0, 1, 1},
		{"NaN other payload, tolerance", nan1, nan2, 0, 1e-3, 0, 0},
		{"NaN vs number, tolerance", nan1, 1, 0, 1e9, 1, 1},
		{"inf vs max float, tolerance", inf, math.MaxFloat32, 1, 1e38, 1, 0},
		{"beyond atol", 1, 1.25, 0, 0.2, 1, 0},
		{"within atol + rtol*|b|", 1, 2, 0.3, 0.5, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := compareChunk([]float32{c.a}, []float32{c.b}, 7, Options{RTol: c.rtol, ATol: c.atol})
			if s.differ != c.differ || s.nan != c.nans {
				t.Fatalf("differ %d nan %d, want %d %d", s.differ, s.nan, c.differ, c.nans)
			}
			if c.differ > 0 && s.first != 7 {
				t.Fatalf("first %d, want 7", s.first)
			}
		})
	}
}
