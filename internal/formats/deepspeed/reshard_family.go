package deepspeed

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// famTensor is one tensor of the target module: its name, the family
// roles fused into it and their layer (-1: global).
type famTensor struct {
	name  string
	parts []family.Role
	layer int
}

// Namings of a target module built from a model family (FORMAT.md,
// "Other sources").
const (
	namesHF    = "Hugging Face"       // XForCausalLM.state_dict()
	namesMegDS = "Megatron-DeepSpeed" // GPTModel (legacy Megatron names)
)

// sourcePieces are elements [local, local+n) of target tensor name on TP
// rank t, as pieces of atomic parameters written from element at.
func (p *plan) sourcePieces(t int, name string, local, n, at int64) []fillPiece {
	if p.virt != nil {
		if pcs, ok := p.virt[t][name]; ok {
			return layout.ClipPieces(pcs, local, n, at)
		}
	}
	return []fillPiece{{Param: name, Shard: p.shards[t][name], Local: local, N: n, At: at}}
}

// sharedParams fills the engine's shared_params: alias -> parameter.
func (p *plan) sharedParams(d *pyobj.Dict) {
	if p.virt != nil {
		var as []string
		for a := range p.aliases {
			as = append(as, a)
		}
		sort.Strings(as)
		for _, a := range as {
			d.Set(a, p.aliases[a])
		}
		return
	}
	for _, e := range p.r.Manifest.Params {
		for _, a := range e.Aliases {
			d.Set(a, e.Name)
		}
	}
}

// planFamily plans a target whose module layout ucp did not read from a
// DeepSpeed checkpoint (taking it from another one, the issue's --like,
// is not written yet): the source's model family gives the tensors, and
// the names, order and param groups come from the family's Hugging Face
// module (Hugging Face, DCP sources) or Megatron-DeepSpeed's GPTModel
// (Megatron-LM sources).
func (p *plan) planFamily() error {
	r := p.r
	c, err := r.Model()
	if err != nil {
		return fmt.Errorf("--to deepspeed from a %s source needs the target's module layout and parameter order: from the source's model family (%v; convert records it from Megatron or Megatron-DeepSpeed args and Hugging Face config.json) taking it from another DeepSpeed checkpoint of the model (--like) is not supported yet", r.Manifest.Source.Format, err)
	}
	if c.LayerNorm1p {
		return fmt.Errorf("%s: apply_layernorm_1p (norm weights stored minus one): neither target module of --to deepspeed stores them so", r.Dir)
	}
	slicer, _, err := layout.NewFamilySlicer(r, c)
	if err != nil {
		return err
	}
	carry, err := megatronAdam(r)
	if err != nil {
		return err
	}
	naming := namesHF
	if f := r.Manifest.Source.Format; f == "megatron" || f == "torch_dist" {
		naming = namesMegDS
	}
	div := c.VocabDivisor
	if div <= 0 {
		div = 128 // Megatron's --make-vocab-size-divisible-by default
	}
	ts, padded, err := p.familyTensors(c, slicer, naming, div)
	if err != nil {
		return err
	}
	stacked := naming == namesMegDS && c.QueryGroups != c.Heads
	states := []string{fragment.FP32}
	if carry {
		states = append(states, "exp_avg", "exp_avg_sq")
	}
	names, steps, err := p.familyParams(slicer, ts, states, stacked, padded, carry)
	if err != nil {
		return err
	}
	if err := p.familyGroups(naming, names, carry, steps); err != nil {
		return err
	}
	p.optim = pyobj.NewDict(pyobj.PlainDict)
	if err := p.synthTemplate(naming, c, names, div); err != nil {
		return err
	}
	what := "its weights only: the optimizer files hold them as fp32 partitions and no Adam state (a fresh optimizer) in one param group with torch AdamW's defaults"
	if carry {
		what = "with the source's fp32 main parameters, Adam moments, step and param groups"
	}
	p.notes = append(p.notes, fmt.Sprintf("the module layout and parameter order are the %s family's %s module (ucp's choice for a %s source); written %s",
		c.Family, naming, r.Manifest.Source.Format, what))
	if p.o.Zero <= 2 {
		return p.checkZero12()
	}
	return nil
}

