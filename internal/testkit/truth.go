// Package testkit holds the test helpers every package's tests share, and
// only those: it compares an atomic checkpoint with the ground truth that
// a fixture generator saved with torch (truth.pt: dicts from parameter
// name to full tensors per state), bit for bit, converts tables, runs
// Python checks under real torch (1.13 and the 2.6 chroot) and finds
// fixtures. No non-test code may import it.
package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// States compared when the truth has them.
var States = []string{fragment.FP32, fragment.ExpAvg, fragment.ExpAvgSq}

// Truth is a loaded truth.pt.
type Truth struct {
	Path string
	File *torchfile.File
	Root *pyobj.Dict
}

// Load opens a truth file.
func Load(path string) (*Truth, error) {
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, err
	}
	d := pyobj.NewDec(path, f.Root)
	root := d.AsDict()
	if err := d.Err(); err != nil {
		f.Close()
		return nil, err
	}
	return &Truth{Path: path, File: f, Root: root}, nil
}

// Close closes the truth file.
func (t *Truth) Close() error { return t.File.Close() }

// Tensors returns the truth's name -> tensor dict of one state.
func (t *Truth) Tensors(state string) map[string]*torchfile.Tensor {
	out := map[string]*torchfile.Tensor{}
	v, ok := t.Root.Get(state)
	if !ok {
		return out
	}
	d, ok := v.(*pyobj.Dict)
	if !ok {
		return out
	}
	for i := 0; i < d.Len(); i++ {
		k, val := d.Item(i)
		name, isStr := k.(string)
		switch tt := val.(type) {
		case *torchfile.Tensor: // other values are no tensors to compare
			if isStr {
				out[name] = tt
			}
		}
	}
	return out
}

// Float32 reads a truth tensor converted to float32 bytes.
func (t *Truth) Float32(tt *torchfile.Tensor) ([]byte, error) {
	raw, err := t.File.ReadTensor(tt)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4*tt.Numel())
	return out, dtype.ToFloat32(out, raw, tt.DType)
}

// Kept lists the truth's dicts of tensors that the atomic checkpoint holds
// in their own dtype, bit for bit, as the fp32 state of their parameter:
// frozen parameters and buffers.
var Kept = []string{"frozen", "buffers"}

// Compare checks every state tensor of the truth against the atomic
// checkpoint in dir and returns one line per mismatch: trained states as
// float32, frozen parameters and buffers in the truth's dtype, and the
// manifest's dtype of each.
func Compare(dir string, tr *Truth) ([]string, error) {
	m, err := atomic.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	dtypes := map[string]string{}
	for _, p := range m.Params {
		dtypes[p.Name] = p.DType
	}
	var diffs []string
	for _, key := range append(append([]string{}, States...), Kept...) {
		state, kept := key, false
		if !slices.Contains(States, key) {
			state, kept = fragment.FP32, true
		}
		tensors := tr.Tensors(key)
		names := make([]string, 0, len(tensors))
		for n := range tensors {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, name := range names {
			tt := tensors[name]
			want, err := tr.File.ReadTensor(tt)
			if err != nil {
				return nil, err
			}
			wdt := tt.DType
			if !kept && wdt != dtype.Float32 {
				if want, err = tr.Float32(tt); err != nil {
					return nil, err
				}
				wdt = dtype.Float32
			}
			if got := dtypes[name]; got != wdt.String() {
				diffs = append(diffs, fmt.Sprintf("%s: manifest dtype %q, want %q", name, got, wdt))
			}
			path := filepath.Join(dir, atomic.StatePath(name, state))
			got, gdt, shape, err := ReadAtomicRaw(path)
			if err != nil {
				diffs = append(diffs, fmt.Sprintf("%s/%s: %v", name, state, err))
				continue
			}
			if gdt != wdt || !torchfile.SameShape(shape, tt.Shape) {
				diffs = append(diffs, fmt.Sprintf("%s/%s: %v%v, want %v%v", name, state, gdt, shape, wdt, tt.Shape))
				continue
			}
			if !bytes.Equal(got, want) {
				es := wdt.Size()
				i := 0
				for i+es <= len(got) && bytes.Equal(got[i:i+es], want[i:i+es]) {
					i += es
				}
				diffs = append(diffs, fmt.Sprintf("%s/%s: element %d is %x, want %x (%v)", name, state, i/es, got[i:i+es], want[i:i+es], wdt))
			}
		}
	}
	return diffs, nil
}

// ReadAtomic reads the 'param' tensor of an atomic state file as float32
// bytes (frozen parameters and buffers, kept in their own dtype, converted
// as torch's .float() does).
func ReadAtomic(path string) ([]byte, []int64, error) {
	raw, dt, shape, err := ReadAtomicRaw(path)
	if err != nil || dt == dtype.Float32 {
		return raw, shape, err
	}
	out := make([]byte, 4*torchfile.Numel(shape))
	return out, shape, dtype.ToFloat32(out, raw, dt)
}

// ReadAtomicRaw reads the 'param' tensor of an atomic state file as
// stored: its bytes, dtype and shape.
func ReadAtomicRaw(path string) ([]byte, dtype.DType, []int64, error) {
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, dtype.Invalid, nil, err
	}
	defer f.Close()
	t, err := atomic.StateTensor(f.Root)
	if err != nil {
		return nil, dtype.Invalid, nil, fmt.Errorf("%s: %w", path, err)
	}
	b, err := f.ReadTensor(t)
	return b, t.DType, t.Shape, err
}

