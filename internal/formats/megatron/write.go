package megatron

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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

// ReshardOptions say which Megatron-LM run the written checkpoint is for.
type ReshardOptions struct {
	TP, PP, VPP, DP int
	// EP and ETP are Megatron's --expert-model-parallel-size and
	// --expert-tensor-parallel-size of a mixture-of-experts target (0: 1
	// and TP).
	EP, ETP int
	// DistOptimizer writes Megatron's distributed optimizer: param groups
	// in model_optim_rng.pt, states in distrib_optim.pt (F3, core >= 0.13).
	DistOptimizer bool
	// Optimizer is the Adam class the loading run builds, which decides
	// where the step goes (stepStyle): "adamw" (torch.optim.AdamW, what
	// Megatron falls back to without TE and Apex), "fused" (TE or Apex
	// FusedAdam), or "" for the source's.
	Optimizer string
	// FirstStageLayers and LastStageLayers are Megatron's
	// --decoder-first/last-pipeline-num-layers (0: not set).
	FirstStageLayers, LastStageLayers int
	// Spec is the layer spec of a target written from a non-Megatron
	// source (planFamily): "local" or "te" ("": te, Megatron's default
	// transformer_impl); a Megatron source keeps its own.
	Spec          string
	Force, NoSync bool
	// Place: this process's share of a multi-node run (Nodes > 1), which
	// writes the iteration folder with the other nodes (multinode.Folder).
	Place multinode.Place
	// torchDist: planned for the torch_dist writer (ReshardDist), which
	// writes Megatron-LM sources' experts (the legacy writer does not yet)
	// and the distributed optimizer's state of a family source.
	torchDist bool
}

// ReshardStats tell what was written.
type ReshardStats struct {
	Files int
	Bytes int64
	Notes []string
	// Node is what this node did in a multi-node run (nil for one process).
	Node *multinode.Result
}

// rsParam is one tensor of a target rank's model state dict.
type rsParam struct {
	local string // key in the written state dict (stage-local layer number)
	src   string // atomic parameter whose shard it holds
	// routed: a routed expert's tensor, global expert number expert; only
	// the EP rank holding it writes it, under its local number, cut at
	// the expert TP rank.
	routed bool
	expert int
	// fp32: the router's expert_bias, a persistent buffer kept in float32
	// whatever the training dtype (megatron-core router.py
	// _maintain_float32_expert_bias) and held by no optimizer (trained).
	fp32 bool
}

// trained keeps the tensors an optimizer holds: all but the router's
// expert_bias buffers (rsParam.fp32).
func trained(list []rsParam) []rsParam {
	out := make([]rsParam, 0, len(list))
	for _, rp := range list {
		if !rp.fp32 {
			out = append(out, rp)
		}
	}
	return out
}

// outFile is one model_optim_rng.pt of a pipeline stage: the dense
// parameters of TP rank t, the routed experts of EP rank e cut at expert
// TP rank u.
type outFile struct{ t, e, u int }

// rsPlan is everything Reshard decided before writing (RESHARD.md).
type rsPlan struct {
	r      *atomic.Reader
	out    *layout.Files // the rank files being written, several at once
	o      ReshardOptions
	dt     dtype.DType
	extra  *pyobj.Dict
	args   *pyobj.Object
	optim  *pyobj.Dict
	groups []*pyobj.Dict
	flags  []groupFlags
	qkWD   bool
	te     bool                        // TransformerEngine spec: core_attention saves _extra_state too
	shards []map[string]fragment.Shard // per target TP rank
	chunks [][][]rsParam               // [pp][chunk] tensors in state-dict order
	states map[string][]string         // parameter -> optimizer tensor states (fp32 first)
	steps  map[string]pyobj.Value
	iter   int64
	// release: a weights-only save from another framework's source
	// (planFamily), in the 'release' folder; virt holds its tensors.
	release bool
	virt    map[string][]virtTensor
	vocab   int64 // target padded vocabulary (0: none)
	layers  int
	untie   bool
	modelCP int64
	style   stepStyle
	split   [][][2]int // [stage][chunk] first global layer, layers
	// ep, etp: expert parallel and expert tensor parallel sizes (1 and TP
	// without experts); files the rank files of every stage.
	ep, etp int
	experts int
	files   []outFile
	// nDense: the dense optimizer's groups, first in groups (chained)
	nDense int
	// eshards: routed experts' shards per expert-TP rank
	eshards []map[string]fragment.Shard
}

// Reshard writes the atomic checkpoint r (converted from a Megatron-LM
// checkpoint) as a Megatron-LM --ckpt-format torch save folder dst at the
// given tensor, pipeline and virtual pipeline sizes: iter_XXXXXXX with one
// mp_rank_TT[_PPP]/model_optim_rng.pt per model-parallel rank, and
// latest_checkpointed_iteration.txt naming it. Everything is checked before
// the first byte is written; the iteration folder appears complete or not
// at all.
func Reshard(ctx context.Context, r *atomic.Reader, dst string, o ReshardOptions) (*ReshardStats, error) {
	p, err := planMegatron(r, o)
	if err != nil {
		return nil, err
	}
	dst = filepath.Clean(dst)
	iterDir, tracker, st, err := p.prepareDst(dst)
	if err != nil {
		return nil, err
	}
	rf := p.rankFolders()
	if o.Place.Multi() {
		units := multinode.Units(rf, func(f rankFolder) string { return f.name }, p.rankBytes)
		folder := p.nodeFolder(iterDir, units, planKey(o), func(ctx context.Context, tmp string, mine []int) ([]string, error) {
			var fs []rankFolder
			for _, u := range mine {
				fs = append(fs, rf[u])
			}
			var files []string
			err := r.VerifyingReads(func() error { return p.writeFlushed(ctx, tmp, fs, st) })
			for _, f := range fs {
				if err == nil {
					files, err = listFolder(tmp, f.name, files)
				}
			}
			return files, err
		})
		return st, p.finishNode(ctx, folder, dst, tracker, o.NoSync, st)
	}
	if err := fsutil.WriteDir(iterDir+atomic.PartialSuffix, iterDir, o.Force, o.NoSync, func(tmp string) error {
		return r.VerifyingReads(func() error {
			return p.writeFlushed(ctx, tmp, rf, st)
		})
	}); err != nil {
		return nil, err
	}
	return st, writeTracker(dst, tracker, o.NoSync, st)
}

// writeTracker writes latest_checkpointed_iteration.txt naming the
// complete iteration folder.
func writeTracker(dst, tracker string, noSync bool, st *ReshardStats) error {
	if err := fsutil.WriteFileAtomic(filepath.Join(dst, trackerFile), []byte(tracker), noSync); err != nil {
		return err
	}
	st.Files++
	return nil
}

