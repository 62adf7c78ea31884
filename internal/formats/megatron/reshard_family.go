package megatron

import (
	"fmt"
	"sort"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// virtTensor is a target rank's tensor built from pieces of several
// atomic parameters (a family source: fused QKV and fc1 from separate
// q/k/v and gate/up, vocabulary re-padded).
type virtTensor struct {
	shape  []int64
	pieces []layout.StatePiece
}

// planFamily plans a Megatron-LM save of an atomic checkpoint converted
// from another framework whose model family is known (RESHARD.md, "Other
// sources"): the model weights only, named and fused as megatron-core's
// GPTModel holds them at the target TP/PP/VPP, args synthesized from the
// family config, written as the 'release' checkpoint Megatron's own
// converters write; it loads with --finetune --no-load-optim
// --no-load-rng. The source's optimizer state, if any, is not carried.
func planFamily(r *atomic.Reader, o ReshardOptions) (*rsPlan, error) {
	c, err := r.Model()
	if err != nil {
		return nil, fmt.Errorf("--to megatron from a %s source needs its model family: %w", r.Manifest.Source.Format, err)
	}
	if err := c.MegatronCheck(); err != nil {
		return nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	if o.Spec != "" && o.Spec != "te" && o.Spec != "local" {
		return nil, fmt.Errorf("--megatron-spec %q: te or local", o.Spec)
	}
	T := o.TP
	for _, x := range []struct {
		what string
		n    int64
	}{{"attention heads", c.Heads}, {"query groups", c.QueryGroups}, {"FFN size", c.FFN}} {
		if x.n%int64(T) != 0 {
			return nil, fmt.Errorf("--tp %d does not divide the %d %s of the model", T, x.n, x.what)
		}
	}
	p := &rsPlan{r: r, o: o, states: map[string][]string{}, steps: map[string]pyobj.Value{}, release: true,
		virt: map[string][]virtTensor{}, layers: int(c.Layers), untie: !c.Tied, te: o.Spec != "local"}
	carry, err := carriesOptimizer(r)
	if err != nil {
		return nil, err
	}
	if !carry && (o.DistOptimizer || o.Optimizer != "") {
		return nil, fmt.Errorf("%s: converted from a %s checkpoint without optimizer state: --to megatron writes its weights only (load with --finetune --no-load-optim --no-load-rng); --distributed-optimizer and --megatron-optimizer need Adam states", r.Dir, r.Manifest.Source.Format)
	}
	if carry && o.DistOptimizer {
		return nil, fmt.Errorf("%s: --distributed-optimizer from a %s source is not written yet; leave it out (Megatron's non-distributed optimizer state is written)", r.Dir, r.Manifest.Source.Format)
	}
	p.dt = dtype.Float32
	if m := r.Manifest.Source.DType; m != "" {
		if p.dt, err = dtype.Parse(m); err != nil {
			return nil, fmt.Errorf("%s: source dtype: %w", r.Dir, err)
		}
	}
	if p.dt != dtype.Float32 && p.dt != dtype.BFloat16 && p.dt != dtype.Float16 {
		return nil, fmt.Errorf("%s: source dtype %v: Megatron trains in float32, bfloat16 or float16", r.Dir, p.dt)
	}
	if p.split, err = pipelineSplit(p.layers, o.PP, max(o.VPP, 1), o.FirstStageLayers, o.LastStageLayers); err != nil {
		return nil, err
	}
	var ps []family.Param
	for _, e := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: e.Name, Shape: e.Shape})
	}
	src, err := family.Resolve(c, ps, r.Manifest.Source.Format)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	if src.Layout.Interleaved {
		return nil, fmt.Errorf("%s: q/k rows in interleaved RoPE order (torchtitan's complex RoPE or rotary_interleaved): --to megatron writes the rotate-half layout only", r.Dir)
	}
	// Every role as Hugging Face holds it: pieces of the source's
	// parameters (fused QKV and gate/up split), for any source naming.
	hfView, err := src.Unfused(family.HF)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	views := map[viewKey]family.Tensor{}
	for _, x := range hfView {
		views[viewKey{x.Role, x.Layer}] = x
	}
	div := c.VocabDivisor
	if div <= 0 {
		div = 128 // Megatron's --make-vocab-size-divisible-by default
	}
	k := div * int64(T)
	p.vocab = (c.Vocab + k - 1) / k * k
	p.extra = pyobj.NewDict(pyobj.PlainDict)
	p.extra.Set("checkpoint_version", 3.0)
	p.args = familyArgs(c, p.dt, p.te, div)
	naming := family.CoreTE
	if !p.te {
		naming = family.Core
	}
	fam := src.F
	P, V := o.PP, max(o.VPP, 1)
	p.chunks = make([][][]rsParam, P)
	for s := range p.chunks {
		p.chunks[s] = make([][]rsParam, V)
	}
	done := map[string]bool{}
	add := func(r0 family.Role, layer int) error {
		name := r0.NameIn(naming, layer, -1)
		if done[name] {
			return nil // the other parts of a fused tensor
		}
		done[name] = true
		ts := make([]virtTensor, T)
		for t := 0; t < T; t++ {
			vt, err := p.familySlice(c, views, fam.Parts(c, r0), layer, t)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", r.Dir, name, err)
			}
			ts[t] = vt
		}
		key := "family:" + name
		p.virt[key] = ts
		if carry {
			if err := p.familyStates(key, ts[0]); err != nil {
				return err
			}
		}
		s, v, local := 0, 0, name
		switch {
		case layer >= 0:
			s, v = p.chunkOf(layer)
			local = globalName(name, -p.split[s][v][0], 0)
		case r0.Name != "embed":
			s, v = P-1, V-1
		}
		p.chunks[s][v] = append(p.chunks[s][v], rsParam{local: local, src: key})
		return nil
	}
	// megatron-core's module order: embedding; per layer the norms and
	// linears as TransformerLayer registers them; final norm, output layer.
	order := []string{"embed", "attn_norm", "o_proj", "o_bias", "q_proj", "q_bias", "q_norm", "k_norm", "mlp_norm", "gate_proj", "gate_bias", "down_proj", "down_bias"}
	present := map[string]family.Role{}
	for _, x := range fam.Present(c) {
		present[x.Name] = x
	}
	if x, ok := present["embed"]; ok {
		if err := add(x, -1); err != nil {
			return nil, err
		}
	}
	for l := 0; l < p.layers; l++ {
		for _, n := range order[1:] {
			if x, ok := present[n]; ok {
				if err := add(x, l); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, n := range []string{"final_norm", "lm_head"} {
		if x, ok := present[n]; ok {
			if err := add(x, -1); err != nil {
				return nil, err
			}
		}
	}
	if c.Tied && P*V > 1 {
		p.chunks[P-1][V-1] = append(p.chunks[P-1][V-1], rsParam{local: "output_layer.weight", src: "family:" + present["embed"].NameIn(naming, -1, -1)})
	}
	for s := range p.chunks {
		for v, list := range p.chunks[s] {
			if len(list) == 0 {
				return nil, fmt.Errorf("pipeline stage %d chunk %d would hold no parameters", s, v)
			}
		}
	}
	if carry {
		if err := p.familyOptimizer(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// viewKey is a role at a layer (-1: global).
type viewKey struct {
	role  string
	layer int
}

// familySlice is TP rank t's piece of the Megatron tensor of fused roles
// parts (one role when not fused) at a layer, from the Hugging Face view
// of the source (views: each role's pieces of the source's parameters,
// whole tensors for unfused sources, row runs of fused ones).
func (p *rsPlan) familySlice(c *family.Config, views map[viewKey]family.Tensor, parts []family.Role, layer, t int) (virtTensor, error) {
	T := p.o.TP
	r0 := parts[0]
	view := func(r family.Role) (family.Tensor, error) {
		v, ok := views[viewKey{r.Name, layer}]
		if !ok {
			return v, fmt.Errorf("no %s", r.Name)
		}
		return v, nil
	}
	if r0.Fuse != family.NoFuse {
		spans, err := family.FusedRows(c, r0.Fuse, false, false, T, t)
		if err != nil {
			return virtTensor{}, err
		}
		vs := make([]family.Tensor, len(parts))
		for i, x := range parts {
			if x.Part != i {
				return virtTensor{}, fmt.Errorf("fused parts out of order")
			}
			if vs[i], err = view(x); err != nil {
				return virtTensor{}, err
			}
		}
		cols := int64(1)
		if len(vs[0].Shape) == 2 {
			cols = vs[0].Shape[1]
		}
		var vt virtTensor
		var at int64
		for _, sp := range spans {
			pcs, err := p.viewPieces(vs[sp.Part], sp.Row*cols, sp.N*cols, at)
			if err != nil {
				return virtTensor{}, err
			}
			vt.pieces = append(vt.pieces, pcs...)
			at += sp.N * cols
		}
		vt.shape = []int64{at / cols}
		if len(vs[0].Shape) == 2 {
			vt.shape = append(vt.shape, cols)
		}
		return vt, nil
	}
	v, err := view(r0)
	if err != nil {
		return virtTensor{}, err
	}
	if len(v.Pieces) != 1 || v.Pieces[0].Start != 0 {
		return virtTensor{}, fmt.Errorf("%s is stored in pieces of %s", v.Name, v.Pieces[0].Param)
	}
	e, ok := p.r.Param(v.Pieces[0].Param)
	if !ok {
		return virtTensor{}, fmt.Errorf("no parameter %s", v.Pieces[0].Param)
	}
	if v.Pieces[0].Len != torchfile.Numel(e.Shape) {
		return virtTensor{}, fmt.Errorf("%s is a part of %s", v.Name, e.Name)
	}
	var sh fragment.Shard
	switch {
	case r0.TP == family.Replicated || T == 1 && r0.TP != family.Vocab:
		sh = fragment.Shard{Shape: append([]int64(nil), e.Shape...)}
	case r0.TP == family.Vocab:
		padded := []int64{p.vocab, e.Shape[1]}
		s, err := fragment.Split{Dim: 0}.Shard(padded, t, T)
		if err != nil {
			return virtTensor{}, err
		}
		sh = fragment.StripPad(s, padded, 0, e.Shape[0])
	case r0.TP == family.Column:
		if sh, err = (fragment.Split{Dim: 0}).Shard(e.Shape, t, T); err != nil {
			return virtTensor{}, err
		}
	case r0.TP == family.Row:
		if sh, err = (fragment.Split{Dim: 1}).Shard(e.Shape, t, T); err != nil {
			return virtTensor{}, err
		}
	}
	n := torchfile.Numel(sh.Shape)
	return virtTensor{shape: sh.Shape, pieces: []layout.StatePiece{{Param: e.Name, State: fragment.FP32, Shard: sh, N: n}}}, nil
}

// viewPieces are elements [start, start+n) of a view, as pieces of the
// source's whole parameters written from element at.
func (p *rsPlan) viewPieces(v family.Tensor, start, n, at int64) ([]layout.StatePiece, error) {
	var out []layout.StatePiece
	var off int64 // the view's element where the current piece starts
	for _, pc := range v.Pieces {
		lo, hi := max(start, off), min(start+n, off+pc.Len)
		if lo < hi {
			e, ok := p.r.Param(pc.Param)
			if !ok {
				return nil, fmt.Errorf("no parameter %s", pc.Param)
			}
			out = append(out, layout.StatePiece{Param: e.Name, State: fragment.FP32, Shard: fragment.Shard{Shape: append([]int64(nil), e.Shape...)},
				Local: pc.Start + lo - off, N: hi - lo, At: at + lo - start})
		}
		off += pc.Len
	}
	if off < start+n {
		return nil, fmt.Errorf("%s: elements [%d,%d) beyond its %d", v.Name, start, start+n, off)
	}
	return out, nil
}

// familyArgs is the args Namespace of a Megatron-LM run of the family
// config (the geometry and math options; the degrees are targetArgs').
func familyArgs(c *family.Config, dt dtype.DType, te bool, div int64) *pyobj.Object {
	a := c.MegatronArgs()
	a["make_vocab_size_divisible_by"] = div
	a["bf16"] = dt == dtype.BFloat16
	a["fp16"] = dt == dtype.Float16
	a["ckpt_format"] = "torch"
	a["use_legacy_models"] = false
	a["context_parallel_size"] = int64(1)
	impl := "transformer_engine"
	if !te {
		impl = "local"
	}
	a["transformer_impl"] = impl
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	d := pyobj.NewDict(pyobj.PlainDict)
	for _, k := range keys {
		v := a[k]
		switch i := v.(type) {
		case int: // pickled as a Python int
			v = int64(i)
		}
		d.Set(k, v)
	}
	return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, Via: pyobj.ByNewObj, State: d, Built: true}
}
