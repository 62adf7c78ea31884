package megatron

import (
	"context"
	"fmt"
	"sort"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Options configure Index.
type Options struct {
	Tag       string // iteration to read: a number, "release" or a folder name
	Workers   int    // files decoded at once (0: all cores)
	VocabSize int64  // true vocabulary size when args has no vocab_size
	Decode    torchfile.Options
}

// Index builds the fragment table of the Megatron checkpoint at path (a
// save folder with latest_checkpointed_iteration.txt, or an iteration
// folder).
func Index(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	dir, tag, err := resolveIter(path, opt.Tag)
	if err != nil {
		return nil, err
	}
	dirs, err := listRankDirs(dir)
	if err != nil {
		return nil, err
	}
	// Map: decode every model_optim_rng.pt, then every distrib_optim.pt.
	paths := make([]string, len(dirs))
	for i, rd := range dirs {
		paths[i] = rd.model
	}
	decoded, err := opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, err
	}
	files := make([]*rankFile, len(dirs))
	for i, f := range decoded {
		rd := pyobj.NewDec(f.Name, f.Root)
		root := rd.AsDict()
		if err := rd.Err(); err != nil {
			return nil, err
		}
		files[i] = &rankFile{rd: dirs[i], root: root}
	}
	a, err := parseArgs(files[0].rd.model, files[0].root)
	if err != nil {
		return nil, err
	}
	for _, f := range files[1:] {
		if err := sameDegrees(a, f); err != nil {
			return nil, err
		}
	}
	// checkpoint_version < 2 stored the fused QKV in other layouts
	// ([3, np/t, hn] or [np/t, hn, 3]) that Megatron converts on load.
	if v, ok := files[0].root.Get("checkpoint_version"); ok {
		if x, ok := pyobj.Float(v); ok && x < 2 {
			return nil, fmt.Errorf("%s: checkpoint_version %v stores the fused QKV in a pre-2.0 layout, which ucp does not read", a.path, x)
		}
	}
	if a.NumExperts > 0 && a.ETP != a.TP {
		for _, f := range files {
			if f.rd.distrib != "" {
				return nil, fmt.Errorf("%s: expert_tensor_parallel_size %d differs from tensor_model_parallel_size %d with the distributed optimizer (%s), which ucp does not read yet", a.path, a.ETP, a.TP, f.rd.distrib)
			}
		}
	}
	if a.NumExperts > 0 && a.MoEExtendedTP {
		// core 0.8-0.9 --moe-extended-tp: every rank holds all experts, their
		// hidden dim split over TP x EP.
		return nil, fmt.Errorf("%s: args.moe_extended_tp is set (experts split over tensor x expert parallel ranks), which ucp does not read", a.path)
	}
	if a.NumExperts > 0 && a.NumExperts%a.EP != 0 {
		return nil, fmt.Errorf("%s: %d experts do not split over expert parallel %d", a.path, a.NumExperts, a.EP)
	}
	if err := assignRanks(dir, dirs, a.TP, a.PP, a.EP, a.ETP, max(a.DP, 1)); err != nil {
		return nil, err
	}
	b := &builder{a: a, files: files, opt: opt,
		table: &fragment.Table{Format: "megatron", Source: dir, Tag: tag}}
	if err := b.readModels(); err != nil {
		return nil, err
	}
	if err := b.readOptimizers(ctx); err != nil {
		return nil, err
	}
	if err := b.build(); err != nil {
		return nil, err
	}
	if err := b.globals(); err != nil {
		return nil, err
	}
	if b.table.Args, err = fragment.ScalarArgs(a.path, a.ns); err != nil {
		return nil, err
	}
	if b.table.DType, err = fragment.TrainingDType(a.path, b.table.Args); err != nil {
		return nil, err
	}
	return b.table, nil
}

// sameDegrees checks that a file's args give the parallel sizes of the first.
func sameDegrees(a *Args, f *rankFile) error {
	o, err := parseArgs(f.rd.model, f.root)
	if err != nil {
		return err
	}
	if o.TP != a.TP || o.PP != a.PP || o.EP != a.EP || o.VPP != a.VPP || o.NumLayers != a.NumLayers {
		return fmt.Errorf("%s: args give TP %d, PP %d, EP %d, VPP %d, %d layers, but %s gives TP %d, PP %d, EP %d, VPP %d, %d layers; the folders come from different runs",
			f.rd.model, o.TP, o.PP, o.EP, o.VPP, o.NumLayers, a.path, a.TP, a.PP, a.EP, a.VPP, a.NumLayers)
	}
	return nil
}

// builder assembles the table from the decoded files.
type builder struct {
	a     *Args
	files []*rankFile
	opt   Options
	table *fragment.Table
	qkWD  bool
}

