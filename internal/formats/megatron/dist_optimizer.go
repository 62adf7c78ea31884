package megatron

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// Optimizer state key forms (DISTFORMAT.md §4).
const (
	fullyPrefix = "optimizer.state."       // fully_reshardable: optimizer.state.<state>.<model key>
	bucketsPre  = "optimizer.distributed." // dp_reshardable
)

var (
	reBucket = regexp.MustCompile(`^optimizer\.distributed\.dp_group_idx_(\d+)\.gbuf_idx_(\d+)\.dtype_(.+)\.bucket_idx_(\d+)\.(\w+)$`)
	reGroupV = regexp.MustCompile(`^optimizer\.distributed\.dp_group_idx_(\d+)\.(optimizer|per_bucket_numel|per_bucket_numel_unpadded|grad_scaler)/shard_0_1$`)
)

var reChained = regexp.MustCompile(`^chained_(\d+)\.(optimizer\..*)$`)

// optKey strips the chained_<k>. prefix a ChainedOptimizer (MoE: dense and
// expert optimizers) puts before optimizer keys; sub is -1 without one, and
// ok is false for keys that are not optimizer state.
func optKey(key string) (sub int, rest string, ok bool) {
	if m := reChained.FindStringSubmatch(key); m != nil {
		k, err := strconv.Atoi(m[1])
		return k, m[2], err == nil
	}
	return -1, key, strings.HasPrefix(key, optPrefix)
}

// subOptimizers returns the common state's optimizer dicts: one, or one per
// sub-optimizer of a ChainedOptimizer ({0: {...}, 1: {...}}).
func (r *distReader) subOptimizers() ([]*pyobj.Dict, error) {
	cd := pyobj.NewDec(r.dir+" common state", r.common)
	od, ok := cd.OptDict("optimizer")
	if !ok {
		return nil, cd.Err()
	}
	d := od.AsDict()
	if d.Len() == 0 {
		return []*pyobj.Dict{d}, nil
	}
	switch k, _ := d.Item(0); k.(type) {
	case int64: // a ChainedOptimizer's
	default:
		return []*pyobj.Dict{d}, nil
	}
	var out []*pyobj.Dict
	for i := 0; i < d.Len(); i++ {
		k, _ := d.Item(i)
		if k != int64(i) {
			return nil, fmt.Errorf("%s: the common state's optimizer has entry %s, not sub-optimizer %d's", r.dir, pyobj.Repr(k), i)
		}
		out = append(out, od.Dict(k).AsDict())
	}
	return out, cd.Err()
}

// stateName maps Megatron's optimizer state names to the atomic ones.
func stateName(s string) string {
	if s == "param" || s == "fp32_param" {
		return fragment.FP32
	}
	return s
}

// optimizer maps the optimizer state onto the parameters and returns its
// sharding type ("" when the checkpoint has none).
func (r *distReader) optimizer() (string, error) {
	var fully, buckets bool
	for _, t := range r.c.Tensors {
		_, key, _ := optKey(t.Key)
		fully = fully || strings.HasPrefix(key, fullyPrefix)
		buckets = buckets || strings.HasPrefix(key, bucketsPre)
	}
	subs, err := r.subOptimizers()
	if err != nil {
		return "", err
	}
	typ := ""
	for _, d := range subs {
		sd := pyobj.NewDec(r.dir+" common state: optimizer", d)
		if sd.Has("param_state_sharding_type") {
			typ = sd.Str("param_state_sharding_type")
		}
		if err := sd.Err(); err != nil {
			return "", err
		}
	}
	grouped, err := r.groupedMLP()
	if err != nil {
		return "", err
	}
	if grouped && (buckets || typ == "fully_sharded_model_space") {
		// Both keep GroupedMLP's fused layout: dp_reshardable buckets hold
		// weight1/weight2 as the rank's flat [nle, H, G*F/t] / [nle, F/t, H]
		// (not per expert), and fully_sharded_model_space saves the states
		// per expert but untransposed, [E, H, G*F] against the weights'
		// [E, G*F, H] (experts.py sh_ten_build_fn, flattened_range branch).
		f := "dp_reshardable"
		if !buckets {
			f = typ
		}
		return "", fmt.Errorf("%s: GroupedMLP experts (--moe-grouped-gemm, legacy grouped GEMM) with the %s optimizer state, whose expert states keep GroupedMLP's fused weight1/weight2 layout, which ucp does not read (only fully_reshardable, or --ckpt-format torch)", r.dir, f)
	}
	switch {
	case fully && buckets:
		return "", fmt.Errorf("%s: both optimizer.state.* and optimizer.distributed.* keys: not one Megatron optimizer format", r.dir)
	case fully:
		if typ == "fully_sharded_model_space" {
			// Core <= 0.14: the same keys (fp32_param for param), each
			// DP rank's flattened range of the TP-local tensor (§3a).
			return typ, r.fullyReshardable()
		}
		if typ != "" && typ != "fully_reshardable" {
			return "", fmt.Errorf("%s: optimizer.state.* keys but param_state_sharding_type %q", r.dir, typ)
		}
		return "fully_reshardable", r.fullyReshardable()
	case buckets:
		if typ != "" && typ != "dp_reshardable" {
			return "", fmt.Errorf("%s: optimizer.distributed.* bucket keys but param_state_sharding_type %q, which ucp does not read", r.dir, typ)
		}
		return "dp_reshardable", r.dpReshardable()
	}
	if typ != "" {
		return "", fmt.Errorf("%s: the common state says param_state_sharding_type %q but no optimizer tensors are saved", r.dir, typ)
	}
	return "", nil
}