// nodeFolder is the iteration folder as the multi-node protocol writes it
// (multinode.Folder): units shared out by size, the plan fingerprinted
// from the options that decide the bytes (o, without this process's place
// and write settings) and the source's manifest.
func (p *rsPlan) nodeFolder(iterDir string, units []multinode.Unit, o any, write func(ctx context.Context, tmp string, units []int) ([]string, error)) *multinode.Folder {
	f := &multinode.Folder{Dst: iterDir, Place: p.o.Place, Force: p.o.Force, NoSync: p.o.NoSync, Units: units, Write: write}
	return f.SetPlan("megatron", o, p.r.Manifest)
}

// planKey is o without what may differ between the nodes of one plan:
// their place and write settings.
func planKey(o ReshardOptions) ReshardOptions {
	o.Place, o.Force, o.NoSync = multinode.Place{}, false, false
	return o
}

// finishNode runs this node's share; the node that completes the folder
// writes the tracker beside it.
func (p *rsPlan) finishNode(ctx context.Context, f *multinode.Folder, dst, tracker string, noSync bool, st *ReshardStats) error {
	var err error
	if st.Node, err = f.Run(ctx); err != nil || !st.Node.Finalized {
		return err
	}
	return writeTracker(dst, tracker, noSync, st)
}

// prepareDst checks the clean destination dst before anything is written:
// it must not overlap the source, and the save folder or the tracker
// already there is replaced only with --force (another checkpoint's tracker
// would be repointed). It makes dst and returns the save folder, the
// tracker's text and the stats with the rng_state note.
func (p *rsPlan) prepareDst(dst string) (string, string, *ReshardStats, error) {
	if err := fsutil.CheckOverlap(p.r.Dir, dst, atomic.PartialSuffix); err != nil {
		return "", "", nil, err
	}
	iterDir, tracker := p.saveDir(dst)
	for _, x := range []string{iterDir, filepath.Join(dst, trackerFile)} {
		if _, err := os.Stat(x); err == nil && !p.o.Force {
			return "", "", nil, fmt.Errorf("%s exists; use --force to replace it", x)
		}
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", "", nil, err
	}
	st := &ReshardStats{Notes: []string{"rng_state is not written: resume with --no-load-rng (the source's generators do not map onto new ranks)"}}
	return iterDir, tracker, st, nil
}

// saveDir is the folder of the save in dst and the tracker's text: the
// iteration's, or 'release' for a weights-only save of another
// framework's model (Megatron's load_checkpoint reads it as iteration 0,
// without optimizer and rng state).
func (p *rsPlan) saveDir(dst string) (string, string) {
	if p.release {
		return filepath.Join(dst, "release"), "release"
	}
	return filepath.Join(dst, fmt.Sprintf("iter_%07d", p.iter)), strconv.FormatInt(p.iter, 10)
}

func planMegatron(r *atomic.Reader, o ReshardOptions) (*rsPlan, error) {
	m := r.Manifest
	switch {
	case o.TP < 1:
		return nil, fmt.Errorf("--tp must be at least 1, not %d", o.TP)
	case o.PP < 1:
		return nil, fmt.Errorf("--pp must be at least 1, not %d", o.PP)
	case o.DP < 1:
		return nil, fmt.Errorf("--dp must be at least 1, not %d", o.DP)
	case o.VPP < 0 || o.VPP == 1:
		return nil, fmt.Errorf("--vpp %d: give 2 or more model chunks per stage, or leave it out", o.VPP)
	case o.VPP > 0 && o.PP < 2:
		return nil, fmt.Errorf("--vpp %d needs --pp 2 or more (Megatron interleaves chunks over pipeline stages)", o.VPP)
	}
	if o.EP < 0 || o.ETP < 0 {
		return nil, fmt.Errorf("--ep %d, --expert-tp %d: give 1 or more", o.EP, o.ETP)
	}
	if m.Source.Format != "megatron" && m.Source.Format != DistFormat {
		return planFamily(r, o) // weights of a known model family
	}
	if o.Spec != "" {
		return nil, fmt.Errorf("--megatron-spec is for sources not converted from Megatron-LM; this one keeps its own (args.transformer_impl)")
	}
	p := &rsPlan{r: r, o: o, states: map[string][]string{}, steps: map[string]pyobj.Value{}, ep: max(o.EP, 1), etp: o.ETP}
	if p.etp == 0 {
		p.etp = o.TP
	}
	if err := p.loadExtra(); err != nil {
		return nil, err
	}
	var err error
	if p.dt, err = dtype.Parse(m.Source.DType); err != nil {
		return nil, fmt.Errorf("%s: source training dtype: %w", r.Dir, err)
	}
	if p.dt != dtype.Float32 && p.dt != dtype.BFloat16 && p.dt != dtype.Float16 {
		return nil, fmt.Errorf("%s: source training dtype %v: Megatron trains in float32, bfloat16 or float16", r.Dir, p.dt)
	}
	model, err := p.readArgs()
	if err != nil {
		return nil, err
	}
	if o.TP > 1 {
		// Megatron divides heads and query groups by TP in every layer.
		for _, c := range []struct {
			what string
			n    int64
		}{{"attention heads", model.Heads}, {"query groups", model.QueryGroups}} {
			if c.n <= 0 || c.n%int64(o.TP) != 0 {
				return nil, fmt.Errorf("--tp %d does not divide the %d %s of the model", o.TP, c.n, c.what)
			}
		}
	}
	if err := p.readOptim(); err != nil {
		return nil, err
	}
	if p.experts > 0 {
		if err := p.targetGroups(); err != nil {
			return nil, err
		}
	}
	if err := p.slices(model); err != nil {
		return nil, err
	}
	if p.style, err = styleOf(o.Optimizer, p.steps); err != nil {
		return nil, err
	}
	if p.groups, err = adamGroups(r.Dir, p.groups, p.style); err != nil {
		return nil, err
	}
	return p, p.place()
}

// extraPath is the atomic checkpoint's extra_state.pt (the source's args,
// iteration and schedulers).
func (p *rsPlan) extraPath() string { return fmt.Sprintf("%s/%s", p.r.Dir, atomic.ExtraState) }

// loadExtra reads extra_state.pt and its args Namespace, once.
func (p *rsPlan) loadExtra() error {
	ev, err := p.r.Load(atomic.ExtraState)
	if err != nil {
		return err
	}
	ed := pyobj.NewDec(p.extraPath(), ev)
	p.extra = ed.AsDict()
	if err := ed.Err(); err != nil {
		return err
	}
	var av pyobj.Value
	if a, ok := ed.Opt("args"); ok {
		av = a.Value()
	}
	switch ns := av.(type) {
	case *pyobj.Object:
		p.args = ns
		return nil
	}
	return fmt.Errorf("%s: no args Namespace (%s); the model geometry is unknown (a torch_dist checkpoint saved outside Megatron's training loop has none)", p.extraPath(), pyobj.TypeName(av))
}

