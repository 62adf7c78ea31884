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
// tasks read, without int64 overflow on multi-GB checkpoints (the old
// (src+out)*NodeBytes/sum wrapped around at about 3 GB); the nodes' totals
// add up to what the table says is read. TestReadBytesAgree checks it
// against a run.
func TestProgressTotal(t *testing.T) {
	// 3 x 300M bf16 elements: 1.8 GB to read.
	tbl := testkit.Synthetic(300<<20, 16<<20)
	for _, nodes := range []int{1, 2, 3} {
		plan, err := mapreduce.NewPlan(tbl, mapreduce.PlanOptions{Nodes: nodes, Cores: 2})
		if err != nil {
			t.Fatal(err)
		}
		var all int64
		for n := 0; n < nodes; n++ {
			got := progressTotal(plan, n, nil)
			if got <= 0 || got >= plan.NodeBytes[n] {
				t.Errorf("%d nodes: node %d bar total %d, its tasks move %d", nodes, n, got, plan.NodeBytes[n])
			}
			all += got
		}
		src, _ := tbl.Bytes()
		if d := src - all; d < 0 || d > int64(len(plan.Tasks)) {
			t.Errorf("%d nodes: totals add up to %d, the conversion reads %d", nodes, all, src)
		}
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

// TestReadBytesAgree (issue 22, friction 9): what inspect and the plan say
// is read is what the run reads, to the byte, vocabulary padding (stored,
// never read) included, and it is what the progress bar counts to.
func TestReadBytesAgree(t *testing.T) {
	for _, c := range []struct {
		fmt, name string
		vocab     int64
	}{
		{"deepspeed", "megatron_tp2_bf16opt_dp2", 0}, // vocabulary padding 48 -> 43
		{"megatron_dist", "core0_19_tp2_pp2_tied_bf16_dprs", 50},
		{"deepspeed", "z1_tiny_dp4_padonly", 0},
		{"megatron", "tp2_gqa_swiglu", 0},
		{"megatron", "tp2_dp2_distopt", 0},
		{"megatron", "novocab_tp2", 100},
		{"megatron_dist", "core0_14_tp2_dp2_bf16_fsms", 0},
		{"zero3", "paper_1024_dp3", 0},
		{"dcp", "ddp_w3", 0},
	} {
		t.Run(c.fmt+"/"+c.name, func(t *testing.T) {
			src := testkit.Fixture(c.fmt, c.name, "checkpoint")
			tbl, err := formats.Index(context.Background(), src, "", formats.Options{VocabSize: c.vocab})
			if err != nil {
				t.Fatal(err)
			}
			defer tbl.Close()
			plan, err := mapreduce.NewPlan(tbl, mapreduce.PlanOptions{Nodes: 1, Cores: 2})
			if err != nil {
				t.Fatal(err)
			}
			want, _ := tbl.Bytes()
			for _, f := range tbl.CopyFiles {
				want += f.Size
			}
			w, err := mapreduce.Create(filepath.Join(t.TempDir(), "atomic"), plan, ucpatomic.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Abort()
			var barred atomic.Int64
			bar := ProgressCounter(func(n int64) { barred.Add(n) })
			stats, err := mapreduce.Run(context.Background(), plan, w, mapreduce.Options{Workers: 2, CheckReplicas: true, Progress: bar})
			if err != nil {
				t.Fatal(err)
			}
			if stats.BytesRead != want {
				t.Errorf("the plan says %d bytes to read, the run read %d", want, stats.BytesRead)
			}
			if total := progressTotal(plan, 0, nil); barred.Load() != stats.BytesRead || total < want-int64(len(plan.Tasks)) || total > want {
				t.Errorf("the bar counted %d of a total %d; the run read %d", barred.Load(), total, stats.BytesRead)
			}
		})
	}
}