// groupsStep sets the table's param groups (without ids) and the step
// every parameter shares, from the optimizer state dicts (one per
// sub-optimizer).
func (r *distReader) groupsStep(where string, vs ...pyobj.Value) error {
	var groups []pyobj.Value
	var step pyobj.Value
	for _, v := range vs {
		od := pyobj.NewDec(where+": the optimizer state", v)
		if in, ok := od.OptDict("optimizer"); ok {
			od = in // fully_reshardable nests torch's state dict
		}
		items := od.List("param_groups")
		if err := od.Err(); err != nil {
			return err
		}
		for _, gd := range items {
			g := gd.AsDict()
			if err := gd.Err(); err != nil {
				return err
			}
			if s, ok := g.Get("step"); ok {
				if step != nil && pyobj.Repr(step) != pyobj.Repr(s) {
					return fmt.Errorf("%s: param groups have different steps (%s, %s), which ucp does not map to parameters", where, pyobj.Repr(step), pyobj.Repr(s))
				}
				step = s
			}
			g = g.Clone()
			g.Delete("params")
			groups = append(groups, g)
		}
	}
	r.step = step
	opt := pyobj.NewDict(pyobj.PlainDict)
	opt.Set("param_groups", &pyobj.List{Items: groups})
	r.table.Optimizer = opt
	return nil
}

// fullyReshardable reads optimizer.state.<state>.<model key>: tensors with
// the model key's shape and chunks.
func (r *distReader) fullyReshardable() error {
	flat, err := r.reformulated()
	if err != nil {
		return err
	}
	byKey := map[string]*dcp.Tensor{}
	for _, t := range r.c.Tensors {
		if _, _, opt := optKey(t.Key); !opt {
			byKey[t.Key] = t
		}
	}
	for _, t := range r.c.Tensors {
		_, key, _ := optKey(t.Key)
		rest, ok := strings.CutPrefix(key, fullyPrefix)
		if !ok {
			continue
		}
		state, model, ok := strings.Cut(rest, ".")
		if !ok || byKey[model] == nil {
			return fmt.Errorf("%s: %q names no saved model key", r.dir, t.Key)
		}
		for _, name := range r.order {
			p := r.params[name]
			if p.t != byKey[model] {
				continue
			}
			sn := stateName(state)
			var st *fragment.State
			if orig, ok := flat[t.Key]; ok {
				st, err = r.flatState(sn, p, t, orig)
			} else if len(t.Size) == len(p.t.Size)+1 {
				return fmt.Errorf("%s: %q has shape %v, the flattened form of the model key's %v (flattened_range), but %s has no mcore_data nd_reformulated_orig_global_shape for it",
					r.dir, t.Key, t.Size, p.t.Size, dcp.MetadataFile)
			} else {
				st, err = r.boxState(sn, p, t)
			}
			if err != nil {
				return err
			}
			p.states[sn] = st
		}
	}
	for _, name := range r.order {
		if p := r.params[name]; len(p.states) > 0 && p.states[fragment.FP32] == nil {
			return fmt.Errorf("%s: %s has optimizer state but no optimizer.state.param.%s (fp32 main parameter)", r.dir, name, p.t.Key)
		}
	}
	subs, err := r.subOptimizers()
	if err != nil {
		return err
	}
	if len(subs) == 0 {
		return fmt.Errorf("%s: fully_reshardable optimizer state without param_groups (the step) in the common state", r.dir)
	}
	vs := make([]pyobj.Value, len(subs))
	for i, d := range subs {
		vs[i] = d
	}
	return r.groupsStep(r.dir+" common state", vs...)
}

// unwrapList returns the only element of a ShardedObject's list.
func unwrapList(v pyobj.Value) pyobj.Value {
	switch l := v.(type) {
	case *pyobj.List:
		if len(l.Items) == 1 {
			return l.Items[0]
		}
	}
	return v
}

// bucketTensor is one saved bucket state.
type bucketTensor struct {
	t     *dcp.Tensor
	state string
}

