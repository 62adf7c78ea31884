package deepspeed

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// DeepSpeed-MoE checkpoints (FORMAT.md, "DeepSpeed-MoE"): the model state
// holds the non-expert weights and no param_shapes, every expert of every
// MoE layer has its own layer_L_expert_E model-state file, and the ZeRO
// optimizer files partition the expert groups over the expert-data-parallel
// group instead of the whole data-parallel one.

var (
	reExpertFile    = regexp.MustCompile(`^layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt$`)
	reOldExpertFile = regexp.MustCompile(`^expert_(\d+)_mp_rank_(\d+)_model_states\.pt$`)
	reExpGroup      = regexp.MustCompile(`^ep_size_(\d+)$`)
)

const (
	moeGate    = ".deepspeed_moe.gate.wg.weight"
	moeExperts = ".deepspeed_moe.experts.deepspeed_experts."
)

// isMoE reports whether a decoded mp_rank model state was saved by
// DeepSpeed's _save_moe_checkpoint (it records num_experts).
func isMoE(f *torchfile.File) bool {
	switch d := f.Root.(type) {
	case *pyobj.Dict:
		_, has := d.Get("num_experts")
		return has
	}
	return false
}

// moeLayer is one deepspeed.moe.layer.MoE module, in module order (the
// moe_layer_id of DeepSpeed's expert file names).
type moeLayer struct {
	head    string // module name, e.g. blocks.0.moe
	experts int
}

// partSet is the ranks that partition one flat group of one expert-parallel
// rank, in partition order.
type partSet struct {
	ep    int // expert-parallel rank (-1: a dense group)
	ranks []int
}

func indexMoE(ctx context.Context, dir, tag string, files *Files, model *torchfile.File, opt Options) (*fragment.Table, error) {
	if len(files.Model) != 1 {
		return nil, fmt.Errorf("%s: DeepSpeed-MoE with %d model-parallel ranks (tensor or pipeline parallelism) is not read yet", dir, len(files.Model))
	}
	md, module, layers, D, err := moeModel(model)
	if err != nil {
		return nil, err
	}
	if len(files.Optim) == 0 {
		return nil, fmt.Errorf("%s: a DeepSpeed-MoE checkpoint without ZeRO optimizer files (its optimizer is in expp_rank_*_optim_states.pt): not read yet; ucp reads DeepSpeed-MoE with ZeRO-1/2", dir)
	}
	experts, err := expertFiles(opt.Scan, dir, layers)
	if err != nil {
		return nil, err
	}
	shapes, lp, lpFile, names, err := moeTensors(ctx, model, md, module, layers, experts, opt)
	if err != nil {
		return nil, err
	}
	optims, err := moeOptims(ctx, dir, files, D, opt)
	if err != nil {
		return nil, err
	}
	o0 := optims[[2]int{0, 0}]
	od, bd := pyobj.NewDec(o0.path, o0.root), pyobj.NewDec(o0.path, o0.base)
	dataFirst := od.Dict("ds_config").OptBool("use_data_before_expert_parallelism", false)
	groups := bd.List("param_groups")
	if err := od.Err(); err != nil {
		return nil, err
	}
	if err := bd.Err(); err != nil {
		return nil, err
	}
	if len(groups) != len(o0.groups) {
		return nil, fmt.Errorf("%s: %d param groups but %d flat groups", o0.path, len(groups), len(o0.groups))
	}

	r, err := ReadRules(md)
	if err != nil {
		return nil, err
	}
	b := &builder{T: 1, P: 1, D: D, optims: optims, rules: r,
		table: &fragment.Table{Format: "deepspeed", Source: dir, Tag: tag}}
	params := map[string]*fragment.Param{}
	EP, err := b.moeGroups(o0, groups, dataFirst, layers, shapes, params)
	if err != nil {
		return nil, err
	}
	// Parameters in module order, experts in global order; tensors no
	// optimizer group holds (frozen parameters, buffers) are kept whole in
	// the dtype they were saved in.
	for _, n := range names {
		if p := params[n]; p != nil {
			b.table.Params = append(b.table.Params, p)
			continue
		}
		if err := b.addWhole(n, []*torchfile.Tensor{lp[n]}, []string{lpFile[n]}, false); err != nil {
			return nil, err
		}
	}
	for n := range params {
		if _, ok := shapes[n]; !ok {
			return nil, fmt.Errorf("%s: the optimizer holds %s, which neither the model state nor an expert file has", o0.path, n)
		}
	}

	b.table.DType = moduleDType(md)
	b.table.Degrees = fragment.Degrees{TP: 1, PP: 1, DP: D, EP: EP, ZeRO: o0.stage}
	if b.table.Optimizer, err = universalOptimizerState(o0, D); err != nil {
		return nil, err
	}
	counts := make([]pyobj.Value, len(o0.groups))
	for g, gr := range o0.groups {
		counts[g] = gr.count
	}
	b.table.Optimizer.Set("partition_count", &pyobj.List{Items: counts})
	copies := []string{model.Name}
	for l, ly := range layers {
		for e := 0; e < ly.experts; e++ {
			copies = append(copies, experts[[2]int{l, e}])
		}
	}
	for _, p := range copies {
		cf, err := fragment.NewCopyFile(filepath.Base(p), p)
		if err != nil {
			return nil, err
		}
		b.table.CopyFiles = append(b.table.CopyFiles, cf)
	}
	topo := "expert-parallel rank = rank % EP (DeepSpeed's default E + D topology)"
	if dataFirst {
		topo = "expert-parallel rank = rank / (DP/EP) (use_data_before_expert_parallelism)"
	}
	b.table.Notes = append(b.table.Notes, fmt.Sprintf("DeepSpeed-MoE: %d MoE layers, expert parallelism %d x expert data parallelism %d; %s; "+
		"experts named by their global number, as DeepSpeed's layer_*_expert_* files name them", len(layers), EP, D/EP, topo))
	return b.table, nil
}

