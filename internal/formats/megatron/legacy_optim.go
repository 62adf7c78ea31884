package megatron

import (
	"fmt"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// readSubs splits model_optim_rng.pt['optimizer'] into sub-optimizer
// state dicts: a list for a ChainedOptimizer (dense, then expert), else
// one dict.
func (f *rankFile) readSubs() error {
	root := pyobj.NewDec(f.rd.model, f.root)
	v, ok := root.Opt("optimizer")
	if !ok {
		if err := root.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%s: no optimizer state (saved with --no-save-optim?); conversion needs the fp32 main parameters and Adam moments", f.rd.model)
	}
	f.subs = []pyobj.Dec{v}
	switch v.Value().(type) {
	case *pyobj.List: // a ChainedOptimizer's
		f.subs = v.AsList()
	}
	for _, sub := range f.subs {
		sub.AsDict()
	}
	if err := root.Err(); err != nil {
		return err
	}
	if len(f.subs) == 0 {
		return fmt.Errorf("%s: the optimizer state is an empty list", f.rd.model)
	}
	return nil
}

// innerOptimizer returns the torch optimizer state dict of a sub-optimizer
// (Float16Optimizer and DistributedOptimizer wrap it as 'optimizer';
// FP32Optimizer saves it bare).
func innerOptimizer(path string, i int, sub pyobj.Dec) (pyobj.Dec, error) {
	if sub.Has("optimizer") {
		inner := sub.Dict("optimizer")
		return inner, sub.Err()
	}
	if sub.Has("param_groups") {
		return sub, nil
	}
	if err := sub.Err(); err != nil {
		return sub, err
	}
	return sub, fmt.Errorf("%s: optimizer[%d] has neither 'optimizer' nor 'param_groups' (keys %v)", path, i, pyobj.SortedKeys(sub.AsDict()))
}

// groupFlags are what tells Megatron's param groups apart: no weight decay
// (names ending '.bias' and 1-D params) and expert parallelism.
type groupFlags struct {
	noWD, expert bool
}

func (g groupFlags) String() string {
	return fmt.Sprintf("wd_mult %s, is_expert_parallel %v", map[bool]string{true: "0", false: "!= 0"}[g.noWD], g.expert)
}

// readGroups reads the param groups of a torch optimizer state dict and
// the flags that tell them apart.
func readGroups(path string, i int, inner pyobj.Dec) ([]pyobj.Dec, []groupFlags, error) {
	groups := inner.List("param_groups")
	if err := inner.Err(); err != nil {
		return nil, nil, err
	}
	flags := make([]groupFlags, len(groups))
	for g, gd := range groups {
		fl := &flags[g]
		switch {
		case gd.Has("wd_mult"):
			fl.noWD = gd.Float("wd_mult") == 0
		case gd.Has("weight_decay"):
			fl.noWD = gd.Float("weight_decay") == 0
		case gd.Err() == nil:
			return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] has neither wd_mult nor weight_decay; its parameters cannot be told", path, i, g)
		}
		if gd.Has("is_expert_parallel") {
			fl.expert = gd.Bool("is_expert_parallel")
		}
		if err := gd.Err(); err != nil {
			return nil, nil, err
		}
	}
	return groups, flags, nil
}

// flagsOf are the group flags of a parameter (optimizer/__init__.py
// get_standard_config_overrides; apply_wd_to_qk_layernorm exempts q/k
// layernorms from the no-decay rule).
func flagsOf(lp *localParam, qkWD bool) groupFlags {
	noWD := strings.HasSuffix(lp.local, ".bias") || len(lp.t.Shape) == 1
	if qkWD && (strings.Contains(lp.local, "q_layernorm.") || strings.Contains(lp.local, "k_layernorm.")) {
		noWD = false
	}
	return groupFlags{noWD: noWD, expert: lp.expert}
}

// groupOf returns the index of the saved group a parameter belongs to.
func groupOf(flags []groupFlags, fl groupFlags) int {
	for g, f := range flags {
		if f == fl {
			return g
		}
	}
	return -1
}

// mapFloat16 reads the state of the non-distributed optimizer: for each
// saved group in order, its members are this rank's parameters (all
// chunks, named order) with the group's flags; group['params'][k] is the
// id of member k, state[id] holds its moments, and the fp32 main copies
// of the 16-bit members are fp32_from_fp16_params[g] in order.
func (f *rankFile) mapFloat16(a *Args, qkWD bool) (notes []string, err error) {
	path := f.rd.model
	for i, sub := range f.subs {
		usedWeights, err := f.mapFloat16Sub(i, sub, qkWD)
		if err != nil {
			return nil, err
		}
		if usedWeights {
			notes = append(notes, "the optimizer holds no fp32 main parameters (fp32_from_fp16_params) for 16-bit weights; fp32 comes from the 16-bit model weights")
		}
	}
	for _, lp := range f.params {
		if lp.states == nil {
			return nil, fmt.Errorf("%s: %s belongs to no optimizer param group", path, lp.local)
		}
	}
	return notes, nil
}