// dpGroup is the bucketed state of one model-parallel rank (TP x PP
// domain): buckets by gbuf and bucket index.
type dpGroup struct {
	sub      int // sub-optimizer: 0 dense (or all), 1 expert-parallel
	idx      int
	gbufs    map[int]map[int][]bucketTensor
	dtypes   map[int]dtype.DType // gbuf -> param dtype, from the key's "(param dtype, grad dtype)"
	unpadded pyobj.Value
	optim    pyobj.Value
	where    map[string]string // value name -> item, for messages
}

// dpReshardable reads the per-bucket flat tensors of the distributed
// optimizer and re-derives DDP's parameter layout per bucket.
func (r *distReader) dpReshardable() error {
	subs, err := r.dpGroups()
	if err != nil {
		return err
	}
	if err := r.dpDomains(subs); err != nil {
		return err
	}
	var optims []pyobj.Value
	for sub, groups := range subs {
		idx := make([]int, 0, len(groups))
		for i := range groups {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for want, i := range idx {
			if i != want {
				return fmt.Errorf("%s: optimizer state of sub-optimizer %d's dp_group_idx_%d is missing", r.dir, sub, want)
			}
		}
		if len(idx) == 0 {
			continue
		}
		if groups[0].optim == nil {
			return fmt.Errorf("%s: no dp_group_idx_0.optimizer item (param groups, step) for sub-optimizer %d", r.dir, sub)
		}
		optims = append(optims, groups[0].optim)
		for _, i := range idx {
			if err := r.mapGroup(groups[i]); err != nil {
				return err
			}
		}
	}
	if err := r.groupsStep(r.dir+" dp_group_idx_0.optimizer", optims...); err != nil {
		return err
	}
	for _, name := range r.order {
		if p := r.params[name]; len(p.states) == 0 && !isBuffer(name) {
			return fmt.Errorf("%s: no optimizer bucket holds %s", r.dir, name)
		}
	}
	return nil
}

// dpGroups collects the bucket tensors and the per_bucket_numel_unpadded
// and optimizer items of every dp_group_idx domain, per sub-optimizer.
func (r *distReader) dpGroups() ([]map[int]*dpGroup, error) {
	// Sub-optimizer 0 (or the only one) holds the dense parameters, 1 the
	// expert-parallel ones (MoE with EP > 1), each keyed by its own domains.
	subs := []map[int]*dpGroup{{}, {}}
	get := func(sub, i int) *dpGroup {
		if subs[sub][i] == nil {
			subs[sub][i] = &dpGroup{sub: sub, idx: i, gbufs: map[int]map[int][]bucketTensor{}, dtypes: map[int]dtype.DType{}, where: map[string]string{}}
		}
		return subs[sub][i]
	}
	for _, t := range r.c.Tensors {
		sub, key, _ := optKey(t.Key)
		if !strings.HasPrefix(key, bucketsPre) {
			continue
		}
		if sub > 1 {
			return nil, fmt.Errorf("%s: %q: bucketed state of a third sub-optimizer, which ucp does not read", r.dir, t.Key)
		}
		m := reBucket.FindStringSubmatch(key)
		if m == nil {
			return nil, fmt.Errorf("%s: %q: an optimizer.distributed key ucp does not know", r.dir, t.Key)
		}
		nums, err := atois(m[1], m[2], m[4])
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", r.dir, t.Key, err)
		}
		gi, gb, bi := nums[0], nums[1], nums[2]
		if len(t.Size) != 1 {
			return nil, fmt.Errorf("%s: %q has shape %v; bucket state is 1-D", r.dir, t.Key, t.Size)
		}
		g := get(max(sub, 0), gi)
		pd, ok := bucketDType(m[3])
		if !ok {
			return nil, fmt.Errorf("%s: %q: dtype key %q is not \"(torch.<param dtype>, torch.<grad dtype>)\"", r.dir, t.Key, m[3])
		}
		if old, seen := g.dtypes[gb]; seen && old != pd {
			return nil, fmt.Errorf("%s: %q: gbuf_idx_%d holds %v and %v parameters", r.dir, t.Key, gb, old, pd)
		}
		g.dtypes[gb] = pd
		if g.gbufs[gb] == nil {
			g.gbufs[gb] = map[int][]bucketTensor{}
		}
		g.gbufs[gb][bi] = append(g.gbufs[gb][bi], bucketTensor{t: t, state: m[5]})
	}
	for _, v := range r.c.Values {
		sub, key, _ := optKey(v.Key)
		m := reGroupV.FindStringSubmatch(key)
		if m == nil || sub > 1 {
			continue
		}
		nums, err := atois(m[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", r.dir, v.Key, err)
		}
		g := get(max(sub, 0), nums[0])
		g.where[m[2]] = filepath.Join(r.dir, v.Item) // the file and byte range of the item
		switch m[2] {
		case "per_bucket_numel_unpadded":
			g.unpadded = unwrapList(v.V)
		case "optimizer":
			g.optim = unwrapList(v.V)
		}
	}
	return subs, nil
}

// dpDomains derives PP (and EP) from the number of dp_group_idx domains
// and checks them against the args.
func (r *distReader) dpDomains(subs []map[int]*dpGroup) error {
	n := len(subs[0])
	if n%r.tp != 0 {
		return fmt.Errorf("%s: %d dp_group_idx domains do not split over tensor parallel %d", r.dir, n, r.tp)
	}
	pp := n / r.tp
	if r.pp != 0 && r.pp != pp {
		return fmt.Errorf("%s: args.pipeline_model_parallel_size is %d but the optimizer state has %d = TP %d x PP %d domains", r.dir, r.pp, n, r.tp, pp)
	}
	r.pp = pp
	if err := r.pipelineChunks(); err != nil {
		return err
	}
	// Expert domains are the ranks of the expert TP x EP x PP group.
	if m := len(subs[1]); m > 0 {
		U := max(r.etp, 1)
		if m%(U*pp) != 0 {
			return fmt.Errorf("%s: %d expert dp_group_idx domains do not split over expert TP %d x PP %d", r.dir, m, U, pp)
		}
		if ep := m / (U * pp); r.ep > 1 && ep != r.ep {
			return fmt.Errorf("%s: args.expert_model_parallel_size is %d but the expert optimizer state has %d = expert TP %d x EP %d x PP %d domains", r.dir, r.ep, m, U, ep, pp)
		} else {
			r.ep = ep
		}
	} else if r.ep > 1 {
		return fmt.Errorf("%s: args.expert_model_parallel_size is %d but no bucketed state of an expert optimizer (chained_1) is saved", r.dir, r.ep)
	}
	return nil
}

// pipelineChunks sets r.split, the layers of every (stage, model chunk)
// the saving run built: args' virtual pipeline size and uneven split
// (--decoder-first/last-pipeline-num-layers, or TransformerConfig's
// num_layers_in_first/last_pipeline_stage), else PP even stages of one
// chunk. DDP keeps one set of grad buffers per model chunk, numbered on
// from the previous chunk's (distrib_optimizer.py gbuf_ranges over
// model_chunks, core_v0.19.0).
func (r *distReader) pipelineChunks() error {
	var layers int64
	for _, p := range r.params {
		layers = max(layers, layerOf(p.name)+1)
	}
	if n, err := r.argInt("num_layers", layers); err != nil {
		return err
	} else if n != layers {
		return fmt.Errorf("%s: args.num_layers is %d but decoder layers 0..%d are saved", r.dir, n, layers-1)
	}
	if r.args != nil {
		if v, ok := r.args.Attr("pipeline_model_parallel_layout"); ok && v != nil {
			return fmt.Errorf("%s: args.pipeline_model_parallel_layout is set (%s): the bucketed optimizer state of a custom pipeline layout is not read", r.dir, pyobj.Repr(v))
		}
	}
	vpp, err := r.argInt("virtual_pipeline_model_parallel_size", 1)
	if err != nil {
		return err
	}
	var first, last int64
	for _, n := range [][2]string{{"decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"}, {"decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage"}} {
		v := &first
		if n[0] == "decoder_last_pipeline_num_layers" {
			v = &last
		}
		for _, name := range n {
			if *v == 0 {
				if *v, err = r.argInt(name, 0); err != nil {
					return err
				}
			}
		}
	}
	r.split, err = pipelineSplit(int(layers), r.pp, int(max(vpp, 1)), int(first), int(last))
	if err != nil {
		return fmt.Errorf("%s: the saving run's pipeline split (args): %w", r.dir, err)
	}
	return nil
}

// atois parses the numbers of a key (dp_group_idx_G, gbuf_idx_i ...).
func atois(ss ...string) ([]int, error) {
	out := make([]int, len(ss))
	for i, s := range ss {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("index %q: %w", s, err)
		}
		out[i] = n
	}
	return out, nil
}

