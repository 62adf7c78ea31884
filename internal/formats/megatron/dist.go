package megatron

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// DistFormat is the name of Megatron's dist_checkpointing format on top of
// PyTorch DCP (--ckpt-format torch_dist), the default since core 0.9.
const DistFormat = "torch_dist"

// Names inside a torch_dist folder (DISTFORMAT.md).
const (
	commonFile = "common.pt"              // the common state, core <= 0.18
	commonItem = "common_state/shard_0_1" // the common state, core >= 0.19
	optPrefix  = "optimizer."
)

func hasDistMetadata(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, dcp.MegatronMetadataFile))
	return err == nil && st.Mode().IsRegular()
}

// DetectDist reports whether path is a Megatron dist_checkpointing
// checkpoint: an iteration folder holding metadata.json (Megatron's own
// rule), or a save folder whose latest_checkpointed_iteration.txt names one.
func DetectDist(path string) bool {
	dir, _, err := resolveIter(path, "")
	return err == nil && hasDistMetadata(dir)
}

// distReader is the state of IndexDist.
type distReader struct {
	dir    string
	c      *dcp.Checkpoint
	opt    Options
	common *pyobj.Dict
	args   *pyobj.Object // nil: saved outside Megatron's training loop
	tp, pp int
	ep     int // expert parallel: from the bucketed expert optimizer state, else args, else 1
	etp    int // expert tensor parallel: args, else TP
	swiglu bool
	// grouped: the experts are GroupedMLP's (legacy grouped GEMM): a model
	// chunk spans several experts, or args say so (groupedMLP).
	grouped bool
	vocab   int64 // true vocabulary rows (0: keep the padding)
	table   *fragment.Table
	params  map[string]*distParam
	order   []string // atomic names in model-key order
	step    pyobj.Value
	split   [][][2]int // [stage][model chunk] first global layer, layers (dp_reshardable only)
}

// distParam is one atomic parameter and where its model tensor lies.
type distParam struct {
	name   string
	t      *dcp.Tensor // the model key holding it
	idx    []int64     // indices on the prepended axes (global layer, expert)
	shape  []int64     // padded full shape (the key's shape without the layer axis)
	k      kind
	states map[string]*fragment.State
}

// IndexDist builds the fragment table of the torch_dist checkpoint at path
// (a save folder or an iteration folder).
func IndexDist(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	dir, tag, err := resolveIter(path, opt.Tag)
	if err != nil {
		return nil, err
	}
	be, err := dcp.MegatronBackend(dir)
	if err != nil {
		return nil, err
	}
	if be == "" {
		return nil, fmt.Errorf("%s: no %s: not a Megatron dist_checkpointing folder", dir, dcp.MegatronMetadataFile)
	}
	if be != DistFormat {
		return nil, fmt.Errorf("%s: sharded_backend %q, which ucp does not read (only %q)", filepath.Join(dir, dcp.MegatronMetadataFile), be, DistFormat)
	}
	c, err := dcp.Open(ctx, dir, dcp.Options{Workers: opt.Workers, PadSizes: true, Attrs: []string{"mcore_data"}})
	if err != nil {
		return nil, err
	}
	r := &distReader{dir: dir, c: c, opt: opt, params: map[string]*distParam{},
		table: &fragment.Table{Format: DistFormat, Source: dir, Tag: tag}}
	if err := r.index(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if c.Scratch != "" {
		r.table.Scratch = []string{c.Scratch} // items decoded from stream transforms
	}
	return r.table, nil
}

func (r *distReader) index(ctx context.Context) error {
	if err := r.readCommon(ctx); err != nil {
		return err
	}
	if err := r.splitPrepended(); err != nil {
		return err
	}
	if err := r.geometry(); err != nil {
		return err
	}
	if err := r.modelParams(); err != nil {
		return err
	}
	r.layerOrder()
	opType, err := r.optimizer()
	if err != nil {
		return err
	}
	if err := r.finish(opType); err != nil {
		return err
	}
	return nil
}

// readCommon finds the common state: the common_state byte item (core >=
// 0.19) or common.pt (older), a dict either way.
func (r *distReader) readCommon(ctx context.Context) error {
	var v pyobj.Value
	where := ""
	for _, val := range r.c.Values {
		if val.Key == commonItem {
			// A ShardedObject item is a list of the local objects (one here).
			ld := pyobj.NewDec(val.Item, val.V)
			l := pyobj.As[*pyobj.List](ld, "the 1-element list of a ShardedObject")
			if err := ld.Err(); err != nil {
				return err
			}
			if len(l.Items) != 1 {
				return fmt.Errorf("%s: %s (%s) holds %d objects, not the 1 of a ShardedObject", r.dir, commonItem, val.Item, len(l.Items))
			}
			v, where = l.Items[0], val.Item
		}
	}
	if v == nil {
		p := filepath.Join(r.dir, commonFile)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: neither %s nor a %q item: the common state (args, iteration, optimizer param groups) is missing", r.dir, commonFile, commonItem)
		}
		fs, err := torchfile.DecodeAll(ctx, []string{p}, 1)
		if err != nil {
			return err
		}
		v, where = fs[0].Root, p
	}
	cd := pyobj.NewDec(where, v)
	r.common = cd.AsDict()
	if a, ok := cd.Opt("args"); ok {
		r.args = pyobj.As[*pyobj.Object](a, "an argparse.Namespace")
	}
	return cd.Err()
}

