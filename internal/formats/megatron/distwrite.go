package megatron

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/multinode"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Megatron-core versions whose torch_dist layout ucp writes (DISTWRITE.md);
// DefaultCore is the newest one with a real fixture.
const (
	Core015     = "0.15"
	Core018     = "0.18"
	Core019     = "0.19"
	DefaultCore = Core019
)

// Distributed-optimizer sharding types (distrib_optim_sharding_type).
const (
	FullyReshardable = "fully_reshardable"
	DPReshardable    = "dp_reshardable"
)

// DistOptions say which Megatron-LM run a written torch_dist checkpoint is
// for: the degrees, uneven split and Adam of ReshardOptions, the
// megatron-core version and the optimizer sharding type.
type DistOptions struct {
	ReshardOptions
	Core          string // Core015, Core018, Core019 ("": DefaultCore)
	OptimSharding string // FullyReshardable ("") or DPReshardable
	Workers       int    // chunk ranges written at once, over all rank files (0: all cores)
	taskBytes     int64  // bytes of one write task (0: layout.WriteFills' default); tests make it small
}

// dwChunk is one box of a DCP tensor key: written by rank file, its
// elements read from pieces of the atomic checkpoint (At relative to the
// chunk; the pieces' State is replaced by state) and zeros where no piece
// (or no shard map) places elements; src is the plan's tensor (an atomic
// parameter or a family source's fused tensor, "" for padding only).
type dwChunk struct {
	rank          int
	offsets, size []int64
	src, state    string
	pieces        []layout.StatePiece
	info          dcp.StorageInfo
}

// dwKey is one key of the checkpoint: a tensor with chunks, or a bytes
// item (its torch.save stream).
type dwKey struct {
	key     string
	dt      dtype.DType
	size    []int64
	chunks  []*dwChunk
	data    []byte
	info    dcp.StorageInfo
	stacked bool // a decoder layer's tensor with the leading layer axis
}

// localNorms are the local spec's sharded_state_dict_keys_map
// (megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec):
// its norms are saved under the names TE's fused linears give them.
var localNorms = [][2]string{
	{".input_layernorm.", ".self_attention.linear_qkv.layer_norm_"},
	{".pre_mlp_layernorm.", ".mlp.linear_fc1.layer_norm_"},
}

// layerKey is the torch_dist key of an atomic parameter and its global
// layer on the layer axis (-1: none): stacked layers (homogeneous) drop
// the number (the key gets a leading layer axis), per-layer keys keep it
// and have no layer axis; teNorms: the local spec's norms take TE names.
func layerKey(name string, stacked, teNorms bool) (string, int) {
	n := layerIndex(name)
	if n < 0 {
		return name, -1
	}
	m := reLayer.FindStringSubmatch(name)
	rest := "." + strings.TrimPrefix(name, m[0])
	if teNorms {
		for _, ln := range localNorms {
			if strings.HasPrefix(rest, ln[0]) {
				rest = ln[1] + strings.TrimPrefix(rest, ln[0])
			}
		}
	}
	if !stacked {
		return m[0] + strings.TrimPrefix(rest, "."), -1
	}
	return m[1] + strings.TrimPrefix(rest, "."), n
}

// key is the torch_dist key of an atomic (a family source: target) name
// and its layer on the layer axis (-1: none). megatron-core stacks the
// layers under one key only when they are homogeneous: with a
// moe_layer_freq pattern (deepseek_v3's leading dense layers) every layer
// keeps its number (transformer_block.py sharded_state_dict,
// non_homogeneous_layers). Only the local spec's non-MLA layer maps its
// norms to TE names (gpt_layer_specs.py sharded_state_dict_keys_map); the
// TE spec's MoE layers keep pre_mlp_layernorm.
func (w *distWriter) key(name string) (string, int) {
	return layerKey(name, !w.perLayer, !w.p.te && !w.mla)
}

// kind is how a tensor splits over TP: by name, and MLA's down
// projections (column-parallel in the local spec, whole in TE's).
func (w *distWriter) kind(name string) kind {
	if k := mlaDownKind(name, !w.p.te); k != kindUnknown {
		return k
	}
	return splitKind(name, w.swiglu)
}