func (b *builder) readModels() error {
	for _, f := range b.files {
		if err := f.readModel(b.a); err != nil {
			return err
		}
	}
	offsets, err := layerOffsets(b.a, b.files)
	if err != nil {
		return err
	}
	needSwiGLU, needVocab := false, false
	for _, f := range b.files {
		if err := f.assignNames(b.a, offsets); err != nil {
			return err
		}
		for _, lp := range f.params {
			k := splitKind(lp.local, false)
			needSwiGLU = needSwiGLU || k == kindCol && reFC1.MatchString(lp.local) || k == kindGrouped1
			needVocab = needVocab || k == kindVocab || lp.tied
		}
	}
	if err := b.a.geometry(needSwiGLU, needVocab); err != nil {
		return err
	}
	b.qkWD, err = b.a.boolAttr("apply_wd_to_qk_layernorm", false)
	if len(b.a.UnevenPipeline) > 0 {
		b.table.Notes = append(b.table.Notes, fmt.Sprintf("uneven pipeline split (%v): global layer numbers come from the layer counts of the stages", b.a.UnevenPipeline))
	}
	return err
}

// readOptimizers maps every rank's optimizer state onto its parameters.
func (b *builder) readOptimizers(ctx context.Context) error {
	if b.weightsOnly() {
		return nil
	}
	var dpaths []string
	var dfiles []*rankFile
	for _, f := range b.files {
		if err := f.readSubs(); err != nil {
			return err
		}
		if f.rd.distrib != "" {
			dpaths = append(dpaths, f.rd.distrib)
			dfiles = append(dfiles, f)
		} else if b.a.DistOpt || len(dpaths) > 0 {
			return fmt.Errorf("%s: missing %s (args.use_distributed_optimizer is %v)", f.rd.model[:len(f.rd.model)-len(modelFile)]+distribFile, distribFile, b.a.DistOpt)
		}
	}
	if len(dpaths) > 0 && len(dpaths) != len(b.files) {
		for _, f := range b.files {
			if f.rd.distrib == "" {
				return fmt.Errorf("%s: missing %s (other folders have one)", f.rd.model[:len(f.rd.model)-len(modelFile)]+distribFile, distribFile)
			}
		}
	}
	if len(dpaths) == 0 {
		for _, f := range b.files {
			notes, err := f.mapFloat16(b.a, b.qkWD)
			if err != nil {
				return err
			}
			for _, n := range notes {
				b.note(n)
			}
		}
		return nil
	}
	decoded, err := b.opt.Decode.DecodeAll(ctx, dpaths, b.opt.Workers)
	if err != nil {
		return err
	}
	for i, f := range dfiles {
		if err := f.mapDistributed(b.a, decoded[i].Root, b.qkWD); err != nil {
			return err
		}
	}
	return nil
}

// weightsOnly handles a save in which no rank file has optimizer state
// (--no-save-optim, or a converter's 'release' checkpoint such as ucp's
// reshard from a Hugging Face source): every weight is its own fp32
// state, as stored, with no Adam moments or step. A save in which only
// some files lack it is not one (readSubs refuses it).
func (b *builder) weightsOnly() bool {
	if b.a.DistOpt {
		return false
	}
	for _, f := range b.files {
		if v, ok := f.root.Get("optimizer"); ok && v != nil {
			return false
		}
		if f.rd.distrib != "" {
			return false
		}
	}
	for _, f := range b.files {
		for _, lp := range f.params {
			lp.states = map[string]srcRef{fragment.FP32: {ref: fragment.Ref(f.rd.model, lp.t, 0)}}
		}
	}
	b.note("no optimizer state in any rank file (a weights-only save): the weights are converted as stored, with no Adam moments or step")
	return true
}

// source is one copy of a parameter's local tensor (a TP shard, or a
// replica from another TP or EP rank).
type source struct {
	f  *rankFile
	lp *localParam
}