// readArgs reads the writer's settings from the source's args and returns
// the target geometry (layout.MegatronModel).
func (p *rsPlan) readArgs() (layout.Model, error) {
	r, o := p.r, p.o
	switch p.args.State.(type) {
	case *pyobj.Dict:
	default:
		return layout.Model{}, fmt.Errorf("%s: args has no attribute dict", p.extraPath())
	}
	args := layout.Args{Path: p.extraPath(), NS: p.args}
	L, err := args.Int("num_layers", 0)
	if err != nil {
		return layout.Model{}, err
	}
	if L <= 0 {
		return layout.Model{}, fmt.Errorf("%s: args.num_layers is missing", p.extraPath())
	}
	p.layers = int(L)
	if p.modelCP, err = args.Int("context_parallel_size", 1); err != nil {
		return layout.Model{}, err
	}
	if err := p.readExperts(args); err != nil {
		return layout.Model{}, err
	}
	// A bool that is not one is an error naming the file, not false.
	if legacy, err := args.Bool("use_legacy_models", false); err != nil || legacy {
		if err != nil {
			return layout.Model{}, err
		}
		return layout.Model{}, fmt.Errorf("%s: a legacy (non-MCore) Megatron model: --to megatron writes MCore state dicts only", r.Dir)
	}
	if p.untie, err = args.Bool("untie_embeddings_and_output_weights", false); err != nil {
		return layout.Model{}, err
	}
	if p.qkWD, err = args.Bool("apply_wd_to_qk_layernorm", false); err != nil {
		return layout.Model{}, err
	}
	ad := pyobj.NewDec(p.extraPath()+": args", p.args.State)
	p.te = ad.OptStr("transformer_impl", "") == "transformer_engine"
	if err := ad.Err(); err != nil {
		return layout.Model{}, err
	}
	if p.split, err = pipelineSplit(p.layers, o.PP, max(o.VPP, 1), o.FirstStageLayers, o.LastStageLayers); err != nil {
		return layout.Model{}, err
	}
	ed := pyobj.NewDec(p.extraPath(), p.extra)
	if ed.Has("iteration") {
		p.iter = ed.Int("iteration")
	}
	if err := ed.Err(); err != nil {
		return layout.Model{}, err
	}
	if p.iter < 0 {
		return layout.Model{}, fmt.Errorf("%s: iteration is %d", p.extraPath(), p.iter)
	}
	return layout.MegatronModel(args)
}

// readOptim reads the source's optimizer state (param groups, grad scaler)
// from the atomic checkpoint.
func (p *rsPlan) readOptim() error {
	path := filepath.Join(p.r.Dir, atomic.ZeroDir, atomic.OptimizerState)
	ov, err := p.r.Load(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if err != nil {
		return err
	}
	od := pyobj.NewDec(path, ov)
	p.optim = od.AsDict()
	if err := od.Err(); err != nil {
		return err
	}
	groups, flags, err := readGroups(path, 0, od)
	if err != nil {
		return err
	}
	p.flags = flags
	for _, g := range groups {
		p.groups = append(p.groups, g.AsDict())
	}
	return nil
}

// slices computes every parameter's shard on every target TP rank as
// Megatron holds it (load: vocabulary re-padded, QKV per query group,
// SwiGLU [gate_r; up_r]).
func (p *rsPlan) slices(model layout.Model) error {
	T := p.o.TP
	p.shards = make([]map[string]fragment.Shard, T)
	for t := range p.shards {
		p.shards[t] = map[string]fragment.Shard{}
	}
	srcT := max(p.r.Manifest.Source.Degrees.TP, 1)
	for i := range p.r.Manifest.Params {
		e := &p.r.Manifest.Params[i]
		switch {
		case e.Frozen && !isBuffer(e.Name):
			return fmt.Errorf("%s: frozen parameter or buffer %s: --to megatron writes trained parameters and the router's expert_bias only", p.r.Dir, e.Name)
		case isGrouped(e.Name) || strings.HasPrefix(e.Name, "language_model."):
			return fmt.Errorf("%s: parameter %s: --to megatron does not write GroupedMLP (weight1/weight2) or legacy-model layouts yet", p.r.Dir, e.Name)
		case isExpert(e.Name) && findExpert(e.Name).local < 0:
			return fmt.Errorf("%s: parameter %s: an expert parameter without an expert number, which --to megatron does not place", p.r.Dir, e.Name)
		}
		meta, err := layout.ReadMeta(filepath.Join(p.r.Dir, atomic.StatePath(e.Name, fragment.FP32)))
		if err != nil {
			return err
		}
		if isExpert(e.Name) {
			// Routed experts are cut over the expert-TP ranks.
			if err := p.expertSlices(model, e, meta); err != nil {
				return err
			}
			if err := p.readStates(e); err != nil {
				return err
			}
			continue
		}
		var padded int64
		if T == srcT {
			padded = e.PaddedVocab
		}
		for t := 0; t < T; t++ {
			sh, err := model.Slice(e, meta, T, t, padded)
			if err != nil {
				return err
			}
			if torchfile.Numel(sh.Shape) == 0 && torchfile.Numel(e.Shape) > 0 {
				return fmt.Errorf("%s: shape %v cannot be split %d ways", e.Name, e.Shape, T)
			}
			p.shards[t][e.Name] = sh
			if meta.Vocab && len(sh.Shape) > 0 {
				p.vocab = sh.Shape[0] * int64(T)
			}
		}
		if e.Frozen {
			continue // the router's expert_bias: a buffer, in no optimizer
		}
		if err := p.readStates(e); err != nil {
			return err
		}
	}
	return nil
}

// readStates records the optimizer states and the step of a parameter.
func (p *rsPlan) readStates(e *atomic.ParamEntry) error {
	var states []string
	for _, f := range e.Files {
		if f.State != fragment.StepState {
			states = append(states, f.State)
		}
	}
	p.states[e.Name] = fragment.StateOrder(states)
	if len(p.states[e.Name]) == 0 || p.states[e.Name][0] != fragment.FP32 {
		return fmt.Errorf("%s: parameter %s has no fp32 state", p.r.Dir, e.Name)
	}
	v, ok, err := p.r.Step(e.Name)
	if err != nil {
		return err
	}
	if ok {
		p.steps[e.Name] = v
	}
	return nil
}

// place puts every parameter on its pipeline stage and model chunk:
// global layer n lives in the chunk v of stage s whose layer range
// (pipelineSplit) holds it, renumbered from 0 there; the
// embedding on the first chunk, the rest (final norm, output layer) on
// the last; a tied output layer gets the embedding's copy there unless
// one chunk is both first and last.
func (p *rsPlan) place() error {
	P, V := p.o.PP, max(p.o.VPP, 1)
	p.chunks = make([][][]rsParam, P)
	for s := range p.chunks {
		p.chunks[s] = make([][]rsParam, V)
	}
	var embedding string
	for _, e := range p.r.Manifest.Params {
		n := layerIndex(e.Name)
		s, v := P-1, V-1
		local := e.Name
		switch {
		case n >= 0:
			if n >= p.layers {
				return fmt.Errorf("%s: %s is beyond num_layers %d", p.r.Dir, e.Name, p.layers)
			}
			s, v = p.chunkOf(n)
			local = globalName(e.Name, -p.split[s][v][0], 0)
			if x := findExpert(e.Name); isExpert(e.Name) && x.local >= 0 {
				p.chunks[s][v] = append(p.chunks[s][v], rsParam{local: local, src: e.Name, routed: true, expert: x.local})
				continue
			}
		case strings.HasPrefix(e.Name, "embedding."):
			s, v = 0, 0
			if isWordEmbedding(e.Name) {
				embedding = e.Name
			}
		}
		// The frozen ones slices admitted: the router's expert_bias.
		p.chunks[s][v] = append(p.chunks[s][v], rsParam{local: local, src: e.Name, fp32: e.Frozen})
	}
	if embedding != "" && !p.untie && P*V > 1 {
		p.chunks[P-1][V-1] = append(p.chunks[P-1][V-1], rsParam{local: "output_layer.weight", src: embedding})
	}
	for s := range p.chunks {
		for v, list := range p.chunks[s] {
			if len(list) == 0 {
				return fmt.Errorf("pipeline stage %d chunk %d would hold no parameters", s, v)
			}
		}
	}
	return nil
}

// rankFolder is one mp_rank folder of the save: rank file f of stage s.
type rankFolder struct {
	name string
	f    outFile
	s    int
}

// rankFolders lists the mp_rank folders in the order they are written.
func (p *rsPlan) rankFolders() []rankFolder {
	var out []rankFolder
	for s := 0; s < p.o.PP; s++ {
		for _, f := range p.rankFiles() {
			name := fmt.Sprintf("mp_rank_%02d", f.t)
			if p.o.PP > 1 {
				name += fmt.Sprintf("_%03d", s)
			}
			if p.ep > 1 {
				name += fmt.Sprintf("_%03d", f.e)
			}
			out = append(out, rankFolder{name: name, f: f, s: s})
		}
	}
	return out
}

// rankBytes estimates a rank folder's size from its tensors (weights,
// and fp32 main parameters and two moments), for sharing the folders out
// among nodes.
func (p *rsPlan) rankBytes(r rankFolder) int64 {
	var n int64
	for _, list := range p.chunks[r.s] {
		for _, rp := range p.ofEPRank(list, r.f.e) {
			i := r.f.t
			if isExpert(rp.src) {
				i = r.f.u
			}
			n += p.rankNumel(rp.src, i)
		}
	}
	return n * 14
}

// writeFlushed writes the mp_rank folders given into dir, several files
// at once (layout.Files), and returns once they are in place.
func (p *rsPlan) writeFlushed(ctx context.Context, dir string, folders []rankFolder, st *ReshardStats) error {
	return layout.WriteAll(ctx, p.r, layout.WriteOptions{Sync: !p.o.NoSync}, func(out *layout.Files) error {
		p.out = out
		for _, rf := range folders {
			if err := ctx.Err(); err != nil {
				return err
			}
			sub := filepath.Join(dir, rf.name)
			if err := os.MkdirAll(sub, 0o755); err != nil { // a rerun node finds its folders
				return err
			}
			if err := p.writeRank(ctx, filepath.Join(sub, modelFile), rf.f, rf.s, st); err != nil {
				return err
			}
		}
		return nil
	})
}

// listFolder appends the files of dir/sub (relative to dir) to files:
// what a node wrote into a rank folder, temporary files of a killed run
// left out.
func listFolder(dir, sub string, files []string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(dir, sub))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, filepath.Join(sub, e.Name()))
		}
	}
	return files, nil
}