// cut is how many ways a stage-s tensor is cut and the rank file of each
// cut: TP ranks, or for routed expert g of EP rank e the expert-TP ranks
// U, u's chunk going to the file of stage rank u + U*e's TP rank (rank
// order tp-cp-ep-dp-pp): any file loads.
func (w *distWriter) cut(s, expert int) (int, func(int) int) {
	p := w.p
	T := p.o.TP
	if expert < 0 {
		return T, func(t int) int { return t + T*s }
	}
	U, e := p.etp, expert/(p.experts/p.ep)
	return U, func(u int) int { return (u+U*e)%T + T*s }
}

// ReshardDist writes the atomic checkpoint r (converted from Megatron-LM)
// as a Megatron-LM --ckpt-format torch_dist save folder dst for the given
// degrees: iter_XXXXXXX/ with metadata.json, the common state, one
// __R_0.distcp per model-parallel rank and .metadata (written last), then
// latest_checkpointed_iteration.txt (DISTWRITE.md).
func ReshardDist(ctx context.Context, r *atomic.Reader, dst string, o DistOptions) (*ReshardStats, error) {
	switch o.Core {
	case "":
		o.Core = DefaultCore
	case Core015, Core018, Core019:
	default:
		return nil, fmt.Errorf("--megatron-core %q: ucp writes the torch_dist layouts of megatron-core %s, %s and %s", o.Core, Core015, Core018, Core019)
	}
	switch o.OptimSharding {
	case "":
		o.OptimSharding = FullyReshardable
	case FullyReshardable:
	case DPReshardable:
	default:
		return nil, fmt.Errorf("--dist-optim-sharding %q: give %s or %s", o.OptimSharding, FullyReshardable, DPReshardable)
	}
	if o.Workers <= 0 {
		o.Workers = runtime.NumCPU()
	}
	// torch_dist holds the distributed optimizer's state (fully_reshardable).
	o.DistOptimizer = true
	o.torchDist = true
	p, err := planMegatron(r, o.ReshardOptions)
	if err != nil {
		return nil, err
	}
	if p.release && o.OptimSharding == DPReshardable {
		return nil, fmt.Errorf("%s: --dist-optim-sharding %s: the %s source has no optimizer state (its weights are written, for --finetune)", r.Dir, DPReshardable, r.Manifest.Source.Format)
	}
	w := &distWriter{p: p, o: o}
	if err := w.keys(); err != nil {
		return nil, err
	}
	dst = filepath.Clean(dst)
	iterDir, tracker, st, err := p.prepareDst(dst)
	if err != nil {
		return nil, err
	}
	if p.release {
		st.Notes = []string{fmt.Sprintf("the %s source's weights only, as a 'release' checkpoint (no optimizer state): Megatron loads it as iteration 0; start with --finetune", r.Manifest.Source.Format)}
	}
	if o.Place.Multi() {
		f, err := w.nodeFolder(iterDir, st)
		if err != nil {
			return nil, err
		}
		return st, p.finishNode(ctx, f, dst, tracker, o.NoSync, st)
	}
	if err := fsutil.WriteDir(iterDir+atomic.PartialSuffix, iterDir, o.Force, o.NoSync, func(tmp string) error {
		return r.VerifyingReads(func() error { return w.write(ctx, tmp, iterDir, st) })
	}); err != nil {
		return nil, err
	}
	return st, writeTracker(dst, tracker, o.NoSync, st)
}

type distWriter struct {
	p      *rsPlan
	o      DistOptions
	swiglu bool
	// mla: multi-latent attention; perLayer: non-homogeneous layers
	// (a moe_layer_freq pattern), each keyed with its number.
	mla, perLayer bool
	tensor        []*dwKey // model keys, then optimizer keys
	items         []*dwKey // bytes items (rank 0's file)
}

// stageOf is the pipeline stage holding an atomic parameter.
func (w *distWriter) stageOf(name string, layer int) int {
	switch {
	case layer >= 0:
		s, _ := w.p.chunkOf(layer)
		return s
	case strings.HasPrefix(name, "embedding."):
		return 0
	}
	return w.o.PP - 1
}