// argInt returns an int attribute of args, or def when there are no args
// or no such attribute (None included).
func (r *distReader) argInt(name string, def int64) (int64, error) {
	if r.args == nil {
		return def, nil
	}
	v, ok := r.args.Attr(name)
	if !ok || v == nil {
		return def, nil
	}
	n, ok := pyobj.Int(v)
	if !ok {
		return 0, fmt.Errorf("%s: args.%s is %s, not an int", r.dir, name, pyobj.Repr(v))
	}
	return n, nil
}

func (r *distReader) argBool(name string) (val, ok bool, err error) {
	if r.args == nil {
		return false, false, nil
	}
	v, has := r.args.Attr(name)
	if !has || v == nil {
		return false, false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, false, fmt.Errorf("%s: args.%s is %s, not a bool", r.dir, name, pyobj.Repr(v))
	}
	return b, true, nil
}

func (r *distReader) tensor(key string) *dcp.Tensor {
	for _, t := range r.c.Tensors {
		if t.Key == key {
			return t
		}
	}
	return nil
}

// distinctOffsets counts the different chunk offsets of t along dim d.
func distinctOffsets(t *dcp.Tensor, d int) int {
	seen := map[int64]bool{}
	for _, ch := range t.Chunks {
		if d < len(ch.Offsets) {
			seen[ch.Offsets[d]] = true
		}
	}
	return len(seen)
}

// geometry finds TP, PP, SwiGLU and the vocabulary: from args when the
// training loop saved them, else from the chunk grid (every chunk of a
// ShardedTensor is one rank's box) and --vocab-size.
func (r *distReader) geometry() error {
	var qkv *dcp.Tensor
	prefix := 0
	for _, t := range r.c.Tensors {
		if _, _, opt := optKey(t.Key); strings.HasSuffix(t.Key, ".self_attention.linear_qkv.weight") && !opt {
			qkv = t
			if _, stacked := stackedRest(t.Key); stacked {
				prefix = 1
			}
			break
		}
	}
	tp := 1
	if qkv != nil {
		tp = distinctOffsets(qkv, prefix)
	}
	n, err := r.argInt("tensor_model_parallel_size", int64(tp))
	if err != nil {
		return err
	}
	if qkv != nil && int(n) != tp {
		return fmt.Errorf("%s: args.tensor_model_parallel_size is %d but %s is saved in %d row blocks", r.dir, n, qkv.Key, tp)
	}
	r.tp = int(n) // without a fused QKV (multi-latent attention) args say it
	pp, err := r.argInt("pipeline_model_parallel_size", 0)
	if err != nil {
		return err
	}
	r.pp = int(pp)
	ep, err := r.argInt("expert_model_parallel_size", 1)
	if err != nil {
		return err
	}
	r.ep = int(max(ep, 1))
	// Routed experts are cut over the expert-TP ranks (default TP).
	etp, err := r.argInt("expert_tensor_parallel_size", int64(tp))
	if err != nil {
		return err
	}
	r.etp = int(max(etp, 1))
	if sw, ok, err := r.argBool("swiglu"); err != nil {
		return err
	} else if ok {
		r.swiglu = sw
	} else {
		// The SwiGLU factory saves [gate; up] as two boxes per TP rank.
		for _, t := range r.c.Tensors {
			if rest, stacked := stackedRest(t.Key); stacked && rest == "mlp.linear_fc1.weight" {
				r.swiglu = distinctOffsets(t, 1) == 2*tp
			}
		}
	}
	v, err := r.argInt("vocab_size", 0)
	if err != nil {
		return err
	}
	o := r.opt.VocabSize
	switch {
	case v > 0 && o > 0 && o != v:
		return fmt.Errorf("%s: --vocab-size %d contradicts args.vocab_size %d saved in the checkpoint", r.dir, o, v)
	case v > 0:
		r.vocab = v
	case o > 0:
		r.vocab = o
	}
	return nil
}

