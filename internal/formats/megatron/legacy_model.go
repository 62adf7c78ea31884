package megatron

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// rankFile is one mp_rank_* folder, decoded.
type rankFile struct {
	rd     *rankDir
	root   *pyobj.Dict
	chunks [][]*localParam // per model chunk: parameters, tied copies and buffers, in state-dict order
	params []*localParam   // parameters of all chunks (tied copies included), chunk then named order
	subs   []pyobj.Dec     // optimizer, one per sub-optimizer (ChainedOptimizer: dense, expert)
}

// localParam is one tensor of a rank's model state dict.
type localParam struct {
	local  string // name in the file (nested legacy dicts joined with '.')
	name   string // atomic name (for a tied copy: the embedding's)
	t      *torchfile.Tensor
	chunk  int
	expert bool
	tied   bool // synchronized copy of the word embedding: not atomic
	buffer bool // persistent buffer, not a parameter
	shared bool // shared_embedding: its own bucket in the DDP layout
	key    orderKey

	states map[string]srcRef // optimizer state name -> where it is stored
	step   *fragment.Step
}

// srcRef is the run of a stored tensor that holds one whole local tensor.
type srcRef struct {
	ref   fragment.TensorRef
	start int64
}

// orderKey sorts atomic parameters into the model's named_parameters()
// order at TP = PP = EP = 1.
type orderKey [4]int

func (a orderKey) less(b orderKey) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// chunkNames returns the model keys of a file: "model", or model0 ...
// model{V-1} with virtual pipeline parallelism.
func chunkNames(path string, root *pyobj.Dict, vpp int) ([]string, error) {
	if vpp <= 0 {
		if _, ok := root.Get("model"); !ok {
			return nil, fmt.Errorf("%s: no 'model' state dict", path)
		}
		return []string{"model"}, nil
	}
	var names []string
	for v := 0; v < vpp; v++ {
		k := "model" + strconv.Itoa(v)
		if _, ok := root.Get(k); !ok {
			return nil, fmt.Errorf("%s: no %q state dict (args has virtual_pipeline_model_parallel_size %d)", path, k, vpp)
		}
		names = append(names, k)
	}
	return names, nil
}

// flatten lists the tensors of a (possibly nested) model state dict with
// their dotted names; non-tensors (extra state, None) are skipped.
func flatten(path string, d *pyobj.Dict, prefix string, depth int, fn func(name string, t *torchfile.Tensor) error) error {
	if depth > 16 {
		return fmt.Errorf("%s: model state dict nests deeper than 16 levels at %q", path, prefix)
	}
	dd := pyobj.NewDec(fmt.Sprintf("%s: model state dict under %q", path, prefix), d)
	items := dd.Items()
	if err := dd.Err(); err != nil {
		return err
	}
	for _, it := range items {
		v := it.Value()
		name := prefix + it.Key
		if strings.HasSuffix(name, "_extra_state") {
			continue // TE/FP8 metadata in any form: not a parameter
		}
		switch x := v.(type) {
		case *pyobj.Dict:
			if err := flatten(path, x, name+".", depth+1, fn); err != nil {
				return err
			}
		case *torchfile.Tensor:
			if err := fn(name, x); err != nil {
				return err
			}
		}
	}
	return nil
}

// readModel lists the parameters of every chunk of a file with local names.
func (f *rankFile) readModel(a *Args) error {
	names, err := chunkNames(f.rd.model, f.root, a.VPP)
	if err != nil {
		return err
	}
	for v, cn := range names {
		rd := pyobj.NewDec(f.rd.model, f.root)
		md := rd.Dict(cn).AsDict()
		if err := rd.Err(); err != nil {
			return err
		}
		var list []*localParam
		err := flatten(f.rd.model, md, "", 0, func(name string, t *torchfile.Tensor) error {
			lp := &localParam{local: name, t: t, chunk: v, expert: expertParallel(name, a.EP), buffer: isBuffer(name)}
			if !lp.buffer {
				if c := tiedCopyOf(name, a.Untie); c != "" {
					lp.tied, lp.name = true, c
				}
			}
			list = append(list, lp)
			return nil
		})
		if err != nil {
			return err
		}
		f.chunks = append(f.chunks, list)
		for _, lp := range list {
			if !lp.buffer {
				f.params = append(f.params, lp)
			}
		}
	}
	return nil
}

// layerCounts returns the number of layers of each chunk of a file: one
// more than the highest stage-local layer number.
func (f *rankFile) layerCounts() []int {
	out := make([]int, len(f.chunks))
	for v, list := range f.chunks {
		for _, lp := range list {
			if n := layerIndex(lp.local); n+1 > out[v] {
				out[v] = n + 1
			}
		}
	}
	return out
}