// boxes are the boxes TP rank t of T saves of a tensor of (padded) shape
// full, as Megatron's layers build their ShardedTensors: replicated whole
// (rank 0 only: the main replica), column-parallel / vocabulary / QKV rows
// split, row-parallel columns split, SwiGLU fc1 a gate and an up box
// (megatron/core/transformer/mlp.py apply_swiglu_sharded_factory).
func boxes(k kind, full []int64, T, t int) ([][2][]int64, error) {
	whole := [][2][]int64{{make([]int64, len(full)), clone(full)}}
	split := func(d int) ([][2][]int64, error) {
		if d >= len(full) || full[d]%int64(T) != 0 {
			return nil, fmt.Errorf("shape %v cannot be split %d ways on dim %d", full, T, d)
		}
		off, size := make([]int64, len(full)), clone(full)
		size[d] = full[d] / int64(T)
		off[d] = int64(t) * size[d]
		return [][2][]int64{{off, size}}, nil
	}
	switch k {
	case kindRep:
		if t > 0 {
			return nil, nil
		}
		return whole, nil
	case kindVocab, kindQKV, kindCol:
		return split(0)
	case kindRow:
		return split(1)
	case kindSwiGLU:
		if full[0]%int64(2*T) != 0 {
			return nil, fmt.Errorf("SwiGLU shape %v cannot be split %d ways", full, T)
		}
		f := full[0] / 2
		var out [][2][]int64
		for _, base := range []int64{0, f} {
			off, size := make([]int64, len(full)), clone(full)
			size[0] = f / int64(T)
			off[0] = base + int64(t)*size[0]
			out = append(out, [2][]int64{off, size})
		}
		return out, nil
	}
	return nil, fmt.Errorf("no tensor-parallel rule")
}

// keys builds every key of the checkpoint: the model's tensors and, for
// fully_reshardable, optimizer.state.{param,exp_avg,exp_avg_sq}.<key> with
// the model key's shape and chunks; the _extra_state items of the layers'
// linears and the common state (0.19) as bytes items.
func (w *distWriter) keys() error {
	p := w.p
	// A swiglu that is not a bool is an error naming the file, not false.
	args := layout.Args{Path: p.extraPath(), NS: p.args}
	swiglu, err := args.Bool("swiglu", false)
	if err != nil {
		return err
	}
	w.swiglu = swiglu
	if w.mla, err = args.Bool("multi_latent_attention", false); err != nil {
		return err
	}
	if w.perLayer, err = nonHomogeneous(args); err != nil {
		return err
	}
	model, err := w.modelKeys()
	if err != nil {
		return err
	}
	if w.p.release { // weights only
		return w.itemKeys(model)
	}
	if w.o.OptimSharding == DPReshardable {
		if err := w.dprsKeys(); err != nil {
			return err
		}
	}
	if err := w.optimKeys(model); err != nil {
		return err
	}
	return w.itemKeys(model)
}

// modelKeys adds the model's sharded tensors (stacked layers with a layer
// axis, each TP rank's boxes) and returns them in manifest (a family
// source: module) order.
func (w *distWriter) modelKeys() ([]*dwKey, error) {
	p := w.p
	var ordered []*dwKey
	var err error
	if p.virt != nil {
		ordered, err = w.familyModelKeys()
	} else {
		ordered, err = w.megatronModelKeys()
	}
	if err != nil {
		return nil, err
	}
	for _, mk := range ordered {
		if mk.stacked {
			if err := coversLayers(mk, p.layers, strings.Contains(mk.key, expertKey), p.experts); err != nil {
				return nil, fmt.Errorf("%s: %w", p.r.Dir, err)
			}
		}
		for _, ch := range mk.chunks {
			ch.state = fragment.FP32
		}
		w.tensor = append(w.tensor, mk)
	}
	return ordered, nil
}

