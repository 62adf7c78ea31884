// IndexZero3 indexes DeepSpeed ZeRO-3 checkpoints (including AutoTP
// grids of tensor x data parallel ranks) into a fragment table.
//
// ZeRO-3 partitions every parameter on its own: flattened, padded to a
// multiple of the data-parallel degree D and split evenly, Pn = ceil(n/D)
// elements per rank, the padding at the end of the last rank(s). Each
// rank's flat fp32 partition of a sub-group is the concatenation of its
// Pn-element pieces of the sub-group's parameters (ZERO3.md, "Partitions",
// documents what is read).

package deepspeed

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Zero3Options configure IndexZero3.
type Zero3Options struct {
	Tag     string
	Workers int
	Scan    *Scan // the listings of the walk that detected the format (nil: list)
	Decode  torchfile.Options
}

// DetectZero3 reports whether path holds a ZeRO-3 checkpoint: per-rank
// zero_pp_rank_*_model_states.pt files and no mp_rank_* model states.
func (s *Scan) DetectZero3(path string) bool {
	f, err := s.Files(path, "")
	return err == nil && len(f.Zero3) > 0 && len(f.Model) == 0
}

// rank is one (tp, dp) cell of the grid.
type rank struct {
	tp, dp int
	model  pyobj.Dec     // the model state's root, a dict
	shapes []GroupShapes // param_shapes per sub-group
	oroot  *pyobj.Dict   // the optimizer file's root
	osd    *pyobj.Dict   // optimizer_state_dict
	flat   []*torchfile.Tensor
	states []pyobj.Dec // torch optimizer state per sub-group, dicts
	count  []int64     // partition count per sub-group
	rankIn []int64     // partition rank per sub-group
	mpath  string
	opath  string
}

// IndexZero3 builds the fragment table of the ZeRO-3 checkpoint at path.
func IndexZero3(ctx context.Context, path string, opt Zero3Options) (*fragment.Table, error) {
	files, err := opt.Scan.Files(path, opt.Tag)
	if err != nil {
		return nil, err
	}
	dir, tag := files.Dir, files.Tag
	if len(files.Zero3) == 0 {
		return nil, fmt.Errorf("%s: no zero_pp_rank_*_mp_rank_*_model_states.pt files (not a ZeRO-3 checkpoint)", dir)
	}
	T, D := 0, 0
	for k := range files.Zero3 {
		D, T = max(D, k[0]+1), max(T, k[1]+1)
	}
	for k := range files.Optim {
		D, T = max(D, k[0]+1), max(T, k[1]+1)
	}
	var paths []string
	for tp := 0; tp < T; tp++ {
		for dp := 0; dp < D; dp++ {
			m, ok := files.Zero3[[2]int{dp, tp}]
			if !ok {
				return nil, fmt.Errorf("%s: missing rank file zero_pp_rank_%d_mp_rank_%02d_model_states.pt (grid of %d tensor x %d data parallel ranks)", dir, dp, tp, T, D)
			}
			o, ok := files.Optim[[2]int{dp, tp}]
			if !ok {
				return nil, fmt.Errorf("%s: missing rank file zero_pp_rank_%d_mp_rank_%02d_optim_states.pt (grid of %d tensor x %d data parallel ranks)", dir, dp, tp, T, D)
			}
			paths = append(paths, m, o)
		}
	}
	decoded, err := opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, err
	}
	grid := make([][]*rank, T)
	for tp := 0; tp < T; tp++ {
		grid[tp] = make([]*rank, D)
		for dp := 0; dp < D; dp++ {
			i := 2 * (tp*D + dp)
			r, err := parseRank(decoded[i], decoded[i+1], tp, dp, D)
			if err != nil {
				return nil, err
			}
			grid[tp][dp] = r
		}
	}
	if err := checkRanksZero3(dir, grid); err != nil {
		return nil, err
	}
	return build(dir, tag, grid)
}