// rankFiles are the files of a stage: one per TP rank without experts.
func (p *rsPlan) rankFiles() []outFile {
	if p.files != nil {
		return p.files
	}
	out := make([]outFile, p.o.TP)
	for t := range out {
		out[t] = outFile{t: t, u: t}
	}
	return out
}

// expertFiles lists the files of a stage of a mixture-of-experts run
// with D data-parallel ranks per stage. Megatron saves one file per
// (TP rank, EP rank) (megatron/training/checkpointing.py save_checkpoint:
// the ranks with DP rank 0 or expert-DP rank 0; get_checkpoint_name adds
// _EEE when EP > 1), and each rank loads its own. Within a stage rank r
// is TP rank r%T, expert TP rank r%ETP and EP rank (r/ETP)%EP
// (parallel_state.py RankGenerator, order tp-cp-ep-dp-pp, CP 1). Two
// ranks that would load one file at different expert TP ranks cannot be
// written.
func expertFiles(T, D, EP, ETP int) ([]outFile, error) {
	if (T*D)%(EP*ETP) != 0 {
		return nil, fmt.Errorf("expert parallel %d x expert tensor parallel %d does not divide the %d ranks of a pipeline stage (--tp %d x --dp %d), as Megatron requires", EP, ETP, T*D, T, D)
	}
	seen := map[[2]int]int{}
	var out []outFile
	for r := 0; r < T*D; r++ {
		f := outFile{t: r % T, e: (r / ETP) % EP, u: r % ETP}
		k := [2]int{f.t, f.e}
		if u, ok := seen[k]; ok {
			if u != f.u {
				return nil, fmt.Errorf("--tp %d --dp %d --ep %d --expert-tp %d: ranks of TP rank %d and EP rank %d hold expert TP ranks %d and %d but would load one file", T, D, EP, ETP, f.t, f.e, u, f.u)
			}
			continue
		}
		seen[k] = f.u
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].t != out[j].t {
			return out[i].t < out[j].t
		}
		return out[i].e < out[j].e
	})
	return out, nil
}