// expertOf returns the global expert number of an expert parameter, or -1.
func expertOf(name string) int {
	_, after, ok := strings.Cut(name, expertName)
	if !ok {
		return -1
	}
	num, _, _ := strings.Cut(after, ".")
	e, err := strconv.Atoi(num)
	if err != nil {
		return -1
	}
	return e
}

// numExperts is the number of experts per layer (0 without MoE).
func (r *distReader) numExperts() int {
	n := 0
	for _, name := range r.order {
		n = max(n, expertOf(name)+1)
	}
	return n
}

// stageParam is one parameter of a pipeline stage in named_parameters order.
type stageParam struct {
	p      *distParam // nil for the tied output layer copy (not atomic)
	local  []int64
	shard  fragment.Shard
	shared bool
	dtype  dtype.DType // the saved model tensor's dtype: DDP's buffer
}

// Per-layer parameter order of the two layer specs: the local spec
// registers input_layernorm before self_attention (whose linear_proj
// precedes linear_qkv); TE fuses the norms into the next linear. torch_dist
// keys use TE names for both (the local spec's sharded_state_dict_keys_map).
var (
	inputNorm   = []string{"self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias"}
	linearProj  = []string{"self_attention.linear_proj.weight", "self_attention.linear_proj.bias"}
	layerCommon = []string{
		"self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
		"self_attention.q_layernorm.weight", "self_attention.q_layernorm.bias",
		"self_attention.k_layernorm.weight", "self_attention.k_layernorm.bias",
		"mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
		"mlp.router.weight", expertName + "#",
		"mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias",
	}
	layerOrderLocal = slices.Concat(inputNorm, linearProj, layerCommon)
	layerOrderTE    = slices.Concat(linearProj, inputNorm, layerCommon)
)