func parseRank(mf, of *torchfile.File, tp, dp, D int) (*rank, error) {
	r := &rank{tp: tp, dp: dp, mpath: mf.Name, opath: of.Name}
	r.model = pyobj.NewDec(mf.Name, mf.Root)
	sv, ok := r.model.Opt("param_shapes")
	if !ok && r.model.Err() == nil {
		return nil, fmt.Errorf("%s: no param_shapes list", mf.Name)
	}
	r.shapes = ParamShapes(sv)
	if err := r.model.Err(); err != nil {
		return nil, err
	}
	root := pyobj.NewDec(of.Name, of.Root)
	osd := root.Dict("optimizer_state_dict")
	if err := root.Err(); err != nil {
		return nil, err
	}
	r.osd, r.oroot = osd.AsDict(), root.AsDict()
	zs := osd.Key("zero_stage").Value()
	if err := root.Err(); err != nil {
		return nil, err
	}
	if ZeroStage(zs) != 3 {
		return nil, fmt.Errorf("%s: zero_stage is %s, not 3", of.Name, pyobj.Repr(zs))
	}
	flats, ok := osd.Opt("fp32_flat_groups")
	if !ok {
		return nil, fmt.Errorf("%s: no fp32_flat_groups list", of.Name)
	}
	for _, fv := range flats.AsList() {
		r.flat = append(r.flat, pyobj.As[*torchfile.Tensor](fv, "tensor"))
	}
	if err := root.Err(); err != nil {
		return nil, err
	}
	if len(r.flat) != len(r.shapes) {
		return nil, fmt.Errorf("%s: %d fp32 sub-groups but %s lists %d", of.Name, len(r.flat), filepath.Base(mf.Name), len(r.shapes))
	}
	states := osd.Dict("optimizer_state_dict").Dict("state")
	count := osd.Int("partition_count")
	if err := root.Err(); err != nil {
		return nil, err
	}
	if int(count) != D {
		return nil, fmt.Errorf("%s: partition_count %d, but the grid has %d data-parallel ranks", of.Name, count, D)
	}
	// AutoEP records each sub-group's own partition group.
	var pgroups []pyobj.Dec
	if v, ok := osd.Opt("ds_zero_partition_groups"); ok {
		pgroups = v.AsList()
	}
	for s := range r.flat {
		sd, ok := states.OptDict(int64(s))
		if !ok && freshState(states) {
			sd, ok = pyobj.NewDec(of.Name, pyobj.NewDict(pyobj.PlainDict)), true // a fresh optimizer (index.go)
		}
		if !ok && root.Err() == nil {
			return nil, fmt.Errorf("%s: optimizer state of sub-group %d is missing (saved before the first optimizer step?)", of.Name, s)
		}
		r.states = append(r.states, sd)
		c, rk := count, int64(dp)
		if s < len(pgroups) && pgroups[s].AsDict() != nil {
			c = pgroups[s].OptInt("partition_count", c)
			rk = pgroups[s].OptInt("partition_rank", rk)
		}
		if err := root.Err(); err != nil {
			return nil, err
		}
		if c <= 0 || rk < 0 || rk >= c {
			return nil, fmt.Errorf("%s: sub-group %d has partition rank %d of %d", of.Name, s, rk, c)
		}
		r.count = append(r.count, c)
		r.rankIn = append(r.rankIn, rk)
	}
	return r, nil
}

// piece is where one parameter's partition lies in a rank's flat group.
type piece struct {
	sub    int
	offset int64 // in the flat sub-group tensor
}

