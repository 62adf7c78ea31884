package megatron

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// carriesOptimizer reports whether a family source's optimizer state goes
// to Megatron too: a DeepSpeed source (Megatron-DeepSpeed) whose every
// trained parameter has Adam's exp_avg and exp_avg_sq. Other sources (Hugging
// Face, DCP) give weights only.
func carriesOptimizer(r *atomic.Reader) (bool, error) {
	f := r.Manifest.Source.Format
	if f != "deepspeed" && f != "deepspeed-zero3" {
		return false, nil
	}
	if !r.HasFile(filepath.Join(atomic.ZeroDir, atomic.OptimizerState)) {
		return false, nil
	}
	var with, without []string
	for _, e := range r.Manifest.Params {
		if e.Frozen {
			continue
		}
		has := map[string]bool{}
		for _, x := range e.Files {
			has[x.State] = true
		}
		if has["exp_avg"] && has["exp_avg_sq"] && has[fragment.FP32] {
			with = append(with, e.Name)
		} else {
			without = append(without, e.Name)
		}
	}
	if len(with) > 0 && len(without) > 0 {
		return false, fmt.Errorf("%s: %s has Adam states but %s has none; Megatron's optimizer needs them for every parameter", r.Dir, with[0], without[0])
	}
	return len(with) > 0, nil
}

// familyStates records the optimizer states of a target tensor built from
// the pieces of source parameters: fp32, exp_avg and exp_avg_sq of each
// (elementwise, so they follow the weights' pieces) and one step.
func (p *rsPlan) familyStates(key string, vt virtTensor) error {
	p.states[key] = []string{fragment.FP32, "exp_avg", "exp_avg_sq"}
	var step pyobj.Value
	var from string
	for _, pc := range vt.pieces {
		v, ok, err := p.r.Step(pc.Param)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if step != nil && stepKey(v) != stepKey(step) {
			return fmt.Errorf("%s: %s and %s, fused into %s, are at different steps", p.r.Dir, from, pc.Param, key)
		}
		step, from = v, pc.Param
	}
	if step != nil {
		p.steps[key] = step
	}
	return nil
}

func stepKey(v pyobj.Value) string {
	switch b := v.(type) {
	case *torchfile.Blob:
		return fmt.Sprintf("tensor %v %x", b.DType, b.Data)
	}
	return pyobj.Repr(v)
}

// reGlobalStep is DeepSpeed's default tag.
var reGlobalStep = regexp.MustCompile(`^global_step(\d+)$`)

// familyOptimizer sets up the Megatron optimizer state of a DeepSpeed
// (Megatron-DeepSpeed) source (RESHARD.md, "From DeepSpeed"): the
// iteration, Megatron's two param groups (weight decay, then none: core's
// _get_param_groups order) with the source groups' hyper-parameters, and
// the learning-rate scheduler the DeepSpeed engine saved.
func (p *rsPlan) familyOptimizer() error {
	r := p.r
	p.release = false
	var lrs [2]pyobj.Value
	for i, n := range []string{"lr", "min_lr"} {
		v, ok, err := manifestNumber(r, n)
		if err != nil {
			return err
		}
		if ok {
			lrs[i] = v
		}
	}
	it, hasIt, err := manifestNumber(r, "iteration")
	if err != nil {
		return err
	}
	if hasIt && it >= 0 {
		p.iter = int64(it)
	} else if m := reGlobalStep.FindStringSubmatch(r.Manifest.Source.Tag); m != nil {
		p.iter, _ = strconv.ParseInt(m[1], 10, 64)
	} else {
		return fmt.Errorf("%s: the source records no iteration (args.iteration or a global_stepN tag): Megatron needs one to resume", r.Dir)
	}
	path := filepath.Join(r.Dir, atomic.ZeroDir, atomic.OptimizerState)
	ov, err := r.Load(filepath.Join(atomic.ZeroDir, atomic.OptimizerState))
	if err != nil {
		return err
	}
	src, flags, err := readGroups(path, 0, pyobj.NewDec(path, ov))
	if err != nil {
		return err
	}
	ms, err := p.dsModelStates()
	if err != nil {
		return err
	}
	if err := p.checkDSGroups(ms, flags); err != nil {
		return err
	}
	p.optim = pyobj.NewDict(pyobj.PlainDict)
	// core's _get_param_groups: sorted override keys, None (weight decay) first.
	for _, noWD := range []bool{false, true} {
		g := -1
		for i, f := range flags {
			if f.noWD == noWD && !f.expert {
				g = i
				break
			}
		}
		if g < 0 {
			return fmt.Errorf("%s: no param group %s weight decay; Megatron puts biases and 1-D parameters in one without and the rest in one with", path, map[bool]string{true: "without", false: "with"}[noWD])
		}
		p.groups = append(p.groups, megatronGroup(src[g], noWD, lrs))
		if err := src[g].Err(); err != nil {
			return err
		}
		p.flags = append(p.flags, groupFlags{noWD: noWD})
	}
	if ls, ok := ms.OptDict("lr_scheduler"); ok && ls.Has("max_lr") {
		// Megatron-DeepSpeed's OptimizerParamScheduler.state_dict():
		// the keys Megatron-LM's load_state_dict reads.
		p.extra.Set("opt_param_scheduler", ls.AsDict())
	}
	if err := ms.Err(); err != nil {
		return err
	}
	if _, ok := p.extra.Get("opt_param_scheduler"); !ok {
		return fmt.Errorf("%s: the DeepSpeed model states hold no Megatron learning-rate scheduler (lr_scheduler with max_lr), which Megatron's load_checkpoint reads with the optimizer", r.Dir)
	}
	if p.style, err = styleOf(p.o.Optimizer, p.steps); err != nil {
		return err
	}
	p.groups, err = adamGroups(r.Dir, p.groups, p.style)
	return err
}