// stackedRest returns the layer-relative name of a stacked layer key
// ("decoder.layers.mlp.linear_fc1.weight" -> "mlp.linear_fc1.weight"); a
// per-layer key (decoder.layers.3....) is not stacked.
func stackedRest(key string) (string, bool) {
	const p = "decoder.layers."
	if !strings.HasPrefix(key, p) {
		return "", false
	}
	rest := key[len(p):]
	if rest == "" || rest[0] >= '0' && rest[0] <= '9' {
		return "", false
	}
	return rest, true
}

// Expert keys: SequentialMLP and TEGroupedMLP both save
// <prefix>mlp.experts.experts.<rest> with an expert axis (global expert
// index); the atomic name is the SequentialMLP one the legacy reader gives.
const (
	expertKey  = "mlp.experts.experts."
	expertName = "mlp.experts.local_experts."
)

// splitKey returns how many axes Megatron prepended to a model key (a
// layer axis for stacked layers, an expert axis for experts) and the
// atomic name of the parameter at given indices on them.
func splitKey(key string) (int, func(idx []int64) string) {
	rest, stacked := stackedRest(key)
	before, after, expert := strings.Cut(key, expertKey)
	switch {
	case stacked && expert:
		lb, _, _ := strings.Cut(rest, expertKey)
		return 2, func(idx []int64) string {
			return fmt.Sprintf("decoder.layers.%d.%s%s%d.%s", idx[0], lb, expertName, idx[1], after)
		}
	case stacked:
		return 1, func(idx []int64) string { return fmt.Sprintf("decoder.layers.%d.%s", idx[0], rest) }
	case expert:
		return 1, func(idx []int64) string { return fmt.Sprintf("%s%s%d.%s", before, expertName, idx[0], after) }
	}
	return 0, func([]int64) string { return key }
}

// splitPrepended cuts every chunk that spans several entries of the
// prepended axes (layer, expert) into one chunk per entry, so that each
// chunk holds one layer's parameter of one expert. GroupedMLP (core <=
// 0.16) saves each EP rank's experts as one chunk of nle entries on the
// expert axis (experts.py sharded_state_dict: (prepend_axis_num, ep_rank,
// ep_size) of the [nle, ...] local tensor); the other layouts save one
// expert per chunk. An entry of a row-major chunk is a contiguous run of
// its elements.
func (r *distReader) splitPrepended() error {
	for _, t := range r.c.Tensors {
		key := t.Key
		if _, _, opt := optKey(key); opt {
			i := strings.Index(key, "decoder.")
			if i < 0 {
				continue
			}
			key = key[i:]
		}
		axes, _ := splitKey(key)
		if axes == 0 {
			continue
		}
		var out []dcp.ChunkRef
		for _, ch := range t.Chunks {
			if len(ch.Sizes) < axes || torchfile.Numel(ch.Sizes[:axes]) == 1 {
				out = append(out, ch)
				continue
			}
			ct := ch.Ref.T
			if ct == nil || !torchfile.SameShape(ct.Shape, ch.Sizes) || !slices.Equal(ct.Stride, torchfile.ContiguousStrides(ct.Shape)) {
				return fmt.Errorf("%s: %q: chunk at %v of sizes %v spans several entries of the prepended axes and is not a contiguous tensor of that shape", r.dir, t.Key, ch.Offsets, ch.Sizes)
			}
			if _, _, opt := optKey(t.Key); !opt {
				r.grouped = true
			}
			inner := torchfile.Numel(ch.Sizes[axes:])
			idx := make([]int64, axes)
			for k := int64(0); ; k++ {
				sub := ch
				sub.Offsets, sub.Sizes = clone(ch.Offsets), clone(ch.Sizes)
				for d := range idx {
					sub.Offsets[d] += idx[d]
					sub.Sizes[d] = 1
				}
				st := *ct
				st.StorageOffset += k * inner
				st.Shape, st.Stride = clone(sub.Sizes), torchfile.ContiguousStrides(sub.Sizes)
				sub.Ref = fragment.TensorRef{Path: ch.Ref.Path, T: &st}
				out = append(out, sub)
				d := axes - 1
				for ; d >= 0; d-- {
					idx[d]++
					if idx[d] < ch.Sizes[d] {
						break
					}
					idx[d] = 0
				}
				if d < 0 {
					break
				}
			}
		}
		t.Chunks = out
	}
	return nil
}

