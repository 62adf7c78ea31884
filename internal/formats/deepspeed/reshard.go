package deepspeed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/multinode"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// WriteVersion is the DeepSpeed release whose engine Reshard imitates:
// its file names, key orders, partition and padding rules (FORMAT.md).
const WriteVersion = "0.14.5"

// ReshardOptions say which DeepSpeed run the written checkpoint is for.
type ReshardOptions struct {
	DP, TP int
	Zero   int         // ZeRO stage: 1, 2 or 3
	DType  dtype.DType // training dtype; Invalid: the source's (float32 when unknown)
	// BF16Optimizer writes BF16_Optimizer files (bf16, ZeRO stage 1, fp32
	// gradient accumulation) instead of DeepSpeedZeroOptimizer ones.
	BF16Optimizer bool
	Force         bool // replace DST when it exists
	NoSync        bool
	NoLatest      bool // leave the 'latest' pointer beside DST alone
	// Version is the DeepSpeed release the target runs ("0.19.5"), written
	// as ds_version; "" takes the source's ds_version.
	Version string
	// Place: this process's share of a multi-node run (Nodes > 1), which
	// writes the tag folder with the other nodes (multinode.Folder).
	Place multinode.Place
}

// ReshardStats tell what was written.
type ReshardStats struct {
	Files   int
	Bytes   int64
	Notes   []string
	Pointer *atomic.Pointer // 'latest' beside DST, unless NoLatest
	// Node is what this node did in a multi-node run (nil for one process).
	Node *multinode.Result
}

// Reshard writes the atomic checkpoint r as the tag folder dst of a native
// DeepSpeed checkpoint, as DeepSpeed's engine would save that model at the
// given data-parallel size, tensor-parallel size, ZeRO stage and dtype, and
// writes 'latest' naming it beside dst. Everything is checked before the
// first byte is written; dst appears complete or not at all.
func Reshard(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error) {
	p, err := planReshard(r, o)
	if err != nil {
		return nil, err
	}
	dst = filepath.Clean(dst)
	if err := fsutil.CheckOverlap(r.Dir, dst, atomic.PartialSuffix); err != nil {
		return nil, err
	}
	tag := filepath.Base(dst)
	if tag == "." || tag == ".." || tag == string(filepath.Separator) {
		return nil, fmt.Errorf("%s: not a tag folder name", dst)
	}
	if _, err := os.Stat(dst); err == nil && !o.Force {
		return nil, fmt.Errorf("%s exists; use --force to replace it", dst)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, err
	}
	st := &ReshardStats{Notes: p.notes}
	if o.Place.Multi() {
		if st.Node, err = p.nodeFolder(ctx, dst, st).Run(ctx); err != nil || !st.Node.Finalized {
			return st, err
		}
	} else if err := fsutil.WriteDir(dst+atomic.PartialSuffix, dst, o.Force, o.NoSync, func(tmp string) error {
		return r.VerifyingReads(func() error { return p.writeFlushed(ctx, tmp, p.files(), st) })
	}); err != nil {
		return nil, err
	}
	if !o.NoLatest {
		p, err := atomic.WritePointer(filepath.Join(filepath.Dir(dst), "latest"), tag, dst, o.NoSync)
		if err != nil {
			return nil, err
		}
		st.Pointer = &p
	}
	return st, nil
}

// rgroup is one optimizer parameter group of the target.
type rgroup struct {
	names []string
	hyper *pyobj.Dict // the source's param group (hyper-parameters)
	step  pyobj.Value
}

// plan is everything Reshard decided before writing.
type plan struct {
	r       *atomic.Reader
	out     *layout.Files // the files being written, several at once
	o       ReshardOptions
	dt      dtype.DType
	srcT    int
	groups  []*rgroup
	params  map[string]*atomic.ParamEntry
	meta    map[string]layout.Meta
	shards  []map[string]fragment.Shard // per target TP rank
	optim   *pyobj.Dict                 // zero/optimizer_state.pt
	tmpl    []string                    // model-state template per target TP rank (relative paths)
	frozen  []string                    // frozen parameters (not buffers), manifest order
	buffers map[string]bool
	aliases map[string]string // alias -> parameter
	notes   []string
	// scaler is the loss scaler every optimizer file holds (lossScaler),
	// dynamicScale its dynamic_loss_scale.
	scaler       pyobj.Value
	dynamicScale bool
	srcStage     int
	// version is the ds_version written (ReshardOptions.Version, else the
	// source's, else WriteVersion); parallelDims says that release writes
	// checkpoint_parallel_dimensions.
	version      string
	parallelDims bool
	// paddedVocab is the target's vocabulary rows (0: no vocabulary
	// parameter), written into Megatron-DeepSpeed's args.
	paddedVocab int64
	subs        []subGroup  // ZeRO-3 sub-groups
	clip        pyobj.Value // clip_grad written (dsConfig)
	// A target from a model family (reshard_family.go): synth is the
	// model-state template built for it (nil: tmpl's files, in tmplDir or
	// else the atomic checkpoint), virt each tensor's pieces of the atomic
	// parameters per TP rank.
	synth   *pyobj.Dict
	tmplDir string
	virt    []map[string][]layout.StatePiece
}

