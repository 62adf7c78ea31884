package arrowtable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/arrowtable"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// jsFile is what testdata/arrowcheck/check.mjs prints for one file.
type jsFile struct {
	NumRows int `json:"numRows"`
	Batches int `json:"batches"`
	Fields  []struct {
		Name, Type string
		Nullable   bool
	} `json:"fields"`
	Rows []map[string]any `json:"rows"`
}

// readWithJS reads Arrow IPC files with the apache-arrow npm package
// (scripts/deps.sh installs it into testdata/arrowcheck); args may start
// with --columns=a,b to print only those columns.
func readWithJS(t *testing.T, paths ...string) map[string]jsFile {
	t.Helper()
	node := testkit.Tool(t, "node", "reading the Arrow files with apache-arrow (JavaScript)")
	dir := filepath.Join(testkit.RepoRoot(), "testdata", "arrowcheck")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "apache-arrow", "package.json")); err != nil {
		if os.Getenv("CI") == "true" || os.Getenv("UCP_REQUIRE_TOOLS") == "1" {
			t.Fatalf("apache-arrow is not installed in %s (scripts/deps.sh runs npm ci there): %v", dir, err)
		}
		t.Skipf("apache-arrow not installed in %s (scripts/deps.sh runs npm ci there)", dir)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(node, append([]string{filepath.Join(dir, "check.mjs")}, paths...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node check.mjs: %v\n%s", err, stderr.Bytes())
	}
	got := map[string]jsFile{}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func strs(v []int64) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = fmt.Sprint(x)
	}
	return out
}

// boxes is the expected value of a box column: one vector per map, or nil.
func boxes(maps []fragment.BoxMap, pick func(fragment.BoxMap) []int64) any {
	if maps == nil {
		return nil
	}
	out := []any{}
	for _, m := range maps {
		out = append(out, strs(pick(m)))
	}
	return out
}

// wantFragments lists the rows the fragment file must hold, from the table.
func wantFragments(t *fragment.Table) []map[string]any {
	var rows []map[string]any
	for _, p := range t.Params {
		kind, _ := fragment.Classify(p)
		for _, st := range p.States {
			for _, f := range st.Frags {
				sh := st.Shards[f.Shard]
				var flatStart, flatEnd any
				if sh.Maps == nil {
					flatStart, flatEnd = fmt.Sprint(f.LocalStart), fmt.Sprint(f.LocalStart+f.Len)
				}
				rows = append(rows, map[string]any{
					"param": p.Name, "state": st.Name, "pattern": kind.String(), "param_shape": strs(p.Shape),
					"file": f.Src.Path, "bytes": fmt.Sprint(f.Len * int64(f.Src.DType().Size())),
					"contiguous": f.Src.T.IsContiguous(), "dtype": f.Src.DType().String(), "elements": fmt.Sprint(f.Len),
					"src_start": fmt.Sprint(f.SrcStart), "shard": fmt.Sprint(f.Shard), "shard_label": sh.Label,
					"shard_shape": strs(sh.Shape), "shard_start": fmt.Sprint(f.LocalStart), "flat_start": flatStart, "flat_end": flatEnd,
					"box_offsets":       boxes(sh.Maps, func(m fragment.BoxMap) []int64 { return m.To }),
					"box_lengths":       boxes(sh.Maps, func(m fragment.BoxMap) []int64 { return m.Size }),
					"box_shard_offsets": boxes(sh.Maps, func(m fragment.BoxMap) []int64 { return m.From }),
					"replica":           fmt.Sprint(sh.Replica),
				})
			}
		}
	}
	return rows
}

