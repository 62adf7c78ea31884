package dcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// convertDir indexes a DCP folder and converts it into a fresh atomic folder.
func convertDir(t *testing.T, src string) string {
	t.Helper()
	tbl, err := Index(context.Background(), src, Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tbl.Close() })
	return testkit.Convert(t, tbl, 2)
}

// stateFiles returns the bytes of every zero/<param>/<state>.pt, the
// global optimizer state and the extra state of an atomic checkpoint.
func stateFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(dir, atomic.ZeroDir, "*", "*.pt"))
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, filepath.Join(dir, atomic.ZeroDir, atomic.OptimizerState), filepath.Join(dir, atomic.ExtraState))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
	}
	return out
}

// An atomic checkpoint exported to DCP with 1, 2 or 3 shards converts back
// to byte-identical atomic files: weights, moments, steps, param groups and
// the extra state.
func TestExportRoundTrip(t *testing.T) {
	cases := []string{"fsdp2_w2", "fsdp_tp_w4", "torchtitan_w2", "optim_ids_w2", "variant_v22_w2", "emptyrank_w4"}
	if testing.Short() {
		cases = cases[:2]
	}
	for _, c := range cases {
		t.Run(c, func(t *testing.T) {
			a := convertDir(t, testkit.Fixture("dcp", c, "checkpoint"))
			want := stateFiles(t, a)
			r, err := atomic.OpenReader(a, atomic.ReaderOptions{Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, shards := range []int{1, 2, 3} {
				d := filepath.Join(t.TempDir(), "dcp")
				st, err := Export(context.Background(), r, d, ExportOptions{Shards: shards, NoSync: true, Workers: 2})
				if err != nil {
					t.Fatalf("%d shards: %v", shards, err)
				}
				if st.Files != shards {
					t.Errorf("%d files for %d shards", st.Files, shards)
				}
				if _, err := os.Stat(d + atomic.PartialSuffix); !os.IsNotExist(err) {
					t.Errorf("%s.partial left behind", d)
				}
				checkExported(t, d, r, shards)
				got := stateFiles(t, convertDir(t, d))
				if len(got) != len(want) {
					t.Errorf("%d shards: %d files back, want %d", shards, len(got), len(want))
				}
				for name, w := range want {
					if !bytes.Equal(got[name], w) {
						t.Errorf("%d shards: %s differs after the round trip", shards, name)
					}
				}
			}
		})
	}
}

// checkExported reads an exported folder back with the reader: every
// weight is model.<name> in float32, split along dim 0 in torch.chunk
// sizes over the rank files.
func checkExported(t *testing.T, dir string, r *atomic.Reader, shards int) {
	t.Helper()
	ck, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if ck.World != shards {
		t.Errorf("world %d, want %d", ck.World, shards)
	}
	if ck.Meta.Version != CurrentVersion || ck.Meta.StorageMeta == nil || ck.Meta.StorageMeta.CheckpointID != dir {
		t.Errorf("version %q, storage_meta %+v", ck.Meta.Version, ck.Meta.StorageMeta)
	}
	byKey := map[string]*Tensor{}
	for _, tt := range ck.Tensors {
		byKey[tt.Key] = tt
	}
	for _, p := range r.Params() {
		tt := byKey["model."+p.Name]
		if tt == nil {
			t.Errorf("no model.%s", p.Name)
			continue
		}
		if tt.DType != dtype.Float32 || !torchfile.SameShape(tt.Size, p.Shape) {
			t.Errorf("model.%s is %v%v, want float32%v", p.Name, tt.DType, tt.Size, p.Shape)
		}
		want := 1
		if len(p.Shape) > 0 && p.Shape[0] > 0 {
			// torch.chunk: ceil-sized pieces, so fewer than shards may be non-empty.
			c := (p.Shape[0] + int64(shards) - 1) / int64(shards)
			want = int((p.Shape[0] + c - 1) / c)
		}
		if len(tt.Chunks) != want {
			t.Errorf("model.%s has %d chunks, want %d", p.Name, len(tt.Chunks), want)
		}
		for i, ch := range tt.Chunks {
			if !strings.HasPrefix(ch.Item, "__"+strconv.Itoa(i)+"_0.distcp@") {
				t.Errorf("model.%s chunk %d is in %s", p.Name, i, ch.Item)
			}
		}
	}
}

// Items must tile their files: back to back, as FileSystemWriter writes.
func TestExportItemsTileFiles(t *testing.T) {
	a := convertDir(t, testkit.Fixture("dcp", "fsdp2_w2", "checkpoint"))
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(t.TempDir(), "dcp")
	if _, err := Export(context.Background(), r, d, ExportOptions{Shards: 2, NoSync: true, SaveID: "fixed"}); err != nil {
		t.Fatal(err)
	}
	md, err := ReadMetadata(filepath.Join(d, MetadataFile))
	if err != nil {
		t.Fatal(err)
	}
	if md.StorageMeta.SaveID != "fixed" {
		t.Errorf("save_id %q", md.StorageMeta.SaveID)
	}
	ends := map[string]int64{}
	for _, s := range md.Storage {
		if s.Info.Offset != ends[s.Info.RelativePath] {
			t.Errorf("%s: item at %d, previous one ends at %d", s.Index, s.Info.Offset, ends[s.Info.RelativePath])
		}
		ends[s.Info.RelativePath] = s.Info.Offset + s.Info.Length
	}
	for name, end := range ends {
		st, err := os.Stat(filepath.Join(d, name))
		if err != nil || st.Size() != end {
			t.Errorf("%s: items end at %d, file has %v", name, end, st)
		}
	}
	// Bytes items come first in their file, as DCP writes them.
	seenTensor := map[string]bool{}
	for _, s := range md.Storage {
		if s.Index.HasOffset {
			seenTensor[s.Info.RelativePath] = true
		} else if seenTensor[s.Info.RelativePath] {
			t.Errorf("%s comes after a tensor item", s.Index)
		}
	}
}

// --dtype bfloat16 and float16 round each float32 to nearest even, as
// torch's .to() does; the round trip gives the rounded values.
func TestExportDTypes(t *testing.T) {
	a := convertDir(t, testkit.Fixture("dcp", "fsdp2_w2", "checkpoint"))
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
		d := filepath.Join(t.TempDir(), "dcp")
		if _, err := Export(context.Background(), r, d, ExportOptions{Shards: 2, DType: dt, NoSync: true}); err != nil {
			t.Fatal(err)
		}
		back := convertDir(t, d)
		for _, p := range r.Params() {
			orig, _, err := testkit.ReadAtomic(filepath.Join(a, atomic.StatePath(p.Name, fragment.FP32)))
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := testkit.ReadAtomic(filepath.Join(back, atomic.StatePath(p.Name, fragment.FP32)))
			if err != nil {
				t.Fatal(err)
			}
			half := make([]byte, len(orig)/2)
			if err := fromFloat32(half, orig, dt); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, len(orig))
			if err := dtype.ToFloat32(want, half, dt); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%v: %s differs from its rounded values", dt, p.Name)
			}
		}
	}
	if _, err := Export(context.Background(), r, filepath.Join(t.TempDir(), "x"), ExportOptions{DType: dtype.Int8}); err == nil ||
		!strings.Contains(err.Error(), "cannot export int8") {
		t.Errorf("int8 export: %v", err)
	}
}

