package mapreduce_test

import (
	"bytes"
	"context"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
	. "github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// synthetic builds a table of bf16 parameters of the given sizes.
func synthetic(sizes []int64) *fragment.Table { return testkit.Synthetic(sizes...) }

func TestPlanDeterministicAndBalanced(t *testing.T) {
	// One embedding holds half of all bytes, as BLOOM's does; the rest are
	// layers of varied sizes and tiny biases.
	var sizes []int64
	var rest int64
	for i := 0; i < 60; i++ {
		n := int64(16 * (1 + (i*7919)%2000))
		if i%5 == 0 {
			n = 16
		}
		sizes = append(sizes, n)
		rest += n
	}
	sizes = append([]int64{rest / 16 * 16}, sizes...)
	tbl := synthetic(sizes)
	for _, nodes := range []int{1, 2, 4} {
		a, err := NewPlan(tbl, PlanOptions{Nodes: nodes, Cores: 3})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := NewPlan(tbl, PlanOptions{Nodes: nodes, Cores: 3})
		if !reflect.DeepEqual(a, b) || a.ID() != b.ID() {
			t.Fatalf("%d nodes: plans differ between runs", nodes)
		}
		lo, hi := a.NodeBytes[0], a.NodeBytes[0]
		for _, nb := range a.NodeBytes {
			lo, hi = min(lo, nb), max(hi, nb)
		}
		if float64(hi) > 1.05*float64(lo) {
			t.Errorf("%d nodes: bytes per node %v are not within 5%%", nodes, a.NodeBytes)
		}
		// The giant parameter must be spread over several nodes.
		onNodes := map[int]bool{}
		for _, tk := range a.Tasks {
			if a.Outputs[tk.Output].Param == 0 {
				onNodes[tk.Node] = true
			}
		}
		if len(onNodes) != nodes {
			t.Errorf("%d nodes: the giant parameter runs on %d of them", nodes, len(onNodes))
		}
		for n := 0; n < nodes; n++ {
			shares := a.WorkerShares(n)
			var wl, wh int64 = -1, 0
			for _, s := range shares {
				var b int64
				for _, tk := range s {
					b += tk.Bytes
				}
				if wl < 0 || b < wl {
					wl = b
				}
				wh = max(wh, b)
			}
			if float64(wh) > 1.10*float64(wl) {
				t.Errorf("%d nodes: node %d workers are unbalanced (%d vs %d bytes)", nodes, n, wl, wh)
			}
		}
	}
	// Every element of every state is in exactly one task.
	p, _ := NewPlan(tbl, PlanOptions{Nodes: 4, Cores: 2})
	covered := map[[2]int]int64{}
	for _, tk := range p.Tasks {
		if tk.Kind == ReduceTask {
			o := p.Outputs[tk.Output]
			covered[[2]int{o.Param, o.State}] += tk.End - tk.Start
		}
	}
	for pi, prm := range tbl.Params {
		for si := range prm.States {
			if covered[[2]int{pi, si}] != prm.Numel() {
				t.Fatalf("param %d state %d: tasks cover %d of %d", pi, si, covered[[2]int{pi, si}], prm.Numel())
			}
		}
	}
}

func TestPlanMemoryBoundsChunks(t *testing.T) {
	tbl := synthetic([]int64{1 << 24})
	p, err := NewPlan(tbl, PlanOptions{Nodes: 1, Cores: 4, Memory: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if max := int64(64<<20) / 4 / BytesPerChunkElem; p.ChunkElems > max {
		t.Fatalf("chunk of %d elements exceeds the memory budget's %d", p.ChunkElems, max)
	}
}

// convert runs the plan's nodes one after another in this process.
func convert(t *testing.T, tbl *fragment.Table, opt PlanOptions, workers int) string {
	t.Helper()
	return convertWith(t, tbl, opt, Options{Workers: workers, CheckReplicas: true})
}

// convertWith is convert with the run's options (Node is set per node).
func convertWith(t *testing.T, tbl *fragment.Table, opt PlanOptions, ro Options) string {
	t.Helper()
	plan, err := NewPlan(tbl, opt)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "atomic")
	var w *atomic.Writer
	for n := 0; n < plan.Nodes; n++ {
		w, err = Create(dst, plan, atomic.Options{Node: n, Nodes: plan.Nodes})
		if err != nil {
			t.Fatal(err)
		}
		ro.Node = n
		if _, err := Run(context.Background(), plan, w, ro); err != nil {
			t.Fatal(err)
		}
		all, err := w.FinishNode()
		if err != nil {
			t.Fatal(err)
		}
		if all != (n == plan.Nodes-1) {
			t.Fatalf("node %d: all records present = %v", n, all)
		}
	}
	if _, err := Finalize(plan, w); err != nil {
		t.Fatal(err)
	}
	return dst
}

func sameFiles(t *testing.T, what string, a, b map[string][]byte) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d files vs %d", what, len(a), len(b))
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			t.Errorf("%s: %s differs", what, k)
		}
	}
}