// modelKey is the model tensor key of global shape full (a layer's: with
// the leading layer axis; an expert's: with the expert axis after it),
// added to model and ordered when new.
func (w *distWriter) modelKey(model map[string]*dwKey, ordered *[]*dwKey, key string, layer, expert int, full []int64) *dwKey {
	if mk, ok := model[key]; ok {
		return mk
	}
	size := full
	if expert >= 0 {
		size = append([]int64{int64(w.p.experts)}, size...)
	}
	if layer >= 0 {
		size = append([]int64{int64(w.p.layers)}, size...)
	}
	mk := &dwKey{key: key, dt: w.p.dt, size: size, stacked: layer >= 0}
	if isBuffer(key) {
		mk.dt = dtype.Float32 // the router's expert_bias (rsParam.fp32)
	}
	model[key] = mk
	*ordered = append(*ordered, mk)
	return mk
}

// megatronModelKeys are the model's tensors of a Megatron-LM source, one
// box per TP rank (two for SwiGLU) of each atomic parameter.
func (w *distWriter) megatronModelKeys() ([]*dwKey, error) {
	p := w.p
	model := map[string]*dwKey{}
	var ordered []*dwKey
	for _, e := range p.r.Manifest.Params {
		ekey, expert := distExpertKey(e.Name)
		key, layer := w.key(ekey)
		k := w.kind(e.Name)
		if k == kindUnknown || k == kindGrouped1 || k == kindGrouped2 {
			return nil, fmt.Errorf("%s: parameter %s: no torch_dist layout known for it", p.r.Dir, e.Name)
		}
		full := clone(e.Shape)
		if k == kindVocab && p.vocab > 0 {
			full[0] = p.vocab
		}
		mk := w.modelKey(model, &ordered, key, layer, expert, full)
		n, fileOf := w.cut(w.stageOf(e.Name, layer), expert)
		err := w.addBoxes(mk, k, full, n, fileOf, layer, expert, e.Name, func(_ int, b [2][]int64) ([]layout.StatePiece, error) {
			return []layout.StatePiece{{Param: e.Name, Shard: boxShard(b[0], b[1], e.Shape), N: torchfile.Numel(b[1])}}, nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p.r.Dir, e.Name, err)
		}
	}
	return ordered, nil
}

// addBoxes adds to mk the chunks of a tensor of global shape full (without
// the layer and expert axes) cut n ways (kind k's boxes), cut i's in rank
// file fileOf(i); pieces gives the atomic pieces of cut i's box b. A
// layer's (an expert's) chunk is one entry of the layer (expert) axis.
func (w *distWriter) addBoxes(mk *dwKey, k kind, full []int64, n int, fileOf func(int) int, layer, expert int, src string,
	pieces func(i int, b [2][]int64) ([]layout.StatePiece, error)) error {
	for i := 0; i < n; i++ {
		bs, err := boxes(k, full, n, i)
		if err != nil {
			return err
		}
		for _, b := range bs {
			pcs, err := pieces(i, b)
			if err != nil {
				return err
			}
			ch := &dwChunk{rank: fileOf(i), offsets: b[0], size: b[1], src: src, pieces: pcs}
			if expert >= 0 {
				ch.offsets = append([]int64{int64(expert)}, ch.offsets...)
				ch.size = append([]int64{1}, ch.size...)
			}
			if layer >= 0 {
				ch.offsets = append([]int64{int64(layer)}, ch.offsets...)
				ch.size = append([]int64{1}, ch.size...)
			}
			mk.chunks = append(mk.chunks, ch)
		}
	}
	return nil
}

// nonHomogeneous reports a model whose layers are not all alike, which
// megatron-core saves per layer, unstacked: a moe_layer_freq pattern (a
// list, or an int above 1).
func nonHomogeneous(args layout.Args) (bool, error) {
	v, ok := args.Attr("moe_layer_freq")
	if !ok || v == nil {
		return false, nil
	}
	if _, ok := v.(*pyobj.List); ok {
		return true, nil
	}
	n, err := args.Int("moe_layer_freq", 1)
	if err != nil {
		return false, fmt.Errorf("%w (a list or an int)", err)
	}
	return n > 1, nil
}

