package dcp

import (
	"bytes"
	"context"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

func loadTruth(t *testing.T, c string) *testkit.Truth {
	t.Helper()
	tr, err := testkit.Load(testkit.Fixture("dcp", c, "truth.pt"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func truthDict(t *testing.T, tr *testkit.Truth, key string) *pyobj.Dict {
	t.Helper()
	v, ok := tr.Root.Get(key)
	d, ok2 := v.(*pyobj.Dict)
	if !ok || !ok2 {
		t.Fatalf("truth has no %s dict", key)
	}
	return d
}

// Every fixture converts bit for bit to its truth: fp32 weights (from any
// saved dtype), Adam moments, steps, buffers, and the extra state.
func TestFixturesConvertToTruth(t *testing.T) {
	t.Parallel()
	for _, c := range testkit.Cases(t, "dcp", 13) {
		t.Run(c, func(t *testing.T) {
			tr := loadTruth(t, c)
			tbl, err := Index(context.Background(), testkit.Fixture("dcp", c, "checkpoint"), Options{Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tbl.Close() })
			names, _ := pyobj.Strings(mustGet(t, tr.Root, "param_names"))
			buffers := truthDict(t, tr, "buffers")
			if got, want := len(tbl.Params), len(names)+buffers.Len(); got != want {
				t.Errorf("%d parameters, want %d (%d weights, %d buffers)", got, want, len(names), buffers.Len())
			}
			dst := testkit.Convert(t, tbl, 2)
			if len(tr.Tensors(fragment.FP32)) > 0 {
				testkit.Check(t, dst, tr.Path)
			}
			checkBuffers(t, tr, tbl, dst)
			checkSteps(t, tr, tbl, dst)
			checkExtra(t, tr, dst)
			if c == "fsdp2_w2" {
				testkit.CheckWithTorch(t, dst, tr.Path)
			}
		})
	}
}

func mustGet(t *testing.T, d *pyobj.Dict, k string) pyobj.Value {
	t.Helper()
	v, ok := d.Get(k)
	if !ok {
		t.Fatalf("missing %q", k)
	}
	return v
}

func checkBuffers(t *testing.T, tr *testkit.Truth, tbl *fragment.Table, dst string) {
	t.Helper()
	buffers := truthDict(t, tr, "buffers")
	for i := 0; i < buffers.Len(); i++ {
		k, v := buffers.Item(i)
		name := k.(string)
		p := tbl.Param(name)
		if p == nil || !p.Frozen {
			t.Errorf("buffer %s is not a frozen parameter", name)
			continue
		}
		want, err := tr.Float32(v.(*torchfile.Tensor))
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := testkit.ReadAtomic(filepath.Join(dst, atomic.StatePath(name, fragment.FP32)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("buffer %s differs (%v)", name, err)
		}
	}
}

func checkSteps(t *testing.T, tr *testkit.Truth, tbl *fragment.Table, dst string) {
	t.Helper()
	steps := truthDict(t, tr, "step")
	for i := 0; i < steps.Len(); i++ {
		k, v := steps.Item(i)
		name := k.(string)
		wt := v.(*torchfile.Tensor)
		want, err := tr.File.ReadTensor(wt)
		if err != nil {
			t.Fatal(err)
		}
		f, err := torchfile.Open(filepath.Join(dst, atomic.StatePath(name, fragment.StepState)))
		if err != nil {
			t.Errorf("step of %s: %v", name, err)
			continue
		}
		gt, ok := f.Root.(*torchfile.Tensor)
		if !ok || gt.DType != wt.DType || len(gt.Shape) != 0 {
			t.Errorf("step of %s is %s, want a 0-dim %v tensor", name, pyobj.TypeName(f.Root), wt.DType)
		} else if got, err := f.ReadTensor(gt); err != nil || !bytes.Equal(got, want) {
			t.Errorf("step of %s differs", name)
		}
		f.Close()
	}
	for _, p := range tbl.Params {
		if p.Step != nil {
			if _, ok := steps.Get(p.Name); !ok {
				t.Errorf("%s has a step the truth does not have", p.Name)
			}
		}
	}
}

// checkExtra compares every non-tensor value of the truth (and tensors that
// are no parameter state) with extra_state.pt at its planner_data path.
func checkExtra(t *testing.T, tr *testkit.Truth, dst string) {
	t.Helper()
	extra := truthDict(t, tr, "extra")
	paths := truthDict(t, tr, "paths")
	want := map[string]pyobj.Value{}
	for i := 0; i < extra.Len(); i++ {
		k, v := extra.Item(i)
		want[k.(string)] = v
	}
	if len(want) == 0 {
		if _, err := os.Stat(filepath.Join(dst, atomic.ExtraState)); err == nil {
			t.Errorf("extra_state.pt written for a checkpoint without non-tensor state")
		}
		return
	}
	f, err := torchfile.Open(filepath.Join(dst, atomic.ExtraState))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		pv, _ := paths.Get(k)
		path, _ := pyobj.Seq(pv)
		got, ok := getElement(f.Root, path)
		if !ok {
			t.Errorf("extra %s: missing at %v", k, pyobj.Repr(pv))
			continue
		}
		if err := sameValue(got, f, want[k], tr.File); err != nil {
			t.Errorf("extra %s: %v", k, err)
		}
	}
}

func getElement(root pyobj.Value, path []pyobj.Value) (pyobj.Value, bool) {
	cur := root
	for _, p := range path {
		switch c := cur.(type) {
		case *pyobj.Dict:
			v, ok := c.Get(p)
			if !ok {
				return nil, false
			}
			cur = v
		case *pyobj.List:
			i, ok := p.(int64)
			if !ok || i >= int64(len(c.Items)) {
				return nil, false
			}
			cur = c.Items[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// sameValue compares decoded Python values; tensors by dtype, shape and bytes.
func sameValue(a pyobj.Value, af *torchfile.File, b pyobj.Value, bf *torchfile.File) error {
	switch x := a.(type) {
	case *torchfile.Tensor:
		y, ok := b.(*torchfile.Tensor)
		if !ok {
			return fmt.Errorf("got a tensor, want %s", pyobj.TypeName(b))
		}
		if x.DType != y.DType || !torchfile.SameShape(x.Shape, y.Shape) {
			return fmt.Errorf("tensor %v%v, want %v%v", x.DType, x.Shape, y.DType, y.Shape)
		}
		xb, err1 := af.ReadTensor(x)
		yb, err2 := bf.ReadTensor(y)
		if err1 != nil || err2 != nil || !bytes.Equal(xb, yb) {
			return fmt.Errorf("tensor bytes differ")
		}
		return nil
	case *pyobj.Dict:
		y, ok := b.(*pyobj.Dict)
		if !ok || x.Len() != y.Len() {
			return fmt.Errorf("got %s, want %s", pyobj.Repr(a), pyobj.Repr(b))
		}
		for i := 0; i < x.Len(); i++ {
			k, v := x.Item(i)
			k2, v2 := y.Item(i)
			if err := sameValue(k, af, k2, bf); err != nil {
				return fmt.Errorf("key %d: %v", i, err)
			}
			if err := sameValue(v, af, v2, bf); err != nil {
				return fmt.Errorf("[%s]: %v", pyobj.Repr(k), err)
			}
		}
		return nil
	case *pyobj.List:
		y, ok := b.(*pyobj.List)
		if !ok {
			return fmt.Errorf("got a list, want %s", pyobj.TypeName(b))
		}
		return sameSeq(x.Items, af, y.Items, bf)
	case pyobj.Tuple:
		y, ok := b.(pyobj.Tuple)
		if !ok {
			return fmt.Errorf("got a tuple, want %s", pyobj.TypeName(b))
		}
		return sameSeq(x, af, y, bf)
	case *pyobj.Object:
		y, ok := b.(*pyobj.Object)
		if !ok || x.Class.String() != y.Class.String() || x.Via != y.Via || x.Built != y.Built {
			return fmt.Errorf("got %s, want %s", pyobj.TypeName(a), pyobj.TypeName(b))
		}
		if err := sameSeq(x.Args, af, y.Args, bf); err != nil {
			return err
		}
		return sameValue(x.State, af, y.State, bf)
	case pyobj.Bytes:
		y, ok := b.(pyobj.Bytes)
		if !ok || !bytes.Equal(x, y) {
			return fmt.Errorf("got bytes %q, want %s", []byte(x), pyobj.Repr(b))
		}
		return nil
	case *big.Int:
		y, ok := b.(*big.Int)
		if !ok || x.Cmp(y) != 0 {
			return fmt.Errorf("got %s, want %s", x, pyobj.Repr(b))
		}
		return nil
	case nil, bool, int64, float64, string, pyobj.DType:
		if a != b {
			return fmt.Errorf("got %s (%s), want %s (%s)", pyobj.Repr(a), pyobj.TypeName(a), pyobj.Repr(b), pyobj.TypeName(b))
		}
		return nil
	}
	if pyobj.Repr(a) != pyobj.Repr(b) || pyobj.TypeName(a) != pyobj.TypeName(b) {
		return fmt.Errorf("got %s, want %s", pyobj.Repr(a), pyobj.Repr(b))
	}
	return nil
}

func sameSeq(a []pyobj.Value, af *torchfile.File, b []pyobj.Value, bf *torchfile.File) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d items, want %d", len(a), len(b))
	}
	for i := range a {
		if err := sameValue(a[i], af, b[i], bf); err != nil {
			return fmt.Errorf("item %d: %v", i, err)
		}
	}
	return nil
}

// The patterns ucp derives (what inspect prints and the manifest records)
// are the truth's for every tensor key: model weights, buffers, optimizer
// states, and the 0-dim steps.
func TestFixturePatterns(t *testing.T) {
	for _, c := range testkit.Cases(t, "dcp", 13) {
		t.Run(c, func(t *testing.T) {
			tr := loadTruth(t, c)
			ck, err := Open(context.Background(), testkit.Fixture("dcp", c, "checkpoint"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ck.Close() })
			tbl, err := ck.Table()
			if err != nil {
				t.Fatal(err)
			}
			// key -> (parameter, state) from the truth's key map.
			keys := truthDict(t, tr, "keys")
			where := map[string][2]string{}
			for i := 0; i < keys.Len(); i++ {
				k, v := keys.Item(i)
				d := v.(*pyobj.Dict)
				for j := 0; j < d.Len(); j++ {
					role, key := d.Item(j)
					state := role.(string)
					if state == "param" || state == "buffer" {
						state = fragment.FP32
					}
					where[key.(string)] = [2]string{k.(string), state}
				}
			}
			pats := truthDict(t, tr, "patterns")
			for i := 0; i < pats.Len(); i++ {
				k, v := pats.Item(i)
				key, want := k.(string), v.(string)
				got := ""
				if w, ok := where[key]; ok && w[1] != fragment.StepState {
					p := tbl.Param(w[0])
					if p == nil || p.State(w[1]) == nil {
						t.Errorf("%s: no state %s of %s", key, w[1], w[0])
						continue
					}
					one := &fragment.Param{Name: p.Name, Shape: p.Shape, Info: p.Info, States: []*fragment.State{p.State(w[1])}}
					kind, _ := fragment.Classify(one)
					got = kind.String()
				} else {
					got = tensorPattern(t, ck, key)
				}
				if got != want {
					t.Errorf("%s: pattern %s, want %s", key, got, want)
				}
			}
		})
	}
}

// tensorPattern classifies a tensor that is no parameter state (a step, a
// stray tensor) the way the table classifies states.
func tensorPattern(t *testing.T, ck *Checkpoint, key string) string {
	for _, tt := range ck.Tensors {
		if tt.Key == key {
			a := &assembly{c: ck}
			p := &fragment.Param{Name: key, Shape: tt.Size, Info: fragment.Info{Replicas: a.replicas(tt)},
				States: []*fragment.State{a.state(fragment.FP32, tt)}}
			kind, _ := fragment.Classify(p)
			return kind.String()
		}
	}
	t.Errorf("%s: not a tensor of the checkpoint", key)
	return ""
}

// The metadata of every layout decodes with the fields its torch version
// writes, and the planner_data paths are the truth's.
func TestFixtureMetadata(t *testing.T) {
	fields := map[string][]string{
		"v2.2": {"state_dict_metadata", "planner_data", "storage_data"},
		"v2.3": {"state_dict_metadata", "planner_data", "storage_data"},
		"v2.4": {"state_dict_metadata", "planner_data", "storage_data", "storage_meta"},
		"v2.7": {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"},
	}
	for _, c := range testkit.Cases(t, "dcp", 13) {
		t.Run(c, func(t *testing.T) {
			tr := loadTruth(t, c)
			meta := truthDict(t, tr, "meta")
			layout, _ := pyobj.Str(mustGet(t, meta, "layout"))
			md, err := ReadMetadata(testkit.Fixture("dcp", c, "checkpoint", MetadataFile))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(md.Fields) != fmt.Sprint(fields[layout]) || len(md.Unknown) != 0 {
				t.Errorf("fields %v (unknown %v), want %v", md.Fields, md.Unknown, fields[layout])
			}
			if (layout == "v2.7") != (md.Version == "1.0.0") {
				t.Errorf("layout %s has version %q", layout, md.Version)
			}
			if layout >= "v2.4" {
				id, _ := pyobj.Str(mustGet(t, meta, "checkpoint_id"))
				save, _ := pyobj.Str(mustGet(t, meta, "save_id"))
				if md.StorageMeta == nil || md.StorageMeta.CheckpointID != id || md.StorageMeta.SaveID != save {
					t.Errorf("storage_meta %+v, want checkpoint_id %s save_id %s", md.StorageMeta, id, save)
				}
			} else if md.StorageMeta != nil {
				t.Errorf("layout %s has storage_meta", layout)
			}
			paths := truthDict(t, tr, "paths")
			if len(md.Entries) != paths.Len() {
				t.Errorf("%d entries, want %d", len(md.Entries), paths.Len())
			}
			for i := 0; i < paths.Len(); i++ {
				k, v := paths.Item(i)
				want, _ := pyobj.Seq(v)
				got := md.Path(k.(string))
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("path of %s is %v, want %v", k, got, want)
				}
				e, ok := md.Entry(k.(string))
				if !ok {
					t.Errorf("%s is not in state_dict_metadata", k)
					continue
				}
				if tensors := truthDict(t, tr, "tensors"); e.Bytes {
					if _, isTensor := tensors.Get(k); isTensor {
						t.Errorf("%s is bytes, want a tensor", k)
					}
				} else if tv, ok := tensors.Get(k); !ok {
					t.Errorf("%s is a tensor, want bytes", k)
				} else if tt := tv.(*torchfile.Tensor); tt.DType != e.DType || !torchfile.SameShape(tt.Shape, e.Size) {
					t.Errorf("%s is %v%v, want %v%v", k, e.DType, e.Size, tt.DType, tt.Shape)
				}
			}
		})
	}
}

// The optimizer's param groups land in zero/optimizer_state.pt; the
// flattened per-parameter groups of torchtitan fold back into one group.
func TestParamGroups(t *testing.T) {
	for _, c := range []string{"fsdp2_w2", "optim_ids_w2", "torchtitan_w2", "variant_v22_w2"} {
		t.Run(c, func(t *testing.T) {
			tbl, err := Index(context.Background(), testkit.Fixture("dcp", c, "checkpoint"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tbl.Close() })
			pg, err := pyobj.Path(tbl.Optimizer, "param_groups")
			if err != nil {
				t.Fatal(err)
			}
			groups, _ := pyobj.Seq(pg)
			if len(groups) != 1 {
				t.Fatalf("%d param groups, want 1", len(groups))
			}
			g := groups[0].(*pyobj.Dict)
			lr, _ := g.Get("lr")
			if lr != 0.00075 {
				t.Errorf("lr %v", lr)
			}
			params, _ := g.Get("params")
			items, _ := pyobj.Seq(params)
			if len(items) != len(tbl.Params)-countFrozen(tbl) {
				t.Errorf("params %s for %d trained parameters", pyobj.Repr(params), len(tbl.Params)-countFrozen(tbl))
			}
		})
	}
}

func countFrozen(t *fragment.Table) int {
	n := 0
	for _, p := range t.Params {
		if p.Frozen {
			n++
		}
	}
	return n
}

// keep dtype imported for helpers shared with other tests.
var _ = dtype.Float32