func build(dir, tag string, grid [][]*rank) (*fragment.Table, error) {
	T, D := len(grid), len(grid[0])
	r00 := grid[0][0]
	rules, err := ReadRules(r00.model)
	if err != nil {
		return nil, err
	}
	t := &fragment.Table{Format: "deepspeed-zero3", Source: dir, Tag: tag,
		Degrees: fragment.Degrees{TP: T, PP: 1, DP: D, EP: 1, ZeRO: 3}}
	// DeepSpeed prefixes the optimizer files with "bf16_" exactly when the
	// run trains in bfloat16 (DeepSpeedEngine._get_zero_ckpt_prefix,
	// deepspeed/runtime/engine.py); the ZeRO-3 module state holds only
	// placeholders, so the file name is what tells.
	if strings.HasPrefix(filepath.Base(r00.opath), "bf16_") {
		t.DType = dtype.BFloat16.String()
	}
	// Parameter names and per-TP shapes, from each TP rank's dp-0 file.
	var names []string
	where := make([]map[string]piece, T)
	shapes := make([]map[string][]int64, T)
	for tp := 0; tp < T; tp++ {
		where[tp], shapes[tp] = map[string]piece{}, map[string][]int64{}
		r := grid[tp][0]
		for s, g := range r.shapes {
			var off int64
			for _, name := range g.Names {
				shape := g.Shape[name]
				if _, dup := where[tp][name]; dup {
					return nil, fmt.Errorf("%s: parameter %s appears in two sub-groups", r.mpath, name)
				}
				where[tp][name] = piece{sub: s, offset: off}
				shapes[tp][name] = shape
				off += ceilDiv(torchfile.Numel(shape), r.count[s])
				if tp == 0 {
					names = append(names, name)
				}
			}
			// Every rank's flat group must hold exactly these pieces.
			for dp := 0; dp < D; dp++ {
				if n := grid[tp][dp].flat[s].Numel(); n != off {
					return nil, fmt.Errorf("%s: fp32_flat_groups[%d] has %d elements, but its parameters' partitions need %d",
						grid[tp][dp].opath, s, n, off)
				}
			}
		}
	}
	for _, name := range names {
		ts := make([][]int64, T)
		for tp := 0; tp < T; tp++ {
			s, ok := shapes[tp][name]
			if !ok {
				return nil, fmt.Errorf("%s: parameter %s is missing from param_shapes", grid[tp][0].mpath, name)
			}
			ts[tp] = s
		}
		pl, err := rules.Classify(name, ts)
		if err != nil {
			return nil, err
		}
		shards, shape, err := pl.Shards(name, T)
		if err != nil {
			return nil, err
		}
		p := pl.Param(name, shape)
		for tp := 0; tp < T; tp++ {
			if torchfile.Numel(shards[tp].Shape) != torchfile.Numel(ts[tp]) {
				return nil, fmt.Errorf("parameter %s: rank %d holds shape %v but the pattern gives it %v", name, tp, ts[tp], shards[tp].Shape)
			}
			if err := addFragments(p, shards, grid[tp], where[tp][name], torchfile.Numel(ts[tp]), tp); err != nil {
				return nil, err
			}
		}
		t.Params = append(t.Params, p)
	}
	if err := addFrozen(t, grid, rules); err != nil {
		return nil, err
	}
	if err := addAliases(t, grid[0][0].model); err != nil {
		return nil, err
	}
	if um := rules.Unmatched(); len(um) > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("universal_checkpoint_info patterns that match no parameter: %v", um))
	}
	if t.Optimizer, err = optimizerState(r00); err != nil {
		return nil, err
	}
	for tp := 0; tp < T; tp++ {
		for dp := 0; dp < D; dp++ {
			m := grid[tp][dp].mpath
			cf, err := fragment.NewCopyFile(filepath.Base(m), m)
			if err != nil {
				return nil, err
			}
			t.CopyFiles = append(t.CopyFiles, cf)
		}
	}
	return t, nil
}

// addFragments adds the DP fragments of TP rank tp's shard: rank r holds
// elements [r*Pn, r*Pn + valid(r)) of the shard, valid(r) = clamp(n - r*Pn).
func addFragments(p *fragment.Param, shards []fragment.Shard, ranks []*rank, pc piece, n int64, tp int) error {
	for _, r := range ranks {
		c, rk := r.count[pc.sub], r.rankIn[pc.sub]
		pn := ceilDiv(n, c)
		valid := max(0, min(pn, n-rk*pn))
		if tp == 0 && r.dp == 0 {
			p.Info.Padding = c*pn - n
		}
		st := r.states[pc.sub]
		names, srcs := FlatStates(r.flat[pc.sub], st, r.flat[pc.sub].Numel())
		if err := st.Err(); err != nil {
			return err
		}
		for _, k := range names {
			s := p.StateWith(k, shards)
			if valid > 0 {
				s.Frags = append(s.Frags, fragment.Fragment{Shard: tp, LocalStart: rk * pn, Len: valid,
					Src: fragment.Ref(r.opath, srcs[k], 0), SrcStart: pc.offset})
			}
		}
		if p.Step == nil {
			if sv, ok := st.AsDict().Get(fragment.StepState); ok {
				p.Step = stepOf(r.opath, sv)
			}
		}
	}
	return nil
}

func stepOf(path string, v pyobj.Value) *fragment.Step {
	switch t := v.(type) {
	case *torchfile.Tensor:
		ref := fragment.Ref(path, t, 0)
		return &fragment.Step{Tensor: &ref}
	}
	return &fragment.Step{Value: v}
}

// addAliases records tied weights: shared_params (alias -> stored name),
// which DeepSpeed fills in global rank 0's model state only.
func addAliases(t *fragment.Table, model pyobj.Dec) error {
	sp, ok := model.OptDict("shared_params")
	if !ok {
		return sp.Err()
	}
	for _, it := range sp.Items() {
		canon := it.AsStr()
		if err := it.Err(); err != nil {
			return err
		}
		if p := t.Param(canon); p != nil {
			p.Info.Aliases = append(p.Info.Aliases, it.Key)
		}
	}
	return sp.Err()
}