// moeGroups places the parameters of every param group: a dense group
// over all D ranks, an expert group (moe, named ep_size_<N>) over the rank
// sets of each expert-parallel rank; it returns the expert parallelism.
func (b *builder) moeGroups(o0 *optimState, groups []pyobj.Dec, dataFirst bool, layers []moeLayer, shapes map[string][]int64, params map[string]*fragment.Param) (int, error) {
	D := b.D
	EP := 1
	for g, gv := range groups {
		moe := gv.OptBool("moe", false)
		gname := gv.OptStr("name", "")
		if err := gv.Err(); err != nil {
			return 0, err
		}
		count := int(o0.groups[g].count)
		sets, ep := []partSet{{ep: -1}}, 1
		if moe {
			m := reExpGroup.FindStringSubmatch(gname)
			if m == nil {
				return 0, fmt.Errorf("%s: MoE param group %d is named %q, not ep_size_<N> as DeepSpeed names expert groups", o0.path, g, gname)
			}
			n, _ := strconv.Atoi(m[1])
			if n <= 0 || D%n != 0 || D/n != count {
				return 0, fmt.Errorf("%s: MoE param group %d (%s) is partitioned %d ways; %d data-parallel ranks at expert parallelism %d need %d", o0.path, g, gname, count, D, n, D/max(n, 1))
			}
			EP, ep = max(EP, n), n
			sets = expertSets(D, n, dataFirst)
		} else {
			if count != D {
				return 0, fmt.Errorf("%s: param group %d is partitioned %d ways but there are %d data-parallel ranks", o0.path, g, count, D)
			}
			for dp := 0; dp < D; dp++ {
				sets[0].ranks = append(sets[0].ranks, dp)
			}
		}
		for _, s := range sets {
			if err := b.moeGroup(g, s, ep, layers, shapes, params); err != nil {
				return 0, err
			}
		}
	}
	return EP, nil
}