// Parameters of one expert (SequentialMLP's local MLP) in registration order.
var expertOrder = []string{"linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias"}

// layerPlace is the sort key of a layer-relative name in named_parameters
// order: its place in the layer order; experts by number, then their own
// order.
func layerPlace(rest string, order []string) ([3]int, bool) {
	if after, ok := strings.CutPrefix(rest, expertName); ok {
		num, sub, ok := strings.Cut(after, ".")
		e, err := strconv.Atoi(num)
		i, j := slices.Index(order, expertName+"#"), slices.Index(expertOrder, sub)
		if !ok || err != nil || i < 0 || j < 0 {
			return [3]int{}, false
		}
		return [3]int{i, e, j}, true
	}
	i := slices.Index(order, rest)
	return [3]int{i, 0, 0}, i >= 0
}

// tpShard is the shard TP rank tp holds of p (its local tensor and where
// it lies in the atomic tensor), as Megatron's layers split it.
func (r *distReader) tpShard(p *distParam, tp int) (fragment.Shard, error) {
	full := p.shape
	var pat fragment.Pattern
	switch p.k {
	case kindRep:
		return fragment.Shard{Shape: clone(full), Replica: tp}, nil
	case kindVocab, kindQKV, kindCol:
		pat = fragment.Split{Dim: 0}
	case kindRow:
		pat = fragment.Split{Dim: 1}
	case kindSwiGLU:
		sp, err := fragment.EqualSubParams(0, 2, full[0], r.cut(p))
		if err != nil {
			return fragment.Shard{}, fmt.Errorf("%s: %s: %w", r.dir, p.name, err)
		}
		pat = sp
	default:
		return fragment.Shard{}, fmt.Errorf("%s: %s: unknown tensor-parallel layout, so its place in the optimizer buckets cannot be derived", r.dir, p.name)
	}
	// A domain's rank tp is a TP rank (dense) or an expert-TP rank (expert
	// optimizer); a parameter of the other kind is listed but not held
	// (mapGbuf's include), so its rank is only kept in range.
	sh, err := pat.Shard(full, tp%r.cut(p), r.cut(p))
	if err != nil {
		return fragment.Shard{}, fmt.Errorf("%s: %s: %w", r.dir, p.name, err)
	}
	if p.k == kindVocab && r.vocab > 0 && r.vocab < full[0] {
		sh = fragment.StripPad(sh, full, 0, r.vocab)
		if len(sh.Maps) == 0 {
			to, size := make([]int64, len(full)), clone(full)
			to[0], size[0] = r.vocab, 0
			sh.Maps = []fragment.BoxMap{{From: make([]int64, len(full)), To: to, Size: size}}
		}
	}
	sh.Replica = 0
	return sh, nil
}

