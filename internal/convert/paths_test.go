package convert

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// TestOutputPathsValidated (fault 9): names the destination cannot hold
// (too long for the file system, equal to one of ucp's own files, two
// outputs on one path) are refused before anything is written (convert
// checks them before it creates DST.partial).
func TestOutputPathsValidated(t *testing.T) {
	param := func(name string) *fragment.Param {
		p := &fragment.Param{Name: name, Shape: []int64{2}}
		p.AddState(fragment.FP32)
		return p
	}
	table := func(names ...string) *fragment.Table {
		t := &fragment.Table{Format: "test", Optimizer: pyobj.DictOf("param_groups", &pyobj.List{})}
		for _, n := range names {
			t.Params = append(t.Params, param(n))
		}
		return t
	}
	long := strings.Repeat("layer.", 43) + "weight" // 264 bytes
	tests := []struct {
		name string
		t    *fragment.Table
		want string
	}{
		{"name longer than 255 bytes", table("ok", long), "longer than the"},
		{"file name too long with the temporary suffix", func() *fragment.Table {
			t := table("w")
			t.WriteFiles = []fragment.ValueFile{{Name: strings.Repeat("m", 240) + ".pt", Value: pyobj.DictOf()}}
			return t
		}(), "longer than the"},
		{"parameter named like optimizer_state.pt", table("a", atomic.OptimizerState), "optimizer_state.pt"},
		{"copied file on a state file's path", func() *fragment.Table {
			t := table("w")
			t.CopyFiles = []fragment.CopyFile{{Name: "zero/w/fp32.pt", Src: "/dev/null"}}
			return t
		}(), "would be the same file"},
		{"copied file named like the manifest", func() *fragment.Table {
			t := table("w")
			t.CopyFiles = []fragment.CopyFile{{Name: atomic.ManifestName, Src: "/dev/null"}}
			return t
		}(), "would be the same file"},
	}
	plan := func(tbl *fragment.Table) *mapreduce.Plan {
		p, err := mapreduce.NewPlan(tbl, mapreduce.PlanOptions{Nodes: 1, Cores: 1})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "atomic")
			err := checkOutputs(dst, plan(tc.t))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing written") {
				t.Fatalf("error %v, want one saying %q and nothing written", err, tc.want)
			}
			if _, err := os.Stat(dst + atomic.PartialSuffix); !os.IsNotExist(err) {
				t.Fatalf("a refused run left %s", dst+atomic.PartialSuffix)
			}
		})
	}
	// A name of 200 bytes fits (with room for the temporary names).
	if err := checkOutputs(filepath.Join(t.TempDir(), "atomic"), plan(table(strings.Repeat("y", 200)))); err != nil {
		t.Fatal(err)
	}
}
