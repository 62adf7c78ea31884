package deepspeed

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options configure Index.
type Options struct {
	Tag     string // tag folder to read instead of the one 'latest' names
	Workers int    // files decoded at once (0: all cores)
	Scan    *Scan  // the listings of the walk that detected the format (nil: list)
	Decode  torchfile.Options
}

// modelState is one mp_rank_XX_model_states.pt.
type modelState struct {
	path   string
	dec    pyobj.Dec // the root, for strict reads
	root   *pyobj.Dict
	shapes []GroupShapes // param_shapes, per group
}

// optimState is one ZeRO-1/2 or BF16_Optimizer optimizer file.
type optimState struct {
	path    string
	dp, mp  int
	root    *pyobj.Dict
	osd     *pyobj.Dict
	base    *pyobj.Dict // base_optimizer_state
	stage   int
	bf16opt bool
	groups  []*group
}

// group is one flattened parameter group of one rank.
type group struct {
	fp32     *torchfile.Tensor
	state    pyobj.Dec   // torch optimizer state of the group's flat parameter (a dict)
	mappings *pyobj.Dict // param_slice_mappings[g], or nil
	mapDec   pyobj.Dec   // the same, to decode
	padding  int64
	count    int64 // partition count (DP degree of the group)
	size     int64 // partition size S, padding included
}

// Index builds the fragment table of a DeepSpeed ZeRO-1/2 checkpoint at
// path (a save folder with 'latest', or a tag folder).
func Index(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	files, err := opt.Scan.Files(path, opt.Tag)
	if err != nil {
		return nil, err
	}
	dir, tag := files.Dir, files.Tag
	M, err := modelRanks(dir, files)
	if err != nil {
		return nil, err
	}
	// Map: decode every pickle, in parallel; model states first, since they
	// say how many data-parallel ranks to expect.
	var paths []string
	for mp := 0; mp < M; mp++ {
		paths = append(paths, files.Model[mp])
	}
	decoded, err := opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, err
	}
	if isMoE(decoded[0]) {
		return indexMoE(ctx, dir, tag, files, decoded[0], opt)
	}
	models := make([]*modelState, M)
	for mp := 0; mp < M; mp++ {
		if models[mp], err = parseModelState(decoded[mp]); err != nil {
			return nil, err
		}
	}
	D := len(files.Optim) / M
	if n := models[0].dec.OptInt("dp_world_size", 0); n > 0 {
		D = int(n)
	}
	if err := models[0].dec.Err(); err != nil {
		return nil, err
	}
	if paths, err = optimFiles(dir, files, D, M); err != nil {
		return nil, err
	}
	decoded, err = opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, err
	}
	optims := map[[2]int]*optimState{}
	for i, f := range decoded {
		dp, mp := i/M, i%M
		o, err := parseOptimState(f, dp, mp)
		if err != nil {
			return nil, err
		}
		optims[[2]int{dp, mp}] = o
	}

	if err := checkRanks(dir, models, optims, D, M); err != nil {
		return nil, err
	}
	T, P, err := degrees(files, models)
	if err != nil {
		return nil, err
	}
	r, err := ReadRules(models[0].dec)
	if err != nil {
		return nil, err
	}
	if len(r.Unsupported()) > 0 {
		return nil, fmt.Errorf("%s: the checkpoint marks parameters as unsupported for universal conversion: %v", models[0].path, r.Unsupported())
	}
	b := &builder{T: T, P: P, D: D, models: models, optims: optims, rules: r,
		table: &fragment.Table{Format: "deepspeed", Source: dir, Tag: tag}}
	if err := b.build(); err != nil {
		return nil, err
	}
	// Megatron-DeepSpeed saves its training arguments with the model state.
	if v, ok := models[0].root.Get("args"); ok {
		if b.table.Args, err = fragment.ScalarArgs(models[0].path, v); err != nil {
			return nil, err
		}
		if b.table.DType, err = fragment.TrainingDType(models[0].path, b.table.Args); err != nil {
			return nil, err
		}
	}
	if b.table.DType == "" {
		b.table.DType = moduleDType(models[0].dec)
		if err := models[0].dec.Err(); err != nil {
			return nil, err
		}
	}
	o00 := optims[[2]int{0, 0}]
	b.table.Degrees = fragment.Degrees{TP: T, PP: P, DP: D, EP: 1, ZeRO: o00.stage}
	if b.table.Optimizer, err = universalOptimizerState(o00, D); err != nil {
		return nil, err
	}
	if err := b.modelStateFiles(files, r); err != nil {
		return nil, err
	}
	return b.table, nil
}

