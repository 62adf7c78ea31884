package zero3

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/ucp-project/ucp/internal/testkit"
)

func TestRealZero3Checkpoint(t *testing.T) {
	dir := testkit.Fixture("deepspeed-real", "z3_dp2_fp32")
	if !Detect(filepath.Join(dir, "checkpoint")) {
		t.Fatal("not detected as ZeRO-3")
	}
	tbl, err := Index(context.Background(), filepath.Join(dir, "checkpoint"), Options{})
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
