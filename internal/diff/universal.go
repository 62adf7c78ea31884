package diff

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// IsUniversal says whether dir looks like a universal checkpoint: ucp's
// atomic output (ucp.json) or ds_to_universal's (a zero/ folder of
// per-parameter folders, no manifest).
func IsUniversal(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, atomic.ManifestName)); err == nil {
		return true
	}
	st, err := os.Stat(filepath.Join(dir, atomic.ZeroDir))
	return err == nil && st.IsDir()
}

// IndexUniversal reads a universal checkpoint folder into a fragment table
// with one whole-tensor shard per state file, so that it is read by the
// same reducers as any source. State files are either DeepSpeed's dict
// {'param': tensor, 'cat_dim': ...} (ZeRO-1/2, ucp) or a bare tensor
// (ds_to_universal on ZeRO-3 writes flat 1-D tensors): a flat tensor takes
// the parameter's shape from the folder's model-state files (param_shapes)
// when they name it with the same number of elements.
func IndexUniversal(ctx context.Context, dir string, workers int) (*fragment.Table, error) {
	zero := filepath.Join(dir, atomic.ZeroDir)
	ents, err := os.ReadDir(zero)
	if err != nil {
		return nil, fmt.Errorf("%s: not a universal checkpoint: %w", dir, err)
	}
	t := &fragment.Table{Format: "universal", Source: dir}
	if m, err := atomic.ReadManifest(dir); err == nil {
		t.Format, t.Tag, t.Degrees, t.DType = "atomic", m.Source.Tag, fragment.Degrees(m.Source.Degrees), m.Source.DType
	}
	type file struct {
		param, state, path string
	}
	var files []file
	var names []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		sub, err := os.ReadDir(filepath.Join(zero, e.Name()))
		if err != nil {
			return nil, err
		}
		names = append(names, e.Name())
		for _, s := range sub {
			if s.IsDir() || !strings.HasSuffix(s.Name(), ".pt") {
				continue
			}
			files = append(files, file{e.Name(), strings.TrimSuffix(s.Name(), ".pt"), filepath.Join(zero, e.Name(), s.Name())})
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no parameter folders", zero)
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = f.path
	}
	decoded, err := torchfile.DecodeAll(ctx, paths, workers)
	if err != nil {
		return nil, err
	}
	shapes, shapesFrom, err := paramShapes(dir)
	if err != nil {
		return nil, err
	}
	params := map[string]*fragment.Param{}
	flat := 0
	for i, f := range files {
		p := params[f.param]
		if p == nil {
			p = &fragment.Param{Name: f.param}
			params[f.param] = p
		}
		root := decoded[i].Root
		if f.state == fragment.StepState {
			if tt, ok := root.(*torchfile.Tensor); ok {
				p.Step = &fragment.Step{Tensor: &fragment.TensorRef{Path: f.path, T: tt}}
			} else {
				p.Step = &fragment.Step{Value: root}
			}
			continue
		}
		tt, err := StateTensor(root)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.path, err)
		}
		shape := tt.Shape
		if want, ok := shapes[f.param]; ok && len(shape) == 1 && !torchfile.SameShape(want, shape) && torchfile.Numel(want) == tt.Numel() {
			shape = want
			flat++
		}
		if p.Shape == nil {
			p.Shape = shape
		} else if !torchfile.SameShape(p.Shape, shape) {
			return nil, fmt.Errorf("%s: shape %v, but the parameter's other states have %v", f.path, shape, p.Shape)
		}
		st := p.AddState(f.state)
		st.Shards = []fragment.Shard{{Shape: shape}}
		st.Frags = []fragment.Fragment{{Len: tt.Numel(), Src: fragment.TensorRef{Path: f.path, T: tt}}}
	}
	if flat > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("%d state files of multi-dim parameters hold flat 1-D tensors (ds_to_universal on ZeRO-3), shaped by param_shapes of %s", flat, shapesFrom))
	}
	order := names
	if m, err := atomic.ReadManifest(dir); err == nil {
		order = order[:0]
		for _, p := range m.Params {
			order = append(order, p.Name)
		}
	}
	for _, n := range order {
		p := params[n]
		if p == nil {
			return nil, fmt.Errorf("%s: the manifest lists %s but zero/ has no files of it", dir, n)
		}
		sort.SliceStable(p.States, func(i, j int) bool { return stateRank(p.States[i].Name) < stateRank(p.States[j].Name) })
		t.Params = append(t.Params, p)
		delete(params, n)
	}
	if len(params) > 0 {
		var extra []string
		for n := range params {
			extra = append(extra, n)
		}
		sort.Strings(extra)
		return nil, fmt.Errorf("%s: zero/ has parameters the manifest does not list: %s", dir, strings.Join(extra, ", "))
	}
	return t, nil
}

// stateRank orders the standard states first, then the others by name
// (file order is already by name).
func stateRank(s string) int {
	switch s {
	case fragment.FP32:
		return 0
	case fragment.ExpAvg:
		return 1
	case fragment.ExpAvgSq:
		return 2
	}
	return 3
}

// StateTensor returns the tensor of a universal state file: the 'param'
// of DeepSpeed's dict, or the file's bare tensor.
func StateTensor(root pyobj.Value) (*torchfile.Tensor, error) {
	switch x := root.(type) {
	case *torchfile.Tensor:
		return x, nil
	case *pyobj.Dict:
		d := pyobj.NewDec("", x)
		t := pyobj.As[*torchfile.Tensor](d.Key("param"), "tensor")
		return t, d.Err()
	}
	return nil, fmt.Errorf("holds a %s, want a tensor or a dict with 'param'", pyobj.TypeName(root))
}

// paramShapes reads param_shapes (a list of dicts name -> torch.Size, one
// per parameter group) from the first model-state file of dir, if any.
func paramShapes(dir string) (map[string][]int64, string, error) {
	ms, _ := filepath.Glob(filepath.Join(dir, "*model_states.pt"))
	if len(ms) == 0 {
		return nil, "", nil
	}
	sort.Strings(ms)
	f, err := torchfile.Decode(ms[0])
	if err != nil {
		return nil, "", err
	}
	v, err := pyobj.Path(f.Root, "param_shapes")
	if err != nil {
		return nil, "", nil // not a DeepSpeed model state: no shapes to borrow
	}
	groups, ok := pyobj.Seq(v)
	if !ok {
		groups = []pyobj.Value{v}
	}
	out := map[string][]int64{}
	for _, g := range groups {
		d, ok := g.(*pyobj.Dict)
		if !ok {
			return nil, "", fmt.Errorf("%s: param_shapes holds a %s, want dicts", ms[0], pyobj.TypeName(g))
		}
		for i := 0; i < d.Len(); i++ {
			k, val := d.Item(i)
			name, ok1 := pyobj.Str(k)
			shape, ok2 := pyobj.Ints(val)
			if !ok1 || !ok2 {
				return nil, "", fmt.Errorf("%s: param_shapes entry %s: %s, want name -> shape", ms[0], pyobj.Repr(k), pyobj.TypeName(val))
			}
			out[name] = shape
		}
	}
	return out, filepath.Base(ms[0]), nil
}