// modelRanks checks that the tag folder holds the model states of model-
// parallel ranks 0..M-1 and ZeRO optimizer files of those ranks only, and
// returns M.
func modelRanks(dir string, files *Files) (int, error) {
	if len(files.Model) == 0 {
		if len(files.Zero3) > 0 {
			return 0, fmt.Errorf("%s: a ZeRO-3 checkpoint (per-rank zero_pp_rank_*_model_states.pt files), not ZeRO-1/2", dir)
		}
		return 0, fmt.Errorf("%s: no mp_rank_*_model_states.pt files", dir)
	}
	M := len(files.Model)
	for mp := 0; mp < M; mp++ {
		if _, ok := files.Model[mp]; !ok {
			return 0, fmt.Errorf("%s: missing rank file mp_rank_%02d_model_states.pt (found %d model-state files)", dir, mp, M)
		}
	}
	if len(files.Optim) == 0 {
		return 0, fmt.Errorf("%s: no ZeRO optimizer files (*zero_pp_rank_*_optim_states.pt); conversion needs ZeRO-1/2 optimizer state", dir)
	}
	for k := range files.Optim {
		if k[1] >= M {
			return 0, fmt.Errorf("%s: missing rank file mp_rank_%02d_model_states.pt (optimizer files exist for model-parallel rank %d)", dir, M, k[1])
		}
	}
	return M, nil
}