// Convert indexes and converts src into a fresh folder with the given
// number of workers and returns the atomic checkpoint's path.
func Convert(tb testing.TB, t *fragment.Table, workers int) string {
	tb.Helper()
	if err := t.Validate(); err != nil {
		tb.Fatalf("coverage check: %v", err)
	}
	dst := filepath.Join(tb.TempDir(), "atomic")
	plan, err := mapreduce.NewPlan(t, mapreduce.PlanOptions{Nodes: 1, Cores: workers})
	if err != nil {
		tb.Fatal(err)
	}
	w, err := mapreduce.Create(dst, plan, atomic.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := mapreduce.Run(context.Background(), plan, w, mapreduce.Options{Workers: workers, CheckReplicas: true}); err != nil {
		w.Abort()
		tb.Fatal(err)
	}
	if _, err := w.FinishNode(); err != nil {
		tb.Fatal(err)
	}
	if _, err := mapreduce.Finalize(plan, w); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// Check compares dst with the truth file and fails the test on any difference.
func Check(tb testing.TB, dst, truthPath string) {
	tb.Helper()
	tr, err := Load(truthPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer tr.Close()
	if len(tr.Tensors(fragment.FP32)) == 0 {
		tb.Fatalf("%s has no fp32 tensors: nothing to compare", truthPath)
	}
	diffs, err := Compare(dst, tr)
	if err != nil {
		tb.Fatal(err)
	}
	for _, d := range diffs {
		tb.Error(d)
	}
}

// Python returns Debian's python3 when it can import torch. Without it the
// test is skipped, unless UCP_REQUIRE_TORCH=1 (CI), when it fails.
func Python(tb testing.TB) string {
	tb.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		if os.Getenv("UCP_REQUIRE_TORCH") == "1" {
			tb.Fatalf("UCP_REQUIRE_TORCH=1 but %s cannot import torch: %v", py, err)
		}
		tb.Skipf("%s cannot import torch; skipping the real-torch check", py)
	}
	return py
}

// CheckWithTorch runs testdata/check/check_atomic.py with real torch.
func CheckWithTorch(tb testing.TB, dst, truthPath string, extra ...string) {
	tb.Helper()
	py := Python(tb)
	args := append([]string{filepath.Join(RepoRoot(), "testdata", "check", "check_atomic.py"), dst, truthPath}, extra...)
	out, err := exec.Command(py, args...).CombinedOutput()
	if err != nil {
		tb.Errorf("real torch check failed: %v\n%s", err, strings.TrimSpace(string(out)))
	}
}

// TorchBatch collects converted checkpoints of several subtests and checks
// them with real torch in one Python process (importing torch costs
// seconds): Add moves each atomic folder where it outlives its subtest.
type TorchBatch struct {
	dir   string
	cases []torchCase
}

type torchCase struct {
	Name      string `json:"name"`
	Atomic    string `json:"atomic"`
	Truth     string `json:"truth"`
	Universal string `json:"universal,omitempty"`
}

// NewTorchBatch starts a batch owned by the (parent) test tb.
func NewTorchBatch(tb testing.TB) *TorchBatch {
	return &TorchBatch{dir: tb.TempDir()}
}

// Add queues dst (moved into the batch's folder) for a check against the
// truth file, and DeepSpeed's universal output when universal is set.
func (b *TorchBatch) Add(tb testing.TB, name, dst, truthPath, universal string) {
	tb.Helper()
	kept := filepath.Join(b.dir, fmt.Sprintf("case%d", len(b.cases)))
	if err := os.Rename(dst, kept); err != nil {
		tb.Fatal(err)
	}
	b.cases = append(b.cases, torchCase{Name: name, Atomic: kept, Truth: truthPath, Universal: universal})
}

// Run checks every queued case and reports each failing one.
func (b *TorchBatch) Run(tb testing.TB) {
	tb.Helper()
	if len(b.cases) == 0 {
		return
	}
	py := Python(tb)
	list := filepath.Join(b.dir, "cases.json")
	js, _ := json.Marshal(b.cases)
	if err := os.WriteFile(list, js, 0o644); err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command(py, filepath.Join(RepoRoot(), "testdata", "check", "check_atomic.py"), "--batch", list).CombinedOutput()
	var lines []string
	done := 0
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 4 && f[0] == "==" && f[1] == "result":
			done++
			if f[3] != "0" {
				tb.Errorf("real torch check of %s: %s mismatches:\n%s", f[2], f[3], strings.Join(lines, "\n"))
			}
			lines = nil
		case len(f) == 2 && f[0] == "==":
			lines = nil
		default:
			lines = append(lines, l)
		}
	}
	if done != len(b.cases) {
		tb.Fatalf("real torch check finished %d of %d cases (%v):\n%s", done, len(b.cases), err, out)
	}
}