// familyTensors lists the target module's tensors in the naming's order
// and the vocabulary rows the target holds (Megatron-DeepSpeed pads them
// for TP, the Hugging Face module does not).
func (p *plan) familyTensors(c *family.Config, slicer *layout.FamilySlicer, naming string, div int64) (ts []famTensor, padded int64, err error) {
	r := p.r
	switch naming {
	case namesHF:
		if err := c.Check(); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", r.Dir, err)
		}
		if p.o.TP > 1 {
			return nil, 0, fmt.Errorf("--tp %d with Hugging Face module names: DeepSpeed's AutoTP layout is not written; use --tp 1", p.o.TP)
		}
		ts = hfTensors(slicer)
		padded = c.Vocab
		if c.Tied {
			// XForCausalLM.state_dict() holds the tied head under its own name.
			p.aliases["lm_head.weight"] = "model.embed_tokens.weight"
		}
	case namesMegDS:
		if ts, err = megdsTensors(c, p.o.TP); err != nil {
			return nil, 0, fmt.Errorf("%s: %w", r.Dir, err)
		}
		k := div * int64(p.o.TP)
		padded = (c.Vocab + k - 1) / k * k
		p.paddedVocab = padded
	}
	return ts, padded, nil
}

// familyParams slices every target tensor for each TP rank into pieces of
// atomic parameters and lists them with the steps the source recorded.
func (p *plan) familyParams(slicer *layout.FamilySlicer, ts []famTensor, states []string, stacked bool, padded int64, carry bool) ([]string, map[string]pyobj.Value, error) {
	r := p.r
	p.virt = make([]map[string][]layout.StatePiece, p.o.TP)
	p.shards = make([]map[string]fragment.Shard, p.o.TP)
	for t := range p.virt {
		p.virt[t] = map[string][]layout.StatePiece{}
		p.shards[t] = map[string]fragment.Shard{}
	}
	var names []string
	steps := map[string]pyobj.Value{}
	for _, x := range ts {
		e := &atomic.ParamEntry{Name: x.name}
		for _, s := range states {
			e.Files = append(e.Files, atomic.StateEntry{State: s})
		}
		for t := 0; t < p.o.TP; t++ {
			ft, err := slicer.Slice(x.parts, x.layer, p.o.TP, t, stacked, padded)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %s: %w", r.Dir, x.name, err)
			}
			p.virt[t][x.name] = ft.Pieces
			p.shards[t][x.name] = fragment.Shard{Shape: ft.Shape}
			if t == 0 {
				e.Shape = append([]int64(nil), ft.Shape...)
				if carry && len(ft.Pieces) > 0 {
					v, ok, err := r.Step(ft.Pieces[0].Param)
					if err != nil {
						return nil, nil, err
					}
					if ok {
						steps[x.name] = v
					}
				}
			}
		}
		p.params[x.name] = e
		names = append(names, x.name)
	}
	return names, steps, nil
}

// sourceGroup returns the source's param group (not an expert one) with or
// without weight decay.
func sourceGroup(path string, od pyobj.Dec, pgs []pyobj.Dec, noWD bool) (pyobj.Dec, error) {
	for i, gd := range pgs {
		// A flag that is not a bool is an error naming the file, not false.
		if gd.OptBool("is_expert_parallel", false) {
			continue
		}
		if err := gd.Err(); err != nil {
			return gd, err
		}
		var f float64
		switch {
		case gd.Has("wd_mult"):
			f = gd.Float("wd_mult")
		case gd.Has("weight_decay"):
			f = gd.Float("weight_decay")
		case gd.Err() == nil:
			return gd, fmt.Errorf("%s: param_groups[%d] has neither wd_mult nor weight_decay", path, i)
		}
		if err := gd.Err(); err != nil {
			return gd, err
		}
		if (f == 0) == noWD {
			return gd, nil
		}
	}
	return od, fmt.Errorf("%s: no param group %s weight decay", path, map[bool]string{true: "without", false: "with"}[noWD])
}

// megatronAdam reports whether the source's optimizer state goes to the
// target: a Megatron-LM source whose every parameter has Adam's moments
// (other sources give weights only).
func megatronAdam(r *atomic.Reader) (bool, error) {
	if f := r.Manifest.Source.Format; f != "megatron" && f != "torch_dist" {
		return false, nil
	}
	n := 0
	for _, e := range r.Manifest.Params {
		has := map[string]bool{}
		for _, x := range e.Files {
			has[x.State] = true
		}
		if has["exp_avg"] && has["exp_avg_sq"] {
			n++
		}
	}
	switch n {
	case 0:
		return false, nil
	case len(r.Manifest.Params):
		return true, nil
	}
	return false, fmt.Errorf("%s: %d of %d parameters have Adam states; the target's optimizer needs them for all", r.Dir, n, len(r.Manifest.Params))
}