// optimKeys adds the fully reshardable optimizer's tensors: one per model
// tensor and state, chunked as the model.
func (w *distWriter) optimKeys(model []*dwKey) error {
	p := w.p
	for _, state := range w.fullStates() {
		name := state
		if state == fragment.FP32 {
			name = "param"
		}
		for _, mk := range model {
			if isBuffer(mk.key) {
				continue // the router's expert_bias: a buffer, in no optimizer
			}
			ok := &dwKey{key: "optimizer.state." + name + "." + mk.key, dt: dtype.Float32, size: clone(mk.size)}
			for _, ch := range mk.chunks {
				if !p.hasState(ch.src, state) {
					return fmt.Errorf("%s: parameter %s has no %s state; Megatron's distributed optimizer saves param, exp_avg and exp_avg_sq", p.r.Dir, p.srcName(ch.src), state)
				}
				c := *ch
				c.state = state
				ok.chunks = append(ok.chunks, &c)
			}
			w.tensor = append(w.tensor, ok)
		}
	}
	return nil
}

// itemKeys adds the byte items: the layers' _extra_state and, for core
// 0.19, the common state.
func (w *distWriter) itemKeys(model []*dwKey) error {
	order := make([]string, len(model))
	for i, mk := range model {
		order[i] = mk.key
	}
	none, err := dcp.SaveBytes(&pyobj.List{Items: []pyobj.Value{nil}})
	if err != nil {
		return err
	}
	for _, x := range w.extraItems(order) {
		w.items = append(w.items, &dwKey{key: x, data: none})
	}
	if w.o.Core == Core019 {
		common, err := w.common()
		if err != nil {
			return err
		}
		data, err := dcp.SaveBytes(&pyobj.List{Items: []pyobj.Value{common}})
		if err != nil {
			return err
		}
		w.items = append(w.items, &dwKey{key: "common_state/shard_0_1", data: data})
	}
	return nil
}

// coversLayers checks that a stacked key has every layer's chunks and,
// for experts, every expert's of every layer.
func coversLayers(k *dwKey, L int, experts bool, E int) error {
	n := 1
	if experts {
		n = E
	}
	seen := make([]bool, L*n)
	for _, ch := range k.chunks {
		i := int(ch.offsets[0]) * n
		if experts {
			i += int(ch.offsets[1])
		}
		seen[i] = true
	}
	for i, ok := range seen {
		switch {
		case ok:
		case experts:
			return fmt.Errorf("%s: layer %d expert %d has no tensor (torch_dist stacks every layer's experts under one key)", k.key, i/n, i%n)
		default:
			return fmt.Errorf("%s: layer %d has no tensor (torch_dist stacks every layer under one key)", k.key, i)
		}
	}
	return nil
}

// extraSuffixes are the layer modules that save _extra_state (MCore's
// parallel linears and TE modules: None without FP8), in the order the
// layer registers them; TE's core attention saves one with the TE spec.
var extraSuffixes = []string{"self_attention.core_attention", "self_attention.linear_proj", "self_attention.linear_qkv",
	"self_attention.linear_q_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
	"self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj", "mlp.linear_fc1", "mlp.linear_fc2",
	"mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"}