// fromFloat32 rounds as torch does; compared with torch itself when it is here.
func TestFromFloat32Rounding(t *testing.T) {
	t.Parallel()
	vals := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.00390625, 1.01171875, 1.001953125, 3.0000002, 65504, 65520, 1e-8, 6e-5,
		float32(math.Inf(1)), float32(math.Inf(-1)), 3.4028235e38, 1.1754944e-38, 0.1, -2.5e-3}
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	// Known bfloat16 results: ties go to even.
	bf := make([]byte, 2*len(vals))
	if err := fromFloat32(bf, src, dtype.BFloat16); err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]uint16{2: 0x3f80, 4: 0x3f80, 5: 0x3f82, 6: 0x3f80, 12: 0x7f80, 13: 0xff80} {
		if got := binary.LittleEndian.Uint16(bf[2*i:]); got != want {
			t.Errorf("bfloat16(%v) = %#04x, want %#04x", vals[i], got, want)
		}
	}
	nan := make([]byte, 4)
	binary.LittleEndian.PutUint32(nan, 0x7fa00001)
	if err := fromFloat32(bf[:2], nan, dtype.BFloat16); err != nil || binary.LittleEndian.Uint16(bf) != 0xffff {
		t.Errorf("bfloat16(NaN) = %#04x", binary.LittleEndian.Uint16(bf))
	}
	py := torchPython(t)
	var hexIn bytes.Buffer
	for _, b := range src {
		hexIn.WriteString(strconv.FormatInt(int64(b)|0x100, 16)[1:])
	}
	script := "import torch,sys\nb=bytes.fromhex('" + hexIn.String() + "')\n" +
		"t=torch.frombuffer(bytearray(b),dtype=torch.float32)\n" +
		"print(bytes(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()).hex())\n" +
		"print(bytes(t.to(torch.float16).view(torch.int16).numpy().tobytes()).hex())\n"
	out, err := exec.Command(py, "-c", script).Output()
	if err != nil {
		t.Fatalf("torch: %v", err)
	}
	lines := strings.Fields(string(out))
	for i, dt := range []dtype.DType{dtype.BFloat16, dtype.Float16} {
		got := make([]byte, 2*len(vals))
		if err := fromFloat32(got, src, dt); err != nil {
			t.Fatal(err)
		}
		if i >= len(lines) || lines[i] != hexOf(got) {
			t.Errorf("%v: ucp %s, torch %v", dt, hexOf(got), lines)
		}
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}

