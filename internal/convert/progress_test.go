package convert

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	ucpatomic "github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestProgressTotal (fault 10): the bar's total is the bytes this node's
// tasks move, without int64 overflow on multi-GB checkpoints (the old
// (src+out)*NodeBytes/sum wrapped around at about 3 GB), and it is what
// the reducers report while converting.
func TestProgressTotal(t *testing.T) {
	// 3 x 300M bf16 elements: 5.4 GB to read and write.
	tbl := testkit.Synthetic(300<<20, 16<<20)
	for _, nodes := range []int{1, 2, 3} {
		plan, err := mapreduce.NewPlan(tbl, mapreduce.PlanOptions{Nodes: nodes, Cores: 2})
		if err != nil {
			t.Fatal(err)
		}
		var all int64
		for n := 0; n < nodes; n++ {
			got := progressTotal(plan, n, nil)
			if got != plan.NodeBytes[n] || got <= 0 {
				t.Errorf("%d nodes: node %d bar total %d, its tasks move %d", nodes, n, got, plan.NodeBytes[n])
			}
			all += got
		}
		src, out := tbl.Bytes()
		if all != src+out {
			t.Errorf("%d nodes: totals add up to %d, the conversion moves %d", nodes, all, src+out)
		}
	}
	// On a real checkpoint the reducers report exactly the total.
	src := testkit.Fixture("deepspeed-real", "z2_dp2_bf16", "checkpoint")
	rt, err := formats.Index(context.Background(), src, "", formats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := mapreduce.NewPlan(rt, mapreduce.PlanOptions{Nodes: 1, Cores: 2})
	if err != nil {
		t.Fatal(err)
	}
	w, err := mapreduce.Create(filepath.Join(t.TempDir(), "atomic"), plan, ucpatomic.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	var moved atomic.Int64
	if _, err := mapreduce.Run(context.Background(), plan, w, mapreduce.Options{Workers: 2, CheckReplicas: true,
		Progress: func(r, wr int64) { moved.Add(r + wr) }}); err != nil {
		t.Fatal(err)
	}
	total := progressTotal(plan, 0, nil)
	if d := total - moved.Load(); d < 0 || d > int64(len(plan.Tasks)) {
		t.Errorf("bar total %d, the reducers reported %d bytes", total, moved.Load())
	}
}

// TestSpaceCheck (fault 12): a plan that writes more than the
// destination's free space is refused before writing, with both numbers.
func TestSpaceCheck(t *testing.T) {
	dir := t.TempDir()
	huge := testkit.Synthetic(1 << 40) // stride-0 sources can claim this from a tiny file
	plan, err := mapreduce.NewPlan(huge, mapreduce.PlanOptions{Nodes: 1, Cores: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = checkSpace(filepath.Join(dir, "atomic"), plan, 0, true)
	if err == nil || !strings.Contains(err.Error(), "has only") || !strings.Contains(err.Error(), fmt.Sprint(3*4<<40+SpaceMargin)) ||
		!strings.Contains(err.Error(), "nothing written") {
		t.Fatalf("error %v", err)
	}
	small, err := mapreduce.NewPlan(testkit.Synthetic(1<<10), mapreduce.PlanOptions{Nodes: 1, Cores: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSpace(filepath.Join(dir, "atomic"), small, 0, true); err != nil {
		t.Fatal(err)
	}
}
