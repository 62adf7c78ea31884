package megatron

import (
	"fmt"
	"sort"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
)

// familyPrefix marks a family source's tensors in a plan (rsParam.src,
// rsPlan.virt): "family:" + the global Megatron name.
const familyPrefix = "family:"

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
	T, EP, ETP, err := familyDegrees(r, c, o)
	if err != nil {
		return nil, err
	}
	p := &rsPlan{r: r, o: o, states: map[string][]string{}, steps: map[string]pyobj.Value{}, release: true,
		virt: map[string][]virtTensor{}, layers: int(c.Layers), untie: !c.Tied, te: o.Spec != "local",
		ep: EP, etp: ETP, experts: int(c.Experts)}
	carry, err := carriesOptimizer(r)
	if err != nil {
		return nil, err
	}
	if c.Experts > 0 {
		if carry {
			return nil, fmt.Errorf("%s: a mixture-of-experts %s source with optimizer state: --to megatron writes the optimizer of a model without experts only (Megatron keeps the experts' in a separate, chained optimizer)", r.Dir, r.Manifest.Source.Format)
		}
		if p.files, err = expertFiles(T, o.DP, EP, ETP); err != nil {
			return nil, err
		}
	}
	// The torch_dist writer always plans the distributed optimizer; of a
	// weights-only source it writes the model only.
	if !carry && (o.DistOptimizer && !o.torchDist || o.Optimizer != "") {
		return nil, fmt.Errorf("%s: converted from a %s checkpoint without optimizer state: --to megatron writes its weights only (load with --finetune --no-load-optim --no-load-rng); --distributed-optimizer and --megatron-optimizer need Adam states", r.Dir, r.Manifest.Source.Format)
	}
	if carry && o.DistOptimizer && !o.torchDist {
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
	slicer, src, err := layout.NewFamilySlicer(r, c)
	if err != nil {
		return nil, err
	}
	if src.Layout.Interleaved && c.RotaryInterleaved {
		return nil, fmt.Errorf("%s: q/k rows in interleaved RoPE order with rotary_interleaved: --to megatron writes the rotate-half layout only", r.Dir)
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
	if err := p.familyParams(c, slicer, src.F, naming, T, ETP, carry); err != nil {
		return nil, err
	}
	if carry {
		if err := p.familyOptimizer(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// familyDegrees checks that the target's TP, EP and expert TP divide the
// model's heads, query groups, experts and FFN sizes; ETP defaults to TP.
func familyDegrees(r *atomic.Reader, c *family.Config, o ReshardOptions) (T, EP, ETP int, err error) {
	T, EP, ETP = o.TP, max(o.EP, 1), o.ETP
	if ETP == 0 {
		ETP = T
	}
	type divides struct {
		what string
		n    int64
		by   int
		flag string
	}
	checks := []divides{{"attention heads", c.Heads, T, "--tp"}, {"query groups", c.QueryGroups, T, "--tp"}}
	switch {
	case c.Experts > 0:
		// Every layer is MoE but deepseek_v3's leading dense ones: their
		// FFN is split by TP.
		checks = append(checks, divides{"experts", c.Experts, EP, "--ep"}, divides{"expert FFN size", c.MoEFFN, ETP, "--expert-tp"})
		if c.SharedFFN > 0 {
			checks = append(checks, divides{"shared expert FFN size", c.SharedFFN, T, "--tp"})
		}
		if c.DenseLayers > 0 {
			checks = append(checks, divides{"FFN size", c.FFN, T, "--tp"})
		}
		if c.MLA && o.Spec == "local" { // ColumnParallelLinear down projections
			checks = append(checks, divides{"q_lora_rank", c.QLoraRank, T, "--tp"}, divides{"kv_lora_rank + qk_pos_emb_head_dim", c.KVLoraRank + c.QKRopeDim, T, "--tp"})
		}
	case EP > 1 || o.ETP > 0 && o.ETP != T:
		return 0, 0, 0, fmt.Errorf("%s: --ep %d, --expert-tp %d: the %s model has no experts", r.Dir, EP, o.ETP, c.Family)
	default:
		checks = append(checks, divides{"FFN size", c.FFN, T, "--tp"})
	}
	for _, x := range checks {
		if x.n%int64(x.by) != 0 {
			return 0, 0, 0, fmt.Errorf("%s %d does not divide the %d %s of the model", x.flag, x.by, x.n, x.what)
		}
	}
	return T, EP, ETP, nil
}

// familyParams lists the target's tensors per pipeline stage and model
// chunk in megatron-core's module order, each TP (or expert TP) rank's
// slice as pieces of atomic parameters.
func (p *rsPlan) familyParams(c *family.Config, slicer *layout.FamilySlicer, fam *family.Family, naming family.Naming, T, ETP int, carry bool) error {
	P, V := p.o.PP, max(p.o.VPP, 1)
	p.chunks = make([][][]rsParam, P)
	for s := range p.chunks {
		p.chunks[s] = make([][]rsParam, V)
	}
	done := map[string]bool{}
	add := func(r0 family.Role, layer, expert int) error {
		name := r0.NameIn(naming, layer, expert)
		if done[name] {
			return nil // the other parts of a fused tensor
		}
		done[name] = true
		n := T // routed experts are cut at the expert TP size
		if r0.Scope == family.Expert {
			n = ETP
		}
		parts := fam.Parts(c, r0)
		for i := range parts {
			parts[i].TP = parts[i].TPIn(naming) // MLA's down projections: whole on every rank in the TE spec
		}
		ts := make([]virtTensor, n)
		for t := range ts {
			ft, err := slicer.SliceExpert(parts, layer, expert, n, t, false, p.vocab)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", p.r.Dir, name, err)
			}
			ts[t] = virtTensor{shape: ft.Shape, pieces: ft.Pieces}
		}
		key := familyPrefix + name
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
		p.chunks[s][v] = append(p.chunks[s][v], rsParam{local: local, src: key, routed: expert >= 0, expert: expert, fp32: r0.Name == "router_bias"})
		return nil
	}
	// megatron-core's module order: embedding; per layer the norms and
	// linears as TransformerLayer registers them (MLA: linear_proj, then
	// the q and kv projections, then their norms, multi_latent_attention.py;
	// a MoE layer's MLP: router, experts, shared experts, moe_layer.py
	// MoELayer); final norm, output layer. SequentialMLP holds each
	// expert's fc1 and fc2 together, TEGroupedMLP every fc1 then every fc2.
	order := []string{"attn_norm", "o_proj", "o_bias", "q_proj", "q_bias", "q_down", "q_up", "kv_down", "kv_up", "q_down_norm", "kv_down_norm",
		"q_norm", "k_norm", "mlp_norm", "moe_norm", "gate_proj", "gate_bias", "down_proj", "down_bias",
		"router", "router_bias", "experts", "shared_gate", "shared_down", "shared_expert_gate"}
	present := map[string]family.Role{}
	for _, x := range fam.Present(c) {
		present[x.Name] = x
	}
	if x, ok := present["embed"]; ok {
		if err := add(x, -1, -1); err != nil {
			return err
		}
	}
	for l := 0; l < p.layers; l++ {
		for _, n := range order {
			if n == "experts" {
				if err := p.addExperts(c, present, l, int(c.Experts), add); err != nil {
					return err
				}
				continue
			}
			if x, ok := present[n]; ok && x.At(c, l) {
				if err := add(x, l, -1); err != nil {
					return err
				}
			}
		}
	}
	for _, n := range []string{"final_norm", "lm_head"} {
		if x, ok := present[n]; ok {
			if err := add(x, -1, -1); err != nil {
				return err
			}
		}
	}
	if c.Tied && P*V > 1 {
		p.chunks[P-1][V-1] = append(p.chunks[P-1][V-1], rsParam{local: "output_layer.weight", src: familyPrefix + present["embed"].NameIn(naming, -1, -1)})
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

// addExperts adds a layer's routed experts in the order the layer spec
// registers them.
func (p *rsPlan) addExperts(c *family.Config, present map[string]family.Role, l, n int, add func(family.Role, int, int) error) error {
	gate, ok := present["expert_gate"]
	if !ok || !gate.At(c, l) {
		return nil
	}
	down := present["expert_down"]
	if p.te {
		for _, r := range []family.Role{gate, down} {
			for e := 0; e < n; e++ {
				if err := add(r, l, e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for e := 0; e < n; e++ {
		for _, r := range []family.Role{gate, down} {
			if err := add(r, l, e); err != nil {
				return err
			}
		}
	}
	return nil
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
		case []any: // moe_layer_freq's pattern: a Python list
			v = &pyobj.List{Items: i}
		}
		d.Set(k, v)
	}
	return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, Via: pyobj.ByNewObj, State: d, Built: true}
}