// writeRank writes model_optim_rng.pt of rank file f, pipeline stage s.
func (p *rsPlan) writeRank(ctx context.Context, path string, f outFile, s int, st *ReshardStats) error {
	t := f.t
	var fills []layout.StateFill
	blob := func(name, state string, dt dtype.DType) *torchfile.Blob {
		i := t
		if isExpert(name) {
			i = f.u // routed experts are cut at the expert TP rank
		}
		shape, pcs := p.rankTensor(name, i)
		b := &torchfile.Blob{DType: dt, Shape: append([]int64(nil), shape...)}
		fills = append(fills, layout.StateFill{Blob: b, Pieces: withState(pcs, state)})
		return b
	}
	root := pyobj.NewDict(pyobj.PlainDict)
	root.Set("args", p.targetArgs())
	cv, ok := p.extra.Get("checkpoint_version")
	if !ok {
		cv = 3.0
	}
	root.Set("checkpoint_version", cv)
	root.Set("iteration", p.iter)
	var members []rsParam // this rank's parameters, chunk then state-dict order
	for v, all := range p.chunks[s] {
		list := p.ofEPRank(all, f.e)
		md := pyobj.NewDict(pyobj.OrderedDict)
		// Modules with get_extra_state save '_extra_state' after their own
		// parameters (TE modules, MCore's parallel linears: None without
		// FP8); a strict load_state_dict expects the keys.
		for i, rp := range list {
			mod := linearModule(rp.local)
			if p.te && strings.HasSuffix(mod, ".self_attention.linear_proj") && (i == 0 || linearModule(list[i-1].local) != mod) {
				md.Set(strings.TrimSuffix(mod, "linear_proj")+"core_attention._extra_state", nil)
			}
			dt := p.dt
			if rp.fp32 {
				dt = dtype.Float32
			}
			md.Set(rp.local, blob(rp.src, fragment.FP32, dt))
			if mod != "" && (i+1 == len(list) || linearModule(list[i+1].local) != mod) {
				md.Set(mod+"._extra_state", nil)
			}
		}
		if s == p.o.PP-1 && v == len(p.chunks[s])-1 {
			if _, ok := md.Get("output_layer._extra_state"); !ok {
				md.Set("output_layer._extra_state", nil) // tied output layer without its weight
			}
		}
		key := "model"
		if p.o.VPP > 0 {
			key += strconv.Itoa(v)
		}
		root.Set(key, md)
		members = append(members, trained(list)...)
	}
	if p.release { // weights only: loaded with --finetune --no-load-optim
		return p.writeFile(ctx, path, root, fills, st)
	}
	var opt pyobj.Value
	var err error
	if p.o.DistOptimizer {
		opt, err = p.distGroups(members)
		if d, ok := opt.(*pyobj.Dict); ok && err == nil && p.chained() {
			// ChainedOptimizer.state_dict(): a list, dense then expert.
			l := &pyobj.List{}
			for _, k := range d.Keys() {
				v, _ := d.Get(k)
				l.Items = append(l.Items, v)
			}
			opt = l
		}
	} else {
		opt, err = p.chainedOptimizer(members, blob)
	}
	if err != nil {
		return err
	}
	root.Set("optimizer", opt)
	for _, k := range []string{"opt_param_scheduler", "lr_scheduler", "num_floating_point_operations_so_far"} {
		if v, ok := p.extra.Get(k); ok {
			root.Set(k, v)
		}
	}
	if err := p.writeFile(ctx, path, root, fills, st); err != nil {
		return err
	}
	if p.o.DistOptimizer {
		return p.writeDistrib(ctx, filepath.Join(filepath.Dir(path), distribFile), f, s, st)
	}
	return nil
}

// rankTensor is TP rank i's (the expert TP rank's for a routed expert)
// tensor of the plan's tensor src as pieces of atomic states (state
// fragment.FP32; the optimizer states follow the weights' pieces): a
// family source's fused tensor, else the atomic parameter's shard (a
// routed expert's from the expert-TP shards). Both writers read every
// target tensor through it.
func (p *rsPlan) rankTensor(src string, i int) ([]int64, []layout.StatePiece) {
	if vt, ok := p.virt[src]; ok {
		return vt[i].shape, vt[i].pieces
	}
	var sh fragment.Shard
	if isExpert(src) && p.eshards != nil {
		sh = p.eshards[i][src] // i may pass TP: --expert-tp > --tp
	} else {
		sh = p.shards[i][src]
	}
	return sh.Shape, []layout.StatePiece{{Param: src, State: fragment.FP32, Shard: sh, N: torchfile.Numel(sh.Shape)}}
}

// rankNumel is the element count of rankTensor(src, i).
func (p *rsPlan) rankNumel(src string, i int) int64 {
	shape, _ := p.rankTensor(src, i)
	return torchfile.Numel(shape)
}

// srcName is the parameter a plan's tensor key names (family: prefix
// dropped), for messages.
func (p *rsPlan) srcName(src string) string { return strings.TrimPrefix(src, familyPrefix) }

// withState is a copy of pieces reading the given state.
func withState(pcs []layout.StatePiece, state string) []layout.StatePiece {
	out := make([]layout.StatePiece, len(pcs))
	for j, pc := range pcs {
		pc.State = state
		out[j] = pc
	}
	return out
}

// chainedOptimizer is the non-distributed optimizer's state of one rank:
// optimizer's, or with expert-parallel experts ChainedOptimizer's list of
// the dense and the expert sub-optimizer's (each its own ids from 0).
func (p *rsPlan) chainedOptimizer(members []rsParam, blob func(name, state string, dt dtype.DType) *torchfile.Blob) (pyobj.Value, error) {
	if !p.chained() {
		return p.optimizer(members, p.groups, p.flags, blob)
	}
	out := &pyobj.List{}
	for i := 0; i < 2; i++ {
		groups, flags := p.subGroups(i)
		v, err := p.optimizer(p.ofSub(members, i), groups, flags, blob)
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, v)
	}
	return out, nil
}

// ofEPRank keeps the parameters EP rank e holds: every one but the routed
// experts of other EP ranks, those renumbered locally.
func (p *rsPlan) ofEPRank(list []rsParam, e int) []rsParam {
	if p.ep <= 1 {
		return list
	}
	var out []rsParam
	nle := p.experts / p.ep
	for _, rp := range list {
		if rp.routed {
			if rp.expert/nle != e {
				continue
			}
			rp.local = globalName(rp.local, 0, -e*nle)
		}
		out = append(out, rp)
	}
	return out
}

// reLinear matches the parameters of modules that save '_extra_state'.
var reLinear = regexp.MustCompile(`^(.*\.(?:linear_qkv|linear_proj|linear_fc1|linear_fc2|linear_q_proj|linear_q_down_proj|linear_q_up_proj|linear_kv_down_proj|linear_kv_up_proj)|output_layer)\.[^.]+$`)

// linearModule returns the module of a parameter that saves
// '_extra_state', or "".
func linearModule(local string) string {
	if m := reLinear.FindStringSubmatch(local); m != nil {
		return m[1]
	}
	return ""
}

// groupFlagsOf are the param-group flags of a rank tensor (flagsOf).
func (p *rsPlan) groupFlagsOf(rp rsParam) groupFlags {
	var dims int
	if vt, ok := p.virt[rp.src]; ok {
		dims = len(vt[0].shape)
	} else if e, ok := p.r.Param(rp.src); ok {
		dims = len(e.Shape)
	}
	noWD := strings.HasSuffix(rp.local, ".bias") || dims == 1
	if p.qkWD && (strings.Contains(rp.local, "q_layernorm.") || strings.Contains(rp.local, "k_layernorm.")) {
		noWD = false
	}
	return groupFlags{noWD: noWD, expert: rp.routed && p.chained()}
}