// addFrozen adds frozen parameters (each rank holds its ZeRO-3 partition
// in frozen_param_fragments) and buffers (full in every rank's module).
func addFrozen(t *fragment.Table, grid [][]*rank, rules *Rules) error {
	T := len(grid)
	r00 := grid[0][0]
	// frozen returns rank r's frozen_param_<what>[name], ok false when the
	// dict (None without frozen parameters) or the name is missing.
	frozen := func(r *rank, what, name string) (pyobj.Dec, bool) {
		d, ok := r.model.OptDict("frozen_param_" + what)
		if !ok {
			return d, false
		}
		return d.Opt(name)
	}
	fs, _ := r00.model.OptDict("frozen_param_shapes")
	for _, it := range fs.Items() {
		name := it.Key
		ts := make([][]int64, T)
		for tp := 0; tp < T; tp++ {
			sv, ok := frozen(grid[tp][0], "shapes", name)
			if !ok && sv.Err() == nil {
				return fmt.Errorf("%s: frozen parameter %s has no shape", grid[tp][0].mpath, name)
			}
			ts[tp] = sv.AsInts()
			if err := sv.Err(); err != nil {
				return err
			}
		}
		pl, err := rules.Classify(name, ts)
		if err != nil {
			return err
		}
		p, st, err := pl.Frozen(name, T)
		if err != nil {
			return err
		}
		for tp := 0; tp < T; tp++ {
			n := torchfile.Numel(ts[tp])
			D := int64(len(grid[tp]))
			pn := ceilDiv(n, D)
			for _, r := range grid[tp] {
				fv, ok := frozen(r, "fragments", name)
				if !ok && fv.Err() == nil {
					return fmt.Errorf("%s: frozen parameter %s has no fragment", r.mpath, name)
				}
				frag := pyobj.As[*torchfile.Tensor](fv, "tensor")
				if err := fv.Err(); err != nil {
					return err
				}
				valid := max(0, min(pn, n-int64(r.dp)*pn))
				if frag.Numel() < valid {
					return fmt.Errorf("%s: frozen fragment of %s has %d elements, need %d", r.mpath, name, frag.Numel(), valid)
				}
				if valid > 0 {
					st.Frags = append(st.Frags, fragment.Fragment{Shard: tp, LocalStart: int64(r.dp) * pn, Len: valid,
						Src: fragment.Ref(r.mpath, frag, 0)})
				}
			}
		}
		t.Params = append(t.Params, p)
	}
	if err := r00.model.Err(); err != nil {
		return err
	}
	if bv, ok := r00.model.Opt("buffer_names"); ok {
		mod := r00.model.Dict("module")
		for _, name := range bv.AsStrings() {
			v, ok := mod.Opt(name)
			if !ok && r00.model.Err() == nil {
				return fmt.Errorf("%s: buffer %s is not in the module state", r00.mpath, name)
			}
			bt := pyobj.As[*torchfile.Tensor](v, "tensor")
			if err := r00.model.Err(); err != nil {
				return err
			}
			p := &fragment.Param{Name: name, Shape: append([]int64(nil), bt.Shape...), Frozen: true, Info: fragment.Info{CatDim: -1}}
			st := p.AddState(fragment.FP32)
			st.Shards = []fragment.Shard{{Shape: append([]int64(nil), bt.Shape...)}}
			st.Frags = []fragment.Fragment{{Len: bt.Numel(), Src: fragment.Ref(r00.mpath, bt, 0)}}
			t.Params = append(t.Params, p)
		}
	}
	return r00.model.Err()
}

// optimizerState is zero/optimizer_state.pt: rank 0's optimizer state
// without the flat fp32 groups and moment tensors (the loader reads only
// the step and the param groups), param_groups last.
func optimizerState(r *rank) (*pyobj.Dict, error) {
	root := pyobj.NewDec(r.opath, r.osd)
	d := r.osd.Clone()
	d.Delete("fp32_flat_groups")
	inner := root.Dict("optimizer_state_dict")
	c := inner.AsDict().Clone()
	states := inner.Dict("state")
	lean := pyobj.NewDict(states.AsDict().Kind)
	m := states.AsDict()
	for i := 0; i < m.Len(); i++ {
		k, _ := m.Item(i)
		sd := states.Dict(k)
		if !sd.Has(fragment.StepState) {
			continue
		}
		v := sd.Key(fragment.StepState).Value()
		switch t := v.(type) {
		case *torchfile.Tensor: // read lazily, where it is
			ref := fragment.Ref(r.opath, t, 0)
			v = &ref
		}
		lean.Set(k, pyobj.DictOf(fragment.StepState, v))
	}
	if err := root.Err(); err != nil {
		return nil, err
	}
	c.Set("state", lean)
	d.Set("optimizer_state_dict", c)
	if pg, ok := c.Get("param_groups"); ok {
		d.Set("param_groups", pg)
	}
	return d, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
