package deepspeed

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

func TestFixturesZero3(t *testing.T) {
	testkit.ConvertCases(t, "zero3", 13, func(t *testing.T, dir string) *fragment.Table {
		tbl, err := IndexZero3(context.Background(), dir, Zero3Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}, nil)
}

// TestPaperPadding: 1024 elements on DP 3 pad to 1026, 342 per rank.
func TestPaperPadding(t *testing.T) {
	tbl, err := IndexZero3(context.Background(), testkit.Fixture("zero3", "paper_1024_dp3", "checkpoint"), Zero3Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tbl.Params {
		if p.Numel() == 1024 {
			if p.Info.Padding != 2 || len(p.States[0].Frags) != 3 || p.States[0].Frags[0].Len != 342 {
				t.Fatalf("%s: padding %d, %d fragments of %d", p.Name, p.Info.Padding, len(p.States[0].Frags), p.States[0].Frags[0].Len)
			}
			return
		}
	}
	t.Fatal("no 1024-element parameter")
}

// TestSameStateAsZeRO1: the ZeRO-3 checkpoints tinylm_dp2/dp3 hold the state of the real
// DeepSpeed ZeRO-1 checkpoint z1_dp2_fp32; both convert to byte-identical atomic files.
func TestSameStateAsZeRO1(t *testing.T) {
	z1dir := testkit.Fixture("deepspeed-real", "z1_dp2_fp32", "checkpoint")
	z1, err := Index(context.Background(), z1dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref := testkit.Convert(t, z1, 2)
	for _, c := range []string{"tinylm_dp2", "tinylm_dp3"} {
		z3, err := IndexZero3(context.Background(), testkit.Fixture("zero3", c, "checkpoint"), Zero3Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := testkit.Convert(t, z3, 2)
		for _, p := range z1.Params {
			for _, st := range []string{fragment.FP32, fragment.ExpAvg, fragment.ExpAvgSq} {
				a, err1 := os.ReadFile(filepath.Join(ref, atomic.StatePath(p.Name, st)))
				b, err2 := os.ReadFile(filepath.Join(got, atomic.StatePath(p.Name, st)))
				if err1 != nil || err2 != nil {
					t.Fatalf("%s/%s: %v %v", p.Name, st, err1, err2)
				}
				if !bytes.Equal(a, b) {
					t.Errorf("%s: %s/%s differs from the ZeRO-1 conversion", c, p.Name, st)
				}
			}
		}
	}
}

func TestMissingGridCell(t *testing.T) {
	src := testkit.Fixture("zero3", "tp2_dp2_bf16", "checkpoint")
	d := testkit.CopyTree(t, src)
	tag, _ := os.ReadFile(filepath.Join(d, "latest"))
	victim := filepath.Join(d, strings.TrimSpace(string(tag)), "zero_pp_rank_1_mp_rank_01_model_states.pt")
	if err := os.Remove(victim); err != nil {
		t.Fatal(err)
	}
	_, err := IndexZero3(context.Background(), d, Zero3Options{})
	if err == nil || !strings.Contains(err.Error(), "missing rank file zero_pp_rank_1_mp_rank_01_model_states.pt") {
		t.Fatalf("error %v", err)
	}
}