// hfTensors lists the Hugging Face module's tensors in its order.
func hfTensors(s *layout.FamilySlicer) []famTensor {
	var out []famTensor
	for _, v := range s.Views() {
		// One role each: Slice at TP 1 takes the role's rows.
		out = append(out, famTensor{name: v.Name, parts: []family.Role{{Name: v.Role, Fuse: family.NoFuse, TP: family.Replicated}}, layer: v.Layer})
	}
	return out
}

// megdsTensors lists Megatron-DeepSpeed GPTModel's tensors in
// named_parameters order (megatron/model/{language_model,transformer}.py
// of microsoft/Megatron-DeepSpeed: embedding; per layer input_layernorm,
// self_attention.query_key_value, dense, post_attention_layernorm,
// mlp.dense_h_to_4h, dense_4h_to_h; final_layernorm; output_layer), the
// fused QKV and gate/up of the family's parts.
func megdsTensors(c *family.Config, T int) ([]famTensor, error) {
	switch {
	case c.QKNorm:
		return nil, fmt.Errorf("%s: q/k layernorms, which Megatron-DeepSpeed's GPTModel does not have; --like a DeepSpeed checkpoint of a module that has them", c.Family)
	case c.QKVBias != c.OutBias || c.OutBias != c.MLPBias:
		return nil, fmt.Errorf("%s: biases on some linears only (q/k/v %v, output %v, MLP %v): Megatron-DeepSpeed's add_bias_linear sets all of them", c.Family, c.QKVBias, c.OutBias, c.MLPBias)
	case c.RopeScaling != nil:
		return nil, fmt.Errorf("%s: rope_scaling %s, which Megatron-DeepSpeed's rotary embedding does not compute", c.Family, c.RopeScaling.Type)
	case c.RotaryPercent != 1:
		return nil, fmt.Errorf("%s: rotary_percent %v: not carried to Megatron-DeepSpeed", c.Family, c.RotaryPercent)
	}
	for _, x := range []struct {
		what string
		n    int64
	}{{"attention heads", c.Heads}, {"query groups", c.QueryGroups}, {"FFN size", c.FFN}} {
		if x.n%int64(T) != 0 {
			return nil, fmt.Errorf("--tp %d does not divide the %d %s of the model", T, x.n, x.what)
		}
	}
	f, err := family.Get(c.Family)
	if err != nil {
		return nil, err
	}
	present := map[string]family.Role{}
	for _, r := range f.Present(c) {
		present[r.Name] = r
	}
	var out []famTensor
	add := func(name, role string, layer int) {
		r, ok := present[role]
		if !ok {
			return
		}
		out = append(out, famTensor{name: name, parts: f.Parts(c, r), layer: layer})
	}
	add("language_model.embedding.word_embeddings.weight", "embed", -1)
	for l := 0; l < int(c.Layers); l++ {
		pre := fmt.Sprintf("language_model.encoder.layers.%d.", l)
		add(pre+"input_layernorm.weight", "attn_norm", l)
		add(pre+"self_attention.query_key_value.weight", "q_proj", l)
		add(pre+"self_attention.query_key_value.bias", "q_bias", l)
		add(pre+"self_attention.dense.weight", "o_proj", l)
		add(pre+"self_attention.dense.bias", "o_bias", l)
		add(pre+"post_attention_layernorm.weight", "mlp_norm", l)
		add(pre+"mlp.dense_h_to_4h.weight", "gate_proj", l)
		add(pre+"mlp.dense_h_to_4h.bias", "gate_bias", l)
		add(pre+"mlp.dense_4h_to_h.weight", "down_proj", l)
		add(pre+"mlp.dense_4h_to_h.bias", "down_bias", l)
	}
	add("language_model.encoder.final_layernorm.weight", "final_norm", -1)
	add("language_model.output_layer.weight", "lm_head", -1)
	return out, nil
}