func planReshard(r *atomic.Reader, o ReshardOptions) (*plan, error) {
	m := r.Manifest
	src := m.Source
	fromDS := src.Format == "deepspeed" || src.Format == "deepspeed-zero3"
	if fromDS && src.Degrees.PP > 1 {
		return nil, fmt.Errorf("%s: converted from a pipeline-parallel checkpoint (PP %d); writing DeepSpeed pipeline layer files is not supported", r.Dir, src.Degrees.PP)
	}
	switch o.Zero {
	case 1, 2, 3:
	case 0:
		return nil, fmt.Errorf("--zero 0 is not supported: without ZeRO DeepSpeed keeps the optimizer state in the model-state file; use 1, 2 or 3")
	default:
		return nil, fmt.Errorf("unknown ZeRO stage %d (DeepSpeed has 1, 2 and 3)", o.Zero)
	}
	if o.DP < 1 {
		return nil, fmt.Errorf("--dp must be at least 1, not %d", o.DP)
	}
	if o.TP < 1 {
		return nil, fmt.Errorf("--tp must be at least 1, not %d", o.TP)
	}
	if err := refuseExperts(r); err != nil {
		return nil, err
	}
	p := &plan{r: r, o: o, dt: o.DType, srcT: max(src.Degrees.TP, 1), srcStage: src.Degrees.ZeRO,
		params: map[string]*atomic.ParamEntry{}, meta: map[string]layout.Meta{}, buffers: map[string]bool{},
		aliases: map[string]string{}}
	if p.dt == dtype.Invalid {
		p.dt = dtype.Float32
		if src.DType != "" {
			dt, err := dtype.Parse(src.DType)
			if err != nil {
				return nil, fmt.Errorf("%s: source dtype: %w", r.Dir, err)
			}
			p.dt = dt
		}
	}
	if p.dt != dtype.Float32 && p.dt != dtype.BFloat16 && p.dt != dtype.Float16 {
		return nil, fmt.Errorf("training dtype %v: DeepSpeed trains in float32, bfloat16 or float16", p.dt)
	}
	if !fromDS {
		// Another framework's module layout: the target's names and
		// order from the model family.
		if err := p.planFamily(); err != nil {
			return nil, err
		}
		return p, p.planScaler()
	}
	if o.BF16Optimizer && (p.dt != dtype.BFloat16 || o.Zero != 1) {
		return nil, fmt.Errorf("--bf16-optimizer needs --dtype bfloat16 and --zero 1 (DeepSpeed uses BF16_Optimizer for bf16 at ZeRO stage 1 with fp32 gradient accumulation)")
	}
	if o.TP > 1 && o.Zero == 3 {
		return nil, fmt.Errorf("--zero 3 with --tp %d: DeepSpeed ZeRO-3 with tensor parallelism needs AutoTP metadata that ucp does not write; use --tp 1", o.TP)
	}
	for i := range m.Params {
		e := &m.Params[i]
		p.params[e.Name] = e
		for _, a := range e.Aliases {
			p.aliases[a] = e.Name
		}
	}
	ov, err := r.Load(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if err != nil {
		return nil, err
	}
	od := pyobj.NewDec(p.optimPath(), ov)
	if p.optim = od.AsDict(); od.Err() != nil {
		return nil, od.Err()
	}
	if err := p.templates(); err != nil {
		return nil, err
	}
	if err := p.readGroups(); err != nil {
		return nil, err
	}
	if err := p.slices(); err != nil {
		return nil, err
	}
	if o.Zero <= 2 {
		if err := p.checkZero12(); err != nil {
			return nil, err
		}
	}
	return p, p.planScaler()
}

// planScaler plans the loss scaler of the optimizers that save one (every
// one but BF16_Optimizer): a source without one (another framework's)
// gets what DeepSpeed's engine creates, never None, which the engine
// would load as its scaler and fail on at the first backward.
func (p *plan) planScaler() error {
	if p.o.Zero != 3 && p.o.BF16Optimizer {
		return nil
	}
	var err error
	p.scaler, p.dynamicScale, err = p.lossScaler()
	return err
}

// templates picks the model-state file each target TP rank starts from:
// the source's file of that rank when TP is unchanged, else rank 0's.
func (p *plan) templates() error {
	byMP := map[int]string{}
	for _, f := range p.r.Manifest.Files {
		name := filepath.Base(f.Path)
		if m := ModelStatesFile.FindStringSubmatch(name); m != nil {
			byMP[Atoi(m[1])] = f.Path
		} else if m := Zero3ModelFile.FindStringSubmatch(name); m != nil && Atoi(m[1]) == 0 {
			byMP[Atoi(m[2])] = f.Path
		}
	}
	if len(byMP) == 0 {
		return fmt.Errorf("%s: no DeepSpeed model-state file in the atomic checkpoint (it gives the module layout, counters and param groups)", p.r.Dir)
	}
	p.tmpl = make([]string, p.o.TP)
	for t := range p.tmpl {
		k := 0
		if p.o.TP == p.srcT {
			k = t
		}
		path, ok := byMP[k]
		if !ok {
			return fmt.Errorf("%s: no model-state file of model-parallel rank %d", p.r.Dir, k)
		}
		p.tmpl[t] = path
	}
	return nil
}

// optimPath is the atomic checkpoint's copy of the source's optimizer
// state (its param groups, loss scaler and clipping).
func (p *plan) optimPath() string {
	return filepath.Join(p.r.Dir, atomic.ZeroDir, atomic.OptimizerState)
}

// openTemplate decodes a template's pickle (tensors are read lazily).
func (p *plan) openTemplate(t int) (*torchfile.File, *pyobj.Dict, error) {
	if p.synth != nil {
		return &torchfile.File{Name: "the model states built from the model family", Root: p.synth}, p.synth, nil
	}
	dir := p.r.Dir
	if p.tmplDir != "" {
		dir = p.tmplDir
	}
	path := filepath.Join(dir, filepath.FromSlash(p.tmpl[t]))
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, nil, err
	}
	d := pyobj.NewDec(path, f.Root)
	root := d.AsDict()
	if err := d.Err(); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, root, nil
}

// readGroups pairs the source's param groups with the parameters of each:
// param_shapes[i] of the model states lists group i's parameters (ZeRO-3:
// sub-group s, and param_groups[i].params lists group i's sub-groups).
func (p *plan) readGroups() error {
	f, root, err := p.openTemplate(0)
	if err != nil {
		return err
	}
	defer f.Close()
	md := pyobj.NewDec(f.Name, root)
	if md.Has("buffer_names") {
		for _, n := range md.Key("buffer_names").AsStrings() {
			p.buffers[n] = true
		}
	}
	shapes := md.List("param_shapes")
	if err := md.Err(); err != nil {
		return err
	}
	if len(shapes) == 0 {
		return fmt.Errorf("%s: no param_shapes list", f.Name)
	}
	od := pyobj.NewDec(p.optimPath(), p.optim)
	pgs := od.List("param_groups")
	if err := od.Err(); err != nil {
		return err
	}
	if len(pgs) == 0 {
		return fmt.Errorf("%s: param_groups is empty", p.optimPath())
	}
	seen, err := p.groupParams(f.Name, shapes, pgs)
	if err != nil {
		return err
	}
	for _, e := range p.r.Manifest.Params {
		switch {
		case e.Frozen && !p.buffers[e.Name]:
			p.frozen = append(p.frozen, e.Name)
		case !e.Frozen && !seen[e.Name]:
			return fmt.Errorf("%s: parameter %s is in no param group of the model states", p.r.Dir, e.Name)
		}
	}
	return p.groupSteps()
}