// moeModel reads the model state of a DeepSpeed-MoE checkpoint: its
// module, its MoE layers in module order (their gates are non-expert
// weights of the module state, saved in module order) with their expert
// counts, and the data-parallel size.
func moeModel(model *torchfile.File) (md, module pyobj.Dec, layers []moeLayer, D int, err error) {
	md = pyobj.NewDec(model.Name, model.Root)
	module = md.Dict("module")
	nums := md.List("num_experts")
	D = int(md.Int("dp_world_size"))
	if err := md.Err(); err != nil {
		return md, module, nil, 0, err
	}
	for _, it := range module.Items() {
		if h, ok := strings.CutSuffix(it.Key, moeGate); ok {
			layers = append(layers, moeLayer{head: h})
		}
	}
	if len(layers) != len(nums) {
		return md, module, nil, 0, fmt.Errorf("%s: num_experts lists %d MoE layers but the module holds %d MoE gates (*%s)", model.Name, len(nums), len(layers), moeGate)
	}
	for i := range layers {
		layers[i].experts = int(nums[i].AsInt())
	}
	if err := md.Err(); err != nil {
		return md, module, nil, 0, err
	}
	return md, module, layers, D, nil
}

// moeTensors decodes the expert files and lists every tensor of the model
// (module order, experts in global order) with its shape, its saved
// tensor and the file holding it.
func moeTensors(ctx context.Context, model *torchfile.File, md, module pyobj.Dec, layers []moeLayer, experts map[[2]int]string, opt Options) (
	shapes map[string][]int64, lp map[string]*torchfile.Tensor, lpFile map[string]string, names []string, err error) {
	var paths []string
	var keys [][2]int
	for l, ly := range layers {
		for e := 0; e < ly.experts; e++ {
			paths = append(paths, experts[[2]int{l, e}])
			keys = append(keys, [2]int{l, e})
		}
	}
	decoded, err := opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	shapes = map[string][]int64{} // global name -> shape
	lp = map[string]*torchfile.Tensor{}
	lpFile = map[string]string{}
	for _, it := range module.Items() {
		t := pyobj.As[*torchfile.Tensor](it.Dec, "tensor")
		shapes[it.Key], lp[it.Key], lpFile[it.Key] = t.Shape, t, model.Name
		names = append(names, it.Key)
	}
	if err := md.Err(); err != nil {
		return nil, nil, nil, nil, err
	}
	for i, f := range decoded {
		l, e := keys[i][0], keys[i][1]
		prefix := layers[l].head + moeExperts + strconv.Itoa(e) + "."
		dec := pyobj.NewDec(f.Name, f.Root)
		items := dec.Items()
		if err := dec.Err(); err != nil {
			return nil, nil, nil, nil, err
		}
		if len(items) == 0 {
			return nil, nil, nil, nil, fmt.Errorf("%s: MoE layer %d (%s) expert %d: the expert file holds no tensors", f.Name, l, layers[l].head, e)
		}
		for _, it := range items {
			if !strings.HasPrefix(it.Key, prefix) {
				return nil, nil, nil, nil, fmt.Errorf("%s: holds %s, not a weight of MoE layer %d (%s) expert %d (%s*)", f.Name, it.Key, l, layers[l].head, e, prefix)
			}
			t := pyobj.As[*torchfile.Tensor](it.Dec, "tensor")
			if err := dec.Err(); err != nil {
				return nil, nil, nil, nil, err
			}
			shapes[it.Key], lp[it.Key], lpFile[it.Key] = t.Shape, t, f.Name
			names = append(names, it.Key)
		}
	}

	return shapes, lp, lpFile, names, nil
}