// build groups the local tensors by atomic name and builds each parameter.
func (b *builder) build() error {
	bySrc := map[string][]source{}
	keys := map[string]orderKey{}
	var tied []source
	for _, f := range b.files {
		for _, list := range f.chunks {
			for _, lp := range list {
				if lp.tied {
					tied = append(tied, source{f: f, lp: lp})
					continue
				}
				bySrc[lp.name] = append(bySrc[lp.name], source{f: f, lp: lp})
				if k, ok := keys[lp.name]; !ok || lp.key.less(k) {
					keys[lp.name] = lp.key
				}
			}
		}
	}
	for _, name := range sortedNames(keys) {
		p, err := b.param(name, bySrc[name])
		if err != nil {
			return err
		}
		b.table.Params = append(b.table.Params, p)
	}
	// Tied copies: same shape as the embedding shard of their TP rank.
	copies := map[string]string{}
	for _, c := range tied {
		var emb *source
		for i, s := range bySrc[c.lp.name] {
			if s.f.rd.tp == c.f.rd.tp {
				emb = &bySrc[c.lp.name][i]
				break
			}
		}
		if emb == nil {
			return fmt.Errorf("%s: %s is a tied copy of %s, which no first-stage folder holds", c.f.rd.model, c.lp.local, c.lp.name)
		}
		if !torchfile.SameShape(emb.lp.t.Shape, c.lp.t.Shape) {
			return fmt.Errorf("%s: %s (a tied copy of %s) has shape %v but %s holds the embedding with shape %v",
				c.f.rd.model, c.lp.local, c.lp.name, c.lp.t.Shape, emb.f.rd.model, emb.lp.t.Shape)
		}
		copies[c.lp.name] = c.lp.local
	}
	for emb, local := range copies {
		b.note(fmt.Sprintf("%s on the last pipeline stage is a synchronized copy of %s (tied embeddings); the first stage's copy is used", local, emb))
	}
	if p := b.table.Param("embedding.word_embeddings.weight"); p != nil && !b.a.Untie {
		p.Info.Aliases = append(p.Info.Aliases, "output_layer.weight")
	}
	if p := b.table.Param("language_model.embedding.word_embeddings.weight"); p != nil && copies[p.Name] != "" {
		p.Info.Aliases = append(p.Info.Aliases, copies[p.Name])
	}
	return nil
}

// tpRank is the tensor-parallel shard a file holds of a parameter: its
// expert-TP rank for routed experts.
func tpRank(s source, expert bool) int {
	if expert {
		return s.f.rd.etp
	}
	return s.f.rd.tp
}

// param builds one atomic parameter from all its copies.
func (b *builder) param(name string, srcs []source) (*fragment.Param, error) {
	a := b.a
	first := srcs[0]
	for _, s := range srcs[1:] {
		if !torchfile.SameShape(s.lp.t.Shape, first.lp.t.Shape) {
			return nil, fmt.Errorf("%s: %s has shape %v but %s holds it with shape %v; shards must have equal shapes",
				s.f.rd.model, s.lp.local, s.lp.t.Shape, first.f.rd.model, first.lp.t.Shape)
		}
	}
	buffer := first.lp.buffer
	T := a.TP
	k := splitKind(first.lp.local, a.SwiGLU)
	expert := isExpert(name) && a.ETP != a.TP
	if expert {
		T = a.ETP // routed experts (GroupedMLP's too) are cut over the expert-TP ranks
	}
	if buffer {
		k = kindRep
	}
	if k == kindUnknown {
		k = mlaDownKind(first.lp.local, a.MLALocal)
	}
	if k == kindUnknown {
		if T > 1 {
			return nil, fmt.Errorf("%s: %s: unknown tensor-parallel layout (not a Megatron GPT parameter name ucp knows); cannot merge %d tensor-parallel shards",
				first.f.rd.model, first.lp.local, T)
		}
		k = kindRep
	}
	pl, err := b.placement(k, first, T)
	if err != nil {
		return nil, err
	}
	if unknown := splitKind(first.lp.local, a.SwiGLU) == kindUnknown && mlaDownKind(first.lp.local, a.MLALocal) == kindUnknown && !buffer; unknown {
		pl.info.TPKnown = false // kept whole at TP 1 by default, not by a rule
	}
	// Copies per TP rank, in folder order: the first is placed, the others
	// (EP replicas of dense parameters, TP replicas) are checked equal.
	byRank := make([][]source, pl.ranks())
	for _, s := range srcs {
		r := 0
		switch {
		case pl.byEP:
			r = s.f.rd.ep*T + tpRank(s, expert)
		case len(byRank) > 1:
			r = tpRank(s, expert)
		}
		byRank[r] = append(byRank[r], s)
	}
	rankName := func(r int) string {
		if pl.byEP {
			return fmt.Sprintf("expert-parallel rank %d, tensor-parallel rank %d", r/T, r%T)
		}
		return fmt.Sprintf("tensor-parallel rank %d", r)
	}
	for r, ss := range byRank {
		if len(ss) == 0 {
			return nil, fmt.Errorf("%s: no folder holds %s of %s", b.table.Source, rankName(r), name)
		}
	}
	p := &fragment.Param{Name: name, Shape: pl.shape, Info: pl.info, Frozen: buffer}
	states := []string{fragment.FP32}
	if !buffer {
		states = stateNames(srcs)
	}
	for _, sn := range states {
		if err := b.placeState(p, sn, byRank, pl, buffer, rankName); err != nil {
			return nil, err
		}
	}
	if !buffer {
		for _, ss := range byRank {
			for _, s := range ss {
				if s.lp.step != nil && p.Step == nil {
					p.Step = s.lp.step
				}
			}
		}
	}
	return p, nil
}