// chunkParams lists the parameters of model chunk v of pipeline stage pp
// in named_parameters order (GPTModel: embedding, decoder layers, final
// norm, output layer) with the given per-layer order: the embedding on the
// first chunk of the first stage, the output on the last chunk of the last
// (pre_process / post_process with a virtual pipeline).
func (r *distReader) chunkParams(pp, v, tp int, layerOrder []string) ([]stageParam, error) {
	V := len(r.split[pp])
	first, last := pp == 0 && v == 0, pp == r.pp-1 && v == V-1
	tied := r.tensor("output_layer.weight") == nil
	var out []stageParam
	add := func(name string, shared bool) error {
		p := r.params[name]
		if p == nil {
			return nil
		}
		sh, err := r.tpShard(p, tp)
		if err != nil {
			return err
		}
		out = append(out, stageParam{p: p, local: sh.Shape, shard: sh, shared: shared, dtype: p.t.DType})
		return nil
	}
	known := map[string]bool{}
	for _, n := range []string{"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
		"decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight"} {
		known[n] = true
	}
	for _, n := range r.order {
		if layerOf(n) < 0 && !known[n] {
			return nil, fmt.Errorf("%s: %s: a parameter outside GPTModel's embedding, decoder and output layer, so the optimizer bucket layout cannot be derived", r.dir, n)
		}
	}
	if first {
		if err := add("embedding.word_embeddings.weight", tied && !last); err != nil {
			return nil, err
		}
		if err := add("embedding.position_embeddings.weight", false); err != nil {
			return nil, err
		}
	}
	for l := int64(r.split[pp][v][0]); l < int64(r.split[pp][v][0]+r.split[pp][v][1]); l++ {
		prefix := fmt.Sprintf("decoder.layers.%d.", l)
		var names []string
		keys := map[string][3]int{}
		for _, n := range r.order {
			if rest, ok := strings.CutPrefix(n, prefix); ok && !isBuffer(n) { // buffers are in no grad buffer
				k, known := layerPlace(rest, layerOrder)
				if !known {
					return nil, fmt.Errorf("%s: %s: a layer parameter whose place in named_parameters ucp does not know, so the optimizer bucket layout cannot be derived", r.dir, n)
				}
				keys[n] = k
				names = append(names, n)
			}
		}
		sort.SliceStable(names, func(i, j int) bool {
			a, b := keys[names[i]], keys[names[j]]
			return slices.Compare(a[:], b[:]) < 0
		})
		for _, n := range names {
			if err := add(n, false); err != nil {
				return nil, err
			}
		}
	}
	if last {
		for _, n := range []string{"decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight"} {
			if err := add(n, false); err != nil {
				return nil, err
			}
		}
		if tied && !first {
			// The tied output layer copy: in the buffer (a shared embedding)
			// but not atomic.
			emb := r.params["embedding.word_embeddings.weight"]
			if emb == nil {
				return nil, fmt.Errorf("%s: tied embeddings but no embedding.word_embeddings.weight", r.dir)
			}
			sh, err := r.tpShard(emb, tp)
			if err != nil {
				return nil, err
			}
			out = append(out, stageParam{local: sh.Shape, shared: true, dtype: emb.t.DType})
		}
	}
	return out, nil
}

// bucketDType reads the parameter dtype of a bucket key's
// "(torch.bfloat16, torch.float32)".
func bucketDType(s string) (dtype.DType, bool) {
	in, ok := strings.CutPrefix(s, "(")
	if !ok {
		return dtype.Invalid, false
	}
	pd, _, ok := strings.Cut(in, ",")
	if !ok {
		return dtype.Invalid, false
	}
	return dtype.FromTorchName(strings.TrimSpace(pd))
}

// bucketSizes reads per_bucket_numel_unpadded of one gbuf:
// [{(param dtype, grad dtype): [n_0, n_1, ...]}, ...] per gbuf.
func bucketSizes(v pyobj.Value, gbuf int) ([]int64, bool) {
	d := pyobj.NewDec("", v) // the caller names the file and shows v
	e := d.Index(gbuf)
	m := e.AsDict()
	if m == nil || m.Len() != 1 {
		return nil, false
	}
	k, _ := m.Item(0)
	sizes := e.Key(k).AsInts()
	return sizes, d.Err() == nil
}

// layoutFor places the stage's parameters in buckets walking them in
// reverse with 64-element alignment (core >= 0.8), closing a bucket where
// per_bucket_numel_unpadded says (the bucket size is not saved) or at a
// shared embedding; it fails when the walk does not reproduce the sizes.
func layoutFor(ps []stageParam, unpadded []int64) (layoutResult, string) {
	res := layoutResult{bucket: make([]int, len(ps)), start: make([]int64, len(ps))}
	var rel int64
	n := 0
	closeAt := func(e int64) string {
		b := len(res.unpadded)
		if b >= len(unpadded) || unpadded[b] != e {
			return fmt.Sprintf("bucket %d would end at %d", b, e)
		}
		res.unpadded = append(res.unpadded, e)
		rel, n = 0, 0
		return ""
	}
	for i := len(ps) - 1; i >= 0; i-- {
		rel = pad(rel, rulesHead.align)
		if ps[i].shared && n > 0 {
			if e := closeAt(rel); e != "" {
				return res, e
			}
		}
		end := rel + torchfile.Numel(ps[i].local)
		res.bucket[i], res.start[i] = len(res.unpadded), rel
		n++
		b := len(res.unpadded)
		if ps[i].shared || (b < len(unpadded) && end >= unpadded[b]) {
			if e := closeAt(end); e != "" {
				return res, e
			}
		} else {
			rel = end
		}
	}
	if n > 0 {
		if e := closeAt(rel); e != "" {
			return res, e
		}
	}
	if len(res.unpadded) != len(unpadded) {
		return res, fmt.Sprintf("%d buckets", len(res.unpadded))
	}
	return res, ""
}