// TestSplitAndNodesMatchSingle: tiny odd chunks (so every sharded
// parameter is split across reducers and across nodes) and 4 nodes give
// files byte-identical to one unsplit run (so do tiny pieces within a
// task), for a TP 2 checkpoint with
// row-parallel, sub-parameter, vocabulary and averaged parameters.
func TestSplitAndNodesMatchSingle(t *testing.T) {
	tbl, err := deepspeed.Index(context.Background(), testkit.Fixture("deepspeed", "megatron_tp2_unevengqa_z2_bf16_dp3", "checkpoint"), deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	refDir := convert(t, tbl, PlanOptions{Nodes: 1, Cores: 1, ChunkElems: 1 << 30}, 1)
	ref := testkit.ReadTree(t, refDir)
	sameFiles(t, "chunks of 7 elements", ref, testkit.ReadTree(t, convert(t, tbl, PlanOptions{Nodes: 1, Cores: 3, ChunkElems: 7}, 3)))
	// Whole parameters per task, each reduced and written in pieces of
	// 7 float32 elements (or 14 bf16): runs and averages cut anywhere.
	sameFiles(t, "pieces of 28 bytes", ref, testkit.ReadTree(t, convertWith(t, tbl, PlanOptions{Nodes: 1, Cores: 2, ChunkElems: 1 << 30},
		Options{Workers: 2, CheckReplicas: true, PieceBytes: 28})))
	// 4 nodes, tasks of 13 elements written in pieces of 20 bytes: the
	// files shared between nodes are finished from pieces of pieces.
	dst := convertWith(t, tbl, PlanOptions{Nodes: 4, Cores: 2, ChunkElems: 13}, Options{Workers: 2, CheckReplicas: true, PieceBytes: 20})
	sameFiles(t, "4 nodes", ref, testkit.ReadTree(t, dst))
	m, err := atomic.ReadManifest(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, ".ucp-nodes")); !os.IsNotExist(err) {
		t.Error("node records left in the checkpoint")
	}
	if len(m.Params) != len(tbl.Params) {
		t.Errorf("manifest lists %d params", len(m.Params))
	}
	// The state files the nodes shared have the block CRC-32s of the
	// 1-node run's (the finalizer combines them from the nodes' records).
	mref, err := atomic.ReadManifest(refDir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(mref.Params, m.Params) {
		t.Error("4 nodes: the manifest's parameters or files differ from the 1-node run's")
	}
	for _, p := range m.Params {
		for _, f := range p.Files {
			if f.State != atomic.StepState && f.Blocks == "" {
				t.Errorf("4 nodes: %s has no block CRC-32s", f.Path)
			}
		}
	}
	testkit.Check(t, dst, testkit.Fixture("deepspeed", "megatron_tp2_unevengqa_z2_bf16_dp3", "truth.pt"))
}

// TestReadErrorStopsRun: a source file that shrank after indexing makes a
// reducer fail; the run stops with that file named and no checkpoint
// appears, not even a partial one.
func TestReadErrorStopsRun(t *testing.T) {
	src := testkit.CopyTree(t, testkit.Fixture("deepspeed", "z2_bf16_dp4", "checkpoint"))
	tbl, err := deepspeed.Index(context.Background(), src, deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	victim := tbl.Params[len(tbl.Params)/2].States[0].Frags[0].Src.Path
	if err := os.Truncate(victim, 200); err != nil {
		t.Fatal(err)
	}
	plan, _ := NewPlan(tbl, PlanOptions{Nodes: 1, Cores: 2})
	dst := filepath.Join(t.TempDir(), "atomic")
	w, err := Create(dst, plan, atomic.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), plan, w, Options{Workers: 2})
	if err == nil || !strings.Contains(err.Error(), filepath.Base(victim)) {
		t.Fatalf("error %v, want one naming %s", err, victim)
	}
	w.Abort()
	for _, p := range []string{dst, dst + atomic.PartialSuffix} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed run", p)
		}
	}
}

