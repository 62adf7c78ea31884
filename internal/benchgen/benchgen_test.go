package benchgen_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/atomic"
	"github.com/ucp-project/ucp/dtype"
	"github.com/ucp-project/ucp/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/benchgen"
	"github.com/ucp-project/ucp/internal/truth"
)

// TestGeneratedCheckpointConverts: a small generated checkpoint converts,
// and every atomic element equals the generator's formula for the full
// tensor (so the benchmark's checkpoint is as valid as the fixtures).
func TestGeneratedCheckpointConverts(t *testing.T) {
	c := benchgen.Config{Hidden: 16, Layers: 2, Vocab: 301, Positions: 8, TP: 2, DP: 3, Seed: 7}
	src := filepath.Join(t.TempDir(), "src")
	if err := benchgen.Generate(src, c); err != nil {
		t.Fatal(err)
	}
	tbl, err := deepspeed.Index(context.Background(), src, deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := truth.Convert(t, tbl, 2)
	states := []string{"fp32", "exp_avg", "exp_avg_sq"}
	checked := 0
	for pi, p := range tbl.Params {
		for si, st := range states {
			got, shape, err := truth.ReadAtomic(filepath.Join(dst, atomic.StatePath(p.Name, st)))
			if err != nil {
				t.Fatal(err)
			}
			if pi == 0 && shape[0] != int64(c.Vocab) {
				t.Fatalf("vocabulary rows %d, want %d", shape[0], c.Vocab)
			}
			for i, v := range dtype.Float32s(got) {
				if want := benchgen.Value(c.Seed, pi, si, int64(i)); v != want {
					t.Fatalf("%s/%s element %d: %v, want %v", p.Name, st, i, v, want)
				}
				checked++
			}
		}
	}
	padded := (c.Vocab + 128*c.TP - 1) / (128 * c.TP) * (128 * c.TP)
	if want := 3 * (c.Params() - int64((padded-c.Vocab)*c.Hidden)); int64(checked) != want {
		t.Fatalf("checked %d elements, want %d", checked, want)
	}
}