// distGroups is DistributedOptimizer.state_dict(): the param groups
// without 'params' and with the group's step (a float for a torch Adam
// 0-dim step tensor, as Megatron saves state['step'].item()), and the
// grad scaler.
func (p *rsPlan) distGroups(members []rsParam) (pyobj.Value, error) {
	// One step for every group, as state_dict() sets it (load_state_dict
	// under torch AdamW reads every group's): the members' (all equal).
	var step pyobj.Value
	for _, rp := range members {
		v, ok := p.steps[rp.src]
		if !ok {
			continue
		}
		f, err := stepNumber(v)
		if err != nil {
			return nil, fmt.Errorf("%s: step of %s: %w", p.r.Dir, rp.src, err)
		}
		// DistributedOptimizer.state_dict: state['step'].item() (a float)
		// for torch AdamW, int(step) for TE/Apex FusedAdam.
		if p.style == stepTorch {
			step = f
		} else {
			step = int64(f)
		}
		break
	}
	// A chained target (MoE with expert parallelism) saves one state dict
	// per sub-optimizer (ChainedOptimizer.state_dict; torch_dist's common
	// state keys them 0, 1).
	subs := p.subOptimizers()
	all := pyobj.NewDict(pyobj.PlainDict)
	for i, sub := range subs {
		groups := &pyobj.List{}
		for _, grp := range sub {
			gd := grp.Clone()
			gd.Delete("params")
			if step != nil {
				gd.Set(fragment.StepState, step)
			}
			groups.Items = append(groups.Items, gd)
		}
		inner := pyobj.NewDict(pyobj.PlainDict)
		inner.Set("param_groups", groups)
		out := pyobj.NewDict(pyobj.PlainDict)
		out.Set("optimizer", inner)
		if gs, ok := p.optim.Get("grad_scaler"); ok && p.dt != dtype.Float32 {
			out.Set("grad_scaler", gs)
		}
		if len(subs) == 1 {
			return out, nil
		}
		all.Set(int64(i), out)
	}
	return all, nil
}

// blobScalar is the value of a 0-dim float tensor.
func blobScalar(b *torchfile.Blob) (float64, error) {
	if torchfile.Numel(b.Shape) != 1 || !b.DType.IsFloat() || int64(len(b.Data)) != int64(b.DType.Size()) {
		return 0, fmt.Errorf("a %v%v tensor is not a float scalar", b.DType, b.Shape)
	}
	f32 := make([]byte, 4)
	if b.DType == dtype.Float32 {
		copy(f32, b.Data)
	} else if err := dtype.ToFloat32(f32, b.Data, b.DType); err != nil {
		return 0, err
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(f32))), nil
}

// writeDistrib writes distrib_optim.pt of TP rank t, stage s as DP rank 0
// saves it (get_parameter_state_dp_zero, core >= 0.7 'buckets_coalesced'):
// per DDP buffer (model chunk, then dtype) one fp32 tensor per state of
// numel_unpadded elements, each parameter at its place in Megatron's
// bucket layout with the bucket-end padding removed, zeros between.
func (p *rsPlan) writeDistrib(ctx context.Context, path string, f outFile, s int, st *ReshardStats) error {
	a, err := p.targetArgsParsed(path)
	if err != nil {
		return err
	}
	var fills []layout.StateFill
	var roots []pyobj.Value
	any := false
	for i, has := range p.distribSubs(f) {
		if !has {
			roots = append(roots, nil) // not DP rank 0 of this sub-optimizer's group
			continue
		}
		root, fl, err := p.distribState(a, f, s, i)
		if err != nil {
			return err
		}
		roots, fills, any = append(roots, root), append(fills, fl...), true
	}
	if !any {
		return nil // no rank loading this file is DP rank 0 of any group
	}
	if len(roots) == 1 {
		return p.writeFile(ctx, path, roots[0], fills, st)
	}
	return p.writeFile(ctx, path, &pyobj.List{Items: roots}, fills, st)
}

// distribState is one sub-optimizer's get_parameter_state_dp_zero()
// (sub 0: all parameters, or the dense ones; 1: the file's EP rank's
// experts at its expert-TP rank), per model chunk's buffer.
func (p *rsPlan) distribState(a *Args, f outFile, s, sub int) (*pyobj.Dict, []layout.StateFill, error) {
	// The tensors' rank: the TP rank, the expert-TP rank for the experts.
	t, i0 := f.t, f.t
	if sub == 1 {
		i0 = f.u
	}
	root := pyobj.NewDict(pyobj.PlainDict)
	root.Set("buckets_coalesced", true)
	var fills []layout.StateFill
	for v, all := range p.chunks[s] {
		list := trained(p.ofSub(p.ofEPRank(all, f.e), sub))
		lay := p.listLayout(a, s, v, list, i0, p.stageNumel(t, s))
		base := make([]int64, len(lay.unpadded)+1)
		for i, u := range lay.unpadded {
			base[i+1] = base[i] + u
		}
		nu := base[len(lay.unpadded)]
		world := pyobj.NewDict(pyobj.PlainDict)
		for _, state := range []string{fragment.FP32, "exp_avg", "exp_avg_sq"} {
			b := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{nu}}
			f := layout.StateFill{Blob: b}
			for i, rp := range list {
				if !p.hasState(rp.src, state) {
					return nil, nil, fmt.Errorf("%s: parameter %s has no %s state; Megatron's distributed optimizer saves param, exp_avg and exp_avg_sq", p.r.Dir, p.srcName(rp.src), state)
				}
				_, pcs := p.rankTensor(rp.src, i0)
				for _, pc := range withState(pcs, state) {
					pc.At += base[lay.bucket[i]] + lay.start[i]
					f.Pieces = append(f.Pieces, pc)
				}
			}
			sort.Slice(f.Pieces, func(i, j int) bool { return f.Pieces[i].At < f.Pieces[j].At })
			fills = append(fills, f)
			key := state
			if state == fragment.FP32 {
				key = "param"
			}
			world.Set(key, b)
		}
		world.Set("numel_unpadded", nu)
		buf := pyobj.NewDict(pyobj.PlainDict)
		buf.Set(p.bufferDTypes(a), world)
		root.Set(int64(v), buf)
	}
	return root, fills, nil
}

// targetArgsParsed reads targetArgs as the loading run's Args (bucket
// size, grad dtype); path names the file being written in errors.
func (p *rsPlan) targetArgsParsed(path string) (*Args, error) {
	holder := pyobj.NewDict(pyobj.PlainDict)
	holder.Set("args", p.targetArgs())
	return parseArgs(path, holder)
}

// bufferDTypes is the dtype key of a DDP buffer, (param dtype, grad
// dtype): a Float16Module-wrapped model holds every parameter in the
// training dtype, so each model chunk has one buffer.
func (p *rsPlan) bufferDTypes(a *Args) pyobj.Tuple {
	return pyobj.Tuple{pyobj.DType{DType: p.dt}, pyobj.DType{DType: a.gradDType(p.dt)}}
}