// groupParams makes one rgroup per param group, naming its parameters from
// param_shapes (one dict per flat group, names in order); it returns the
// parameters seen.
func (p *plan) groupParams(name string, shapes, pgs []pyobj.Dec) (map[string]bool, error) {
	seen := map[string]bool{}
	for i, gd := range pgs {
		g := &rgroup{hyper: gd.AsDict()}
		subs := []int64{int64(i)}
		if len(pgs) != len(shapes) {
			// ZeRO-3 sub-groups: the group's params are sub-group indices.
			subs = gd.Key("params").AsInts()
		}
		if err := gd.Err(); err != nil {
			if len(pgs) != len(shapes) {
				return nil, fmt.Errorf("%w (%d param groups for %d param_shapes groups: want sub-group indices)", err, len(pgs), len(shapes))
			}
			return nil, err
		}
		for _, s := range subs {
			if s < 0 || int(s) >= len(shapes) {
				return nil, fmt.Errorf("%s: param group names flat group %d of %d", name, s, len(shapes))
			}
			for _, it := range shapes[s].Items() {
				n := it.Key
				e, ok := p.params[n]
				if !ok || e.Frozen {
					return nil, fmt.Errorf("%s: parameter %s of param group %d has no optimizer state in the atomic checkpoint", p.r.Dir, n, i)
				}
				if seen[n] {
					return nil, fmt.Errorf("%s: parameter %s is in two param groups", p.r.Dir, n)
				}
				seen[n] = true
				g.names = append(g.names, n)
			}
			if err := shapes[s].Err(); err != nil {
				return nil, err
			}
		}
		p.groups = append(p.groups, g)
	}
	return seen, nil
}

// groupSteps gives each group its step, as the torch optimizer holds one
// per group: its parameters' (which must agree), else the first state's of
// the source's optimizer.
func (p *plan) groupSteps() error {
	for gi, g := range p.groups {
		for _, n := range g.names {
			v, ok, err := p.r.Step(n)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if g.step == nil {
				g.step = v
			} else if stepRepr(v) != stepRepr(g.step) {
				return fmt.Errorf("%s: param group %d holds parameters at different steps (%s: %s, others %s)", p.r.Dir, gi, n, stepRepr(v), stepRepr(g.step))
			}
		}
		if g.step != nil {
			continue
		}
		od := pyobj.NewDec(p.optimPath(), p.optim)
		if osd, ok := od.OptDict("optimizer_state_dict"); ok {
			if st, ok := osd.OptDict("state"); ok && st.AsDict().Len() > 0 {
				k0, _ := st.AsDict().Item(0)
				if s0, ok := st.Dict(k0).Opt(fragment.StepState); ok {
					g.step = s0.Value()
				}
			}
		}
		if err := od.Err(); err != nil {
			return err
		}
	}
	return nil
}

func stepRepr(v pyobj.Value) string {
	switch b := v.(type) {
	case *torchfile.Blob:
		return fmt.Sprintf("tensor %v %x", b.DType, b.Data)
	}
	return pyobj.Repr(v)
}

// slices computes every parameter's shard on every target TP rank, as
// DeepSpeed's universal loader would cut it, and checks that each rank
// gets a non-empty shard of every non-empty parameter.
func (p *plan) slices() error {
	model, err := layout.ReadModel(p.r)
	if err != nil {
		return err
	}
	p.shards = make([]map[string]fragment.Shard, p.o.TP)
	for t := range p.shards {
		p.shards[t] = map[string]fragment.Shard{}
	}
	for _, e := range p.r.Manifest.Params {
		if p.buffers[e.Name] {
			continue
		}
		meta, err := layout.ReadMeta(filepath.Join(p.r.Dir, atomic.StatePath(e.Name, fragment.FP32)))
		if err != nil {
			return err
		}
		p.meta[e.Name] = meta
		ent := e
		// The source's padded vocabulary at its own TP; at another TP the
		// target pads as its framework does.
		var padded int64
		if p.o.TP == p.srcT {
			padded = e.PaddedVocab
		}
		for t := 0; t < p.o.TP; t++ {
			sh, err := model.Slice(&ent, meta, p.o.TP, t, padded)
			if err != nil {
				return err
			}
			if torchfile.Numel(sh.Shape) == 0 && torchfile.Numel(e.Shape) > 0 {
				return fmt.Errorf("%s: shape %v cannot be split %d ways (tensor-parallel rank %d gets nothing)", e.Name, e.Shape, p.o.TP, t)
			}
			p.shards[t][e.Name] = sh
			if meta.Vocab && len(sh.Shape) > 0 {
				p.paddedVocab = sh.Shape[0] * int64(p.o.TP)
			}
		}
	}
	return nil
}

// checkZero12 refuses layouts DeepSpeed v0.14.5 saves wrongly: it charges
// a group's whole alignment padding to the last rank and strips it from
// that rank's partition, which fails when the padding is larger.
func (p *plan) checkZero12() error {
	for t := 0; t < p.o.TP; t++ {
		for gi := range p.groups {
			n := p.groupNumel(gi, t)
			a, s := zero12Layout(n, p.o.DP)
			if a-n > s {
				return fmt.Errorf("param group %d has %d elements on tensor-parallel rank %d: at --dp %d its last rank would hold %d padding elements in a partition of %d, "+
					"which DeepSpeed %s cannot save (use --dp %d or less)", gi, n, t, p.o.DP, a-n, s, WriteVersion, maxDP12(n))
			}
		}
	}
	return nil
}

func maxDP12(n int64) int {
	d := 1
	for c := 2; c <= 1<<16; c++ {
		if a, s := zero12Layout(n, c); a-n <= s {
			d = c
		}
	}
	return d
}

