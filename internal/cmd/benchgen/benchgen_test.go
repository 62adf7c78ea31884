package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestGeneratedCheckpointConverts: a small generated checkpoint of each
// kind converts, and every atomic element equals the generator's formula
// for the full tensor (so the benchmark's checkpoints are as valid as the
// fixtures).
func TestGeneratedCheckpointConverts(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		index func(string) (*fragment.Table, error)
	}{
		{"zero2 tp2", Config{Hidden: 16, Layers: 2, Vocab: 301, Positions: 8, TP: 2, DP: 3, Seed: 7},
			func(src string) (*fragment.Table, error) {
				return deepspeed.Index(context.Background(), src, deepspeed.Options{})
			}},
		// Row-parallel fragments over 64 KiB: their rows are read with
		// preadv straight into place.
		{"zero2 tp2 wide", Config{Hidden: 256, Layers: 1, Vocab: 301, Positions: 8, TP: 2, DP: 2, Seed: 7},
			func(src string) (*fragment.Table, error) {
				return deepspeed.Index(context.Background(), src, deepspeed.Options{})
			}},
		{"llama tp2", Config{Hidden: 16, Layers: 2, Vocab: 301, Positions: 8, TP: 2, DP: 3, Seed: 7, Llama: true},
			func(src string) (*fragment.Table, error) {
				return deepspeed.Index(context.Background(), src, deepspeed.Options{})
			}},
		{"zero3", Config{Hidden: 16, Layers: 2, Vocab: 301, Positions: 8, TP: 1, DP: 3, Seed: 7, Zero3: true},
			func(src string) (*fragment.Table, error) {
				return deepspeed.IndexZero3(context.Background(), src, deepspeed.Zero3Options{})
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			src := filepath.Join(t.TempDir(), "src")
			if err := Generate(src, cfg); err != nil {
				t.Fatal(err)
			}
			tbl, err := c.index(src)
			if err != nil {
				t.Fatal(err)
			}
			dst := testkit.Convert(t, tbl, 2)
			states := []string{"fp32", "exp_avg", "exp_avg_sq"}
			padded := (cfg.Vocab + 128*cfg.TP - 1) / (128 * cfg.TP) * (128 * cfg.TP)
			rows := int64(cfg.Vocab) // Megatron-DeepSpeed's universal info trims the padding
			if cfg.Zero3 {
				rows = int64(padded) // no universal info: the padded table is the parameter
			}
			index := map[string]int{} // the generator's parameter numbers
			vocabs := 0
			for i, p := range cfg.params() {
				index[p.name] = i
				if p.vocab {
					vocabs++
				}
			}
			checked := 0
			for _, p := range tbl.Params {
				pi, ok := index[p.Name]
				if !ok {
					t.Fatalf("parameter %s is not the generator's", p.Name)
				}
				for si, st := range states {
					got, shape, err := testkit.ReadAtomic(filepath.Join(dst, atomic.StatePath(p.Name, st)))
					if err != nil {
						t.Fatal(err)
					}
					if pi == 0 && shape[0] != rows {
						t.Fatalf("vocabulary rows %d, want %d", shape[0], rows)
					}
					for i, v := range dtype.Float32s(got) {
						if want := Value(cfg.Seed, pi, si, int64(i)); v != want {
							t.Fatalf("%s/%s element %d: %v, want %v", p.Name, st, i, v, want)
						}
						checked++
					}
				}
			}
			if want := 3 * (cfg.Params() - int64(vocabs)*(int64(padded)-rows)*int64(cfg.Hidden)); int64(checked) != want {
				t.Fatalf("checked %d elements, want %d", checked, want)
			}
		})
	}
}
