package formats

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
)

// TestTargets: export and reshard find their writers in the one table,
// each only the rows that write its way, and every export row can
// summarise what it wrote.
func TestTargets(t *testing.T) {
	if got, want := ExportTargets(), []string{"dcp", "hf", "torch"}; !reflect.DeepEqual(got, want) {
		t.Errorf("export targets %v, want %v", got, want)
	}
	if got, want := ReshardTargets(), []string{"deepspeed", "megatron"}; !reflect.DeepEqual(got, want) {
		t.Errorf("reshard targets %v, want %v", got, want)
	}
	for _, name := range ExportTargets() {
		tg, err := LookupExport(name)
		if err != nil || tg.Export == nil || tg.Summary == nil || tg.Help == "" {
			t.Errorf("export target %s: %+v, %v", name, tg, err)
			continue
		}
		if label, line := tg.Summary(&ExportStats{Tensors: 3, Files: 2}, func(n int64) string { return "N" }); label == "" || !strings.Contains(line, "3 tensors") {
			t.Errorf("%s: summary %q %q", name, label, line)
		}
	}
	tests := []struct {
		lookup func(string) (Target, error)
		name   string
		want   string
	}{
		{LookupExport, "deepspeed", `unknown target format "deepspeed" (known: dcp, hf, torch)`},
		{LookupTarget, "dcp", `unknown target format "dcp" (known: deepspeed, megatron)`},
		{LookupExport, "nope", `unknown target format "nope"`},
	}
	for _, tt := range tests {
		if _, err := tt.lookup(tt.name); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("lookup %s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if tg, _ := LookupExport("dcp"); tg.Check(ExportOptions{Shards: 0}) == nil {
		t.Error("dcp accepts 0 shards")
	}
}

// TestIndexValidates: a table that does not cover its parameter leaves as
// a CoverageError, never as a table, and its scratch folder is removed.
func TestIndexValidates(t *testing.T) {
	scratch := t.TempDir()
	p := &fragment.Param{Name: "w", Shape: []int64{4}}
	p.AddState(fragment.FP32) // no fragment covers it
	tbl := &fragment.Table{Format: "test", Params: []*fragment.Param{p}, Scratch: []string{scratch}}
	got, err := validated("SRC", tbl)
	var ce *CoverageError
	if got != nil || !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), "SRC: coverage check failed: ") {
		t.Fatalf("table %v, error %v: want a CoverageError", got, err)
	}
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Errorf("the scratch folder of a refused table is left: %v", err)
	}
	ok := &fragment.Table{Format: "test"}
	if got, err := validated("SRC", ok); got != ok || err != nil {
		t.Errorf("a valid table: %v, %v", got, err)
	}
}