// zero12Layout is DeepSpeed's flat ZeRO-1/2 group: padded to a multiple of
// 2*D (A elements), split in D partitions of S.
func zero12Layout(n int64, D int) (a, s int64) {
	align := int64(2 * D)
	a = (n + align - 1) / align * align
	return a, a / int64(D)
}

func (p *plan) groupNumel(gi, t int) int64 {
	var n int64
	for _, name := range p.groups[gi].names {
		n += torchfile.Numel(p.shards[t][name].Shape)
	}
	return n
}

func (p *plan) groupNumels(gi, t int) []int64 {
	out := make([]int64, len(p.groups[gi].names))
	for i, name := range p.groups[gi].names {
		out[i] = torchfile.Numel(p.shards[t][name].Shape)
	}
	return out
}

// dsFile is one file of the tag folder: the model states (r -1 below
// ZeRO-3) or the optimizer state of TP rank t, DP rank r.
type dsFile struct {
	t, r  int
	optim bool
}

// files lists the tag folder's files in the order they are written: per
// TP rank its model states, then its optimizer files (ZeRO-3: per DP rank
// both).
func (p *plan) files() []dsFile {
	var out []dsFile
	for t := 0; t < p.o.TP; t++ {
		if p.o.Zero != 3 {
			out = append(out, dsFile{t: t, r: -1})
		}
		for r := 0; r < p.o.DP; r++ {
			if p.o.Zero == 3 {
				out = append(out, dsFile{t: t, r: r})
			}
			out = append(out, dsFile{t: t, r: r, optim: true})
		}
	}
	return out
}

// name is a file's name in the tag folder.
func (p *plan) name(f dsFile) string {
	switch {
	case f.optim:
		return p.OptimName(f.t, f.r)
	case p.o.Zero == 3:
		return fmt.Sprintf("zero_pp_rank_%d_mp_rank_%02d_model_states.pt", f.r, f.t)
	}
	return fmt.Sprintf("mp_rank_%02d_model_states.pt", f.t)
}