// moeOptims decodes the D optimizer files (model-parallel rank 0) and
// checks that they come from one run.
func moeOptims(ctx context.Context, dir string, files *Files, D int, opt Options) (map[[2]int]*optimState, error) {
	var paths []string
	for dp := 0; dp < D; dp++ {
		p, ok := files.Optim[[2]int{dp, 0}]
		if !ok {
			return nil, fmt.Errorf("%s: missing rank file %s (%d data-parallel ranks)", dir, files.OptimName(dp, 0), D)
		}
		paths = append(paths, p)
	}
	if len(files.Optim) != D {
		var extra []string
		for k, p := range files.Optim {
			if k[0] >= D || k[1] > 0 {
				extra = append(extra, filepath.Base(p))
			}
		}
		sort.Strings(extra)
		return nil, fmt.Errorf("%s: unexpected rank files %v for %d data-parallel ranks", dir, extra, D)
	}
	decoded, err := opt.Decode.DecodeAll(ctx, paths, opt.Workers)
	if err != nil {
		return nil, err
	}
	optims := map[[2]int]*optimState{}
	for dp, f := range decoded {
		o, err := parseOptimState(f, dp, 0)
		if err != nil {
			return nil, err
		}
		if o.bf16opt {
			return nil, fmt.Errorf("%s: DeepSpeed-MoE with BF16_Optimizer is not read yet", o.path)
		}
		optims[[2]int{dp, 0}] = o
	}
	if err := checkRanks(dir, nil, optims, D, 1); err != nil {
		return nil, err
	}
	return optims, nil
}

// expertFiles finds layer_L_expert_E_mp_rank_00_model_states.pt for every
// expert of every MoE layer, and refuses missing and unexpected ones; it
// reads the tag folder's one listing (s).
func expertFiles(s *Scan, dir string, layers []moeLayer) (map[[2]int]string, error) {
	ents, err := s.readDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[[2]int]string{}
	var extra []string
	for _, e := range ents {
		n := e.Name()
		if reOldExpertFile.MatchString(n) {
			return nil, fmt.Errorf("%s: %s is an expert file of DeepSpeed's old layout (no layer number): not read", dir, n)
		}
		m := reExpertFile.FindStringSubmatch(n)
		if m == nil {
			continue
		}
		l, x, mp := Atoi(m[1]), Atoi(m[2]), Atoi(m[3])
		if mp != 0 || l >= len(layers) || x >= layers[l].experts {
			extra = append(extra, n)
			continue
		}
		k := [2]int{l, x}
		if prev, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: duplicated expert file: %s and %s are MoE layer %d expert %d", dir, filepath.Base(prev), n, l, x)
		}
		out[k] = filepath.Join(dir, n)
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, fmt.Errorf("%s: unexpected expert files %v (the model state lists %d MoE layers)", dir, extra, len(layers))
	}
	for l, ly := range layers {
		for x := 0; x < ly.experts; x++ {
			if _, ok := out[[2]int{l, x}]; !ok {
				return nil, fmt.Errorf("%s: MoE layer %d (%s) expert %d: missing file layer_%d_expert_%d_mp_rank_00_model_states.pt", dir, l, ly.head, x, l, x)
			}
		}
	}
	return out, nil
}

// expertSets are the expert-data-parallel groups of DeepSpeed's
// groups._create_expert_and_data_parallel (no pipeline or tensor
// parallelism), one per expert-parallel rank, in partition order.
func expertSets(D, EP int, dataFirst bool) []partSet {
	sets := make([]partSet, EP)
	for r := 0; r < D; r++ {
		e := r % EP // E + D: expert-parallel groups are runs of EP consecutive ranks
		if dataFirst {
			e = r / (D / EP)
		}
		sets[e].ep = e
		sets[e].ranks = append(sets[e].ranks, r)
	}
	return sets
}

// globalName renames a local expert parameter (deepspeed_experts.<local>.)
// of expert-parallel rank ep (of EP) to its global expert number, as
// DeepSpeed's _save_moe_checkpoint does: ep * local experts + local.
func globalName(local string, ep, EP int, layers []moeLayer) (string, error) {
	head, tail, ok := strings.Cut(local, moeExperts)
	if !ok || ep < 0 {
		return local, nil
	}
	num, rest, _ := strings.Cut(tail, ".")
	i, err := strconv.Atoi(num)
	if err != nil || rest == "" {
		return "", fmt.Errorf("expert parameter %s has no expert number", local)
	}
	for _, ly := range layers {
		if ly.head != head {
			continue
		}
		if ly.experts%EP != 0 || i >= ly.experts/EP {
			return "", fmt.Errorf("expert parameter %s: local expert %d of %d experts at expert parallelism %d", local, i, ly.experts, EP)
		}
		return head + moeExperts + strconv.Itoa(ep*(ly.experts/EP)+i) + "." + rest, nil
	}
	return "", fmt.Errorf("expert parameter %s belongs to no MoE layer of the model state", local)
}