// groupedMLP reports whether the experts are GroupedMLP's: a model chunk
// spanned several experts (splitPrepended), or args ask for grouped GEMM
// (--moe-grouped-gemm) from the local spec or with
// --moe-use-legacy-grouped-gemm (the TE spec otherwise builds
// TEGroupedMLP, saved per expert like SequentialMLP).
func (r *distReader) groupedMLP() (bool, error) {
	if r.grouped {
		return true, nil
	}
	gg, _, err := r.argBool("moe_grouped_gemm")
	if err != nil || !gg {
		return false, err
	}
	legacy, _, err := r.argBool("moe_use_legacy_grouped_gemm")
	if err != nil || legacy {
		return legacy, err
	}
	impl, _ := r.args.Attr("transformer_impl")
	return impl == "local", nil
}

// modelParams splits the model keys into atomic parameters: one per index
// on the prepended axes (global layer, global expert).
func (r *distReader) modelParams() error {
	for _, t := range r.c.Tensors {
		if _, _, opt := optKey(t.Key); opt {
			continue
		}
		axes, name := splitKey(t.Key)
		if len(t.Size) < axes+1 {
			return fmt.Errorf("%s: %q has shape %v: Megatron prepends %d axes (layer, expert) to it", r.dir, t.Key, t.Size, axes)
		}
		for _, ch := range t.Chunks {
			for d := 0; d < axes; d++ {
				if ch.Sizes[d] != 1 {
					return fmt.Errorf("%s: %q: chunk at %v spans %d entries of prepended axis %d; Megatron saves one layer and expert per chunk", r.dir, t.Key, ch.Offsets, ch.Sizes[d], d)
				}
			}
		}
		idx := make([]int64, axes)
		for {
			if err := r.addParam(name(idx), t, clone(idx), t.Size[axes:]); err != nil {
				return err
			}
			d := axes - 1
			for d >= 0 {
				idx[d]++
				if idx[d] < t.Size[d] {
					break
				}
				idx[d] = 0
				d--
			}
			if d < 0 {
				break
			}
		}
	}
	return nil
}

var reDistLayer = regexp.MustCompile(`^decoder\.layers\.(\d+)\.`)

