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
	v, ok := f.root.Get("optimizer")
	if !ok || v == nil {
		return fmt.Errorf("%s: no optimizer state (saved with --no-save-optim?); conversion needs the fp32 main parameters and Adam moments", f.rd.model)
	}
	items := []pyobj.Value{v}
	if l, ok := v.(*pyobj.List); ok {
		items = l.Items
	}
	for i, it := range items {
		d, ok := it.(*pyobj.Dict)
		if !ok {
			return fmt.Errorf("%s: optimizer[%d] is %s, not a dict", f.rd.model, i, pyobj.TypeName(it))
		}
		f.subs = append(f.subs, d)
	}
	if len(f.subs) == 0 {
		return fmt.Errorf("%s: the optimizer state is an empty list", f.rd.model)
	}
	return nil
}

// innerOptimizer returns the torch optimizer state dict of a sub-optimizer
// (Float16Optimizer and DistributedOptimizer wrap it as 'optimizer';
// FP32Optimizer saves it bare).
func innerOptimizer(path string, i int, sub *pyobj.Dict) (*pyobj.Dict, error) {
	if v, ok := sub.Get("optimizer"); ok {
		d, ok := v.(*pyobj.Dict)
		if !ok {
			return nil, fmt.Errorf("%s: optimizer[%d]['optimizer'] is %s, not a dict", path, i, pyobj.TypeName(v))
		}
		return d, nil
	}
	if _, ok := sub.Get("param_groups"); ok {
		return sub, nil
	}
	return nil, fmt.Errorf("%s: optimizer[%d] has neither 'optimizer' nor 'param_groups' (keys %v)", path, i, pyobj.SortedKeys(sub))
}

// groupFlags are what tells Megatron's param groups apart: no weight decay
// (names ending '.bias' and 1-D params) and expert parallelism.
type groupFlags struct {
	noWD, expert bool
}

func (g groupFlags) String() string {
	return fmt.Sprintf("wd_mult %s, is_expert_parallel %v", map[bool]string{true: "0", false: "!= 0"}[g.noWD], g.expert)
}