// write writes the files given into dir.
func (p *plan) write(ctx context.Context, dir string, files []dsFile, st *ReshardStats) error {
	cfg, err := p.dsConfig()
	if err != nil {
		return err
	}
	if p.o.Zero == 3 {
		p.subs = p.zero3SubGroups(cfg)
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case f.optim && p.o.Zero == 3:
			err = p.writeOptim3(ctx, dir, f.t, f.r, cfg, st)
		case f.optim:
			err = p.writeOptim12(ctx, dir, f.t, f.r, cfg, st)
		default:
			err = p.writeModelStates(ctx, filepath.Join(dir, p.name(f)), f.t, f.r, cfg, st)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeFlushed writes the files given into dir, several at once
// (layout.Files), and returns once they are in place.
func (p *plan) writeFlushed(ctx context.Context, dir string, files []dsFile, st *ReshardStats) error {
	return layout.WriteAll(ctx, p.r, layout.WriteOptions{Sync: !p.o.NoSync}, func(out *layout.Files) error {
		p.out = out
		return p.write(ctx, dir, files, st)
	})
}

// nodeFolder is the tag folder as the multi-node protocol writes it: one
// unit per file (sized by its tensors), and nothing to write last but
// 'latest' beside the folder, which Reshard writes once it is complete.
func (p *plan) nodeFolder(ctx context.Context, dst string, st *ReshardStats) *multinode.Folder {
	files := p.files()
	o := p.o
	o.Place, o.Force, o.NoSync, o.NoLatest = multinode.Place{}, false, false, false
	f := &multinode.Folder{Dst: dst, Place: p.o.Place, Force: p.o.Force, NoSync: p.o.NoSync,
		Units: multinode.Units(files, p.name, p.fileBytes),
		Write: func(ctx context.Context, tmp string, units []int) ([]string, error) {
			var mine []dsFile
			var names []string
			for _, u := range units {
				mine = append(mine, files[u])
				names = append(names, p.name(files[u]))
			}
			return names, p.r.VerifyingReads(func() error { return p.writeFlushed(ctx, tmp, mine, st) })
		}}
	return f.SetPlan("deepspeed", o, p.r.Manifest)
}

// fileBytes estimates a file's size from its tensors, for sharing the
// files out among nodes.
func (p *plan) fileBytes(f dsFile) int64 {
	var n int64
	for gi := range p.groups {
		n += p.groupNumel(gi, f.t)
	}
	if !f.optim {
		if p.o.Zero == 3 {
			return 1 // partitioned parameters are saved empty
		}
		return n * int64(p.dt.Size())
	}
	states := 1
	if len(p.groups) > 0 {
		states += len(p.stateNames(p.groups[0]))
	}
	return n / int64(p.o.DP) * 4 * int64(states)
}

// optimName is a ZeRO optimizer file name as DeepSpeed gives it.
func (p *plan) OptimName(t, r int) string {
	prefix := ""
	if p.dt == dtype.BFloat16 {
		prefix = "bf16_"
	}
	return fmt.Sprintf("%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt", prefix, r, t)
}

// dsConfig is the source's DeepSpeed config with the target's ZeRO stage
// and dtype.
func (p *plan) dsConfig() (*pyobj.Dict, error) {
	f, root, err := p.openTemplate(0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := p.setVersion(f.Name, root); err != nil {
		return nil, err
	}
	md := pyobj.NewDec(f.Name, root)
	cfg := pyobj.NewDict(pyobj.PlainDict)
	if d, ok := md.OptDict("ds_config"); ok {
		cfg = d.AsDict().Clone()
	}
	cd := pyobj.NewDec(f.Name+": ds_config", cfg)
	// sub is a copy of the config's section key (a new one when absent).
	sub := func(key string) *pyobj.Dict {
		d := pyobj.NewDict(pyobj.PlainDict)
		if c, ok := cd.OptDict(key); ok {
			d = c.AsDict().Clone()
		}
		cfg.Set(key, d)
		return d
	}
	zo := sub("zero_optimization")
	zo.Set("stage", int64(p.o.Zero))
	if _, ok := zo.Get("round_robin_gradients"); ok {
		zo.Set("round_robin_gradients", false) // the flat order written is the plain one
	}
	for _, k := range []string{"bf16", "fp16"} {
		want := (k == "bf16" && p.dt == dtype.BFloat16) || (k == "fp16" && p.dt == dtype.Float16)
		if _, has := cfg.Get(k); has || want {
			sub(k).Set("enabled", want)
		}
	}
	if _, has := cfg.Get("data_types"); has || p.o.BF16Optimizer {
		dts := sub("data_types")
		if p.o.BF16Optimizer {
			dts.Set("grad_accum_dtype", "fp32")
		} else {
			// The ZeRO optimizer written accumulates in the training dtype
			// (the default); the source's fp32 accumulation would make
			// DeepSpeed pick BF16_Optimizer at stage 1 and refuse stage 2.
			dts.Delete("grad_accum_dtype")
		}
	}
	if p.o.Zero < 3 {
		// Stage-3 settings of a ZeRO-3 source do not describe the target.
		for _, it := range pyobj.NewDec(f.Name+": ds_config", zo).Items() {
			if strings.HasPrefix(it.Key, "stage3_") || it.Key == "offload_param" {
				zo.Delete(it.Key)
			}
		}
	}
	p.batchConfig(cd, cfg)
	// The source's gradient clipping: the optimizer state's, else the config's.
	if v, ok := p.optim.Get("clip_grad"); ok {
		p.clip = v
	} else {
		p.clip = cd.OptFloat("gradient_clipping", 0)
	}
	if err := md.Err(); err != nil {
		return nil, err
	}
	return cfg, cd.Err()
}

// batchConfig keeps the per-rank batch (train_micro_batch_size_per_gpu,
// gradient_accumulation_steps) and makes train_batch_size their product
// with the target's DP, as DeepSpeed's config check requires; when the
// source gives only some of them, nothing is derived.
func (p *plan) batchConfig(cd pyobj.Dec, cfg *pyobj.Dict) {
	micro := cd.OptInt("train_micro_batch_size_per_gpu", 0)
	gas := cd.OptInt("gradient_accumulation_steps", 0)
	if micro > 0 && gas > 0 && cd.Has("train_batch_size") {
		cfg.Set("train_batch_size", micro*gas*int64(p.o.DP))
	}
}

// setVersion decides the ds_version written: the target's release when
// given, else the source's (the template's ds_version), else WriteVersion.
func (p *plan) setVersion(name string, tmpl *pyobj.Dict) error {
	p.version = p.o.Version
	if p.version == "" {
		d := pyobj.NewDec(name, tmpl)
		if p.version = d.OptStr("ds_version", ""); d.Err() != nil {
			return d.Err()
		}
	}
	if p.version == "" {
		p.version = WriteVersion
	}
	v, err := ParseVersion(p.version)
	if err != nil {
		if p.o.Version == "" {
			return fmt.Errorf("%s: ds_version %q: %w (give --deepspeed-version)", name, p.version, err)
		}
		return fmt.Errorf("--deepspeed-version: %w", err)
	}
	p.parallelDims = !VersionLess(v, parallelDimsFrom)
	return nil
}

// ParseVersion reads a DeepSpeed release MAJOR.MINOR[.PATCH] (a missing
// patch is 0; a local suffix such as "+abc123" is ignored).
func ParseVersion(s string) ([3]int, error) {
	var v [3]int
	base, _, _ := strings.Cut(strings.TrimPrefix(s, "v"), "+")
	parts := strings.Split(base, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("%q: want MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 0.14 or 0.19.5", s)
	}
	for i, part := range parts {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return v, fmt.Errorf("%q: %q is not a version number", s, part)
		}
		v[i] = n
	}
	return v, nil
}

// VersionLess orders releases.
func VersionLess(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// lossScaler is the loss-scaler state DeepSpeedZeroOptimizer saves: the
// source's when it suits the target dtype, else what the engine creates
// (a DynamicLossScaler with DeepSpeed's defaults for fp16, a static scale
// of 1 otherwise). Planning calls it once: its note reaches the summary.
func (p *plan) lossScaler() (scaler pyobj.Value, dynamic bool, err error) {
	want := "LossScaler"
	if p.dt == dtype.Float16 {
		want = "DynamicLossScaler"
	}
	od := pyobj.NewDec(p.optimPath(), p.optim)
	if v, ok := od.Opt("loss_scaler"); ok {
		obj := pyobj.As[*pyobj.Object](v, "a loss scaler object")
		if err := od.Err(); err != nil {
			return nil, false, err
		}
		if obj.Class != nil && obj.Class.Name == want {
			// A dynamic that is not a bool is an error naming the file, not false.
			d, has := obj.Attr("dynamic")
			if !has {
				return obj, false, nil
			}
			switch b := d.(type) {
			case bool:
				return obj, b, nil
			}
			return nil, false, fmt.Errorf("%s: loss_scaler.dynamic is %s, not a bool", p.optimPath(), pyobj.Repr(d))
		}
	}
	cls := &pyobj.Global{Module: "deepspeed.runtime.fp16.loss_scaler", Name: want}
	var st *pyobj.Dict
	if want == "LossScaler" {
		st = pyobj.DictOf("cur_scale", 1.0, "dynamic", false)
	} else {
		st = pyobj.DictOf("cur_scale", int64(1<<16), "dynamic", true, "cur_iter", int64(0), "last_overflow_iter", int64(-1),
			"scale_factor", 2.0, "scale_window", int64(1000), "min_scale", int64(1), "delayed_shift", int64(2),
			"cur_hysteresis", int64(2), "consecutive_hysteresis", false, "raise_error_at_min_scale", true,
			"dtype", pyobj.DType{DType: dtype.Float16})
		p.notes = append(p.notes, "the source has no fp16 loss scaler: a DynamicLossScaler with DeepSpeed's defaults (scale 2^16) is written")
	}
	return &pyobj.Object{Class: cls, Via: pyobj.ByNewObj, State: st, Built: true}, want == "DynamicLossScaler", nil
}

// paramGroup is the torch optimizer's state_dict entry of flat group g:
// the source's hyper-parameters, params last.
func paramGroup(h *pyobj.Dict, params ...int64) *pyobj.Dict {
	d := pyobj.NewDict(h.Kind)
	for i := 0; i < h.Len(); i++ {
		k, v := h.Item(i)
		if k != "params" {
			d.Set(k, v)
		}
	}
	l := &pyobj.List{}
	for _, x := range params {
		l.Items = append(l.Items, x)
	}
	d.Set("params", l)
	return d
}

// stateNames are the optimizer states besides fp32 (exp_avg, exp_avg_sq, or
// another optimizer's), in the atomic checkpoint's order.
func (p *plan) stateNames(g *rgroup) []string {
	var out []string
	e := p.params[g.names[0]]
	for _, f := range e.Files {
		if f.State != fragment.FP32 && f.State != fragment.StepState {
			out = append(out, f.State)
		}
	}
	return out
}

var fragmentAddress = &pyobj.Global{Module: "deepspeed.utils.tensor_fragment", Name: "fragment_address"}

func fragmentAddr(numel, start int64) *pyobj.Object {
	return &pyobj.Object{Class: fragmentAddress, Via: pyobj.ByNewObj, Built: true,
		State: pyobj.DictOf("numel", numel, "start", start)}
}

// fill and fillPiece are load's streaming writes.
type (
	fill      = layout.StateFill
	fillPiece = layout.StatePiece
)

// writeOptim12 writes the ZeRO-1/2 (or BF16_Optimizer) optimizer file of
// TP rank t, DP rank r.
func (p *plan) writeOptim12(ctx context.Context, dir string, t, r int, cfg *pyobj.Dict, st *ReshardStats) error {
	D := p.o.DP
	var fills []fill
	states := pyobj.NewDict(pyobj.PlainDict)
	var pgroups, fp32s, paddings, counts, mappings pyobj.List
	for gi, g := range p.groups {
		numels := p.groupNumels(gi, t)
		pieces, S, err := layout.Zero12Pieces(numels, D, r)
		if err != nil {
			return err
		}
		n := p.groupNumel(gi, t)
		a, _ := zero12Layout(n, D)
		var pad int64
		if r == D-1 {
			pad = a - n // v0.14.5 charges all padding to the last rank
		}
		fp32Len := S - pad
		if p.o.BF16Optimizer {
			fp32Len = S
		}
		fp32 := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{fp32Len}, RequiresGrad: true}
		sd := pyobj.NewDict(pyobj.PlainDict)
		if g.step != nil {
			sd.Set(fragment.StepState, g.step)
		}
		mp := pyobj.NewDict(pyobj.OrderedDict)
		var fps []fillPiece
		for _, pc := range pieces {
			name := g.names[pc.Param]
			mp.Set(name, fragmentAddr(pc.N, pc.At))
			fps = append(fps, p.sourcePieces(t, name, pc.Local, pc.N, pc.At)...)
		}
		fills = append(fills, fill{Blob: fp32, Pieces: withState(fps, fragment.FP32)})
		for _, s := range p.stateNames(g) {
			b := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{S}}
			sd.Set(s, b)
			fills = append(fills, fill{Blob: b, Pieces: withState(fps, s)})
		}
		if sd.Len() > 0 { // a fresh optimizer has no entry: torch AdamW's __setstate__ needs a step in each
			states.Set(int64(gi), sd)
		}
		pgroups.Items = append(pgroups.Items, paramGroup(g.hyper, int64(gi)))
		fp32s.Items = append(fp32s.Items, fp32)
		paddings.Items = append(paddings.Items, pad)
		counts.Items = append(counts.Items, int64(D))
		mappings.Items = append(mappings.Items, mp)
	}
	base := pyobj.DictOf("state", states, "param_groups", &pgroups)
	osd := pyobj.NewDict(pyobj.PlainDict)
	if p.o.BF16Optimizer {
		osd.Set("clip_grad", p.clip)
		osd.Set("base_optimizer_state", base)
		osd.Set("single_partition_of_fp32_groups", &fp32s)
		osd.Set("group_paddings", &paddings)
		osd.Set("partition_count", &counts)
		osd.Set("ds_version", p.version)
		osd.Set("param_slice_mappings", &mappings)
	} else {
		osd.Set("loss_scaler", p.scaler)
		osd.Set("dynamic_loss_scale", p.dynamicScale)
		osd.Set("overflow", false)
		osd.Set("clip_grad", p.clip)
		osd.Set("base_optimizer_state", base)
		osd.Set("single_partition_of_fp32_groups", &fp32s)
		osd.Set("zero_stage", zeroStageEnum(p.o.Zero))
		osd.Set("group_paddings", &paddings)
		osd.Set("partition_count", &counts)
		osd.Set("ds_version", p.version)
		osd.Set("param_slice_mappings", &mappings)
	}
	root := pyobj.DictOf("optimizer_state_dict", osd, "ds_config", cfg, "ds_version", p.version)
	return p.writeFile(ctx, filepath.Join(dir, p.OptimName(t, r)), root, fills, st)
}

func withState(ps []fillPiece, state string) []fillPiece {
	out := make([]fillPiece, len(ps))
	for i, x := range ps {
		x.State = state
		out[i] = x
	}
	return out
}

// zeroStageEnum is ZeroStageEnum pickled by name, as DeepSpeed's files hold it.
func zeroStageEnum(stage int) pyobj.Enum {
	name := map[int]string{1: "optimizer_states", 2: "gradients", 3: "weights"}[stage]
	return pyobj.Enum{Class: &pyobj.Global{Module: "deepspeed.runtime.zero.config", Name: "ZeroStageEnum"}, Name: name, ByName: true}
}

// writeFile writes root, streaming the fills' tensors (cast to each blob's
// dtype) and zeros between their pieces; blobs with Data are written as is.
func (p *plan) writeFile(ctx context.Context, path string, root pyobj.Value, fills []fill, st *ReshardStats) error {
	n, err := p.out.Add(ctx, path, root, fills)
	if err != nil {
		return err
	}
	st.Files++
	st.Bytes += n
	return nil
}

// engineKeys are the keys DeepSpeed v0.14.5's engine writes into a model
// state, in order; every other key of the template is client state.
var engineKeys = []string{"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
	"frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
	"global_steps", "global_samples", "dp_world_size", "mp_world_size", checkpointParallelDims, "ds_config", "ds_version"}

// checkpointParallelDims is the engine key DeepSpeed writes from v0.19.5
// on: {'pp_degree': PP, 'tp_degree': TP} between mp_world_size and
// ds_config (deepspeedai/DeepSpeed v0.19.5, commit cf44300453eb,
// deepspeed/runtime/engine.py _checkpoint_parallel_metadata and
// _common_checkpoint_state; no earlier release writes it).
const checkpointParallelDims = "checkpoint_parallel_dimensions"

// parallelDimsFrom is the first release that writes it.
var parallelDimsFrom = [3]int{0, 19, 5}

// newerKeys are engine keys that describe the source's degrees: never
// copied from the template (written for the target when its release has
// them).
var newerKeys = map[string]bool{checkpointParallelDims: true}

// writeModelStates writes the model-state file of TP rank t (ZeRO-3: of DP
// rank r too; r < 0 for ZeRO-1/2): the engine's keys in its order, then the
// template's client state.
func (p *plan) writeModelStates(ctx context.Context, path string, t, r int, cfg *pyobj.Dict, st *ReshardStats) error {
	f, tmpl, err := p.openTemplate(t)
	if err != nil {
		return err
	}
	defer f.Close()
	var fills []fill
	md := pyobj.NewDec(f.Name, tmpl)
	tm := md.Dict("module")
	if err := md.Err(); err != nil {
		return err
	}
	lp := map[string]*torchfile.Blob{} // one tensor per parameter, shared by its aliases
	module, err := p.module(f, tm.AsDict(), "", t, r, lp, &fills)
	if err != nil {
		return err
	}
	state := p.engineState(tmpl, module, t, r, cfg, &fills)
	if err := p.clientState(f, tmpl, state); err != nil {
		return err
	}
	return p.writeFile(ctx, path, state, fills, st)
}

// engineState is the engine's part of a model-state file (engineKeys):
// the target's module, shapes and degrees, the template's counters.
func (p *plan) engineState(tmpl, module *pyobj.Dict, t, r int, cfg *pyobj.Dict, fills *[]fill) *pyobj.Dict {
	get := func(k string, def pyobj.Value) pyobj.Value {
		if v, ok := tmpl.Get(k); ok {
			return v
		}
		return def
	}
	frozenShapes, frozenFrags := p.frozenState(t, r, fills)
	state := pyobj.NewDict(pyobj.PlainDict)
	for _, k := range engineKeys {
		var v pyobj.Value
		switch k {
		case "module":
			v = module
		case "buffer_names":
			v = get(k, &pyobj.List{})
		case "optimizer":
			v = nil
		case "param_shapes":
			v = p.paramShapes(t)
		case "frozen_param_shapes":
			v = frozenShapes
		case "shared_params":
			v = p.sharedParamsOf(t, r)
		case "frozen_param_fragments":
			v = frozenFrags
		case "sparse_tensor_module_names":
			v = get(k, &pyobj.Set{})
		case "skipped_steps", "global_steps", "global_samples":
			v = get(k, int64(0))
		case "dp_world_size":
			v = int64(p.o.DP)
		case "mp_world_size":
			v = int64(p.o.TP)
		case "ds_config":
			v = cfg
		case "ds_version":
			v = p.version
		case checkpointParallelDims:
			if !p.parallelDims {
				continue
			}
			// DeepSpeed v0.19.5 engine.py _checkpoint_parallel_metadata.
			v = pyobj.DictOf("pp_degree", int64(1), "tp_degree", int64(p.o.TP))
		default:
			v = get(k, nil)
		}
		state.Set(k, v)
	}
	return state
}

// paramShapes is param_shapes of TP rank t: per flat group, its
// parameters' shapes (ZeRO-3: per sub-group).
func (p *plan) paramShapes(t int) *pyobj.List {
	if p.o.Zero == 3 {
		return p.zero3Shapes()
	}
	shapes := &pyobj.List{}
	for _, g := range p.groups {
		d := pyobj.NewDict(pyobj.OrderedDict)
		for _, n := range g.names {
			d.Set(n, pyobj.Size(p.shards[t][n].Shape))
		}
		shapes.Items = append(shapes.Items, d)
	}
	return shapes
}

// frozenState is frozen_param_shapes and frozen_param_fragments (ZeRO-2
// and 3; None below), whose tensors it adds to fills.
func (p *plan) frozenState(t, r int, fills *[]fill) (shapes, frags pyobj.Value) {
	if p.o.Zero < 2 {
		return nil, nil
	}
	fs, ff := pyobj.NewDict(pyobj.OrderedDict), pyobj.NewDict(pyobj.OrderedDict)
	for _, n := range p.frozen {
		e := p.params[n]
		sh := p.shards[t][n]
		fs.Set(n, pyobj.Size(sh.Shape))
		b, pieces := p.frozenFragment(e, sh, r)
		ff.Set(n, b)
		*fills = append(*fills, fill{Blob: b, Pieces: pieces})
	}
	return fs, ff
}

// sharedParamsOf is shared_params of TP rank t, DP rank r: the aliases on
// the first file only (sharedParams).
func (p *plan) sharedParamsOf(t, r int) *pyobj.Dict {
	shared := pyobj.NewDict(pyobj.PlainDict)
	if t == 0 && r <= 0 {
		p.sharedParams(shared)
	}
	return shared
}

// clientState copies the template's keys that are not the engine's into
// state (Megatron-DeepSpeed's args updated to the target degrees), with
// their tensors read.
func (p *plan) clientState(f *torchfile.File, tmpl, state *pyobj.Dict) error {
	for i := 0; i < tmpl.Len(); i++ {
		k, v := tmpl.Item(i)
		if _, done := state.Get(k); done {
			continue
		}
		switch ks := k.(type) { // client keys of other types are copied as they are
		case string:
			if newerKeys[ks] {
				continue
			}
			if ks == "args" {
				v = p.args(v)
			}
		}
		cv, err := f.WithBytes(v, pyobj.DefaultLimits(), 0)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", f.Name, pyobj.Repr(k), err)
		}
		state.Set(k, cv)
	}
	return nil
}