// placeState adds state sn of p: per rank, the first copy placed and the
// others as replicas; a buffer's state is the model tensor itself.
func (b *builder) placeState(p *fragment.Param, sn string, byRank [][]source, pl *placement, buffer bool, rankName func(int) string) error {
	name := p.Name
	st := p.AddState(sn)
	for r, ss := range byRank {
		// Replica k is the k-th copy of every shard (a whole copy: TP x EP
		// files hold each dense shard once per EP rank).
		placed, replica := false, 0
		for _, s := range ss {
			ref := srcRef{ref: fragment.Ref(s.f.rd.model, s.lp.t, 0)}
			if !buffer {
				var ok bool
				if ref, ok = s.lp.states[sn]; !ok {
					if s.lp.states == nil {
						continue // a distributed-optimizer copy another rank saved
					}
					return fmt.Errorf("%s: %s has no optimizer state %q, which other copies have", s.f.rd.model, s.lp.local, sn)
				}
			}
			if placed {
				replica++
			}
			placed = true
			// A rank's stored tensor is one shard, or several pieces
			// (GroupedMLP weight1 when EP does not divide H) that tile it.
			pcs := pl.rankPieces(r)
			var n int64
			for i, pc := range pcs {
				sh := pc.shard
				sh.Replica = replica
				sh.Label = s.f.rd.name
				if len(pcs) > 1 {
					sh.Label += fmt.Sprintf(" part %d", i)
				}
				ln := torchfile.Numel(sh.Shape)
				if pc.off != n {
					return fmt.Errorf("%s: %s: internal error: piece %d starts at %d, not %d", s.f.rd.model, s.lp.local, i, pc.off, n)
				}
				n += ln
				st.Shards = append(st.Shards, sh)
				st.Frags = append(st.Frags, fragment.Fragment{Shard: len(st.Shards) - 1, Len: ln, Src: ref.ref, SrcStart: ref.start + pc.off})
			}
			if n != s.lp.t.Numel() {
				return fmt.Errorf("%s: %s has %d elements but its placement covers %d", s.f.rd.model, s.lp.local, s.lp.t.Numel(), n)
			}
		}
		if !placed {
			return fmt.Errorf("%s: no folder holds state %q of %s of %s", b.table.Source, sn, rankName(r), name)
		}
	}
	for _, f := range st.Frags {
		if f.SrcStart+f.Len > f.Src.Numel() {
			return fmt.Errorf("%s: %s state %q needs elements [%d,%d) of a stored tensor of %d", f.Src.Path, name, sn, f.SrcStart, f.SrcStart+f.Len, f.Src.Numel())
		}
	}
	return nil
}

// stateNames lists the optimizer states of a parameter's copies, fp32 first.
func stateNames(srcs []source) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range srcs {
		for k := range s.lp.states {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return fragment.StateOrder(out)
}

// globals fills the degrees, the global optimizer state (param groups
// without their ids, the grad scaler) and the training state carried to
// extra_state.pt.
func (b *builder) globals() error {
	a, f0 := b.a, b.files[0]
	d := fragment.Degrees{TP: a.TP, PP: a.PP, DP: max(a.DP, 1), EP: a.EP, VPP: a.VPP}
	if f0.rd.distrib != "" {
		d.ZeRO = 1 // the distributed optimizer shards optimizer state over DP
	}
	b.table.Degrees = d
	opt := pyobj.NewDict(pyobj.PlainDict)
	var groups []pyobj.Value
	for i, sub := range f0.subs {
		inner, err := innerOptimizer(f0.rd.model, i, sub)
		if err != nil {
			return err
		}
		gs, _, err := readGroups(f0.rd.model, i, inner)
		if err != nil {
			return err
		}
		for _, gd := range gs {
			g := gd.AsDict().Clone()
			g.Delete("params")
			groups = append(groups, g)
		}
		if sv, ok := sub.AsDict().Get("grad_scaler"); ok {
			if _, done := opt.Get("grad_scaler"); !done {
				v, err := fragment.RefTree(f0.rd.model, sv, pyobj.DefaultLimits())
				if err != nil {
					return fmt.Errorf("%s: grad_scaler: %w", f0.rd.model, err)
				}
				opt.Set("grad_scaler", v)
			}
		}
	}
	opt.Set("param_groups", &pyobj.List{Items: groups})
	b.table.Optimizer = opt
	extra := pyobj.NewDict(pyobj.PlainDict)
	for _, k := range []string{"args", "checkpoint_version", "iteration", "opt_param_scheduler", "lr_scheduler", "num_floating_point_operations_so_far"} {
		if v, ok := f0.root.Get(k); ok {
			cv, err := fragment.RefTree(f0.rd.model, v, pyobj.DefaultLimits())
			if err != nil {
				return fmt.Errorf("%s: %s: %w", f0.rd.model, k, err)
			}
			extra.Set(k, cv)
		}
	}
	b.table.Extra = extra
	return nil
}