// extraItems are the keys of the layers' _extra_state ShardedObjects
// (<module>._extra_state/shard_<offsets>_<shape>, the layer and expert
// axes of the module's tensors: transformer/utils.py
// make_sharded_object_for_checkpoint, _get_extra_state_offsets). Stacked
// layers: shard_<l>_<L> per layer; per-layer keys (non-homogeneous
// layers): shard_0_1. Each routed expert's linears (SequentialMLP and
// TEGroupedMLP alike): one per expert, shard_<l>.<g>_<L>.<E> or
// shard_<g>_<E>.
func (w *distWriter) extraItems(order []string) []string {
	p := w.p
	L, E := p.layers, p.experts
	has := map[string]bool{} // module, layer number dropped
	for _, k := range order {
		if strings.Contains(k, ".layer_norm_") {
			continue // a norm under a linear's name (the local spec's keys map): not the linear
		}
		if m := linearModule(k); m != "" {
			if rest, ok := strings.CutPrefix(m, "decoder.layers."); ok {
				if n := layerIndex(m); n >= 0 {
					rest = fmt.Sprintf("%d.", n) + strings.TrimPrefix(m, reLayer.FindString(m))
				}
				has[rest] = true
			}
		}
	}
	prefixes := []string{""} // stacked: decoder.layers.<suffix>
	if w.perLayer {
		prefixes = nil
		for l := 0; l < L; l++ {
			prefixes = append(prefixes, fmt.Sprintf("%d.", l))
		}
	}
	var out []string
	for _, pre := range prefixes {
		for _, suf := range extraSuffixes {
			m := pre + suf
			if !has[m] && !(suf == "self_attention.core_attention" && p.te && has[pre+"self_attention.linear_proj"]) {
				continue
			}
			if pre != "" {
				out = append(out, fmt.Sprintf("decoder.layers.%s._extra_state/shard_0_1", m))
				continue
			}
			for l := 0; l < L; l++ {
				out = append(out, fmt.Sprintf("decoder.layers.%s._extra_state/shard_%d_%d", m, l, L))
			}
		}
		for _, mod := range []string{"linear_fc1", "linear_fc2"} {
			m := pre + expertKey + mod
			if !has[m] {
				continue
			}
			for g := 0; pre != "" && g < E; g++ {
				out = append(out, fmt.Sprintf("decoder.layers.%s._extra_state/shard_%d_%d", m, g, E))
			}
			for l := 0; pre == "" && l < L; l++ {
				for g := 0; g < E; g++ {
					out = append(out, fmt.Sprintf("decoder.layers.%s._extra_state/shard_%d.%d_%d.%d", m, l, g, L, E))
				}
			}
		}
	}
	return out
}

// boxShard reads the box [off, off+size) of a tensor whose atomic shape
// is full (rows past it are vocabulary padding: zeros).
func boxShard(off, size, full []int64) fragment.Shard {
	in := clone(size)
	for d := range in {
		in[d] = max(0, min(off[d]+size[d], full[d])-off[d])
	}
	to := clone(off)
	if in[0] == 0 {
		to[0] = full[0] // only padding: a box of no rows at the end, as placement does
	}
	return fragment.Shard{Shape: clone(size), Maps: []fragment.BoxMap{{From: make([]int64, len(size)), To: to, Size: in}}}
}

// common is the common state dist_checkpointing.save stores beside the
// tensors: the training loop's dict without rng state, args at the new
// degrees (ckpt_format torch_dist) and the optimizer's param groups with
// the sharding type.
func (w *distWriter) common() (*pyobj.Dict, error) {
	p := w.p
	args := p.targetArgs().(*pyobj.Object)
	switch ad := args.State.(type) {
	case *pyobj.Dict: // an argparse.Namespace's (readArgs checked it)
		ad.Set("ckpt_format", "torch_dist")
		ad.Set("dist_ckpt_optim_fully_reshardable", w.o.OptimSharding == FullyReshardable)
	}
	c := pyobj.NewDict(pyobj.PlainDict)
	c.Set("args", args)
	cv, ok := p.extra.Get("checkpoint_version")
	if !ok {
		cv = 3.0
	}
	c.Set("checkpoint_version", cv)
	c.Set("iteration", p.iter)
	if p.release { // weights only: no optimizer, no schedulers
		return c, nil
	}
	var all []rsParam
	for _, st := range p.chunks {
		for _, list := range st {
			all = append(all, list...)
		}
	}
	ov, err := p.distGroups(all)
	if err != nil {
		return nil, err
	}
	opt := ov.(*pyobj.Dict)
	if w.o.OptimSharding == DPReshardable {
		// The optimizer's state_dict items are dp_group_idx_G ShardedObjects:
		// the common state keeps the sharding type only, per sub-optimizer.
		if p.chained() {
			opt = pyobj.NewDict(pyobj.PlainDict)
			for i := range p.subOptimizers() {
				opt.Set(int64(i), pyobj.NewDict(pyobj.PlainDict))
			}
		} else {
			opt = pyobj.NewDict(pyobj.PlainDict)
		}
	}
	// Every core's DistributedOptimizer.sharded_state_dict sets it (core 0.15's load_state_dict
	// asserts it is there: megatron/core/optimizer/distrib_optimizer.py, core_v0.15.3).
	{
		subs := []*pyobj.Dict{opt}
		if p.chained() {
			// {0: dense, 1: expert}: each sub-optimizer's own dict.
			subs = nil
			for _, k := range opt.Keys() {
				v, _ := opt.Get(k)
				subs = append(subs, v.(*pyobj.Dict))
			}
		}
		for _, d := range subs {
			d.Set("param_state_sharding_type", w.o.OptimSharding)
		}
	}
	c.Set("optimizer", opt)
	for _, k := range []string{"opt_param_scheduler", "lr_scheduler", "num_floating_point_operations_so_far"} {
		if v, ok := p.extra.Get(k); ok {
			c.Set(k, v)
		}
	}
	c.Set("content_metadata", w.contentMetadata())
	return c, nil
}