// stageNumel is the elements of TP rank t's parameters of stage s.
func (p *rsPlan) stageNumel(t, s int) int64 {
	var total int64
	for _, list := range p.chunks[s] {
		for _, rp := range trained(list) {
			if p.chained() && isExpert(rp.src) {
				continue // in the expert optimizer's buffers, cut at expert TP
			}
			total += p.rankNumel(rp.src, t)
		}
	}
	return total
}

// listLayout places the parameters list (one DDP buffer of model chunk v
// of stage s: all of the chunk's, or its dense or its expert-parallel ones)
// with their tensors at rank tp (rankTensor: the TP rank, the expert-TP
// rank for an expert buffer): reverse order, 64-element starts, a shared
// embedding in a bucket of its own; total is the stage's elements
// (ddp_num_buckets).
func (p *rsPlan) listLayout(a *Args, s, v int, list []rsParam, tp int, total int64) layoutResult {
	P, V := p.o.PP, len(p.chunks[s])
	lps := make([]layoutParam, len(list))
	for i, rp := range list {
		first, last := s == 0 && v == 0, s == P-1 && v == V-1
		shared := !p.untie && P > 1 && ((rp.local == "output_layer.weight" && rp.src != rp.local) || (isWordEmbedding(rp.local) && first && !last))
		lps[i] = layoutParam{numel: p.rankNumel(rp.src, tp), shared: shared}
	}
	return computeLayout(lps, bucketSize(a, s, v, total), rulesHead)
}

func (p *rsPlan) hasState(param, state string) bool {
	for _, s := range p.states[param] {
		if s == state {
			return true
		}
	}
	return false
}

// optimizer builds the non-distributed optimizer state of one rank:
// Float16OptimizerWithFloat16Params for 16-bit training ('optimizer',
// 'grad_scaler', 'fp32_from_fp16_params'), FP32Optimizer's bare torch
// state dict for float32. Group g's members are the rank's parameters with
// its flags; ids run over the groups in order, as torch numbers them.
func (p *rsPlan) optimizer(members []rsParam, pgroups []*pyobj.Dict, pflags []groupFlags, blob func(name, state string, dt dtype.DType) *torchfile.Blob) (pyobj.Value, error) {
	state := pyobj.NewDict(pyobj.PlainDict)
	groups := &pyobj.List{}
	mains := &pyobj.List{}
	var id int64
	used := 0
	for g, grp := range pgroups {
		gd := grp.Clone()
		if p.style == stepTorch {
			gd.Delete(fragment.StepState) // torch AdamW groups hold none
		}
		var ids []pyobj.Value
		gm := &pyobj.List{}
		for _, rp := range members {
			if p.groupFlagsOf(rp) != pflags[g] {
				continue
			}
			used++
			sd := pyobj.NewDict(pyobj.PlainDict)
			if v, ok := p.steps[rp.src]; ok {
				sv, err := p.stepValue(rp.src, v)
				if err != nil {
					return nil, err
				}
				if p.style == stepTorch {
					// torch AdamW keeps a 0-dim step tensor per parameter
					// (its __setstate__ fails with KeyError 'step' without).
					sd.Set(fragment.StepState, sv)
				} else {
					gd.Set(fragment.StepState, sv)
				}
			}
			for _, sn := range p.states[rp.src][1:] {
				sd.Set(sn, blob(rp.src, sn, dtype.Float32))
			}
			state.Set(id, sd)
			ids = append(ids, id)
			id++
			gm.Items = append(gm.Items, blob(rp.src, fragment.FP32, dtype.Float32))
		}
		gd.Delete("params")
		gd.Set("params", &pyobj.List{Items: ids})
		groups.Items = append(groups.Items, gd)
		mains.Items = append(mains.Items, gm)
	}
	if used != len(members) {
		return nil, fmt.Errorf("%s: %d of this rank's %d parameters fit no param group of optimizer_state.pt (custom param-group overrides?)", p.r.Dir, len(members)-used, len(members))
	}
	inner := pyobj.NewDict(pyobj.PlainDict)
	inner.Set("state", state)
	inner.Set("param_groups", groups)
	if p.dt == dtype.Float32 {
		return inner, nil
	}
	out := pyobj.NewDict(pyobj.PlainDict)
	out.Set("optimizer", inner)
	if gs, ok := p.optim.Get("grad_scaler"); ok {
		out.Set("grad_scaler", gs)
	}
	out.Set("fp32_from_fp16_params", mains)
	return out, nil
}

// targetArgs is the source's args Namespace at the target degrees.
func (p *rsPlan) targetArgs() pyobj.Value {
	c := *p.args
	nd := p.args.State.(*pyobj.Dict).Clone()
	T, P, D := int64(p.o.TP), int64(p.o.PP), int64(p.o.DP)
	nd.Set("tensor_model_parallel_size", T)
	nd.Set("pipeline_model_parallel_size", P)
	nd.Set("data_parallel_size", D)
	nd.Set("world_size", T*P*D*max(p.modelCP, 1))
	nd.Set("use_distributed_optimizer", p.o.DistOptimizer)
	uneven := p.o.FirstStageLayers > 0 || p.o.LastStageLayers > 0
	if p.o.VPP > 0 {
		nd.Set("virtual_pipeline_model_parallel_size", int64(p.o.VPP))
		if uneven {
			// arguments.py: uneven splits take --num-virtual-stages-per-pipeline-rank.
			nd.Set("num_layers_per_virtual_pipeline_stage", nil)
			nd.Set("num_virtual_stages_per_pipeline_rank", int64(p.o.VPP))
		} else {
			nd.Set("num_layers_per_virtual_pipeline_stage", int64(p.layers/(p.o.PP*p.o.VPP)))
		}
	} else {
		nd.Set("virtual_pipeline_model_parallel_size", nil)
		if _, ok := nd.Get("num_layers_per_virtual_pipeline_stage"); ok {
			nd.Set("num_layers_per_virtual_pipeline_stage", nil)
		}
	}
	if _, ok := nd.Get("expert_tensor_parallel_size"); ok || p.experts > 0 {
		nd.Set("expert_tensor_parallel_size", int64(p.etp))
	}
	if _, ok := nd.Get("expert_model_parallel_size"); ok || p.experts > 0 {
		nd.Set("expert_model_parallel_size", int64(p.ep))
	}
	if p.vocab > 0 {
		nd.Set("padded_vocab_size", p.vocab)
	}
	if _, ok := nd.Get("accumulate_allreduce_grads_in_fp32"); !ok && p.dt == dtype.BFloat16 {
		// Args saved outside the training loop lack it: arguments.py's bf16
		// rule (fp32 grads unless grad_reduce_in_bf16, core_v0.19.0) is what
		// the loading run builds its DDP buffers with, and distrib_optim.pt's
		// (param dtype, grad dtype) keys follow it.
		if bf, _ := nd.Get("grad_reduce_in_bf16"); bf != true {
			nd.Set("accumulate_allreduce_grads_in_fp32", true)
		}
	}
	// The split written: the uneven-pipeline arguments asked for, else none.
	for _, k := range []string{"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
		"num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "pipeline_model_parallel_layout"} {
		if _, ok := nd.Get(k); ok {
			nd.Set(k, nil)
		}
	}
	for k, n := range map[string]int{"decoder_first_pipeline_num_layers": p.o.FirstStageLayers, "decoder_last_pipeline_num_layers": p.o.LastStageLayers} {
		if n > 0 {
			nd.Set(k, int64(n))
		}
	}
	for _, k := range []string{"account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "standalone_embedding_stage"} {
		if _, ok := nd.Get(k); ok {
			nd.Set(k, false)
		}
	}
	if _, ok := nd.Get("rank"); ok {
		nd.Set("rank", int64(0))
	}
	c.State = nd
	return &c
}