// Export refuses an existing DST without Force and replaces it with Force.
func TestExportExistingDst(t *testing.T) {
	a := convertDir(t, testkit.Fixture("dcp", "ddp_w3", "checkpoint"))
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(t.TempDir(), "dcp")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Export(context.Background(), r, d, ExportOptions{NoSync: true}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("export over an existing folder: %v", err)
	}
	if _, err := Export(context.Background(), r, d, ExportOptions{NoSync: true, Force: true}); err != nil {
		t.Fatal(err)
	}
	if !Detect(d) {
		t.Errorf("%s is not detected as DCP", d)
	}
}

// The exported folder loads with real torch.distributed.checkpoint
// (check_dcp_load.py: dcp_to_torch_save and dcp.load) of torch 2.6 in the
// Debian 13 chroot, equal to the fixture's truth.
func TestExportLoadsWithRealDCP(t *testing.T) {
	if ok, _ := testkit.Torch2Ready(); !ok {
		testkit.Torch2(t, t.TempDir(), "") // skips, or fails under UCP_REQUIRE_TORCH2=1
	}
	c := "fsdp2_w2"
	a := convertDir(t, testkit.Fixture("dcp", c, "checkpoint"))
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	work := checkDir(t)
	writeExportTruth(t, loadTruth(t, c), filepath.Join(work, "truth.pt"))
	for _, shards := range []int{1, 3} {
		name := fmt.Sprintf("export%d", shards)
		if _, err := Export(context.Background(), r, filepath.Join(work, name), ExportOptions{Shards: shards, NoSync: true}); err != nil {
			t.Fatal(err)
		}
		out := testkit.Torch2(t, work, checkScript(), name, "--truth", "truth.pt")
		if !strings.Contains(out, "check_dcp_load: 0 failed") {
			t.Errorf("%d shards: %s", shards, out)
		}
	}
}

// Every fixture a torch 2.6 can read (all but the stream-transformed ones:
// _extensions arrive in 2.7) loads with real dcp_to_torch_save and dcp.load
// equal to its truth: the stand-in layouts included.
func TestFixturesLoadWithRealDCP(t *testing.T) {
	if ok, _ := testkit.Torch2Ready(); !ok {
		testkit.Torch2(t, t.TempDir(), "")
	}
	work := checkDir(t)
	n := 0
	for _, c := range testkit.Cases(t, "dcp", 13) {
		md, err := ReadMetadata(testkit.Fixture("dcp", c, "checkpoint", MetadataFile))
		if err != nil {
			t.Fatal(err)
		}
		if len(md.Storage) > 0 && md.Storage[0].Info.Transforms != nil {
			continue
		}
		if err := os.CopyFS(filepath.Join(work, "fixtures", c), os.DirFS(testkit.Fixture("dcp", c))); err != nil {
			t.Fatal(err)
		}
		n++
	}
	out := testkit.Torch2(t, work, checkScript(), "fixtures")
	if !strings.Contains(out, "check_dcp_load: 0 failed") || strings.Count(out, "\nok ") != n {
		t.Errorf("want %d cases ok:\n%s", n, out)
	}
	t.Logf("%s", out)
}

// checkDir is a folder for a torch 2.x check with the dcpgen helpers
// check_dcp_load.py imports beside it.
func checkDir(t *testing.T) string {
	t.Helper()
	work := t.TempDir()
	if err := os.CopyFS(filepath.Join(work, "dcpgen"), os.DirFS(filepath.Join(testkit.RepoRoot(), "testdata", "gen", "dcpgen"))); err != nil {
		t.Fatal(err)
	}
	return work
}

func checkScript() string {
	return filepath.Join(testkit.RepoRoot(), "testdata", "gen", "check_dcp_load.py")
}

// probe runs Debian's python3 once for the whole test binary: whether it
// imports torch.
var probe struct {
	once  sync.Once
	torch bool
}

const debianPython = "/usr/bin/python3"

func probePython() {
	probe.once.Do(func() {
		probe.torch = exec.Command(debianPython, "-c", "import torch").Run() == nil
	})
}

// torchPython returns Debian's python3 when it imports torch; otherwise
// testkit.Python skips the test (or fails it under UCP_REQUIRE_TORCH=1).
func torchPython(t *testing.T) string {
	t.Helper()
	if probePython(); probe.torch {
		return debianPython
	}
	return testkit.Python(t)
}