// megatronOnly are megatron-core's param-group keys (_get_param_groups),
// which neither Megatron-DeepSpeed's nor a plain torch optimizer's groups
// have; a FusedAdam group's step and bias_correction go too (the target
// keeps torch AdamW's per-parameter step tensor).
var megatronOnly = map[string]bool{"params": true, "is_expert_parallel": true, "default_config": true, "is_decoupled_lr": true,
	"max_lr": true, "min_lr": true, "step": true, "bias_correction": true}

// familyGroups splits the target's parameters into param groups:
// Megatron-DeepSpeed's get_param_groups ('wd_no_scale_lr' then
// 'no_wd_no_scale_lr': no weight decay for biases and 1-D parameters) or
// the Hugging Face Trainer's [decay, no decay] with the source's
// hyper-parameters; without optimizer state one group with torch AdamW's
// defaults.
func (p *plan) familyGroups(naming string, names []string, carry bool, steps map[string]pyobj.Value) error {
	if !carry {
		p.groups = []*rgroup{{names: names, hyper: pyobj.DictOf("lr", 0.001, "betas", pyobj.Tuple{0.9, 0.999}, "eps", 1e-08,
			"weight_decay", 0.01, "amsgrad", false, "foreach", nil, "maximize", false, "capturable", false, "differentiable", false, "fused", nil)}}
		return nil
	}
	path := filepath.Join(p.r.Dir, atomic.ZeroDir, atomic.OptimizerState)
	ov, err := p.r.Load(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if err != nil {
		return err
	}
	od := pyobj.NewDec(path, ov)
	pgs := od.List("param_groups")
	if err := od.Err(); err != nil {
		return err
	}
	if len(pgs) == 0 {
		return fmt.Errorf("%s: param_groups is empty", path)
	}
	for _, noWD := range []bool{false, true} {
		var members []string
		for _, n := range names {
			if (strings.HasSuffix(n, ".bias") || len(p.params[n].Shape) == 1) == noWD {
				members = append(members, n)
			}
		}
		if len(members) == 0 {
			continue
		}
		sd, err := sourceGroup(path, od, pgs, noWD)
		if err != nil {
			return err
		}
		src := sd.AsDict()
		h := pyobj.NewDict(pyobj.PlainDict)
		if naming == namesMegDS {
			h.Set("name", map[bool]string{false: "wd_no_scale_lr", true: "no_wd_no_scale_lr"}[noWD])
			h.Set("wd_mult", map[bool]float64{false: 1, true: 0}[noWD])
			lm := pyobj.Value(1.0)
			if v, ok := src.Get("lr_mult"); ok {
				lm = v
			}
			h.Set("lr_mult", lm)
		} else if sd.Has("lr_mult") {
			if f := sd.Float("lr_mult"); f != 1 && sd.Err() == nil {
				return fmt.Errorf("%s: lr_mult %v: the Hugging Face module's param groups have no learning-rate multiplier", path, f)
			}
		}
		items := sd.Items()
		if err := sd.Err(); err != nil {
			return err
		}
		for _, it := range items {
			if megatronOnly[it.Key] || it.Key == "wd_mult" || it.Key == "lr_mult" {
				continue
			}
			h.Set(it.Key, it.Value())
		}
		g := &rgroup{names: members, hyper: h}
		for _, n := range members {
			v, ok := steps[n]
			if !ok {
				continue
			}
			sv, err := stepTensor(v)
			if err != nil {
				return fmt.Errorf("%s: step of %s: %w", p.r.Dir, n, err)
			}
			if g.step == nil {
				g.step = sv
			} else if stepRepr(sv) != stepRepr(g.step) {
				return fmt.Errorf("%s: the parameters of one param group are at different steps (%s: %s)", p.r.Dir, n, stepRepr(sv))
			}
		}
		p.groups = append(p.groups, g)
	}
	return nil
}

// stepTensor is a step as torch AdamW keeps it: a 0-dim float32 tensor
// (a FusedAdam int or a distributed optimizer's float become one).
func stepTensor(v pyobj.Value) (pyobj.Value, error) {
	var f float64
	switch x := v.(type) {
	case *torchfile.Blob:
		return x, nil
	case float64:
		f = x
	default:
		n, ok := pyobj.Int(v)
		if !ok {
			return nil, fmt.Errorf("a step of type %s", pyobj.TypeName(v))
		}
		f = float64(n)
	}
	return torchfile.NewBlob(dtype.Float32, nil, dtype.Float32Bytes([]float32{float32(f)})), nil
}

// reIterTag is Megatron's iteration folder.
var reIterTag = regexp.MustCompile(`^iter_(\d+)$`)

// synthTemplate builds the model states the target's files start from:
// the module (names in order; the writer fills the tensors), the engine's
// counters, and for Megatron-DeepSpeed its client state (args,
// checkpoint_version, iteration, universal_checkpoint_info) and the
// learning-rate scheduler Megatron saved.
func (p *plan) synthTemplate(naming string, c *family.Config, names []string, div int64) error {
	r := p.r
	var iter int64
	if m := reIterTag.FindStringSubmatch(r.Manifest.Source.Tag); m != nil {
		iter, _ = strconv.ParseInt(m[1], 10, 64)
	}
	module := pyobj.NewDict(pyobj.OrderedDict)
	marker := func() *torchfile.Tensor { return &torchfile.Tensor{} }
	root := pyobj.NewDict(pyobj.PlainDict)
	if naming == namesHF {
		for _, n := range names {
			module.Set(n, marker())
			if n == "model.norm.weight" && p.aliases["lm_head.weight"] != "" {
				module.Set("lm_head.weight", marker()) // tied: after the body, as the module registers it
			}
		}
	} else {
		// Megatron's state_dict_for_save_checkpoint nesting, as
		// Megatron-DeepSpeed saves it: language_model.{embedding.
		// word_embeddings, encoder (flat), output_layer}.
		lm := pyobj.NewDict(pyobj.OrderedDict)
		enc := pyobj.NewDict(pyobj.OrderedDict)
		for _, n := range names {
			switch {
			case n == "language_model.embedding.word_embeddings.weight":
				lm.Set("embedding", pyobj.DictOf("word_embeddings", pyobj.DictOf("weight", marker())))
			case n == "language_model.output_layer.weight":
				lm.Set("encoder", enc)
				lm.Set("output_layer", pyobj.DictOf("weight", marker()))
			default:
				enc.Set(strings.TrimPrefix(n, "language_model.encoder."), marker())
			}
		}
		if _, ok := lm.Get("encoder"); !ok {
			lm.Set("encoder", enc)
		}
		module.Set("language_model", lm)
	}
	root.Set("module", module)
	root.Set("buffer_names", &pyobj.List{})
	root.Set("global_steps", iter)
	if naming == namesMegDS {
		extra, err := p.megatronExtra()
		if err != nil {
			return err
		}
		if v, ok := extra.Get("opt_param_scheduler"); ok {
			root.Set("lr_scheduler", v)
		}
		root.Set("args", megdsArgs(c, p, iter, div))
		root.Set("checkpoint_version", 3.0)
		root.Set("iteration", iter)
		root.Set("universal_checkpoint_info", megdsUCI(c, p.o.TP, p.paddedVocab))
	}
	p.synth = root
	return nil
}

// megatronExtra is the source's extra_state.pt (Megatron's args,
// scheduler) or an empty dict.
func (p *plan) megatronExtra() (*pyobj.Dict, error) {
	if !p.r.HasFile(atomic.ExtraState) {
		return pyobj.NewDict(pyobj.PlainDict), nil
	}
	v, err := p.r.Load(atomic.ExtraState)
	if err != nil {
		return nil, err
	}
	ed := pyobj.NewDec(p.r.Dir+"/"+atomic.ExtraState, v)
	return ed.AsDict(), ed.Err()
}

// megdsArgs are Megatron-DeepSpeed's saved arguments for the family config
// (its flag names: num_key_value_heads, normalization rmsnorm,
// use_rotary_position_embeddings, rope_theta, layernorm_epsilon); the
// degrees are set by the writer (args).
func megdsArgs(c *family.Config, p *plan, iter, div int64) *pyobj.Object {
	a := pyobj.NewDict(pyobj.PlainDict)
	for _, kv := range []struct {
		k string
		v pyobj.Value
	}{
		{"num_layers", c.Layers}, {"hidden_size", c.Hidden}, {"ffn_hidden_size", c.FFN},
		{"num_attention_heads", c.Heads}, {"num_key_value_heads", c.QueryGroups}, {"kv_channels", c.HeadDim},
		{"max_position_embeddings", c.MaxPositions}, {"seq_length", c.MaxPositions},
		{"make_vocab_size_divisible_by", div},
		{"padded_vocab_size", p.paddedVocab}, {"tensor_model_parallel_size", int64(p.o.TP)},
		{"pipeline_model_parallel_size", int64(1)}, {"data_parallel_size", int64(p.o.DP)},
		{"world_size", int64(p.o.TP * p.o.DP)}, {"swiglu", true}, {"add_bias_linear", c.OutBias},
		{"untie_embeddings_and_output_weights", !c.Tied}, {"add_position_embedding", false},
		{"use_rotary_position_embeddings", true}, {"rope_theta", c.RopeTheta}, {"normalization", "rmsnorm"},
		{"layernorm_epsilon", c.NormEps}, {"fp16", p.dt == dtype.Float16}, {"bf16", p.dt == dtype.BFloat16},
		{"iteration", iter}, {"deepspeed", true}, {"zero_stage", int64(p.o.Zero)}, {"no_pipeline_parallel", true},
	} {
		a.Set(kv.k, kv.v)
	}
	return &pyobj.Object{Class: &pyobj.Global{Module: "argparse", Name: "Namespace"}, Via: pyobj.ByNewObj, State: a, Built: true}
}

// megdsUCI is the universal_checkpoint_info Megatron-DeepSpeed saves with
// a GPTModel (megatron/model/gpt_model.py _universal_checkpoint_info;
// DeepSpeed's deepspeed/checkpoint/constants.py keys): vocabulary
// parameters, TP-replicated norms and biases, row-parallel linears, the
// SwiGLU fc1 as two sub-parameters, and with GQA the fused QKV's
// [Q; K; V] sub-parameters with their per-rank widths (version 0.4).
func megdsUCI(c *family.Config, T int, padded int64) *pyobj.Dict {
	lp := `language_model.encoder.layers.\d+.`
	vocab := &pyobj.List{Items: []pyobj.Value{"language_model.embedding.word_embeddings.weight"}}
	if !c.Tied {
		vocab.Items = append(vocab.Items, "language_model.output_layer.weight")
	}
	rep := []pyobj.Value{lp + "input_layernorm.weight", lp + "post_attention_layernorm.weight", "language_model.encoder.final_layernorm.weight"}
	sw := []pyobj.Value{lp + "mlp.dense_h_to_4h.weight"}
	if c.OutBias {
		rep = append(rep, lp+"self_attention.dense.bias", lp+"mlp.dense_4h_to_h.bias")
		sw = append(sw, lp+"mlp.dense_h_to_4h.bias")
	}
	u := pyobj.NewDict(pyobj.PlainDict)
	u.Set("universal_checkpoint_version", 0.4)
	u.Set("original_vocab_size", c.Vocab)
	u.Set("padded_vocab_size", padded)
	u.Set("vocabulary_parameter_patterns", vocab)
	u.Set("tp_replicated_parameter_patterns", &pyobj.List{Items: rep})
	u.Set("parameter_with_row_parallelism_patterns", &pyobj.List{Items: []pyobj.Value{lp + "mlp.dense_4h_to_h.weight", lp + "self_attention.dense.weight"}})
	u.Set("parameter_with_2_sub_params_cat_dim_0", &pyobj.List{Items: sw})
	if c.QueryGroups != c.Heads {
		q, kv := c.Heads*c.HeadDim, c.QueryGroups*c.HeadDim
		widths := func(n int64) *pyobj.List {
			l := &pyobj.List{}
			for t := 0; t < T; t++ {
				l.Items = append(l.Items, n/int64(T))
			}
			return l
		}
		subs := &pyobj.List{}
		ws := pyobj.NewDict(pyobj.PlainDict)
		kinds := []string{"weight"}
		if c.QKVBias {
			kinds = append(kinds, "bias")
		}
		for _, k := range kinds {
			pat := lp + "self_attention.query_key_value." + k
			shape := &pyobj.List{Items: []pyobj.Value{pyobj.Tuple{q, kv, kv}}}
			if k == "weight" {
				shape.Items = append(shape.Items, c.Hidden)
			}
			subs.Items = append(subs.Items, pyobj.DictOf("patterns", &pyobj.List{Items: []pyobj.Value{pat}}, "shape", shape, "partition_dim", int64(0)))
			ws.Set(pat, &pyobj.List{Items: []pyobj.Value{widths(q), widths(kv), widths(kv)}})
		}
		u.Set("parameter_with_sub_params", subs)
		u.Set("sub_param_shard_widths", ws)
	}
	return u
}