// ConvertOpen converts t as Convert does and opens the result with o.
func ConvertOpen(tb testing.TB, t *fragment.Table, workers int, o atomic.ReaderOptions) *atomic.Reader {
	tb.Helper()
	r, err := atomic.OpenReader(Convert(tb, t, workers), o)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// ConvertCases converts every case of testdata/fixtures/<format> (at
// least min) with two workers and checks it bit for bit against its
// truth.pt, with ucp's reader and then, all cases in one Python process,
// with real torch. index builds a case's table from its checkpoint
// folder; check, when not nil, runs format-specific checks of the table
// against the truth file first.
func ConvertCases(t *testing.T, format string, min int, index func(t *testing.T, checkpoint string) *fragment.Table,
	check func(t *testing.T, tbl *fragment.Table, truthPath string)) {
	torch := NewTorchBatch(t)
	for _, c := range Cases(t, format, min) {
		t.Run(c, func(t *testing.T) {
			dir := Fixture(format, c)
			tp := filepath.Join(dir, "truth.pt")
			tbl := index(t, filepath.Join(dir, "checkpoint"))
			if check != nil {
				check(t, tbl, tp)
			}
			dst := Convert(t, tbl, 2)
			Check(t, dst, tp)
			torch.Add(t, c, dst, tp, "")
		})
	}
	torch.Run(t)
}

// RepoRoot returns the module root (the folder with go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Fixture returns a path under testdata/fixtures.
func Fixture(parts ...string) string {
	return filepath.Join(append([]string{RepoRoot(), "testdata", "fixtures"}, parts...)...)
}

// Cases lists the case folders of testdata/fixtures/<format>, failing
// the test when there are fewer than min.
func Cases(tb testing.TB, format string, min int) []string {
	tb.Helper()
	ents, err := os.ReadDir(Fixture(format))
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	if len(out) < min {
		tb.Fatalf("found %d %s fixture cases, want at least %d", len(out), format, min)
	}
	return out
}

// CopyTree copies a fixture checkpoint into a temporary folder, so that a
// test can break it.
func CopyTree(tb testing.TB, src string) string {
	tb.Helper()
	dst := filepath.Join(tb.TempDir(), "ckpt")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// ReadTree reads every file under dir except the manifest (whose tool
// line and timings differ between runs), by path relative to dir.
func ReadTree(tb testing.TB, dir string) map[string][]byte {
	tb.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == atomic.ManifestName {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = b
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