// boundaries returns the chunk starts and ends of a bucket tensor.
func boundaries(t *dcp.Tensor) map[int64]bool {
	out := map[int64]bool{}
	for _, ch := range t.Chunks {
		out[ch.Offsets[0]] = true
		out[ch.Offsets[0]+ch.Sizes[0]] = true
	}
	return out
}

// mapGroup maps the buckets of one TP x PP domain (dp_group_idx = tp +
// TP*pp, the rank in Megatron's model-parallel group).
func (r *distReader) mapGroup(g *dpGroup) error {
	if g.unpadded == nil {
		return fmt.Errorf("%s: no optimizer.distributed.dp_group_idx_%d.per_bucket_numel_unpadded: the bucket sizes are needed to place parameters", r.dir, g.idx)
	}
	for gb := 0; gb < len(g.gbufs); gb++ {
		if g.gbufs[gb] == nil {
			return fmt.Errorf("%s: dp_group_idx_%d: gbuf_idx_%d is missing (%d grad buffers saved)", r.dir, g.idx, gb, len(g.gbufs))
		}
		if err := r.mapGbuf(g, gb); err != nil {
			return err
		}
	}
	return nil
}

// mapGbuf maps one grad buffer: the stage's parameters of its dtype.
func (r *distReader) mapGbuf(g *dpGroup, gb int) error {
	tp, pp := g.idx%r.tp, g.idx/r.tp
	// Which of the stage's parameters this domain's buffers hold: with EP >
	// 1 the experts (of EP rank ep) are in the expert optimizer's buffers
	// only; domain tp + TP*(ep + EP*pp) of the TP x EP x PP group.
	include := func(sp stageParam) bool { return true }
	if r.ep > 1 || r.etp > 0 && r.etp != r.tp {
		ep, U := 0, max(r.etp, 1)
		if g.sub == 1 {
			tp, ep, pp = g.idx%U, g.idx/U%r.ep, g.idx/(U*r.ep)
		}
		nle := r.numExperts() / r.ep
		include = func(sp stageParam) bool {
			e := -1
			if sp.p != nil {
				e = expertOf(sp.p.name)
			}
			if g.sub == 0 {
				return e < 0
			}
			return e >= ep*nle && e < (ep+1)*nle
		}
	}
	bk := g.gbufs[gb]
	where := g.where["per_bucket_numel_unpadded"]
	unpadded, ok := bucketSizes(g.unpadded, gb)
	if !ok {
		return fmt.Errorf("%s (dp_group_idx_%d.per_bucket_numel_unpadded): holds %s, not [{dtypes: [sizes]}] with grad buffer %d", where, g.idx, pyobj.Repr(g.unpadded), gb)
	}
	if len(unpadded) != len(bk) {
		return fmt.Errorf("%s: dp_group_idx_%d.gbuf_idx_%d has %d buckets saved but per_bucket_numel_unpadded lists %v", where, g.idx, gb, len(bk), unpadded)
	}
	ref, err := r.bucketRefs(g, bk, unpadded)
	if err != nil {
		return err
	}
	type fit struct {
		lay layoutResult
		ps  []stageParam
	}
	var fits []fit
	var tried []string
	for _, spec := range []struct {
		name  string
		order []string
	}{{"local spec", layerOrderLocal}, {"Transformer Engine spec", layerOrderTE}} {
		cand, err := r.gbufParams(g, gb, pp, tp, spec.order, include)
		if err != nil {
			return err
		}
		l, bad := layoutFor(cand, unpadded)
		if bad == "" {
			// Each parameter's range must be a run of saved pieces: DCP
			// chunks are the parameters and the padding between them.
			for i, sp := range cand {
				bd := boundaries(ref[l.bucket[i]])
				if !bd[l.start[i]] || !bd[l.start[i]+torchfile.Numel(sp.local)] {
					bad = fmt.Sprintf("a parameter of %v elements at %d does not match the saved pieces", sp.local, l.start[i])
					break
				}
			}
		}
		if bad != "" {
			tried = append(tried, fmt.Sprintf("%s order: %s", spec.name, bad))
			continue
		}
		fits = append(fits, fit{l, cand})
	}
	if len(fits) == 0 {
		return fmt.Errorf("%s: optimizer.distributed.dp_group_idx_%d.gbuf_idx_%d (tensor-parallel rank %d, pipeline stage %d, %v parameters): no DDP bucket layout of its parameters matches per_bucket_numel_unpadded %v and the saved pieces (%s)",
			where, g.idx, gb, tp, pp, g.dtypes[gb], unpadded, strings.Join(tried, "; "))
	}
	if len(fits) > 1 && !sameLayout(fits[0].lay, fits[0].ps, fits[1].lay, fits[1].ps) {
		return fmt.Errorf("%s: dp_group_idx_%d: the local and Transformer Engine layer orders both fit the buckets but place parameters differently; cannot tell the layer spec", where, g.idx)
	}
	r.placeBuckets(g, gb, tp, fits[0].lay, fits[0].ps, bk)
	return nil
}