// writeExportTruth writes the truth.pt that check_dcp_load.py compares an
// export of a fixture with: model.<fqn> float32 weights and buffers,
// optim.state.<fqn>.<state> float32 moments and the steps, and the
// fixture's non-tensor values at their own paths.
func writeExportTruth(t *testing.T, tr *testkit.Truth, path string) {
	t.Helper()
	paths := pyobj.NewDict(pyobj.PlainDict)
	tensors := pyobj.NewDict(pyobj.PlainDict)
	put := func(key string, p pyobj.Tuple, tt *torchfile.Tensor, asFloat bool) {
		var b *torchfile.Blob
		if asFloat {
			data, err := tr.Float32(tt)
			if err != nil {
				t.Fatal(err)
			}
			b = torchfile.NewBlob(dtype.Float32, tt.Shape, data)
		} else {
			data, err := tr.File.ReadTensor(tt)
			if err != nil {
				t.Fatal(err)
			}
			b = torchfile.NewBlob(tt.DType, tt.Shape, data)
		}
		paths.Set(key, p)
		tensors.Set(key, b)
	}
	for _, state := range []string{"fp32", "buffers", "exp_avg", "exp_avg_sq", "step"} {
		d := truthDict(t, tr, state)
		for i := 0; i < d.Len(); i++ {
			k, v := d.Item(i)
			name := k.(string)
			switch state {
			case "fp32", "buffers":
				put("model."+name, pyobj.Tuple{"model", name}, v.(*torchfile.Tensor), true)
			case "step":
				put("optim.state."+name+".step", pyobj.Tuple{"optim", "state", name, "step"}, v.(*torchfile.Tensor), false)
			default:
				put("optim.state."+name+"."+state, pyobj.Tuple{"optim", "state", name, state}, v.(*torchfile.Tensor), true)
			}
		}
	}
	extra := truthDict(t, tr, "extra")
	tpaths := truthDict(t, tr, "paths")
	for i := 0; i < extra.Len(); i++ {
		k, _ := extra.Item(i)
		p, _ := tpaths.Get(k)
		paths.Set(k, p)
	}
	meta := pyobj.DictOf("case", "ucp-export", "producer", "ucp export --to dcp", "layout", "v2.7", "flatten_rules", "2.4")
	root := pyobj.DictOf("paths", paths, "tensors", tensors, "extra", extra, "meta", meta)
	if err := torchfile.Save(path, root); err != nil {
		t.Fatal(err)
	}
}

// An exported folder is read by the fixture generator's independent
// reader (testdata/gen/dcpgen/reader.py: CPython's pickle for .metadata,
// torch.load for every item) and equals the fixture's truth: weights and
// buffers as float32, moments as float32, steps, non-tensor values.
func TestExportReadByIndependentReader(t *testing.T) {
	t.Parallel()
	py := torchPython(t)
	c := "fsdp2_w2"
	a := convertDir(t, testkit.Fixture("dcp", c, "checkpoint"))
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(t.TempDir(), "dcp")
	if _, err := Export(context.Background(), r, d, ExportOptions{Shards: 3, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	script := `
import sys, torch
sys.path.insert(0, sys.argv[1])
sys.dont_write_bytecode = True
from dcpgen.reader import read_checkpoint
flat = read_checkpoint(sys.argv[2])["flat"]
truth = torch.load(sys.argv[3])
want = {}
for name, t in list(truth["fp32"].items()) + list(truth["buffers"].items()):
    want["model." + name] = t.float()
for s in ("exp_avg", "exp_avg_sq"):
    for name, t in truth[s].items():
        want["optim.state.%s.%s" % (name, s)] = t.float()
for name, t in truth["step"].items():
    want["optim.state.%s.step" % name] = t
want.update(truth["extra"])
bad = []
for k, v in want.items():
    g = flat.get(k)
    if isinstance(v, torch.Tensor):
        ok = isinstance(g, torch.Tensor) and g.dtype == v.dtype and g.shape == v.shape and torch.equal(g, v)
    else:
        ok = type(g) is type(v) and g == v
    if not ok:
        bad.append("%s: got %r want %r" % (k, g, v))
extra = sorted(set(flat) - set(want))
if extra:
    bad.append("unexpected keys %s" % extra)
print("\n".join(bad) if bad else "ok %d keys" % len(want))
sys.exit(1 if bad else 0)
`
	out, err := exec.Command(py, "-c", script, filepath.Join(testkit.RepoRoot(), "testdata", "gen"), d,
		testkit.Fixture("dcp", c, "truth.pt")).CombinedOutput()
	if err != nil {
		t.Errorf("independent reader: %v\n%s", err, out)
	}
}