// optimFiles returns the optimizer files of D x M ranks, DP-major, and
// refuses missing and unexpected ones.
func optimFiles(dir string, files *Files, D, M int) ([]string, error) {
	for dp := 0; dp < D; dp++ {
		for mp := 0; mp < M; mp++ {
			if _, ok := files.Optim[[2]int{dp, mp}]; !ok {
				return nil, fmt.Errorf("%s: missing rank file %s (%d data-parallel x %d model-parallel ranks)", dir, files.OptimName(dp, mp), D, M)
			}
		}
	}
	var extra []string
	for k, p := range files.Optim {
		if k[0] >= D || k[1] >= M {
			extra = append(extra, filepath.Base(p))
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, fmt.Errorf("%s: unexpected rank files %v for %d data-parallel x %d model-parallel ranks", dir, extra, D, M)
	}
	var paths []string
	for dp := 0; dp < D; dp++ {
		for mp := 0; mp < M; mp++ {
			paths = append(paths, files.Optim[[2]int{dp, mp}])
		}
	}
	return paths, nil
}

// modelStateFiles carries the model states into the atomic checkpoint
// (copied, or written again with universal info when they have none) and
// notes how the universal info was used.
func (b *builder) modelStateFiles(files *Files, r *Rules) error {
	models := b.models
	for mp := range models {
		name := filepath.Base(files.Model[mp])
		if !r.Present() {
			// DeepSpeed's universal loader expects the model states to
			// carry universal info, as ds_to_universal --inject_missing_state
			// gives them: write them again with it, tensors streamed.
			rv, err := fragment.RefTree(files.Model[mp], models[mp].root, pyobj.DefaultLimits())
			if err != nil {
				return fmt.Errorf("%s: %w", files.Model[mp], err)
			}
			root := rv.(*pyobj.Dict).Clone() // a copy only where tensors are: never set keys in the source's tree
			root.Set("universal_checkpoint_info", pyobj.DictOf("universal_checkpoint_version", 0.2))
			b.table.WriteFiles = append(b.table.WriteFiles, fragment.ValueFile{Name: name, Value: root})
			continue
		}
		cf, err := fragment.NewCopyFile(name, files.Model[mp])
		if err != nil {
			return err
		}
		b.table.CopyFiles = append(b.table.CopyFiles, cf)
	}
	if um := r.Unmatched(); len(um) > 0 {
		b.table.Notes = append(b.table.Notes, fmt.Sprintf("universal_checkpoint_info patterns that match no parameter: %v", um))
	}
	if !r.Present() {
		b.table.Notes = append(b.table.Notes, "the checkpoint has no universal_checkpoint_info (plain DeepSpeed): its model states are written with {'universal_checkpoint_version': 0.2} added")
	}
	if inf := r.Inferred(); len(inf) > 0 {
		b.table.Notes = append(b.table.Notes, fmt.Sprintf("without universal_checkpoint_info, %d parameters whose shards differ in one dim are concatenated along it: %v", len(inf), inf))
	}
	return nil
}

func parseModelState(f *torchfile.File) (*modelState, error) {
	dec := pyobj.NewDec(f.Name, f.Root)
	ms := &modelState{path: f.Name, dec: dec, root: dec.AsDict()}
	if err := dec.Err(); err != nil {
		return nil, err
	}
	groups, ok := dec.Opt("param_shapes")
	if !ok {
		return nil, fmt.Errorf("%s: no param_shapes (not a ZeRO checkpoint, or BF16 without ZeRO); ucp needs them to place fragments", f.Name)
	}
	ms.shapes = ParamShapes(groups)
	if err := dec.Err(); err != nil {
		return nil, err
	}
	return ms, nil
}

func parseOptimState(f *torchfile.File, dp, mp int) (*optimState, error) {
	fail := func(format string, a ...any) (*optimState, error) {
		return nil, fmt.Errorf("%s: %s", f.Name, fmt.Sprintf(format, a...))
	}
	root := pyobj.NewDec(f.Name, f.Root)
	osd := root.Dict("optimizer_state_dict")
	if err := root.Err(); err != nil {
		return nil, err
	}
	o := &optimState{path: f.Name, dp: dp, mp: mp, root: root.AsDict(), osd: osd.AsDict(), stage: 1}
	if osd.Has("zero_stage") {
		zs := osd.Key("zero_stage")
		o.stage = ZeroStage(zs.Value())
		if o.stage == 3 {
			return fail("a ZeRO-3 optimizer file; ZeRO-3 checkpoints are read by the zero3 reader")
		}
		if o.stage <= 0 {
			return fail("unknown zero_stage %s", pyobj.Repr(zs.Value()))
		}
	} else {
		o.bf16opt = true // BF16_Optimizer saves no zero_stage
	}
	base, ok := osd.Opt("base_optimizer_state")
	if !ok {
		return fail("no base_optimizer_state")
	}
	if _, isList := base.Value().(*pyobj.List); isList {
		return fail("an elastic checkpoint (base_optimizer_state is a list); save with elastic_checkpoint disabled")
	}
	o.base = base.AsDict()
	states := base.Dict("state")
	fp32v, ok := osd.Opt("single_partition_of_fp32_groups")
	if !ok && root.Err() == nil {
		return fail("no single_partition_of_fp32_groups")
	}
	fp32s := fp32v.AsList()
	G := len(fp32s)
	var paddings []int64
	if v, ok := osd.Opt("group_paddings"); ok {
		paddings = perGroupInts(v, G)
	}
	cv, ok := osd.Opt("partition_count")
	if !ok && root.Err() == nil {
		return fail("partition_count is missing")
	}
	counts := perGroupInts(cv, G)
	var mappings []pyobj.Dec
	if v, ok := osd.Opt("param_slice_mappings"); ok {
		mappings = v.AsList()
	}
	for g, tv := range fp32s {
		t := pyobj.As[*torchfile.Tensor](tv, "tensor")
		sv, ok := states.Opt(int64(g))
		if !ok && freshState(states) {
			// Saved before the first step (a fresh optimizer, as reshard writes
			// a weights-only source): the fp32 partitions are the weights.
			sv, ok = pyobj.NewDec(f.Name, pyobj.NewDict(pyobj.PlainDict)), true
		}
		if !ok && root.Err() == nil {
			return fail("optimizer state of group %d is empty (saved before the first optimizer step?)", g)
		}
		if sv.AsDict() == nil {
			break
		}
		gr := &group{fp32: t, state: sv, count: counts[g]}
		if paddings != nil {
			gr.padding = paddings[g]
		}
		if g < len(mappings) {
			gr.mappings, gr.mapDec = mappings[g].AsDict(), mappings[g]
		}
		gr.size = t.Numel()
		if !o.bf16opt {
			gr.size += gr.padding // ZeRO-1/2 strip the padding from the saved fp32 partition
		}
		if ea, ok := sv.Opt("exp_avg"); ok {
			if et := pyobj.As[*torchfile.Tensor](ea, "tensor"); et != nil && et.Numel() != gr.size {
				return fail("group %d: exp_avg has %d elements but the partition has %d", g, et.Numel(), gr.size)
			}
		}
		o.groups = append(o.groups, gr)
	}
	if err := root.Err(); err != nil {
		return nil, err
	}
	return o, nil
}

// perGroupInts reads one int per group: a list of at least n ints, or a
// single int for every group.
func perGroupInts(v pyobj.Dec, n int) []int64 {
	if x, ok := pyobj.Int(v.Value()); ok {
		out := make([]int64, n)
		for i := range out {
			out[i] = x
		}
		return out
	}
	ints := v.AsInts()
	if ints != nil && len(ints) < n {
		v.Failf("%d ints for %d param groups", len(ints), n)
		return make([]int64, n)
	}
	if ints == nil {
		return make([]int64, n)
	}
	return ints
}

// degrees infers tensor and pipeline parallelism (FORMAT.md, "Degrees").
func degrees(files *Files, models []*modelState) (T, P int, err error) {
	M := len(models)
	ms0 := models[0]
	if d, ok := ms0.dec.OptDict("checkpoint_parallel_dimensions"); ok {
		pp, tp := d.Int("pp_degree"), d.Int("tp_degree")
		if err := ms0.dec.Err(); err != nil {
			return 0, 0, err
		}
		if pp > 0 && tp > 0 {
			T, P = int(tp), int(pp)
		}
	}
	if T == 0 {
		if len(files.Layers) > 0 {
			first := -1
			for k := range files.Layers {
				if first < 0 || k[0] < first {
					first = k[0]
				}
			}
			for k := range files.Layers {
				if k[0] == first {
					T++
				}
			}
		} else {
			T = M
		}
		P = M / T
	}
	if T*P != M {
		return 0, 0, fmt.Errorf("%s: %d model-state files do not match tensor parallel %d x pipeline %d", files.Dir, M, T, P)
	}
	n := ms0.dec.OptInt("mp_world_size", int64(M))
	if err := ms0.dec.Err(); err != nil {
		return 0, 0, err
	}
	if int(n) != M {
		return 0, 0, fmt.Errorf("%s: mp_world_size is %d but there are %d mp_rank model-state files", ms0.path, n, M)
	}
	return T, P, nil
}

// universalOptimizerState is zero/optimizer_state.pt (FORMAT.md, "What is written for this source"):
// rank 0's optimizer state without its tensors, paddings zeroed, partition
// counts set, param_groups last.
func universalOptimizerState(o *optimState, D int) (*pyobj.Dict, error) {
	d := o.osd.Clone()
	for _, k := range []string{"base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups"} {
		d.Delete(k)
	}
	G := len(o.groups)
	zeros, counts := make([]pyobj.Value, G), make([]pyobj.Value, G)
	for g := range zeros {
		zeros[g], counts[g] = int64(0), int64(D)
	}
	if _, ok := d.Get("group_paddings"); ok {
		d.Set("group_paddings", &pyobj.List{Items: zeros})
	}
	if _, ok := d.Get("partition_count"); ok {
		d.Set("partition_count", &pyobj.List{Items: counts})
	}
	pg, ok := o.base.Get("param_groups")
	if !ok {
		return nil, fmt.Errorf("%s: base_optimizer_state has no param_groups", o.path)
	}
	d.Set("param_groups", pg)
	return d, nil
}

// builder assembles parameters from all ranks' files.
type builder struct {
	T, P, D int
	models  []*modelState
	optims  map[[2]int]*optimState
	rules   *Rules
	table   *fragment.Table
}

// located is where one parameter lives on one pipeline stage.
type located struct {
	pp, g int
}

func (b *builder) build() error {
	// Parameter order: pipeline stage, group, flat order; the first stage
	// holding a name owns it (tied weights on several stages).
	var names []string
	where := map[string][]located{}
	for p := 0; p < b.P; p++ {
		ms := b.models[p*b.T]
		for g, shapes := range ms.shapes {
			for _, name := range shapes.Names {
				if _, seen := where[name]; !seen {
					names = append(names, name)
				}
				where[name] = append(where[name], located{pp: p, g: g})
			}
		}
	}
	for _, name := range names {
		locs := where[name]
		if len(locs) > 1 {
			if rep, err := b.rules.PipeReplicated(name); err != nil {
				return err
			} else if !rep {
				b.table.Notes = append(b.table.Notes, fmt.Sprintf("%s is held by %d pipeline stages; the first stage's copy is used", name, len(locs)))
			}
			if err := b.sameShapes(name, locs); err != nil {
				return err
			}
		}
		p, err := b.param(name, locs[0])
		if err != nil {
			return err
		}
		b.table.Params = append(b.table.Params, p)
	}
	return b.extras()
}

func (b *builder) sameShapes(name string, locs []located) error {
	for t := 0; t < b.T; t++ {
		first := b.shape(name, locs[0], t)
		for _, l := range locs[1:] {
			if s := b.shape(name, l, t); !torchfile.SameShape(s, first) {
				return fmt.Errorf("%s has shape %v on pipeline stage %d but %v on stage %d", name, first, locs[0].pp, s, l.pp)
			}
		}
	}
	return nil
}

func (b *builder) shape(name string, l located, t int) []int64 {
	ms := b.models[l.pp*b.T+t]
	if l.g >= len(ms.shapes) {
		return nil
	}
	return ms.shapes[l.g].Shape[name]
}

func (b *builder) param(name string, l located) (*fragment.Param, error) {
	shapes := make([][]int64, b.T)
	for t := range shapes {
		if shapes[t] = b.shape(name, l, t); shapes[t] == nil {
			return nil, fmt.Errorf("%s: parameter %s is missing from param_shapes[%d]", b.models[l.pp*b.T+t].path, name, l.g)
		}
	}
	pl, err := b.rules.Classify(name, shapes)
	if err != nil {
		return nil, err
	}
	shards, shape, err := pl.Shards(name, b.T)
	if err != nil {
		return nil, err
	}
	for t, s := range shards {
		if torchfile.Numel(s.Shape) != torchfile.Numel(shapes[t]) {
			return nil, fmt.Errorf("parameter %s: rank %d holds shape %v but the pattern gives it %v", name, t, shapes[t], s.Shape)
		}
	}
	p := pl.Param(name, shape)
	for t := 0; t < b.T; t++ {
		if err := b.addFragments(p, shards, l, t); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// addFragments adds the fragments of TP rank t's shard of p from every DP
// rank, computed from param_shapes and the partition rules (§4.1) and
// checked against param_slice_mappings.
func (b *builder) addFragments(p *fragment.Param, shards []fragment.Shard, l located, t int) error {
	mp := l.pp*b.T + t
	ms := b.models[mp]
	o0 := b.optims[[2]int{0, mp}]
	if l.g >= len(o0.groups) {
		return fmt.Errorf("%s: no optimizer group %d for parameter %s", o0.path, l.g, p.Name)
	}
	// Offset of the parameter in the group's flat buffer.
	var off, numel int64
	found := false
	gs := ms.shapes[l.g]
	for _, k := range gs.Names {
		s := gs.Shape[k]
		if k == p.Name {
			numel, found = torchfile.Numel(s), true
			break
		}
		off += torchfile.Numel(s)
	}
	if !found {
		return fmt.Errorf("%s: parameter %s is not in group %d", ms.path, p.Name, l.g)
	}
	var total int64
	for _, s := range gs.Shape {
		total += torchfile.Numel(s)
	}
	for dp := 0; dp < b.D; dp++ {
		o := b.optims[[2]int{dp, mp}]
		if l.g >= len(o.groups) {
			return fmt.Errorf("%s: has %d optimizer groups, parameter %s needs group %d", o.path, len(o.groups), p.Name, l.g)
		}
		gr := o.groups[l.g]
		if int(gr.count) != b.D {
			return fmt.Errorf("%s: group %d is partitioned %d ways but there are %d data-parallel ranks (expert groups are not supported)", o.path, l.g, gr.count, b.D)
		}
		S := gr.size
		if S*int64(b.D) < total {
			return fmt.Errorf("%s: group %d partitions of %d elements cannot hold the group's %d elements", o.path, l.g, S, total)
		}
		lo, hi := int64(dp)*S, int64(dp+1)*S
		fs, fe := max(off, lo), min(off+numel, hi)
		if err := checkMapping(o, gr, p.Name, fs, fe, lo); err != nil {
			return err
		}
		if fs >= fe {
			continue
		}
		hp, lp, n := fs-lo, fs-off, fe-fs
		if err := b.addStates(p, shards, o, l.g, t, hp, lp, n); err != nil {
			return err
		}
	}
	return nil
}

// checkMapping compares the fragment computed from the partition rules
// with the one DeepSpeed recorded in param_slice_mappings.
func checkMapping(o *optimState, gr *group, name string, fs, fe, lo int64) error {
	if gr.mappings == nil {
		return nil
	}
	if !gr.mapDec.Has(name) {
		if fs >= fe {
			return nil
		}
		return fmt.Errorf("%s: param_slice_mappings has no fragment for %s, but the partition rules place [%d,%d) of it here", o.path, name, fs-lo, fe-lo)
	}
	n, s := readFragmentAddr(gr.mapDec.Key(name))
	if err := gr.mapDec.Err(); err != nil {
		return err
	}
	if fs >= fe {
		if n != 0 {
			return fmt.Errorf("%s: param_slice_mappings places %s on this rank, but the partition rules do not", o.path, name)
		}
		return nil
	}
	if n != fe-fs || s != fs-lo {
		return fmt.Errorf("%s: param_slice_mappings[%q] = (numel %d, start %d) but param_shapes and the partition rules give (numel %d, start %d); "+
			"the files are inconsistent (or saved with round_robin_gradients)", o.path, name, n, s, fe-fs, fs-lo)
	}
	return nil
}

// readFragmentAddr reads the fragment_address at d: DeepSpeed's dataclass
// (numel, start) of a parameter's piece of a flat partition
// (deepspeed/utils/tensor_fragment.py).
func readFragmentAddr(d pyobj.Dec) (numel, start int64) {
	obj := pyobj.As[*pyobj.Object](d, "a fragment_address")
	if obj == nil {
		return 0, 0
	}
	field := func(k string) int64 {
		v, has := obj.Attr(k)
		n, isInt := pyobj.Int(v)
		if !has || !isInt {
			d.Failf("fragment_address.%s is %s, want int", k, pyobj.Repr(v))
		}
		return n
	}
	return field("numel"), field("start")
}

func (b *builder) addStates(p *fragment.Param, shards []fragment.Shard, o *optimState, g, t int, hp, lp, n int64) error {
	gr := o.groups[g]
	names, srcs := FlatStates(gr.fp32, gr.state, gr.size)
	if err := gr.state.Err(); err != nil {
		return err
	}
	for _, k := range names {
		// A state missing on some ranks leaves a hole that Validate reports.
		st := p.StateWith(k, shards)
		src := srcs[k]
		if hp+n > src.Numel() {
			return fmt.Errorf("%s: %s of %s needs elements [%d,%d) of a partition of %d", o.path, k, p.Name, hp, hp+n, src.Numel())
		}
		st.Frags = append(st.Frags, fragment.Extract(fragment.Ref(o.path, src, 0), hp, n, t, lp))
	}
	if p.Step == nil {
		if sv, ok := gr.state.AsDict().Get(fragment.StepState); ok {
			switch x := sv.(type) {
			case *torchfile.Tensor:
				ref := fragment.Ref(o.path, x, 0)
				p.Step = &fragment.Step{Tensor: &ref}
			default:
				p.Step = &fragment.Step{Value: x}
			}
		}
	}
	return nil
}

// extras adds frozen parameters and buffers from the model states, and the
// aliases of tied weights.
func (b *builder) extras() error {
	ms0 := b.models[0]
	if d, ok := ms0.dec.OptDict("shared_params"); ok {
		for _, it := range d.Items() {
			if p := b.table.Param(it.AsStr()); p != nil && it.Key != "" {
				p.Info.Aliases = append(p.Info.Aliases, it.Key)
			}
		}
	}
	if err := ms0.dec.Err(); err != nil {
		return err
	}
	if b.P > 1 {
		return nil // module weights and buffers live in layer files; UCP does not carry them
	}
	// Frozen parameters: full low-precision tensors per TP rank (ZeRO-2;
	// ZeRO-1 saves None).
	frozenShapes := map[int]pyobj.Dec{}
	frozenFrags := map[int]pyobj.Dec{}
	for t := 0; t < b.T; t++ {
		dec := b.models[t].dec
		if d, ok := dec.OptDict("frozen_param_shapes"); ok {
			frozenShapes[t] = d
		}
		if d, ok := dec.OptDict("frozen_param_fragments"); ok {
			frozenFrags[t] = d
		}
		if err := dec.Err(); err != nil {
			return err
		}
	}
	fs0, hasShapes := frozenShapes[0]
	if _, hasFrags := frozenFrags[0]; hasShapes && hasFrags {
		for _, it := range fs0.Items() {
			name := it.Key
			tensors := make([]*torchfile.Tensor, b.T)
			for t := 0; t < b.T; t++ {
				ff, ok := frozenFrags[t]
				var v pyobj.Dec
				if ok {
					v, ok = ff.Opt(name)
				}
				if !ok {
					return fmt.Errorf("%s: frozen parameter %s has no fragment tensor", b.models[t].path, name)
				}
				tensors[t] = pyobj.As[*torchfile.Tensor](v, "tensor")
				if err := v.Err(); err != nil {
					return err
				}
			}
			if err := b.addWhole(name, tensors, b.modelPaths(), false); err != nil {
				return err
			}
		}
		if err := ms0.dec.Err(); err != nil {
			return err
		}
	}
	// Buffers: persistent buffers of the module state dict.
	if v, ok := ms0.dec.Opt("buffer_names"); ok {
		for _, name := range v.AsStrings() {
			tensors := make([]*torchfile.Tensor, b.T)
			for t := 0; t < b.T; t++ {
				dec := b.models[t].dec
				bv, ok := dec.Dict("module").Opt(name)
				if !ok && dec.Err() == nil {
					return fmt.Errorf("%s: buffer %s is not in the module state", b.models[t].path, name)
				}
				tensors[t] = pyobj.As[*torchfile.Tensor](bv, "tensor")
				if err := dec.Err(); err != nil {
					return err
				}
			}
			if err := b.addWhole(name, tensors, b.modelPaths(), true); err != nil {
				return err
			}
		}
	}
	return ms0.dec.Err()
}

// addWhole adds a parameter whose TP shards are whole stored tensors (frozen
// parameters, buffers); buffers are replicated across TP ranks.
func (b *builder) addWhole(name string, tensors []*torchfile.Tensor, paths []string, buffer bool) error {
	if b.table.Param(name) != nil {
		return nil
	}
	shapes := make([][]int64, len(tensors))
	for t, tt := range tensors {
		shapes[t] = tt.Shape
	}
	var pl *Placement
	var err error
	if buffer && b.T > 1 {
		pl = &Placement{Pattern: fragment.Replicated{}, Full: append([]int64(nil), shapes[0]...), Info: fragment.Info{CatDim: -1, TPKnown: true}}
	} else if pl, err = b.rules.Classify(name, shapes); err != nil {
		return err
	}
	p, st, err := pl.Frozen(name, b.T)
	if err != nil {
		return err
	}
	for t, tt := range tensors {
		if tt.Numel() != torchfile.Numel(st.Shards[t].Shape) {
			return fmt.Errorf("%s: %s has %d elements, its shard needs %d", paths[t], name, tt.Numel(), torchfile.Numel(st.Shards[t].Shape))
		}
		st.Frags = append(st.Frags, fragment.Extract(fragment.Ref(paths[t], tt, 0), 0, tt.Numel(), t, 0))
	}
	b.table.Params = append(b.table.Params, p)
	return nil
}

func (b *builder) modelPaths() []string {
	out := make([]string, len(b.models))
	for i, m := range b.models {
		out[i] = m.path
	}
	return out
}

// moduleDType is the dtype of the first floating-point tensor of the saved
// module (the weights in the training dtype), or "".
func moduleDType(root pyobj.Dec) string {
	m, ok := root.OptDict("module") // None with pipeline parallelism: the weights are in layer files
	if !ok {
		return ""
	}
	d := m.AsDict()
	for i := 0; i < d.Len(); i++ {
		_, val := d.Item(i)
		switch t := val.(type) {
		case *torchfile.Tensor:
			if t.DType.IsFloat() {
				return t.DType.String()
			}
		}
	}
	return ""
}

// freshState reports a torch optimizer state with no entry at all: saved
// before the first step, every group without moments or step.
func freshState(states pyobj.Dec) bool {
	d := states.AsDict()
	return d != nil && d.Len() == 0
}