// gbufParams are the parameters grad buffer gb of domain (tp, pp) holds:
// DDP groups a model chunk's parameters into buffers by dtype, and the
// chunks' buffers are numbered in chunk order, so gb is in chunk v when the
// earlier chunks have fewer buffers (distinct dtypes) than gb.
func (r *distReader) gbufParams(g *dpGroup, gb, pp, tp int, order []string, include func(stageParam) bool) ([]stageParam, error) {
	off := 0
	for v := range r.split[pp] {
		all, err := r.chunkParams(pp, v, tp, order)
		if err != nil {
			return nil, err
		}
		var dts []dtype.DType
		for _, sp := range all {
			if include(sp) && !slices.Contains(dts, sp.dtype) {
				dts = append(dts, sp.dtype)
			}
		}
		if gb >= off+len(dts) {
			off += len(dts)
			continue
		}
		if !slices.Contains(dts, g.dtypes[gb]) {
			return nil, fmt.Errorf("%s: dp_group_idx_%d.gbuf_idx_%d holds %v parameters, but model chunk %d of pipeline stage %d has %v ones", r.dir, g.idx, gb, g.dtypes[gb], v, pp, dts)
		}
		var cand []stageParam
		for _, sp := range all {
			if sp.dtype == g.dtypes[gb] && include(sp) {
				cand = append(cand, sp)
			}
		}
		return cand, nil
	}
	return nil, fmt.Errorf("%s: dp_group_idx_%d.gbuf_idx_%d: the %d model chunks of pipeline stage %d have only %d grad buffers", r.dir, g.idx, gb, len(r.split[pp]), pp, off)
}

// bucketRefs checks each saved bucket's states against
// per_bucket_numel_unpadded and returns its param (fp32) tensor, whose
// chunks mark the parameters.
func (r *distReader) bucketRefs(g *dpGroup, bk map[int][]bucketTensor, unpadded []int64) ([]*dcp.Tensor, error) {
	ref := make([]*dcp.Tensor, len(bk))
	for b := range unpadded {
		for _, bt := range bk[b] {
			if bt.t.Size[0] != unpadded[b] {
				return nil, fmt.Errorf("%s: %q has %d elements but per_bucket_numel_unpadded says %d", r.dir, bt.t.Key, bt.t.Size[0], unpadded[b])
			}
			if bt.state == "param" {
				ref[b] = bt.t
			}
		}
		if ref[b] == nil {
			return nil, fmt.Errorf("%s: dp_group_idx_%d bucket %d has no param (fp32 main parameter) tensor", r.dir, g.idx, b)
		}
	}
	return ref, nil
}

// placeBuckets adds the fragments of every parameter of the layout to its
// states: the pieces of each bucket state's chunks within the parameter.
func (r *distReader) placeBuckets(g *dpGroup, gb, tp int, lay layoutResult, ps []stageParam, bk map[int][]bucketTensor) {
	for i, sp := range ps {
		if sp.p == nil {
			continue
		}
		b := lay.bucket[i]
		lo := lay.start[i]
		numel := torchfile.Numel(sp.local)
		for _, bt := range bk[b] {
			sn := stateName(bt.state)
			st := sp.p.states[sn]
			if st == nil {
				st = &fragment.State{Name: sn}
				sp.p.states[sn] = st
			}
			sh := sp.shard
			if sp.p.k == kindRep {
				sh.Replica = tp
			}
			sh.Label = fmt.Sprintf("dp_group_idx_%d.gbuf_idx_%d", g.idx, gb)
			st.Shards = append(st.Shards, sh)
			si := len(st.Shards) - 1
			for _, ch := range bt.t.Chunks {
				if ch.Copy > 0 {
					continue
				}
				s, e := max(lo, ch.Offsets[0]), min(lo+numel, ch.Offsets[0]+ch.Sizes[0])
				if s >= e {
					continue
				}
				st.Frags = append(st.Frags, fragment.Fragment{Shard: si, LocalStart: s - lo, Len: e - s, Src: ch.Ref, SrcStart: s - ch.Offsets[0]})
			}
		}
	}
}

func sameLayout(a layoutResult, ap []stageParam, b layoutResult, bp []stageParam) bool {
	pos := map[*distParam][2]int64{}
	for i, sp := range ap {
		pos[sp.p] = [2]int64{int64(a.bucket[i]), a.start[i]}
	}
	for i, sp := range bp {
		if pos[sp.p] != [2]int64{int64(b.bucket[i]), b.start[i]} {
			return false
		}
	}
	return true
}