// TestCopyFilesSplit: a copied file is cut into byte ranges that tile it
// (so all workers share a big model-state file), all on one node; a
// source that changed size since indexing stops the run naming it.
func TestCopyFilesSplit(t *testing.T) {
	src := testkit.CopyTree(t, testkit.Fixture("deepspeed", "megatron_tp2_unevengqa_z2_bf16_dp3", "checkpoint"))
	tbl, err := deepspeed.Index(context.Background(), src, deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tbl.CopyFiles) == 0 {
		t.Fatal("the fixture has no copied files")
	}
	plan, err := NewPlan(tbl, PlanOptions{Nodes: 4, Cores: 2, ChunkElems: 13})
	if err != nil {
		t.Fatal(err)
	}
	type span struct{ start, end int64 }
	ranges, nodes := map[int][]span{}, map[int]map[int]bool{}
	for _, tk := range plan.Tasks {
		if tk.Kind != CopyTask {
			continue
		}
		ranges[tk.Output] = append(ranges[tk.Output], span{tk.Start, tk.End})
		if nodes[tk.Output] == nil {
			nodes[tk.Output] = map[int]bool{}
		}
		nodes[tk.Output][tk.Node] = true
	}
	for oi, rs := range ranges {
		o := plan.Outputs[oi]
		if len(rs) < 2 || len(nodes[oi]) != 1 {
			t.Errorf("%s: %d ranges on %d nodes, want several on one", o.Path, len(rs), len(nodes[oi]))
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].start < rs[j].start })
		at := int64(0)
		for _, r := range rs {
			if r.start != at || r.end <= r.start {
				t.Fatalf("%s: ranges %v do not tile it", o.Path, rs)
			}
			at = r.end
		}
		if at != o.Size {
			t.Errorf("%s: ranges end at %d of %d bytes", o.Path, at, o.Size)
		}
	}

	victim := tbl.CopyFiles[0].Src
	f, err := os.OpenFile(victim, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("grown"))
	f.Close()
	plan, _ = NewPlan(tbl, PlanOptions{Nodes: 1, Cores: 2, ChunkElems: 13})
	dst := filepath.Join(t.TempDir(), "atomic")
	w, err := Create(dst, plan, atomic.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	_, err = Run(context.Background(), plan, w, Options{Workers: 2})
	if err == nil || !strings.Contains(err.Error(), victim) || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("error %v, want one naming %s as changed", err, victim)
	}
}

// TestStateDType: trained parameters are float32; frozen parameters and
// buffers keep the dtype of their fragments, which must agree; an averaged
// frozen parameter is a computed mean, float32.
func TestStateDType(t *testing.T) {
	ref := func(path string, dt dtype.DType) fragment.Fragment {
		return fragment.Fragment{Len: 1, Src: fragment.TensorRef{Path: path, T: &torchfile.Tensor{DType: dt, Shape: []int64{1}}}}
	}
	for _, c := range []struct {
		name        string
		frozen, avg bool
		frags       []fragment.Fragment
		want        dtype.DType
		err         string
	}{
		{"trained bf16 source", false, false, []fragment.Fragment{ref("a", dtype.BFloat16)}, dtype.Float32, ""},
		{"int64 buffer", true, false, []fragment.Fragment{ref("a", dtype.Int64), ref("b", dtype.Int64)}, dtype.Int64, ""},
		{"fp16 frozen", true, false, []fragment.Fragment{ref("a", dtype.Float16)}, dtype.Float16, ""},
		{"averaged frozen", true, true, []fragment.Fragment{ref("a", dtype.BFloat16), ref("b", dtype.BFloat16)}, dtype.Float32, ""},
		{"no fragments", true, false, nil, dtype.Float32, ""},
		{"shards disagree", true, false, []fragment.Fragment{ref("a", dtype.BFloat16), ref("b", dtype.Float16)}, dtype.Invalid,
			"a stores it as bfloat16 but b as float16"},
	} {
		p := &fragment.Param{Name: "w", Shape: []int64{1}, Frozen: c.frozen, Average: c.avg}
		st := p.AddState(fragment.FP32)
		st.Frags = c.frags
		got, err := StateDType(p, st)
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, %v; want %v, %q", c.name, got, err, c.want, c.err)
		}
	}
}