// wantPlan lists the rows of the plan file, from the plan.
func wantPlan(t *fragment.Table, p *mapreduce.Plan) []map[string]any {
	worker := map[mapreduce.Task]int{}
	for n := 0; n < p.Nodes; n++ {
		for w, share := range p.WorkerShares(n) {
			for _, tk := range share {
				worker[tk] = w
			}
		}
	}
	var rows []map[string]any
	for i, tk := range p.Tasks {
		o := p.Outputs[tk.Output]
		kind, param, state := "state", any(nil), any(nil)
		switch tk.Kind {
		case mapreduce.CopyTask:
			kind = "copy"
		case mapreduce.StepTask:
			kind = "step"
		case mapreduce.ValueTask:
			kind = "value"
		}
		if o.Param >= 0 {
			param = t.Params[o.Param].Name
		}
		if o.Name != "" {
			state = o.Name
		}
		rows = append(rows, map[string]any{"task": fmt.Sprint(i), "node": fmt.Sprint(tk.Node), "worker": fmt.Sprint(worker[tk]),
			"kind": kind, "output": o.Path, "param": param, "state": state, "start": fmt.Sprint(tk.Start), "end": fmt.Sprint(tk.End),
			"chunk": fmt.Sprint(tk.Chunk), "of": fmt.Sprint(tk.Of), "bytes": fmt.Sprint(tk.Bytes)})
	}
	return rows
}