// layerOf returns the global layer number of an atomic name, or -1.
func layerOf(name string) int64 {
	m := reDistLayer.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// layerOrder puts the parameters in model order: those before the first
// layer, then layer by layer (keys' order within a layer, each expert's
// parameters together), then the rest, as named_parameters lists them.
func (r *distReader) layerOrder() {
	type place struct{ section, layer, group, expert, pos int64 }
	places := map[string]place{}
	first := map[string]int64{} // name up to the expert number -> position of the first such parameter
	seenLayer := false
	for i, n := range r.order {
		p := place{group: int64(i), pos: int64(i)}
		switch l := layerOf(n); {
		case l >= 0:
			seenLayer = true
			p.section, p.layer = 1, l
		case seenLayer:
			p.section = 2
		}
		if before, after, ok := strings.Cut(n, expertName); ok {
			num, _, _ := strings.Cut(after, ".")
			if e, err := strconv.ParseInt(num, 10, 64); err == nil {
				// A layer's experts sit where its first expert key is.
				if _, seen := first[before]; !seen {
					first[before] = int64(i)
				}
				p.group, p.expert = first[before], e
			}
		}
		places[n] = p
	}
	sort.SliceStable(r.order, func(i, j int) bool {
		a, b := places[r.order[i]], places[r.order[j]]
		return slices.Compare([]int64{a.section, a.layer, a.group, a.expert, a.pos}, []int64{b.section, b.layer, b.group, b.expert, b.pos}) < 0
	})
}

func (r *distReader) addParam(name string, t *dcp.Tensor, idx, shape []int64) error {
	if err := checkName(r.dir, name); err != nil {
		return err
	}
	if _, dup := r.params[name]; dup {
		return fmt.Errorf("%s: parameter %s comes from two keys (%q and a per-layer or stacked twin)", r.dir, name, t.Key)
	}
	k := splitKind(name, r.swiglu)
	if k == kindUnknown {
		k = kindRep
		for d := range shape {
			if distinctOffsets(t, d+len(t.Size)-len(shape)) > 1 {
				k = kindUnknown // split, but not by a rule ucp knows: placed by its boxes
			}
		}
	}
	r.params[name] = &distParam{name: name, t: t, idx: idx, shape: clone(shape), k: k, states: map[string]*fragment.State{}}
	r.order = append(r.order, name)
	return nil
}

// boxState places the chunks of key t holding parameter p (its layer) as
// the shards of one state; vocabulary rows past r.vocab are dropped.
func (r *distReader) boxState(name string, p *distParam, t *dcp.Tensor) (*fragment.State, error) {
	if !torchfile.SameShape(t.Size, p.t.Size) {
		return nil, fmt.Errorf("%s: %q has shape %v but the model key %q has %v", r.dir, t.Key, t.Size, p.t.Key, p.t.Size)
	}
	pre := len(t.Size) - len(p.shape)
	st := &fragment.State{Name: name}
	if p.k == kindSwiGLU {
		return r.swigluState(st, p, t, pre)
	}
	for _, ch := range t.Chunks {
		if !slices.Equal(ch.Offsets[:pre], p.idx) {
			continue
		}
		to, size := clone(ch.Offsets[pre:]), clone(ch.Sizes[pre:])
		if p.k == kindVocab && r.vocab > 0 && len(size) > 0 {
			if to[0] >= r.vocab {
				continue // padding rows only
			}
			size[0] = min(size[0], r.vocab-to[0])
		}
		st.Shards = append(st.Shards, fragment.Shard{Shape: clone(ch.Sizes[pre:]), Replica: ch.Copy, Label: ch.Item,
			Maps: []fragment.BoxMap{{From: make([]int64, len(to)), To: to, Size: size}}})
		st.Frags = append(st.Frags, fragment.Fragment{Shard: len(st.Shards) - 1, Len: torchfile.Numel(ch.Sizes), Src: ch.Ref})
	}
	if len(st.Shards) == 0 {
		return nil, fmt.Errorf("%s: %q has no chunk for %s", r.dir, t.Key, p.name)
	}
	return st, nil
}

// swigluState places the two boxes ([gate; up] rows) of each TP rank's
// fc1 in one shard per rank, the rank's local [W_r; V_r], as the legacy
// reader does, so the pattern is Shard-NC either way.
func (r *distReader) swigluState(st *fragment.State, p *distParam, t *dcp.Tensor, pre int) (*fragment.State, error) {
	shards := make([]fragment.Shard, r.cut(p))
	for tp := range shards {
		sh, err := r.tpShard(p, tp)
		if err != nil {
			return nil, err
		}
		shards[tp] = sh
	}
	index := map[int]int{} // tp rank -> shard index in st
	for _, ch := range t.Chunks {
		if !slices.Equal(ch.Offsets[:pre], p.idx) {
			continue
		}
		if ch.Copy > 0 {
			continue // a repeated box: the first copy is placed
		}
		to, size := ch.Offsets[pre:], ch.Sizes[pre:]
		found := false
		for tp, sh := range shards {
			for _, m := range sh.Maps {
				if !torchfile.SameShape(m.To, to) || !torchfile.SameShape(m.Size, size) {
					continue
				}
				si, ok := index[tp]
				if !ok {
					sh.Label = fmt.Sprintf("tp%d", tp)
					st.Shards = append(st.Shards, sh)
					si = len(st.Shards) - 1
					index[tp] = si
				}
				rowLen := torchfile.Numel(sh.Shape[1:])
				st.Frags = append(st.Frags, fragment.Fragment{Shard: si, LocalStart: m.From[0] * rowLen, Len: torchfile.Numel(ch.Sizes), Src: ch.Ref})
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%s: %q: chunk at %v of sizes %v is not a SwiGLU half of a tensor-parallel rank (TP %d)", r.dir, t.Key, ch.Offsets, ch.Sizes, r.cut(p))
		}
	}
	if r.cut(p) == 1 {
		for i := range st.Shards {
			st.Shards[i].Maps = nil // [W; V] whole: the two boxes are the identity
		}
	}
	return st, nil
}

// atomicShape is the full shape without vocabulary padding.
func (r *distReader) atomicShape(p *distParam) []int64 {
	s := clone(p.shape)
	if p.k == kindVocab && r.vocab > 0 && len(s) > 0 {
		s[0] = r.vocab
	}
	return s
}

// info gives the universal-checkpoint keys the legacy reader gives the
// same parameter (they depend on the kind only).
func (r *distReader) info(p *distParam) fragment.Info {
	// Megatron's parameter kinds say how each is cut, whatever the source TP.
	in := fragment.Info{CatDim: 0, TPKnown: p.k != kindUnknown}
	switch p.k {
	case kindRep, kindUnknown:
		in.CatDim = -1
	case kindRow:
		in.CatDim = 1
	case kindSwiGLU:
		in.NSubParams = 2
	case kindVocab:
		if r.vocab > 0 && r.vocab < p.shape[0] {
			in.VocabSize, in.PaddedVocab = r.vocab, p.shape[0]
		}
	}
	return in
}

// finish builds the parameters in model-key order and the global state.
func (r *distReader) finish(opType string) error {
	tied := r.tensor("output_layer.weight") == nil && r.params["embedding.word_embeddings.weight"] != nil
	local, err := r.localSpec()
	if err != nil {
		return err
	}
	if local {
		r.note("args record the local layer spec (transformer_impl 'local'): norms saved under TE names are named input_layernorm/pre_mlp_layernorm, as in the model")
		r.order = localNormOrder(r.order)
	}
	for _, name := range r.order {
		p := r.params[name]
		// The router's expert_bias is a buffer: no optimizer state, its dtype kept.
		fp := &fragment.Param{Name: name, Shape: r.atomicShape(p), Info: r.info(p), Frozen: isBuffer(name) && len(p.states) == 0}
		if local {
			fp.Name = moduleName(name)
		}
		if p.k == kindRep && r.tp > 1 {
			fp.Info.Replicas = r.tp // every TP rank holds it; Megatron saves one copy
		}
		if p.k == kindVocab {
			if r.vocab == 0 {
				r.note(fmt.Sprintf("vocabulary padding kept: args has no vocab_size and no --vocab-size was given, so %s keeps all %d padded rows", name, p.shape[0]))
			} else if r.vocab > p.shape[0] {
				return fmt.Errorf("%s: vocabulary size %d exceeds the %d padded rows of %s", r.dir, r.vocab, p.shape[0], name)
			}
		}
		if name == "embedding.word_embeddings.weight" && tied {
			fp.Info.Aliases = []string{"output_layer.weight"}
		}
		if len(p.states) == 0 {
			st, err := r.boxState(fragment.FP32, p, p.t)
			if err != nil {
				return err
			}
			fp.States = []*fragment.State{st}
		} else {
			var names []string
			for n := range p.states {
				names = append(names, n)
			}
			for _, n := range fragment.StateOrder(names) {
				fp.States = append(fp.States, p.states[n])
			}
			if r.step != nil {
				fp.Step = &fragment.Step{Value: r.step}
			}
		}
		r.table.Params = append(r.table.Params, fp)
	}
	d := fragment.Degrees{TP: r.tp, PP: r.pp, DP: 0, EP: r.ep}
	if dp, err := r.argInt("data_parallel_size", 0); err != nil {
		return err
	} else if dp > 0 {
		d.DP = int(dp)
	} else if r.pp > 0 {
		d.DP = max(r.c.World/(r.tp*r.pp), 1)
	}
	if opType != "" {
		d.ZeRO = 1
	}
	if r.pp == 0 {
		r.note("the pipeline and data-parallel degrees are not recorded (no args, no bucketed optimizer state)")
	}
	r.table.Degrees = d
	extra := pyobj.NewDict(pyobj.PlainDict)
	for i := 0; i < r.common.Len(); i++ {
		k, v := r.common.Item(i)
		if k == "optimizer" {
			var err error
			if v, err = r.withoutParamSteps(v); err != nil {
				return err
			}
		}
		extra.Set(k, v)
	}
	for _, v := range r.c.Values {
		if _, _, opt := optKey(v.Key); v.Key == commonItem || opt {
			continue
		}
		extra.Set(v.Key, v.V) // _extra_state and rng_state ShardedObjects
	}
	r.table.Extra = extra
	if r.args != nil {
		var err error
		if r.table.Args, err = fragment.ScalarArgs(r.dir+" (common state)", r.args); err != nil {
			return err
		}
		if r.table.DType, err = fragment.TrainingDType(r.dir+" (common state)", r.table.Args); err != nil {
			return err
		}
	}
	if opType != "" {
		r.note("optimizer state saved as " + opType)
	}
	r.table.Notes = append(r.table.Notes, r.c.Notes...)
	return nil
}

func (r *distReader) note(s string) {
	for _, n := range r.table.Notes {
		if n == s {
			return
		}
	}
	r.table.Notes = append(r.table.Notes, s)
}

// localSpecNorms maps the TE names under which the local spec's
// TransformerLayer saves its norms (sharded_state_dict_keys_map) back to
// the module names, which --ckpt-format torch saves and the legacy reader
// gives. A local-spec model has no other parameter under these names.
var localSpecNorms = []struct{ saved, module string }{
	{".self_attention.linear_qkv.layer_norm_", ".input_layernorm."},
	{".mlp.linear_fc1.layer_norm_", ".pre_mlp_layernorm."},
}

// localSpec tells whether args record a GPT model built with the local
// layer spec: Megatron's model builder (gpt_builders.py, pretrain_gpt.py)
// takes get_gpt_layer_local_spec (or the local decoder block spec) when
// there is no --spec, no experimental attention variant and
// transformer_impl is 'local'. Without args, or with a custom spec, the
// checkpoint does not say; ok is false then.
func (r *distReader) localSpec() (local bool, err error) {
	if r.args == nil {
		return false, nil
	}
	impl, has := r.args.Attr("transformer_impl")
	if !has {
		return false, nil
	}
	s, ok := pyobj.Str(impl)
	if !ok {
		return false, fmt.Errorf("%s: args.transformer_impl is %s, not a string", r.dir, pyobj.Repr(impl))
	}
	for _, a := range []string{"spec", "experimental_attention_variant"} {
		if v, has := r.args.Attr(a); has && v != nil {
			return false, nil
		}
	}
	return s == "local", nil
}

// localNormOrder puts a local-spec layer's norms where the module has
// them (TransformerLayer registers input_layernorm first and
// pre_mlp_layernorm right before mlp): the saved key order does not tell,
// as the keys map renames them (core 0.15 lists them after the layer's
// other keys, 0.19 before).
func localNormOrder(order []string) []string {
	out := make([]string, 0, len(order))
	for i := 0; i < len(order); {
		l := layerOf(order[i])
		j := i + 1
		for l >= 0 && j < len(order) && layerOf(order[j]) == l {
			j++
		}
		var in, pre, rest []string
		for _, n := range order[i:j] {
			switch {
			case l >= 0 && strings.Contains(n, localSpecNorms[0].saved):
				in = append(in, n)
			case l >= 0 && strings.Contains(n, localSpecNorms[1].saved):
				pre = append(pre, n)
			default:
				rest = append(rest, n)
			}
		}
		out = append(out, in...)
		placed := len(pre) == 0
		for _, n := range rest {
			if !placed && strings.Contains(n, ".mlp.") {
				out, placed = append(out, pre...), true
			}
			out = append(out, n)
		}
		if !placed {
			out = append(out, pre...)
		}
		i = j
	}
	return out
}

// moduleName is the legacy reader's name of an atomic parameter of a
// local-spec model.
func moduleName(name string) string {
	for _, m := range localSpecNorms {
		if i := strings.Index(name, m.saved); i >= 0 && strings.HasPrefix(name, "decoder.layers.") {
			return name[:i] + m.module + name[i+len(m.saved):]
		}
	}
	return name
}

// cut is the tensor-parallel size a parameter is cut over: the expert-TP
// size for routed experts, TP for the rest.
func (r *distReader) cut(p *distParam) int {
	if isExpert(p.name) && r.etp > 0 {
		return r.etp
	}
	return r.tp
}