// args updates Megatron-DeepSpeed's saved arguments to the target degrees;
// client state of another shape is copied as it is.
func (p *plan) args(v pyobj.Value) pyobj.Value {
	switch o := v.(type) {
	case *pyobj.Object:
		switch d := o.State.(type) {
		case *pyobj.Dict: // argparse.Namespace
			c := *o
			nd := d.Clone()
			set := func(k string, x int64) {
				if _, ok := nd.Get(k); ok {
					nd.Set(k, x)
				}
			}
			set("tensor_model_parallel_size", int64(p.o.TP))
			set("data_parallel_size", int64(p.o.DP))
			set("world_size", int64(p.o.TP*p.o.DP))
			set("zero_stage", int64(p.o.Zero))
			if p.paddedVocab > 0 {
				set("padded_vocab_size", p.paddedVocab)
			}
			c.State = nd
			return &c
		}
	}
	return v
}

// module rebuilds a (possibly nested) module state dict for TP rank t:
// parameters are their shards in the training dtype (ZeRO-3: empty, as
// partitioned parameters are saved), buffers are the template's, frozen
// parameters come from the atomic checkpoint.
func (p *plan) module(f *torchfile.File, d *pyobj.Dict, prefix string, t, r int, lp map[string]*torchfile.Blob, fills *[]fill) (*pyobj.Dict, error) {
	out := pyobj.NewDict(d.Kind)
	out.Attrs = d.Attrs
	dd := pyobj.NewDec(f.Name+": module "+prefix, d)
	items := dd.Items()
	if err := dd.Err(); err != nil {
		return nil, err
	}
	for _, it := range items {
		k, v := it.Key, it.Value()
		name := prefix + k
		switch x := v.(type) {
		case *pyobj.Dict:
			sub, err := p.module(f, x, name+".", t, r, lp, fills)
			if err != nil {
				return nil, err
			}
			out.Set(k, sub)
			continue
		case *torchfile.Tensor:
			canon := name
			if c, ok := p.aliases[name]; ok {
				canon = c
			}
			if b, ok := lp[canon]; ok {
				out.Set(k, b)
				continue
			}
			e, inAtomic := p.params[canon]
			switch {
			case inAtomic && !p.buffers[canon]:
				dt := p.dt
				if e.Frozen && e.SourceDType != "" {
					if sdt, err := dtype.Parse(e.SourceDType); err == nil && sdt.IsFloat() {
						dt = sdt
					}
				}
				sh := p.shards[t][canon]
				b := &torchfile.Blob{DType: dt, Shape: append([]int64(nil), sh.Shape...), RequiresGrad: false}
				if p.o.Zero == 3 {
					// Partitioned parameters are saved as empty tensors.
					b.Shape, b.Data = []int64{0}, []byte{}
				} else {
					*fills = append(*fills, fill{Blob: b, Pieces: withState(p.sourcePieces(t, canon, 0, torchfile.Numel(sh.Shape), 0), fragment.FP32)})
				}
				lp[canon] = b
				out.Set(k, b)
			case p.buffers[canon] || p.o.TP == p.srcT:
				b, err := readBlob(f, x)
				if err != nil {
					return nil, err
				}
				out.Set(k, b)
			default:
				return nil, fmt.Errorf("%s: module tensor %s is neither a parameter nor a buffer of the checkpoint; it cannot be resharded to --tp %d", f.Name, name, p.o.TP)
			}
			continue
		}
		out.Set(k, v)
	}
	return out, nil
}

