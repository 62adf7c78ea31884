package megatron

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func index(t *testing.T, dir string, o Options) *fragment.Table {
	t.Helper()
	return validated(t, Index, dir, o)
}

// validated indexes dir with one of the package's readers and runs the
// coverage check.
func validated(t *testing.T, read func(context.Context, string, Options) (*fragment.Table, error), dir string, o Options) *fragment.Table {
	t.Helper()
	tbl, err := read(context.Background(), dir, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := tbl.Validate(); err != nil {
		t.Fatalf("coverage check: %v", err)
	}
	return tbl
}

// TestFixtures converts every case and compares it bit for bit with its
// truth, with ucp's reader and then, for all cases in one Python process,
// with real torch; the patterns, the order of the parameters and the
// carried buffers must match the truth too.
func TestFixtures(t *testing.T) {
	testkit.ConvertCases(t, "megatron", 15, func(t *testing.T, dir string) *fragment.Table {
		if !Detect(dir) {
			t.Error("Detect is false")
		}
		return index(t, dir, Options{})
	}, func(t *testing.T, tbl *fragment.Table, tp string) {
		tr, err := testkit.Load(tp)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		checkPatterns(t, tbl, tr)
		checkBuffers(t, tbl, tr)
	})
}

// checkPatterns compares the names (in order), shapes and patterns of the
// trained parameters with the truth's.
func checkPatterns(t *testing.T, tbl *fragment.Table, tr *testkit.Truth) {
	t.Helper()
	namesV, _ := tr.Root.Get("param_names")
	want, ok := pyobj.Strings(namesV)
	if !ok {
		t.Fatal("truth has no param_names")
	}
	var got []string
	for _, p := range tbl.Params {
		if !p.Frozen {
			got = append(got, p.Name)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("parameters (in order):\n got %v\nwant %v", got, want)
	}
	pats, _ := tr.Root.Get("patterns")
	pd, _ := pats.(*pyobj.Dict)
	if pd == nil {
		t.Fatal("truth has no patterns")
	}
	for _, name := range want {
		p := tbl.Param(name)
		if p == nil {
			continue
		}
		wv, _ := pd.Get(name)
		k, _ := fragment.Classify(p)
		if k.String() != wv {
			t.Errorf("%s: pattern %v, truth %v", name, k, wv)
		}
	}
	vs, _ := tr.Root.Get("vocab_size")
	V, _ := pyobj.Int(vs)
	for _, p := range tbl.Params {
		if p.Info.VocabSize > 0 && p.Info.VocabSize != V {
			t.Errorf("%s: vocab size %d, truth %d", p.Name, p.Info.VocabSize, V)
		}
	}
}

// checkBuffers compares the carried buffers (frozen parameters) with the
// truth's buffers, by reading the model weights the table points at.
func checkBuffers(t *testing.T, tbl *fragment.Table, tr *testkit.Truth) {
	t.Helper()
	bv, _ := tr.Root.Get("buffers")
	bd, _ := bv.(*pyobj.Dict)
	n := 0
	if bd != nil {
		n = bd.Len()
	}
	var frozen []*fragment.Param
	for _, p := range tbl.Params {
		if p.Frozen {
			frozen = append(frozen, p)
		}
	}
	if len(frozen) != n {
		t.Fatalf("%d buffers carried, truth has %d", len(frozen), n)
	}
	for _, p := range frozen {
		v, ok := bd.Get(p.Name)
		wt, isT := v.(*torchfile.Tensor)
		if !ok || !isT {
			t.Errorf("buffer %s is not in the truth", p.Name)
			continue
		}
		want, err := tr.Float32(wt)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range p.States[0].Frags {
			got := readFrag(t, f)
			if !bytes.Equal(got, want) {
				t.Errorf("buffer %s from %s differs from the truth", p.Name, f.Src.Path)
			}
		}
	}
}

func readFrag(t *testing.T, f fragment.Fragment) []byte {
	t.Helper()
	tf, err := torchfile.Open(f.Src.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	b, err := tf.ReadTensor(f.Src.T)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSameModelTwoLayouts: one model state saved at TP 2 x PP 2 (with the
// distributed optimizer over DP 2) and at TP 4 x PP 1 converts to the same
// atomic files, byte for byte. The step files differ only in type: the
// distributed optimizer saved torch Adam's float step, FusedAdam an int.
func TestSameModelTwoLayouts(t *testing.T) {
	var dsts []string
	for _, c := range []string{"same_tp2_pp2", "same_tp4_pp1"} {
		tbl := index(t, testkit.Fixture("megatron", c, "checkpoint"), Options{})
		dsts = append(dsts, testkit.Convert(t, tbl, 2))
	}
	files := func(dst string) []string {
		m, err := filepath.Glob(filepath.Join(dst, atomic.ZeroDir, "*", "*.pt"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range m {
			r, _ := filepath.Rel(dst, p)
			out = append(out, r)
		}
		sort.Strings(out)
		return out
	}
	a, b := files(dsts[0]), files(dsts[1])
	if strings.Join(a, ",") != strings.Join(b, ",") || len(a) == 0 {
		t.Fatalf("different files:\n%v\n%v", a, b)
	}
	compared := 0
	for _, rel := range a {
		x, err1 := os.ReadFile(filepath.Join(dsts[0], rel))
		y, err2 := os.ReadFile(filepath.Join(dsts[1], rel))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if filepath.Base(rel) == "step.pt" {
			sx, sy := loadStep(t, filepath.Join(dsts[0], rel)), loadStep(t, filepath.Join(dsts[1], rel))
			if fx, _ := pyobj.Float(sx); fx != 10 || !sameNumber(sx, sy) {
				t.Errorf("%s: step %v vs %v", rel, pyobj.Repr(sx), pyobj.Repr(sy))
			}
			continue
		}
		compared++
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between the two layouts", rel)
		}
	}
	if compared < 3*9 {
		t.Errorf("compared only %d state files", compared)
	}
}

func loadStep(t *testing.T, path string) pyobj.Value {
	t.Helper()
	f, err := torchfile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return f.Root
}

func sameNumber(a, b pyobj.Value) bool {
	x, ok1 := pyobj.Float(a)
	y, ok2 := pyobj.Float(b)
	return ok1 && ok2 && x == y
}