// TestWriteReadByJS writes real checkpoints' tables and plans and reads
// them back with apache-arrow (JavaScript): every row and value must be
// there, and each byte_offset must point at the fragment's bytes.
func TestWriteReadByJS(t *testing.T) {
	for _, c := range []struct{ name, dir string }{
		{"deepspeed-megatron-tp2", testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint")},
		{"deepspeed-z2", testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint")},
		{"dcp-fsdp-tp", testkit.Fixture("dcp", "fsdp_tp_w4", "checkpoint")},
		{"megatron-vpp-distopt", testkit.Fixture("megatron", "pp2_vpp2_distopt", "checkpoint")},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab, err := formats.Index(context.Background(), c.dir, "", formats.Options{Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer tab.Close()
			plan, err := mapreduce.NewPlan(tab, mapreduce.PlanOptions{Nodes: 2, Cores: 3, ChunkElems: 64})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "table.arrow")
			nf, nt, err := arrowtable.Write(path, tab, plan)
			if err != nil {
				t.Fatal(err)
			}
			got := readWithJS(t, path, arrowtable.PlanPath(path))
			frags, tasks := got[path], got[arrowtable.PlanPath(path)]
			want := wantFragments(tab)
			if frags.NumRows != len(want) || nf != len(want) || len(frags.Rows) != len(want) {
				t.Fatalf("fragments: JS reads %d rows, Write says %d, the table has %d", frags.NumRows, nf, len(want))
			}
			if len(frags.Fields) != len(arrowtable.FragmentFields) {
				t.Errorf("fragment schema %+v", frags.Fields)
			}
			offsets := map[string][]byte{}
			for i, w := range want {
				g := frags.Rows[i]
				off := g["byte_offset"]
				delete(g, "byte_offset")
				if !reflect.DeepEqual(g, w) {
					t.Fatalf("fragment row %d:\n got %v\nwant %v", i, g, w)
				}
				checkOffset(t, tab, i, off, offsets)
			}
			wp := wantPlan(tab, plan)
			if tasks.NumRows != len(wp) || nt != len(wp) {
				t.Fatalf("plan: JS reads %d rows, Write says %d, the plan has %d", tasks.NumRows, nt, len(wp))
			}
			if !reflect.DeepEqual(tasks.Rows, wp) {
				t.Errorf("plan rows differ:\n got %v\nwant %v", tasks.Rows[:min(3, len(tasks.Rows))], wp[:min(3, len(wp))])
			}
		})
	}
}

// checkOffset reads the i-th fragment's bytes from its file at the
// written byte_offset and compares them with what torchfile reads for it.
func checkOffset(t *testing.T, tab *fragment.Table, i int, off any, files map[string][]byte) {
	t.Helper()
	k := 0
	for _, p := range tab.Params {
		for _, st := range p.States {
			for _, f := range st.Frags {
				if k != i {
					k++
					continue
				}
				if !f.Src.T.IsContiguous() {
					return
				}
				var at int64
				if _, err := fmt.Sscan(off.(string), &at); err != nil {
					t.Fatalf("byte_offset %v: %v", off, err)
				}
				file, ok := files[f.Src.Path]
				if !ok {
					b, err := os.ReadFile(f.Src.Path)
					if err != nil {
						t.Fatal(err)
					}
					files[f.Src.Path], file = b, b
				}
				n := f.Len * int64(f.Src.DType().Size())
				want := make([]byte, n)
				r, err := os.Open(f.Src.Path)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				if err := torchfile.ReadRange(r, f.Src.T, f.SrcStart, f.Len, want); err != nil {
					t.Fatal(err)
				}
				if at < 0 || at+n > int64(len(file)) || !bytes.Equal(file[at:at+n], want) {
					t.Fatalf("%s/%s fragment %d: the %d bytes at byte_offset %d of %s are not the fragment's", p.Name, st.Name, i, n, at, f.Src.Path)
				}
				return
			}
		}
	}
	t.Fatalf("no fragment %d", i)
}

// TestManyBatches: a table larger than one record batch arrives whole, in
// order, and an empty one as a schema with no rows.
func TestManyBatches(t *testing.T) {
	x := &torchfile.Tensor{Storage: &torchfile.Storage{Key: "0", DType: dtype.Float32, Offset: 64}, DType: dtype.Float32,
		Shape: []int64{arrowtable.BatchRows + 5}, Stride: []int64{1}}
	st := &fragment.State{Name: fragment.FP32, Shards: []fragment.Shard{{Shape: x.Shape}}}
	for i := int64(0); i < x.Shape[0]; i++ {
		st.Frags = append(st.Frags, fragment.Fragment{LocalStart: i, Len: 1, SrcStart: i, Src: fragment.Ref("f.pt", x, 0)})
	}
	big := &fragment.Table{Format: "test", Params: []*fragment.Param{{Name: "w", Shape: x.Shape, States: []*fragment.State{st}}}}
	empty := &fragment.Table{Format: "test"}
	dir := t.TempDir()
	for name, tab := range map[string]*fragment.Table{"big": big, "empty": empty} {
		plan, err := mapreduce.NewPlan(tab, mapreduce.PlanOptions{Nodes: 1, Cores: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := arrowtable.Write(filepath.Join(dir, name+".arrow"), tab, plan); err != nil {
			t.Fatal(err)
		}
	}
	got := readWithJS(t, "--columns=flat_start,byte_offset", filepath.Join(dir, "big.arrow"), filepath.Join(dir, "empty.arrow"),
		filepath.Join(dir, "empty.plan.arrow"))
	b := got[filepath.Join(dir, "big.arrow")]
	if b.NumRows != int(x.Shape[0]) || b.Batches != 2 {
		t.Fatalf("big: %d rows in %d batches", b.NumRows, b.Batches)
	}
	for i, r := range b.Rows {
		if r["flat_start"] != fmt.Sprint(i) || r["byte_offset"] != fmt.Sprint(64+4*i) {
			t.Fatalf("row %d: %v", i, r)
		}
	}
	for _, name := range []string{"empty.arrow", "empty.plan.arrow"} {
		if e := got[filepath.Join(dir, name)]; e.NumRows != 0 || len(e.Fields) == 0 {
			t.Errorf("%s: %d rows, %d fields", name, e.NumRows, len(e.Fields))
		}
	}
}

// TestWriteFailure: a bad name or folder is an error naming the path, and
// nothing half-written remains.
func TestWriteFailure(t *testing.T) {
	tab := &fragment.Table{Format: "test"}
	plan, err := mapreduce.NewPlan(tab, mapreduce.PlanOptions{Nodes: 1, Cores: 1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := arrowtable.Write(filepath.Join(dir, "x.plan.arrow"), tab, plan); err == nil || !strings.Contains(err.Error(), "NAME.plan.arrow") {
		t.Errorf("a plan file's name: %v", err)
	}
	missing := filepath.Join(dir, "no", "x.arrow")
	if _, _, err := arrowtable.Write(missing, tab, plan); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing folder: %v", err)
	}
	// The plan's file is a folder: neither file appears, and no temporary
	// file stays.
	if err := os.Mkdir(filepath.Join(dir, "y.plan.arrow"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := arrowtable.Write(filepath.Join(dir, "y.arrow"), tab, plan); err == nil {
		t.Error("writing the plan over a folder succeeded")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "y.plan.arrow" {
			t.Errorf("%s left behind", e.Name())
		}
	}
}