func readBlob(f *torchfile.File, t *torchfile.Tensor) (*torchfile.Blob, error) {
	b, err := f.ReadTensor(t)
	if err != nil {
		return nil, err
	}
	bl := torchfile.NewBlob(t.DType, t.Shape, b)
	bl.RequiresGrad = t.RequiresGrad
	return bl, nil
}

// frozenFragment is a frozen parameter as DeepSpeed saves it: the whole
// (TP-local) tensor in its dtype for ZeRO-2, this rank's partition for ZeRO-3.
func (p *plan) frozenFragment(e *atomic.ParamEntry, sh fragment.Shard, r int) (*torchfile.Blob, []fillPiece) {
	dt := p.dt
	if e.SourceDType != "" {
		if sdt, err := dtype.Parse(e.SourceDType); err == nil && sdt.IsFloat() {
			dt = sdt
		}
	}
	n := torchfile.Numel(sh.Shape)
	if p.o.Zero == 3 {
		pn := (n + int64(p.o.DP) - 1) / int64(p.o.DP)
		valid := max(0, min(pn, n-int64(r)*pn))
		b := &torchfile.Blob{DType: dt, Shape: []int64{pn}}
		return b, []fillPiece{{Param: e.Name, State: fragment.FP32, Shard: sh, Local: int64(r) * pn, N: valid}}
	}
	b := &torchfile.Blob{DType: dt, Shape: append([]int64(nil), sh.Shape...)}
	return b, []fillPiece{{Param: e.Name, State: fragment.FP32, Shard: sh, N: n}}
}