// writeFile writes one torch.save file, streaming each tensor from its
// atomic states: queued with the plan's other files (layout.Files, flushed
// by Reshard).
func (p *rsPlan) writeFile(ctx context.Context, path string, root pyobj.Value, fills []layout.StateFill, st *ReshardStats) error {
	n, err := p.out.Add(ctx, path, root, fills)
	if err != nil {
		return err
	}
	st.Files++
	st.Bytes += n
	return nil
}

// stepStyle is where the loading run's Adam keeps the step.
type stepStyle uint8

const (
	// stepTorch: torch.optim.AdamW, a 0-dim float32 tensor state['step']
	// per parameter (Megatron's fallback without TE and Apex,
	// megatron/core/optimizer/__init__.py).
	stepTorch stepStyle = iota
	// stepFused: TE/Apex FusedAdam, an int param_group['step'].
	stepFused
)

// styleOf picks the step style: the one asked for, else the source's. A
// Python int step comes from FusedAdam (a group value, or
// DistributedOptimizer's int(step)); a tensor (torch Adam's per-parameter
// step) or a float (DistributedOptimizer's state['step'].item() under
// torch AdamW) from torch AdamW.
func styleOf(asked string, steps map[string]pyobj.Value) (stepStyle, error) {
	switch asked {
	case "adamw", "torch":
		return stepTorch, nil
	case "fused":
		return stepFused, nil
	case "":
	default:
		return 0, fmt.Errorf("--megatron-optimizer %q: give adamw (torch.optim.AdamW) or fused (TE/Apex FusedAdam)", asked)
	}
	for _, v := range steps {
		if _, isInt := v.(int64); isInt {
			return stepFused, nil
		}
		return stepTorch, nil
	}
	return stepFused, nil
}

// stepNumber is the value of a step: an int, a float or a 0-dim tensor.
func stepNumber(v pyobj.Value) (float64, error) {
	switch x := v.(type) {
	case *torchfile.Blob:
		return blobScalar(x)
	case float64:
		return x, nil
	}
	if n, ok := pyobj.Int(v); ok {
		return float64(n), nil
	}
	return 0, fmt.Errorf("a step of type %s", pyobj.TypeName(v))
}

// stepValue is the step of a parameter as the target optimizer keeps it:
// a 0-dim float32 tensor (torch AdamW) or an int (FusedAdam's group).
func (p *rsPlan) stepValue(param string, v pyobj.Value) (pyobj.Value, error) {
	f, err := stepNumber(v)
	if err != nil {
		return nil, fmt.Errorf("%s: step of %s: %w", p.r.Dir, param, err)
	}
	if p.style == stepFused {
		return int64(f), nil
	}
	switch b := v.(type) {
	case *torchfile.Blob:
		if b.DType == dtype.Float32 && len(b.Shape) == 0 {
			return b, nil // kept as it is
		}
	}
	data := make([]byte, 4)
	binary.LittleEndian.PutUint32(data, math.Float32bits(float32(f)))
	return torchfile.NewBlob(dtype.Float32, nil, data), nil
}

// pipelineSplit returns the global layers [first, first+n) of every
// (stage, chunk), as Megatron builds them (core_v0.19.0
// megatron/core/transformer/transformer_block.py get_num_layers_to_build and
// transformer_layer.py get_transformer_layer_offset): with
// --decoder-first/last-pipeline-num-layers F / Lst (0: not set) the first
// (last) stage holds F (Lst) layers and the other stages share the rest
// evenly; else every stage holds L/PP. A stage's layers are split evenly
// over its V chunks, and the chunks are laid out chunk-major: chunk v of
// every stage in stage order, then chunk v+1. The checks are Megatron's
// (transformer_config.py __post_init__, arguments.py).
func pipelineSplit(L, P, V, F, Lst int) ([][][2]int, error) {
	if F < 0 || Lst < 0 {
		return nil, fmt.Errorf("--decoder-first/last-pipeline-num-layers must be positive")
	}
	per := make([]int, P)
	if F == 0 && Lst == 0 {
		if L%(P*V) != 0 {
			return nil, fmt.Errorf("--pp %d x --vpp %d does not divide the %d layers (args.num_layers); give --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split", P, V, L)
		}
		for s := range per {
			per[s] = L / P
		}
	} else {
		if P < 2 {
			return nil, fmt.Errorf("--decoder-first/last-pipeline-num-layers need --pp 2 or more")
		}
		middle, stages := L, P
		if F > 0 {
			middle, stages = middle-F, stages-1
		}
		if Lst > 0 {
			middle, stages = middle-Lst, stages-1
		}
		if middle < 0 || (middle > 0) != (stages > 0) || (stages > 0 && middle%stages != 0) {
			return nil, fmt.Errorf("%d layers: first stage %d and last stage %d leave %d layers for %d middle stages; Megatron needs an even share of at least one layer each (or none left for none)", L, F, Lst, middle, stages)
		}
		for s := range per {
			if stages > 0 {
				per[s] = middle / stages
			}
		}
		if F > 0 {
			per[0] = F
		}
		if Lst > 0 {
			per[P-1] = Lst
		}
	}
	split := make([][][2]int, P)
	for s := range split {
		if per[s]%V != 0 {
			return nil, fmt.Errorf("pipeline stage %d holds %d layers, which --vpp %d does not divide", s, per[s], V)
		}
		split[s] = make([][2]int, V)
	}
	at := 0
	for v := 0; v < V; v++ {
		for s := 0; s < P; s++ {
			split[s][v] = [2]int{at, per[s] / V}
			at += per[s] / V
		}
	}
	return split, nil
}

// chunkOf returns the stage and chunk holding global layer n.
func (p *rsPlan) chunkOf(n int) (s, v int) {
	for s := range p.split {
		for v, r := range p.split[s] {
			if n >= r[0] && n < r[0]+r[1] {
				return s, v
			}
		}
	}
	return len(p.split) - 1, len(p.split[0]) - 1 // beyond num_layers: refused by place
}