// layerOffsets computes each (pp, chunk)'s first global layer from the
// layer counts in the files: global layers run through chunk 0 of every
// stage, then chunk 1, ... (get_transformer_layer_offset). Counts must
// agree across the TP and EP ranks of a stage and add up to num_layers;
// without uneven-pipeline arguments they must be the uniform split.
func layerOffsets(a *Args, files []*rankFile) ([][]int, error) {
	V := max(a.VPP, 1)
	counts := make([][]int, a.PP)
	from := make([]string, a.PP)
	for _, f := range files {
		c := f.layerCounts()
		p := f.rd.pp
		if counts[p] == nil {
			counts[p], from[p] = c, f.rd.model
			continue
		}
		for v := range c {
			if c[v] != counts[p][v] {
				return nil, fmt.Errorf("%s: chunk %d holds %d layers but %s holds %d for the same pipeline stage", f.rd.model, v, c[v], from[p], counts[p][v])
			}
		}
	}
	offsets := make([][]int, a.PP)
	for p := range offsets {
		offsets[p] = make([]int, V)
	}
	total := 0
	for v := 0; v < V; v++ {
		for p := 0; p < a.PP; p++ {
			offsets[p][v] = total
			total += counts[p][v]
		}
	}
	if total != a.NumLayers {
		return nil, fmt.Errorf("%s: the pipeline stages hold %d layers but args.num_layers is %d", files[0].rd.model, total, a.NumLayers)
	}
	if len(a.UnevenPipeline) == 0 && a.NumLayers%(a.PP*V) == 0 {
		per := a.NumLayers / (a.PP * V)
		for p := range counts {
			for v, n := range counts[p] {
				if n != per {
					return nil, fmt.Errorf("%s: pipeline stage %d chunk %d holds %d layers, but a uniform split of num_layers %d over %d stages x %d chunks gives %d, and args names no uneven split",
						from[p], p, v, n, a.NumLayers, a.PP, V, per)
				}
			}
		}
	}
	return offsets, nil
}

// assignNames gives every tensor of a file its atomic name, order key and
// shared-embedding flag.
func (f *rankFile) assignNames(a *Args, offsets [][]int) error {
	p, e := f.rd.pp, f.rd.ep
	V := len(f.chunks)
	nLocal := 0
	if a.NumExperts > 0 {
		nLocal = a.NumExperts / a.EP
	}
	for v, list := range f.chunks {
		first := p == 0 && v == 0
		last := p == a.PP-1 && v == V-1
		// Experts of one layer form a block; within it, the first position
		// of each tensor template and of each local expert.
		exps := make([]expertRef, len(list))
		blockStart := map[string]int{}
		firstTpl := map[string]int{}
		firstLocal := map[string]int{}
		for i, lp := range list {
			exps[i] = findExpert(lp.local)
			if exps[i].local < 0 {
				continue
			}
			blk := lp.local[:strings.Index(lp.local, ".mlp.experts.")]
			if _, ok := blockStart[blk]; !ok {
				blockStart[blk] = i
			}
			if _, ok := firstTpl[exps[i].template]; !ok {
				firstTpl[exps[i].template] = i
			}
			jk := blk + "#" + strconv.Itoa(exps[i].local)
			if _, ok := firstLocal[jk]; !ok {
				firstLocal[jk] = i
			}
		}
		for i, lp := range list {
			if li := layerIndex(lp.local); li >= 0 && li+offsets[p][v] >= a.NumLayers {
				return fmt.Errorf("%s: %s is beyond num_layers %d", f.rd.model, lp.local, a.NumLayers)
			}
			ex := exps[i]
			if ex.local >= 0 {
				if nLocal == 0 {
					return fmt.Errorf("%s: %s is an expert but args.num_experts is not set", f.rd.model, lp.local)
				}
				if ex.local >= nLocal {
					return fmt.Errorf("%s: %s is local expert %d but %d experts over expert parallel %d leave %d per rank", f.rd.model, lp.local, ex.local, a.NumExperts, a.EP, nLocal)
				}
			} else if isGrouped(lp.local) {
				// GroupedMLP: all local experts in one tensor, whose name
				// has no expert number (placement.go splits it).
				if nLocal == 0 {
					return fmt.Errorf("%s: %s is a GroupedMLP weight (all local experts fused) but args.num_experts is not set", f.rd.model, lp.local)
				}
			} else if isExpert(lp.local) {
				return fmt.Errorf("%s: %s is under mlp.experts but names no expert number", f.rd.model, lp.local)
			}
			if !lp.tied {
				lp.name = globalName(lp.local, offsets[p][v], e*nLocal)
				if err := checkName(f.rd.model, lp.name); err != nil {
					return err
				}
			}
			lp.shared = !a.Untie && a.PP > 1 && (lp.tied || (isWordEmbedding(lp.local) && first && !last))
			// Order: chunk in global order, position in the chunk; the expert
			// block as at EP = 1: SequentialMLP by expert then tensor,
			// TEGroupedMLP by tensor then expert.
			lp.key = orderKey{v*a.PP + p, i, 0, 0}
			if ex.local >= 0 {
				blk := lp.local[:strings.Index(lp.local, ".mlp.experts.")]
				bs, g := blockStart[blk], e*nLocal+ex.local
				if ex.grouped {
					lp.key = orderKey{v*a.PP + p, bs, firstTpl[ex.template] - bs, g}
				} else {
					lp.key = orderKey{v*a.PP + p, bs, g, i - firstLocal[blk+"#"+strconv.Itoa(ex.local)]}
				}
			}
		}
	}
	return nil
}

// sortedNames returns atomic names in order.
func sortedNames(keys map[string]orderKey) []string {
	names := make([]string, 0, len(keys))
	for n := range keys {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := keys[names[i]], keys[names[j]]
		if a != b {
			return a.less(b)
		}
		return names[i] < names[j]
	})
	return names
}