// reExpertParam matches routed-expert parameters in every naming ucp reads:
// Megatron's mlp.experts (SequentialMLP, TEGroupedMLP, GroupedMLP),
// Hugging Face's experts.N and DeepSpeed-MoE's deepspeed_moe.experts.
var reExpertParam = regexp.MustCompile(`(^|\.)(experts\.|deepspeed_moe\.)`)

// refuseExperts refuses a mixture-of-experts source by name before
// anything else is planned: DeepSpeed keeps experts in expp_rank_* /
// layer_*_expert_* files with an optimizer over the expert-data-parallel
// group, which this writer does not lay out.
func refuseExperts(r *atomic.Reader) error {
	src := r.Manifest.Source
	what := "a mixture-of-experts model"
	if src.Model != nil && src.Model.Family != "" && src.Model.Experts > 0 {
		what = src.Model.Family
	}
	if src.Model != nil && src.Model.Experts > 0 || src.Degrees.EP > 1 {
		return fmt.Errorf("%s: %s: mixture-of-experts models cannot be written to DeepSpeed (expert files and expert-data-parallel optimizer partitions are not written)", r.Dir, what)
	}
	for _, e := range r.Manifest.Params {
		if reExpertParam.MatchString(e.Name) {
			return fmt.Errorf("%s: %s (parameter %s): mixture-of-experts models cannot be written to DeepSpeed (expert files and expert-data-parallel optimizer partitions are not written)", r.Dir, what, e.Name)
		}
	}
	return nil
}
