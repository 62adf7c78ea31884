package megatron

import (
	"fmt"
	"strings"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// A Megatron-LM source's routed experts written at a new expert layout
// (RESHARD.md, DISTWRITE.md "Mixture of experts"): global expert g of E
// lives on EP rank g/(E/EP), cut over the expert-TP ranks; with EP > 1 or
// an expert TP different from TP the experts are expert-parallel
// (megatron/core/tensor_parallel/layers.py: allreduce = not use_expert_pgs)
// and Megatron's optimizer is a ChainedOptimizer of a dense and an expert
// sub-optimizer (megatron/core/optimizer/__init__.py get_megatron_optimizer,
// NVIDIA/Megatron-LM core_v0.19.0 5be9626709af2722333bf54797c954c09edeada3).

// readExperts reads args.num_experts and checks the expert degrees
// against it and the target's ranks.
func (p *rsPlan) readExperts(args layout.Args) error {
	n, err := args.Int("num_experts", 0)
	if err != nil {
		return err
	}
	T, D := p.o.TP, p.o.DP
	if n <= 0 {
		if p.ep > 1 || p.etp != T {
			return fmt.Errorf("%s: --ep %d, --expert-tp %d: the model has no experts (args.num_experts)", p.r.Dir, p.ep, p.etp)
		}
		return nil
	}
	p.experts = int(n)
	switch {
	case n%int64(p.ep) != 0:
		return fmt.Errorf("--ep %d does not divide the %d experts (args.num_experts)", p.ep, n)
	case (T*D)%(p.ep*p.etp) != 0:
		return fmt.Errorf("expert parallel %d x expert tensor parallel %d does not divide the %d ranks of a pipeline stage (--tp %d x --dp %d), as Megatron requires", p.ep, p.etp, T*D, T, D)
	}
	if p.o.torchDist {
		return nil
	}
	if p.o.DistOptimizer && p.etp != T {
		// The legacy reader does not read it back (expert TP != TP with distrib_optim.pt).
		return fmt.Errorf("--expert-tp %d with --tp %d and --distributed-optimizer: --ckpt-format torch does not write that layout yet (--ckpt-format torch_dist does)", p.etp, T)
	}
	p.files, err = expertFiles(T, D, p.ep, p.etp)
	return err
}

// chained reports a target whose experts are expert-parallel: Megatron
// then chains a dense and an expert optimizer.
func (p *rsPlan) chained() bool { return p.experts > 0 && (p.ep > 1 || p.etp != p.o.TP) }

// expertSlices checks that an expert parameter cuts evenly over the
// expert-TP ranks (heads and query groups are not the expert's concern).
func (p *rsPlan) expertSlices(model layout.Model, e *atomic.ParamEntry, meta layout.Meta) error {
	em := model
	em.Megatron = false
	if p.eshards == nil {
		p.eshards = make([]map[string]fragment.Shard, p.etp)
		for u := range p.eshards {
			p.eshards[u] = map[string]fragment.Shard{}
		}
	}
	for u := 0; u < p.etp; u++ {
		sh, err := em.Slice(e, meta, p.etp, u, 0)
		if err != nil {
			return fmt.Errorf("--expert-tp %d: %w", p.etp, err)
		}
		if torchfile.Numel(sh.Shape) == 0 && torchfile.Numel(e.Shape) > 0 {
			return fmt.Errorf("%s: shape %v cannot be split %d ways (--expert-tp)", e.Name, e.Shape, p.etp)
		}
		p.eshards[u][e.Name] = sh
		if !p.chained() {
			p.shards[u][e.Name] = sh // dense parameters at EP 1 and expert TP = TP
		}
	}
	return nil
}

// targetGroups re-forms the source's param groups for the target's
// optimizers: the dense groups (is_expert_parallel False) as saved, then,
// for a chained target, one expert group per weight-decay setting the
// experts need, in Megatron's order (no override, i.e. wd_mult 1, first):
// the source's expert group when it had one, else its dense group of that
// setting with is_expert_parallel True (the hyper-parameters are the
// same: _get_param_groups builds both from one config). A target without
// expert parallelism drops the source's expert groups: its experts are
// members of the dense groups.
func (p *rsPlan) targetGroups() error {
	var need [2]bool // expert parameters with weight decay, without
	for _, e := range p.r.Manifest.Params {
		if isExpert(e.Name) {
			need[b2i(strings.HasSuffix(e.Name, ".bias") || len(e.Shape) == 1)] = true
		}
	}
	find := func(fl groupFlags) int {
		for g, f := range p.flags {
			if f == fl {
				return g
			}
		}
		return -1
	}
	var groups []*pyobj.Dict
	var flags []groupFlags
	for g, f := range p.flags {
		if !f.expert {
			groups, flags = append(groups, p.groups[g]), append(flags, f)
		}
	}
	p.nDense = len(groups)
	for _, noWD := range []bool{false, true} {
		if !need[b2i(noWD)] {
			continue
		}
		fl := groupFlags{noWD: noWD, expert: true}
		if !p.chained() {
			if find(groupFlags{noWD: noWD}) < 0 {
				return fmt.Errorf("%s: the experts need a param group with %v, which the source's optimizer_state.pt lacks", p.r.Dir, groupFlags{noWD: noWD})
			}
			continue
		}
		if g := find(fl); g >= 0 {
			groups, flags = append(groups, p.groups[g]), append(flags, fl)
			continue
		}
		g := find(groupFlags{noWD: noWD})
		if g < 0 {
			return fmt.Errorf("%s: the experts need a param group with %v, and optimizer_state.pt has none to derive it from", p.r.Dir, fl)
		}
		gd := p.groups[g].Clone()
		gd.Set("is_expert_parallel", true)
		groups, flags = append(groups, gd), append(flags, fl)
	}
	p.groups, p.flags = groups, flags
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// subOptimizers splits the target's groups over its optimizers: one, or
// the dense and the expert one of a chained target.
func (p *rsPlan) subOptimizers() [][]*pyobj.Dict {
	if !p.chained() {
		return [][]*pyobj.Dict{p.groups}
	}
	return [][]*pyobj.Dict{p.groups[:p.nDense], p.groups[p.nDense:]}
}

// distExpertKey is the torch_dist key of a routed expert's parameter and its
// global expert number (-1: not an expert): SequentialMLP's
// mlp.experts.local_experts.<g>.<linear>.<p> and TEGroupedMLP's
// mlp.experts.<linear>.<p><g> both save mlp.experts.experts.<linear>.<p>
// with an expert axis (moe/experts.py sharded_state_dict; DISTFORMAT.md).
func distExpertKey(name string) (string, int) {
	x := findExpert(name)
	if x.local < 0 {
		return name, -1
	}
	base := strings.Replace(x.template, "local_experts.#.", "", 1)
	base = strings.TrimSuffix(base, "#")
	return strings.Replace(base, ".mlp.experts.", "."+expertKey, 1), x.local
}

// ofSub keeps the parameters of sub-optimizer i: all of them when not
// chained, else the dense ones (0) or the routed experts (1).
func (p *rsPlan) ofSub(list []rsParam, i int) []rsParam {
	if !p.chained() {
		return list
	}
	var out []rsParam
	for _, rp := range list {
		if rp.routed == (i == 1) {
			out = append(out, rp)
		}
	}
	return out
}

// subGroups are the param groups and flags of sub-optimizer i.
func (p *rsPlan) subGroups(i int) ([]*pyobj.Dict, []groupFlags) {
	if !p.chained() {
		return p.groups, p.flags
	}
	if i == 0 {
		return p.groups[:p.nDense], p.flags[:p.nDense]
	}
	return p.groups[p.nDense:], p.flags[p.nDense:]
}

// distribSubs says which sub-optimizer states distrib_optim.pt of rank
// file f holds: Megatron's save_parameter_state writes, from every rank,
// the states of the sub-optimizers whose data-parallel group it is rank 0
// of (ChainedOptimizer.save_parameter_state), into that rank's file. Within
// a stage dense DP rank 0 is rank t (EP rank (t/U)%EP); expert-DP rank 0
// are the ranks r < U*EP (rank order etp-ep-edp).
func (p *rsPlan) distribSubs(f outFile) []bool {
	if !p.chained() {
		return []bool{true}
	}
	U, EP, T := p.etp, p.ep, p.o.TP
	expert := false
	for r := 0; r < U*EP; r++ {
		if r%T == f.t && (r/U)%EP == f.e && r%U == f.u {
			expert = true
		}
	}
	return []bool{(f.t/U)%EP == f.e && f.t%U == f.u, expert}
}