// mapFloat16Sub maps the groups of sub-optimizer i; usedWeights says that
// some 16-bit parameter has no fp32 main copy (its weights stand for it).
func (f *rankFile) mapFloat16Sub(i int, sub pyobj.Dec, qkWD bool) (usedWeights bool, err error) {
	path := f.rd.model
	inner, err := innerOptimizer(path, i, sub)
	if err != nil {
		return false, err
	}
	groups, flags, err := readGroups(path, i, inner)
	if err != nil {
		return false, err
	}
	for g := range flags {
		for h := 0; h < g; h++ {
			if flags[h] == flags[g] {
				return false, fmt.Errorf("%s: optimizer[%d] param_groups %d and %d both hold parameters with %v; ucp cannot tell their members apart (custom param-group overrides)", path, i, h, g, flags[g])
			}
		}
	}
	if !inner.Has("state") {
		return false, fmt.Errorf("%s: optimizer[%d] has no 'state' (and the folder has no %s)", path, i, distribFile)
	}
	state := inner.Dict("state")
	mv, hasMains := sub.Opt("fp32_from_fp16_params")
	mains := mv.AsList()
	if err := sub.Err(); err != nil {
		return false, err
	}
	for g, grp := range groups {
		ids := grp.Key("params").AsInts()
		if err := grp.Err(); err != nil {
			return false, err
		}
		var members []*localParam
		for _, lp := range f.params {
			if flagsOf(lp, qkWD) == flags[g] {
				members = append(members, lp)
			}
		}
		if len(ids) != len(members) {
			return false, fmt.Errorf("%s: optimizer[%d] param_groups[%d] (%v) holds %d parameters but the model state has %d such parameters; the optimizer does not match the model",
				path, i, g, flags[g], len(ids), len(members))
		}
		var gmains []pyobj.Dec
		if hasMains {
			if g >= len(mains) {
				return false, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params has %d groups, param_groups %d", path, i, len(mains), len(groups))
			}
			if gmains = mains[g].AsList(); sub.Err() != nil {
				return false, sub.Err()
			}
		}
		used, err := f.memberStates(i, g, grp, members, ids, state, gmains, hasMains)
		if err != nil {
			return false, err
		}
		usedWeights = usedWeights || used
	}
	return usedWeights, nil
}

// memberStates gives each member of group g (parameter ids ids) its fp32
// main parameter (gmains in order for the 16-bit members, with hasMains)
// and its optimizer states (state[id]).
func (f *rankFile) memberStates(i, g int, grp pyobj.Dec, members []*localParam, ids []int64, state pyobj.Dec, gmains []pyobj.Dec, hasMains bool) (usedWeights bool, err error) {
	path := f.rd.model
	j := 0 // index among the group's 16-bit members
	for k, lp := range members {
		where := fmt.Sprintf("%s: optimizer[%d] state of %s (param_groups[%d] id %d)", path, i, lp.local, g, ids[k])
		if !state.Has(ids[k]) {
			return false, fmt.Errorf("%s: missing (saved before the first optimizer step?)", where)
		}
		sd := state.Dict(ids[k])
		items := sd.Items()
		lp.states = map[string]srcRef{}
		// fp32 main parameter: the copy of a 16-bit parameter, or the
		// fp32 parameter itself.
		if lp.t.DType == dtype.Float32 || !hasMains {
			lp.states[fragment.FP32] = srcRef{ref: fragment.Ref(path, lp.t, 0)}
			usedWeights = usedWeights || lp.t.DType != dtype.Float32
		} else {
			if j >= len(gmains) {
				return false, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d] has %d tensors, fewer than the group's 16-bit parameters", path, i, g, len(gmains))
			}
			mt := pyobj.As[*torchfile.Tensor](gmains[j], "tensor")
			if err := gmains[j].Err(); err != nil {
				return false, err
			}
			lp.states[fragment.FP32] = srcRef{ref: fragment.Ref(path, mt, 0)}
			j++
		}
		if err := sd.Err(); err != nil {
			return false, err
		}
		for _, it := range items {
			if it.Key == fragment.StepState {
				continue
			}
			switch tt := it.Value().(type) {
			case *torchfile.Tensor: // other values are an optimizer's scalars
				lp.states[it.Key] = srcRef{ref: fragment.Ref(path, tt, 0)}
			}
		}
		for name, s := range lp.states {
			if !torchfile.SameShape(s.ref.T.Shape, lp.t.Shape) {
				return false, fmt.Errorf("%s: %s has shape %v but the parameter has %v", where, name, s.ref.T.Shape, lp.t.Shape)
			}
		}
		lp.step = stepOf(path, sd.AsDict(), grp.AsDict())
	}
	if hasMains && j != len(gmains) {
		return false, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d] has %d tensors for %d 16-bit parameters", path, i, g, len(gmains), j)
	}
	return usedWeights, nil
}

// stepOf is a parameter's step: torch Adam keeps a 0-dim tensor per
// parameter, fused Adams (Apex, TE) and the distributed optimizer an int
// or float per group.
func stepOf(path string, state, group *pyobj.Dict) *fragment.Step {
	if state != nil {
		if v, ok := state.Get(fragment.StepState); ok {
			switch t := v.(type) {
			case *torchfile.Tensor:
				ref := fragment.Ref(path, t, 0)
				return &fragment.Step{Tensor: &ref}
			}
			return &fragment.Step{Value: v}
		}
	}
	if group != nil {
		if v, ok := group.Get(fragment.StepState); ok {
			return &fragment.Step{Value: v}
		}
	}
	return nil
}