// TestModelStatesKeepSharedStorage converts a ZeRO-2 bf16 checkpoint
// without universal info, whose model states are
// written again: the module weights, views of one flat bf16 buffer, stay
// views of one storage record copied whole (its CRC taken from the
// source's zip, not read back), each with the source's offset, shape,
// stride and bytes, and every record's CRC matches its bytes.
func TestModelStatesKeepSharedStorage(t *testing.T) {
	ckpt := testkit.Fixture("deepspeed", "hf_z2_bf16_nouci_dp2", "checkpoint")
	tbl, err := deepspeed.Index(context.Background(), ckpt, deepspeed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Close()
	if len(tbl.WriteFiles) == 0 {
		t.Fatal("the fixture's model states are not written again (it has universal info?)")
	}
	dst := convert(t, tbl, PlanOptions{Nodes: 1, Cores: 2}, 2)
	name := "mp_rank_00_model_states.pt"
	src, err := torchfile.Open(filepath.Join(ckpt, "global_step3", name))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := torchfile.Open(filepath.Join(dst, name))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if len(src.Storages) != 1 || len(out.Storages) != len(src.Storages) {
		t.Fatalf("%d storages written for the source's %d (want the one flat buffer)", len(out.Storages), len(src.Storages))
	}
	for _, st := range out.Storages {
		b := make([]byte, st.NBytes())
		if _, err := out.ReaderAt().ReadAt(b, st.Offset); err != nil {
			t.Fatal(err)
		}
		if got := crc32.ChecksumIEEE(b); st.CRC32 != got {
			t.Errorf("record data/%s: the zip says CRC %08x, its bytes have %08x", st.Key, st.CRC32, got)
		}
	}
	module := func(f *torchfile.File) *pyobj.Dict {
		root, _ := f.Root.(*pyobj.Dict)
		if root == nil {
			t.Fatalf("%s: root is %T", f.Name, f.Root)
		}
		m, _ := root.Get("module")
		d, _ := m.(*pyobj.Dict)
		if d == nil {
			t.Fatalf("%s: module is %T", f.Name, m)
		}
		return d
	}
	sm, om := module(src), module(out)
	if sm.Len() == 0 || sm.Len() != om.Len() {
		t.Fatalf("%d module entries written for the source's %d", om.Len(), sm.Len())
	}
	for _, k := range sm.Keys() {
		sv, _ := sm.Get(k)
		ov, _ := om.Get(k)
		st, _ := sv.(*torchfile.Tensor)
		ot, _ := ov.(*torchfile.Tensor)
		if st == nil || ot == nil {
			t.Fatalf("module %v: %T written for %T", k, ov, sv)
		}
		if ot.StorageOffset != st.StorageOffset || !reflect.DeepEqual(ot.Shape, st.Shape) || !reflect.DeepEqual(ot.Stride, st.Stride) || ot.DType != st.DType {
			t.Errorf("module %v: %v %v+%d %v written for %v %v+%d %v", k, ot.Shape, ot.Stride, ot.StorageOffset, ot.DType, st.Shape, st.Stride, st.StorageOffset, st.DType)
		}
		a, err := src.ReadTensor(st)
		if err != nil {
			t.Fatal(err)
		}
		b, err := out.ReadTensor(ot)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("module %v: bytes differ", k)
		}
	}
}
