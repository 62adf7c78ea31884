package atomic_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func f32(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// sampleCheckpoint writes a source file and converts a small table: "w"
// (3x4 float32 weight, float32 moments, a 0-dim step tensor), the frozen
// "buf" (2), and extra state holding a tensor.
func sampleCheckpoint(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src.pt")
	w := make([]float32, 12)
	m := make([]float32, 12)
	for i := range w {
		w[i], m[i] = float32(i)+0.5, -float32(i)
	}
	root := pyobj.DictOf(
		"w", torchfile.NewBlob(dtype.Float32, []int64{3, 4}, f32(w...)),
		"m", torchfile.NewBlob(dtype.Float32, []int64{3, 4}, f32(m...)),
		"step", torchfile.NewBlob(dtype.Float32, nil, f32(7)),
		"buf", torchfile.NewBlob(dtype.Float32, []int64{2}, f32(1, 2)),
		"x", torchfile.NewBlob(dtype.Int32, nil, []byte{9, 0, 0, 0}))
	if err := torchfile.Save(src, root); err != nil {
		t.Fatal(err)
	}
	f, err := torchfile.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := f.Root.(*pyobj.Dict)
	ref := func(k string) fragment.TensorRef {
		v, _ := d.Get(k)
		return fragment.TensorRef{Path: src, T: v.(*torchfile.Tensor)}
	}
	state := func(name, key string, shape []int64) *fragment.State {
		r := ref(key)
		return &fragment.State{Name: name, Shards: []fragment.Shard{{Shape: shape}},
			Frags: []fragment.Fragment{{Len: r.Numel(), Src: r}}}
	}
	step := ref("step")
	x := ref("x")
	tbl := &fragment.Table{Format: "test", Source: src, Params: []*fragment.Param{
		{Name: "w", Shape: []int64{3, 4}, States: []*fragment.State{state(fragment.FP32, "w", []int64{3, 4}), state(fragment.ExpAvg, "m", []int64{3, 4})},
			Step: &fragment.Step{Tensor: &step}},
		{Name: "buf", Shape: []int64{2}, Frozen: true, States: []*fragment.State{state(fragment.FP32, "buf", []int64{2})}},
	},
		Extra:     pyobj.DictOf("train", pyobj.DictOf("step", &x, "note", "hi")),
		Optimizer: pyobj.DictOf("param_groups", &pyobj.List{Items: []pyobj.Value{pyobj.DictOf("lr", 0.1, "params", &pyobj.List{Items: []pyobj.Value{"w"}})}}),
	}
	return testkit.Convert(t, tbl, 1)
}

func TestReader(t *testing.T) {
	dir := sampleCheckpoint(t)
	r, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Params()) != 2 {
		t.Fatalf("%d params", len(r.Params()))
	}
	p, ok := r.Param("w")
	if !ok || len(p.Files) != 3 || p.Files[2].State != fragment.StepState {
		t.Fatalf("w: %+v", p)
	}
	st, err := r.OpenState("w", fragment.ExpAvg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Numel() != 12 || st.Shape[0] != 3 {
		t.Errorf("exp_avg numel %d shape %v", st.Numel(), st.Shape)
	}
	got, err := st.ReadFloat32(5, 4)
	if err != nil || len(got) != 4 || got[0] != -5 || got[3] != -8 {
		t.Errorf("exp_avg[5:9] = %v (%v)", got, err)
	}
	raw := make([]byte, 8)
	if err := st.ReadRange(10, 2, raw); err != nil || string(raw) != string(f32(-10, -11)) {
		t.Errorf("exp_avg[10:12] bytes %x (%v)", raw, err)
	}
	if err := st.ReadRange(11, 2, raw); err == nil {
		t.Error("read past the end")
	}
	step, ok, err := r.Step("w")
	b, isBlob := step.(*torchfile.Blob)
	if err != nil || !ok || !isBlob || b.DType != dtype.Float32 || string(b.Data) != string(f32(7)) {
		t.Errorf("step %v %v %v", step, ok, err)
	}
	if _, ok, err := r.Step("buf"); ok || err != nil {
		t.Errorf("buf has a step (%v)", err)
	}
	if _, err := r.OpenState("nope", fragment.FP32); err == nil || !strings.Contains(err.Error(), "no parameter nope") {
		t.Errorf("missing parameter: %v", err)
	}
	if _, err := r.OpenState("buf", fragment.ExpAvg); err == nil || !strings.Contains(err.Error(), "has no state exp_avg") {
		t.Errorf("missing state: %v", err)
	}
	ev, err := r.Load(atomic.ExtraState)
	if err != nil {
		t.Fatal(err)
	}
	xv, _ := pyobj.Path(ev, "train", "step")
	if xb, ok := xv.(*torchfile.Blob); !ok || xb.DType != dtype.Int32 || xb.Data[0] != 9 {
		t.Errorf("extra train.step = %v", pyobj.Repr(xv))
	}
	ov, err := r.Load(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if err != nil {
		t.Fatal(err)
	}
	if pg, _ := pyobj.Path(ov, "param_groups"); pyobj.Repr(pg) == "" {
		t.Error("no param groups")
	}
	if err := r.Verify(); err != nil {
		t.Error(err)
	}
}

// A file that changed after the manifest was written fails verification
// when verification is asked for, with the file named.
func TestReaderVerify(t *testing.T) {
	dir := sampleCheckpoint(t)
	path := filepath.Join(dir, atomic.StatePath("w", fragment.FP32))
	testkit.FlipState(t, path, func(b []byte, off int64) { b[off] ^= 1 }) // a bit of the first element: the zip still reads
	loose, err := atomic.OpenReader(dir, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := loose.OpenState("w", fragment.FP32); err != nil {
		t.Errorf("without verification: %v", err)
	} else {
		st.Close()
	}
	strict, err := atomic.OpenReader(dir, atomic.ReaderOptions{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.OpenState("w", fragment.FP32); err == nil || !strings.Contains(err.Error(), "CRC-32") || !strings.Contains(err.Error(), "fp32.pt") {
		t.Errorf("with verification: %v", err)
	}
	if _, err := strict.OpenState("w", fragment.ExpAvg); err != nil {
		t.Errorf("an intact file: %v", err)
	}
	if err := strict.Verify(); err == nil {
		t.Error("Verify passes a changed file")
	}
}

// A manifest that points outside the checkpoint is refused.
func TestReaderRejectsEscapingPaths(t *testing.T) {
	dir := sampleCheckpoint(t)
	m, err := atomic.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Params[0].Files[0].Path = "../outside.pt"
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, atomic.ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := atomic.OpenReader(dir, atomic.ReaderOptions{}); err == nil || !strings.Contains(err.Error(), "outside the checkpoint") {
		t.Errorf("escaping path: %v", err)
	}
}
