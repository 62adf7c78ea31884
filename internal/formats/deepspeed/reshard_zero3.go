package deepspeed

import (
	"context"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// defaultSubGroupSize is DeepSpeed's zero_optimization.sub_group_size default.
const defaultSubGroupSize = 1_000_000_000

// subGroup is one ZeRO-3 sub-group: consecutive parameters of one param
// group, flattened and partitioned together by the optimizer.
type subGroup struct {
	group int
	names []string
}

// zero3SubGroups splits each param group as DeepSpeed's ZeRO-3 optimizer
// does: parameters accumulate into a sub-group until their partition sizes
// (ceil(n/D) each) reach sub_group_size, and the group's last parameter
// closes its sub-group.
func (p *plan) zero3SubGroups(cfg *pyobj.Dict) []subGroup {
	size := int64(defaultSubGroupSize)
	if v, err := pyobj.Path(cfg, "zero_optimization", "sub_group_size"); err == nil {
		if n, ok := pyobj.Int(v); ok {
			size = n
		} else if f, ok := pyobj.Float(v); ok {
			size = int64(f)
		}
	}
	D := int64(p.o.DP)
	var out []subGroup
	for gi, g := range p.groups {
		var total int64
		for _, n := range g.names {
			total += (torchfile.Numel(p.shards[0][n].Shape) + D - 1) / D
		}
		if size >= total {
			out = append(out, subGroup{group: gi, names: g.names})
			continue
		}
		cur := subGroup{group: gi}
		var acc int64
		for i, n := range g.names {
			cur.names = append(cur.names, n)
			acc += (torchfile.Numel(p.shards[0][n].Shape) + D - 1) / D
			if acc >= size || i == len(g.names)-1 {
				out = append(out, cur)
				cur, acc = subGroup{group: gi}, 0
			}
		}
	}
	return out
}

// zero3Shapes is param_shapes of a ZeRO-3 model state: one ordered map
// name -> full shape per sub-group.
func (p *plan) zero3Shapes() *pyobj.List {
	l := &pyobj.List{}
	for _, sg := range p.subs {
		d := pyobj.NewDict(pyobj.OrderedDict)
		for _, n := range sg.names {
			d.Set(n, pyobj.Size(p.shards[0][n].Shape))
		}
		l.Items = append(l.Items, d)
	}
	return l
}

// writeOptim3 writes DeepSpeedZeroOptimizer_Stage3's rigid state of DP
// rank r: per sub-group the flat fp32 partition (each parameter's
// ceil(n/D) slice, zero padded) and the torch optimizer's state of it.
func (p *plan) writeOptim3(ctx context.Context, dir string, t, r int, cfg *pyobj.Dict, st *ReshardStats) error {
	D := p.o.DP
	var fills []fill
	states := pyobj.NewDict(pyobj.PlainDict)
	var flats pyobj.List
	groupSubs := make([][]int64, len(p.groups))
	for s, sg := range p.subs {
		numels := make([]int64, len(sg.names))
		for i, n := range sg.names {
			numels[i] = torchfile.Numel(p.shards[t][n].Shape)
		}
		pieces, size, err := layout.Zero3Pieces(numels, D, r)
		if err != nil {
			return err
		}
		var fps []fillPiece
		for _, pc := range pieces {
			n := sg.names[pc.Param]
			fps = append(fps, p.sourcePieces(t, n, pc.Local, pc.N, pc.At)...)
		}
		g := p.groups[sg.group]
		sd := pyobj.NewDict(pyobj.PlainDict)
		if g.step != nil {
			sd.Set(fragment.StepState, g.step)
		}
		for _, k := range p.stateNames(g) {
			b := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{size}}
			sd.Set(k, b)
			fills = append(fills, fill{Blob: b, Pieces: withState(fps, k)})
		}
		if sd.Len() > 0 { // a fresh optimizer has no entry (writeOptim12)
			states.Set(int64(s), sd)
		}
		flat := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{size}, RequiresGrad: true}
		flats.Items = append(flats.Items, flat)
		fills = append(fills, fill{Blob: flat, Pieces: withState(fps, fragment.FP32)})
		groupSubs[sg.group] = append(groupSubs[sg.group], int64(s))
	}
	var pgroups pyobj.List
	for gi, g := range p.groups {
		pgroups.Items = append(pgroups.Items, paramGroup(g.hyper, groupSubs[gi]...))
	}
	osd := pyobj.NewDict(pyobj.PlainDict)
	osd.Set("zero_stage", zeroStageEnum(3))
	osd.Set("loss_scaler", p.scaler)
	osd.Set("dynamic_loss_scale", p.dynamicScale)
	osd.Set("overflow", false)
	osd.Set("partition_count", int64(D))
	osd.Set("optimizer_state_dict", pyobj.DictOf("state", states, "param_groups", &pgroups))
	osd.Set("fp32_flat_groups", &flats)
	root := pyobj.DictOf("optimizer_state_dict", osd, "ds_config", cfg, "ds_version", p.version)
	return p.writeFile(ctx, filepath.Join(dir, p.OptimName(t, r)), root, fills, st)
}
