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
	t := &fragment.Table{Format: "universal", Source: dir}
	m, merr := atomic.ReadManifest(dir)
	if merr == nil {
		t.Format, t.Tag, t.Degrees, t.DType = "atomic", m.Source.Tag, fragment.Degrees(m.Source.Degrees), m.Source.DType
	}
	files, names, err := universalFiles(dir, zero)
	if err != nil {
		return nil, err
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
		reshaped, err := addStateFile(p, f, decoded[i].Root, shapes)
		if err != nil {
			return nil, err
		}
		if reshaped {
			flat++
		}
	}
	if flat > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("%d state files of multi-dim parameters hold flat 1-D tensors (ds_to_universal on ZeRO-3), shaped by param_shapes of %s", flat, shapesFrom))
	}
	order := names
	if merr == nil {
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

// uniFile is one state file of a universal checkpoint.
type uniFile struct {
	param, state, path string
}

// universalFiles lists zero/<param>/<state>.pt and the parameter folders.
func universalFiles(dir, zero string) ([]uniFile, []string, error) {
	ents, err := os.ReadDir(zero)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: not a universal checkpoint: %w", dir, err)
	}
	var files []uniFile
	var names []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		sub, err := os.ReadDir(filepath.Join(zero, e.Name()))
		if err != nil {
			return nil, nil, err
		}
		names = append(names, e.Name())
		for _, s := range sub {
			if s.IsDir() || !strings.HasSuffix(s.Name(), ".pt") {
				continue
			}
			files = append(files, uniFile{e.Name(), strings.TrimSuffix(s.Name(), ".pt"), filepath.Join(zero, e.Name(), s.Name())})
		}
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("%s: no parameter folders", zero)
	}
	return files, names, nil
}

// addStateFile adds one decoded state file to its parameter; it reports
// whether a flat 1-D tensor was shaped by param_shapes.
func addStateFile(p *fragment.Param, f uniFile, root pyobj.Value, shapes map[string][]int64) (bool, error) {
	if f.state == fragment.StepState {
		switch tt := root.(type) {
		case *torchfile.Tensor: // a tensor step; a Python number otherwise
			p.Step = &fragment.Step{Tensor: &fragment.TensorRef{Path: f.path, T: tt}}
		default:
			p.Step = &fragment.Step{Value: root}
		}
		return false, nil
	}
	tt, err := atomic.StateTensor(root)
	if err != nil {
		return false, fmt.Errorf("%s: %w", f.path, err)
	}
	shape, reshaped := tt.Shape, false
	if want, ok := shapes[f.param]; ok && len(shape) == 1 && !torchfile.SameShape(want, shape) && torchfile.Numel(want) == tt.Numel() {
		shape, reshaped = want, true
	}
	if p.Shape == nil {
		p.Shape = shape
	} else if !torchfile.SameShape(p.Shape, shape) {
		return false, fmt.Errorf("%s: shape %v, but the parameter's other states have %v", f.path, shape, p.Shape)
	}
	st := p.AddState(f.state)
	st.Shards = []fragment.Shard{{Shape: shape}}
	st.Frags = []fragment.Fragment{{Len: tt.Numel(), Src: fragment.TensorRef{Path: f.path, T: tt}}}
	return reshaped, nil
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
	// A list of dicts, one per group, or one dict.
	d := pyobj.NewDec(ms[0]+": param_shapes", v)
	groups := []pyobj.Dec{d}
	if _, isSeq := pyobj.Seq(v); isSeq {
		groups = d.AsList()
	}
	out := map[string][]int64{}
	for _, g := range groups {
		for _, it := range g.Items() {
			out[it.Key] = it.AsInts()
		}
	}
	if err := d.Err(); err != nil {
		return nil, "", err
	}
	return out, filepath.Base(ms[0]), nil
}