// moeGroup adds the fragments of flat group g of the ranks of one partition
// set. Neither the model state nor the optimizer files record the group's
// parameter order and shapes (no param_shapes): the order is that of the
// fragments in param_slice_mappings, the shapes those of the saved weights,
// and every parameter must start where the ones before it end.
func (b *builder) moeGroup(g int, s partSet, EP int, layers []moeLayer, shapes map[string][]int64, params map[string]*fragment.Param) error {
	type entry struct {
		local, global string
		first         int64
	}
	var S, total int64
	seen := map[string]*entry{}
	var order []*entry
	for i, r := range s.ranks {
		o := b.optims[[2]int{r, 0}]
		if g >= len(o.groups) {
			return fmt.Errorf("%s: has %d optimizer groups, want %d", o.path, len(o.groups), g+1)
		}
		gr := o.groups[g]
		if i == 0 {
			S = gr.size
		} else if gr.size != S {
			return fmt.Errorf("%s: group %d partition of %d elements, but rank %d's has %d", o.path, g, gr.size, s.ranks[0], S)
		}
		total += gr.size - gr.padding
		if gr.mappings == nil {
			return fmt.Errorf("%s: no param_slice_mappings: a DeepSpeed-MoE checkpoint records no param_shapes, ucp needs them to place parameters", o.path)
		}
		items := gr.mapDec.Items()
		if err := gr.mapDec.Err(); err != nil {
			return err
		}
		for _, it := range items {
			name := it.Key
			_, start := readFragmentAddr(it.Dec)
			if err := gr.mapDec.Err(); err != nil {
				return err
			}
			if e := seen[name]; e != nil {
				e.first = min(e.first, int64(i)*S+start)
				continue
			}
			gn, err := globalName(name, s.ep, EP, layers)
			if err != nil {
				return fmt.Errorf("%s: %w", o.path, err)
			}
			e := &entry{local: name, global: gn, first: int64(i)*S + start}
			seen[name] = e
			order = append(order, e)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].first < order[j].first })
	var off int64
	for _, e := range order {
		shape, ok := shapes[e.global]
		if !ok {
			return fmt.Errorf("%s: the optimizer's group %d holds %s (%s), which neither the model state nor an expert file has",
				b.optims[[2]int{s.ranks[0], 0}].path, g, e.global, e.local)
		}
		if e.first != off {
			return fmt.Errorf("%s: param_slice_mappings place %s at flat offset %d of group %d, but the parameters before it end at %d",
				b.optims[[2]int{s.ranks[0], 0}].path, e.local, e.first, g, off)
		}
		if params[e.global] != nil {
			return fmt.Errorf("%s: %s is held by two optimizer partitions (group %d)", b.optims[[2]int{s.ranks[0], 0}].path, e.global, g)
		}
		pl, err := b.rules.Classify(e.global, [][]int64{shape})
		if err != nil {
			return err
		}
		shards, full, err := pl.Shards(e.global, 1)
		if err != nil {
			return err
		}
		p := pl.Param(e.global, full)
		numel := torchfile.Numel(shape)
		for i, r := range s.ranks {
			o := b.optims[[2]int{r, 0}]
			gr := o.groups[g]
			lo, hi := int64(i)*S, int64(i+1)*S
			fs, fe := max(off, lo), min(off+numel, hi)
			if err := checkMapping(o, gr, e.local, fs, fe, lo); err != nil {
				return err
			}
			if fs >= fe {
				continue
			}
			if err := b.addStates(p, shards, o, g, 0, fs-lo, fs-off, fe-fs); err != nil {
				return err
			}
		}
		params[e.global] = p
		off += numel
	}
	if off != total {
		return fmt.Errorf("%s: group %d holds %d elements (partitions less padding) but param_slice_mappings place parameters of %d",
			b.optims[[2]int{s.ranks[0], 0}].path, g, total, off)
	}
	return nil
}