// write writes the iteration folder's files into tmp: metadata.json, the
// common state (common.pt up to core 0.18), the rank files (writeRanks),
// then .metadata, and reads the folder back.
func (w *distWriter) write(ctx context.Context, tmp, final string, st *ReshardStats) error {
	if err := w.writeHead(ctx, tmp, st); err != nil {
		return err
	}
	sizes, err := w.writeRanks(ctx, tmp, nil)
	if err != nil {
		return err
	}
	for _, n := range sizes {
		st.Files++
		st.Bytes += n
	}
	return w.writeLast(ctx, tmp, final, st)
}

// writeHead writes metadata.json and, up to core 0.18, common.pt.
func (w *distWriter) writeHead(ctx context.Context, tmp string, st *ReshardStats) error {
	meta := `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`
	if w.o.Core != Core019 {
		meta = `{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}`
	}
	// Synced like every data file: the folder is published only after.
	if err := fsutil.WriteFileAtomic(filepath.Join(tmp, dcp.MegatronMetadataFile), []byte(meta), w.o.NoSync); err != nil {
		return err
	}
	st.Files++
	st.Bytes += int64(len(meta))
	if w.o.Core != Core019 {
		common, err := w.common()
		if err != nil {
			return err
		}
		path := filepath.Join(tmp, commonFile)
		n, err := layout.WriteFile(ctx, w.p.r, path, common, nil, layout.WriteOptions{Sync: !w.o.NoSync})
		if err != nil {
			return err
		}
		st.Files++
		st.Bytes += n
	}
	return nil
}

// writeLast writes .metadata, which marks a complete save, once every rank
// file is written (their places planned), and reads the folder back.
func (w *distWriter) writeLast(ctx context.Context, tmp, final string, st *ReshardStats) error {
	pkl, err := w.metadata(final).Marshal()
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(tmp, dcp.MetadataFile), pkl, w.o.NoSync); err != nil {
		return err
	}
	st.Files++
	st.Bytes += int64(len(pkl))
	if _, err := IndexDist(ctx, tmp, Options{Workers: w.o.Workers}); err != nil {
		return fmt.Errorf("the written checkpoint does not read back: %w", err)
	}
	return nil
}

// nodeFolder is the iteration folder as the multi-node protocol writes
// it: one unit per rank file; the finalizer writes metadata.json, the
// common state and .metadata (writeHead, writeLast) once every rank file
// is in place.
func (w *distWriter) nodeFolder(iterDir string, st *ReshardStats) (*multinode.Folder, error) {
	_, sizes, err := w.planRanks()
	if err != nil {
		return nil, err
	}
	units := make([]multinode.Unit, len(sizes))
	for r, n := range sizes {
		units[r] = multinode.Unit{Name: rankFileName(r), Bytes: n}
	}
	key := w.o
	key.ReshardOptions, key.Workers, key.taskBytes = planKey(key.ReshardOptions), 0, 0
	f := w.p.nodeFolder(iterDir, units, key, func(ctx context.Context, tmp string, ranks []int) ([]string, error) {
		var files []string
		for _, r := range ranks {
			files = append(files, rankFileName(r))
		}
		if len(ranks) == 0 {
			return nil, nil
		}
		err := w.p.r.VerifyingReads(func() error {
			sizes, err := w.writeRanks(ctx, tmp, ranks)
			for _, r := range ranks {
				if err == nil {
					st.Files++
					st.Bytes += sizes[r]
				}
			}
			return err
		})
		return files, err
	})
	f.Last = func(ctx context.Context, tmp string) error {
		if err := w.writeHead(ctx, tmp, st); err != nil {
			return err
		}
		if _, _, err := w.planRanks(); err != nil {
			return err
		}
		return w.writeLast(ctx, tmp, iterDir, st)
	}
	return f, nil
}