// megatronGroup is a param group as megatron-core 0.19 saves it (its
// _get_param_groups keys, then the torch optimizer's hyper-parameters
// from the source group); lrs are args.lr and args.min_lr, nil when the
// source's args lack them.
func megatronGroup(src pyobj.Dec, noWD bool, lrs [2]pyobj.Value) *pyobj.Dict {
	g := pyobj.NewDict(pyobj.PlainDict)
	wd := 1.0
	if noWD {
		wd = 0.0
	}
	lrMult := src.OptFloat("lr_mult", 1.0)
	var lr pyobj.Value
	if v, ok := src.Opt("lr"); ok {
		lr = v.Value()
	}
	maxLR, minLR := lr, pyobj.Value(0.0)
	if lrs[0] != nil {
		maxLR = lrs[0]
	}
	if lrs[1] != nil {
		minLR = lrs[1]
	}
	g.Set("is_expert_parallel", false)
	g.Set("default_config", true)
	g.Set("wd_mult", wd)
	g.Set("lr_mult", lrMult)
	g.Set("is_decoupled_lr", false)
	g.Set("max_lr", maxLR)
	g.Set("min_lr", minLR)
	skip := map[string]bool{"params": true, "name": true}
	for _, it := range src.Items() {
		if _, done := g.Get(it.Key); !done && !skip[it.Key] {
			g.Set(it.Key, it.Value())
		}
	}
	return g
}

// dsModelStates decodes the first DeepSpeed model-state file the atomic
// checkpoint carries (param_shapes, lr_scheduler).
func (p *rsPlan) dsModelStates() (pyobj.Dec, error) {
	for _, f := range p.r.Manifest.Files {
		if filepath.Base(f.Path) != "mp_rank_00_model_states.pt" && filepath.Base(f.Path) != "zero_pp_rank_0_mp_rank_00_model_states.pt" {
			continue
		}
		path := filepath.Join(p.r.Dir, filepath.FromSlash(f.Path))
		tf, err := torchfile.Open(path)
		if err != nil {
			return pyobj.Dec{}, err
		}
		defer tf.Close()
		d := pyobj.NewDec(path, tf.Root)
		d.AsDict()
		return d, d.Err()
	}
	return pyobj.Dec{}, fmt.Errorf("%s: no DeepSpeed model-state file in the atomic checkpoint (it gives the param groups' members and the scheduler)", p.r.Dir)
}

// checkDSGroups refuses param groups that Megatron's rule (no weight decay
// for biases and 1-D parameters) would not rebuild: param_shapes[g] lists
// group g's parameters.
func (p *rsPlan) checkDSGroups(ms pyobj.Dec, flags []groupFlags) error {
	shapes := ms.List("param_shapes")
	if err := ms.Err(); err != nil {
		return err
	}
	if len(shapes) != len(flags) {
		return fmt.Errorf("%s: the model states' %d param_shapes groups do not match the %d param groups", p.r.Dir, len(shapes), len(flags))
	}
	for g, sd := range shapes {
		items := sd.Items()
		if err := ms.Err(); err != nil {
			return err
		}
		for _, it := range items {
			n := it.Key
			e, ok := p.r.Param(n)
			if !ok {
				continue // an alias or a pipeline name (checked through its canonical name)
			}
			noWD := len(n) > 5 && n[len(n)-5:] == ".bias" || len(e.Shape) == 1
			if noWD != flags[g].noWD {
				return fmt.Errorf("%s: %s is in param group %d (%s), but Megatron's rule puts it in the group with wd_mult %v: custom param groups are not carried to Megatron", p.r.Dir, n, g, flags[g], map[bool]int{true: 0, false: 1}[noWD])
			}
		}
	}
	return nil
}

// manifestNumber reads a number from the training arguments the manifest
// records: absent or null gives ok false; any other type is an error.
func manifestNumber(r *atomic.Reader, name string) (v float64, ok bool, err error) {
	switch x := r.Manifest.Source.Args[name].(type) {
	case nil:
		return 0, false, nil
	case float64:
		return x, true, nil
	case int64:
		return float64(x), true, nil
	case int:
		return float64(x), true, nil
	default:
		return 0, false, fmt.Errorf("%s: the manifest's args.%s is %v, not a number", r.Dir, name, x)
	}
}
