package deepspeed

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

func TestRealZero3Checkpoint(t *testing.T) {
	dir := testkit.Fixture("deepspeed-real", "z3_dp2_fp32")
	if !new(Scan).DetectZero3(filepath.Join(dir, "checkpoint")) {
		t.Fatal("not detected as ZeRO-3")
	}
	tbl, err := IndexZero3(context.Background(), filepath.Join(dir, "checkpoint"), Zero3Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Degrees.DP != 2 || tbl.Degrees.ZeRO != 3 || len(tbl.Params) != 18 {
		t.Fatalf("degrees %+v, %d params", tbl.Degrees, len(tbl.Params))
	}
	dst := testkit.Convert(t, tbl, 2)
	testkit.Check(t, dst, filepath.Join(dir, "truth.pt"))
	testkit.CheckWithTorch(t, dst, filepath.Join(dir, "truth.pt"))
}