func readGroups(path string, i int, inner *pyobj.Dict) ([]*pyobj.Dict, []groupFlags, error) {
	v, ok := inner.Get("param_groups")
	if !ok {
		return nil, nil, fmt.Errorf("%s: optimizer[%d] has no param_groups", path, i)
	}
	items, ok := pyobj.Seq(v)
	if !ok {
		return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups is %s, not a list", path, i, pyobj.TypeName(v))
	}
	var groups []*pyobj.Dict
	var flags []groupFlags
	for g, it := range items {
		d, ok := it.(*pyobj.Dict)
		if !ok {
			return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] is %s", path, i, g, pyobj.TypeName(it))
		}
		var fl groupFlags
		if w, ok := d.Get("wd_mult"); ok {
			x, ok := pyobj.Float(w)
			if !ok {
				return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] wd_mult is %s", path, i, g, pyobj.Repr(w))
			}
			fl.noWD = x == 0
		} else if w, ok := d.Get("weight_decay"); ok {
			x, ok := pyobj.Float(w)
			if !ok {
				return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] weight_decay is %s", path, i, g, pyobj.Repr(w))
			}
			fl.noWD = x == 0
		} else {
			return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] has neither wd_mult nor weight_decay; its parameters cannot be told", path, i, g)
		}
		if e, ok := d.Get("is_expert_parallel"); ok {
			if fl.expert, ok = e.(bool); !ok {
				return nil, nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] is_expert_parallel is %s, not a bool", path, i, g, pyobj.Repr(e))
			}
		}
		groups = append(groups, d)
		flags = append(flags, fl)
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
		inner, err := innerOptimizer(path, i, sub)
		if err != nil {
			return nil, err
		}
		groups, flags, err := readGroups(path, i, inner)
		if err != nil {
			return nil, err
		}
		for g := range flags {
			for h := 0; h < g; h++ {
				if flags[h] == flags[g] {
					return nil, fmt.Errorf("%s: optimizer[%d] param_groups %d and %d both hold parameters with %v; ucp cannot tell their members apart (custom param-group overrides)", path, i, h, g, flags[g])
				}
			}
		}
		stateV, ok := inner.Get("state")
		if !ok {
			return nil, fmt.Errorf("%s: optimizer[%d] has no 'state' (and the folder has no %s)", path, i, distribFile)
		}
		state, ok := stateV.(*pyobj.Dict)
		if !ok {
			return nil, fmt.Errorf("%s: optimizer[%d]['state'] is %s", path, i, pyobj.TypeName(stateV))
		}
		var mains []pyobj.Value
		hasMains := false
		if v, ok := sub.Get("fp32_from_fp16_params"); ok && v != nil {
			if mains, ok = pyobj.Seq(v); !ok {
				return nil, fmt.Errorf("%s: optimizer[%d]['fp32_from_fp16_params'] is %s, not a list", path, i, pyobj.TypeName(v))
			}
			hasMains = true
		}
		usedWeights := false
		for g, grp := range groups {
			ids, ok := pyobj.Ints(mustGet(grp, "params"))
			if !ok {
				return nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d]['params'] is not a list of ids", path, i, g)
			}
			var members []*localParam
			for _, lp := range f.params {
				if flagsOf(lp, qkWD) == flags[g] {
					members = append(members, lp)
				}
			}
			if len(ids) != len(members) {
				return nil, fmt.Errorf("%s: optimizer[%d] param_groups[%d] (%v) holds %d parameters but the model state has %d such parameters; the optimizer does not match the model",
					path, i, g, flags[g], len(ids), len(members))
			}
			var gmains []pyobj.Value
			if hasMains {
				if g >= len(mains) {
					return nil, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params has %d groups, param_groups %d", path, i, len(mains), len(groups))
				}
				if gmains, ok = pyobj.Seq(mains[g]); !ok {
					return nil, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d] is %s", path, i, g, pyobj.TypeName(mains[g]))
				}
			}
			j := 0 // index among the group's 16-bit members
			for k, lp := range members {
				where := fmt.Sprintf("%s: optimizer[%d] state of %s (param_groups[%d] id %d)", path, i, lp.local, g, ids[k])
				sv, ok := state.Get(ids[k])
				if !ok {
					return nil, fmt.Errorf("%s: missing (saved before the first optimizer step?)", where)
				}
				sd, ok := sv.(*pyobj.Dict)
				if !ok {
					return nil, fmt.Errorf("%s is %s, not a dict", where, pyobj.TypeName(sv))
				}
				lp.states = map[string]srcRef{}
				// fp32 main parameter: the copy of a 16-bit parameter, or the
				// fp32 parameter itself.
				if lp.t.DType == dtype.Float32 || !hasMains {
					lp.states[fragment.FP32] = srcRef{ref: fragment.Ref(path, lp.t, 0)}
					usedWeights = usedWeights || lp.t.DType != dtype.Float32
				} else {
					if j >= len(gmains) {
						return nil, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d] has %d tensors, fewer than the group's 16-bit parameters", path, i, g, len(gmains))
					}
					mt, ok := gmains[j].(*torchfile.Tensor)
					if !ok {
						return nil, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d][%d] is %s", path, i, g, j, pyobj.TypeName(gmains[j]))
					}
					lp.states[fragment.FP32] = srcRef{ref: fragment.Ref(path, mt, 0)}
					j++
				}
				for n := 0; n < sd.Len(); n++ {
					kv, vv := sd.Item(n)
					ks, ok := kv.(string)
					if !ok {
						return nil, fmt.Errorf("%s: state key %s is %s, not a str", where, pyobj.Repr(kv), pyobj.TypeName(kv))
					}
					if ks == fragment.StepState {
						continue
					}
					if tt, ok := vv.(*torchfile.Tensor); ok {
						lp.states[ks] = srcRef{ref: fragment.Ref(path, tt, 0)}
					}
				}
				for name, s := range lp.states {
					if !torchfile.SameShape(s.ref.T.Shape, lp.t.Shape) {
						return nil, fmt.Errorf("%s: %s has shape %v but the parameter has %v", where, name, s.ref.T.Shape, lp.t.Shape)
					}
				}
				lp.step = stepOf(path, sd, grp)
			}
			if hasMains && j != len(gmains) {
				return nil, fmt.Errorf("%s: optimizer[%d] fp32_from_fp16_params[%d] has %d tensors for %d 16-bit parameters", path, i, g, len(gmains), j)
			}
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

// stepOf is a parameter's step: torch Adam keeps a 0-dim tensor per
// parameter, fused Adams (Apex, TE) and the distributed optimizer an int
// or float per group.
func stepOf(path string, state, group *pyobj.Dict) *fragment.Step {
	if state != nil {
		if v, ok := state.Get(fragment.StepState); ok {
			if t, ok := v.(*torchfile.Tensor); ok {
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

func mustGet(d *pyobj.Dict, k string) pyobj.Value {
	v, _ := d.Get(k)
	return v
}