// metadata is the .metadata of the written keys, as torch's
// create_default_global_save_plan and FileSystemWriter.finish build it:
// entries in key order (tensors, then the bytes items), chunks in the
// order written, storage_data by rank then offset; no planner data
// (Megatron saves with flatten_state_dict off). Core 0.15 pickles its own
// MCoreMetadata subclass with mcore_data ({} per tensor key: nothing
// reformulated).
func (w *distWriter) metadata(final string) *dcp.Metadata {
	md := &dcp.Metadata{StorageMeta: &dcp.StorageMeta{CheckpointID: final, SaveID: dcp.NewSaveID()}}
	type stored struct {
		off int64
		e   dcp.StorageEntry
		rk  int
	}
	var all []stored
	mcore := pyobj.NewDict(pyobj.PlainDict)
	for _, k := range w.tensor {
		e := &dcp.Entry{Key: k.key, DType: k.dt, Size: clone(k.size)}
		for _, ch := range k.chunks {
			e.Chunks = append(e.Chunks, dcp.Chunk{Offsets: clone(ch.offsets), Sizes: clone(ch.size)})
			all = append(all, stored{ch.info.Offset, dcp.StorageEntry{Index: dcp.MetadataIndex{FQN: k.key, Offset: clone(ch.offsets), HasOffset: true, Hint: -1}, Info: ch.info}, ch.rank})
		}
		md.Entries = append(md.Entries, e)
		mcore.Set(k.key, pyobj.NewDict(pyobj.PlainDict))
	}
	for _, k := range w.items {
		md.Entries = append(md.Entries, &dcp.Entry{Key: k.key, Bytes: true})
		all = append(all, stored{k.info.Offset, dcp.StorageEntry{Index: dcp.MetadataIndex{FQN: k.key, Hint: -1}, Info: k.info}, 0})
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].rk != all[j].rk {
			return all[i].rk < all[j].rk
		}
		return all[i].off < all[j].off
	})
	for _, s := range all {
		md.Storage = append(md.Storage, s.e)
	}
	if w.o.Core == Core015 {
		md.Class = pyobj.Global{Module: "megatron.core.dist_checkpointing.strategies.torch", Name: "MCoreMetadata"}
		md.Unknown = []string{"mcore_data"}
		md.Attrs = map[string]pyobj.Value{"mcore_data": mcore}
	}
	return md
}

// contentMetadata is the content_metadata dist_checkpointing.save stores
// in the common state and Megatron's load_checkpoint reads back to build
// the sharded state dicts it loads (megatron/training/checkpointing.py
// _build_sharded_state_dict_metadata, _clean_metadata_for_serialization;
// without it the load takes the pre-0.13 sharding types): the optimizer
// sharding type, no singleton local shards, and no chained_<k>. prefix on a
// ChainedOptimizer's fully_reshardable keys.
func (w *distWriter) contentMetadata() *pyobj.Dict {
	m := pyobj.NewDict(pyobj.PlainDict)
	m.Set("distrib_optim_sharding_type", w.o.OptimSharding)
	if w.o.OptimSharding == FullyReshardable {
		m.Set("distrib_optim_fully_reshardable_mem_efficient", false)
	}
	m.Set("singleton_local_shards", false)
	m.Set("chained_optim_avoid_prefix", true)
	return m
}
