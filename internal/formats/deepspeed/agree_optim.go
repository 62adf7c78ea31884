package deepspeed

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// OptimizerFields records what the optimizer file of one rank (ZeRO-1/2,
// BF16_Optimizer or ZeRO-3) shares with the other ranks of its run.
func OptimizerFields(r *Ranks, path, rank string, root *pyobj.Dict) error {
	field := func(name string, v pyobj.Value) error { return r.Field(path, rank, name, v) }
	dec := pyobj.NewDec(path, root)
	osd := dec.Dict("optimizer_state_dict")
	get := raw
	wrapper := "BF16_Optimizer (no zero_stage)"
	if zs := get(osd, "zero_stage"); zs != nil {
		wrapper = fmt.Sprintf("ZeRO stage %d", ZeroStage(zs))
	}
	if err := field("optimizer wrapper", wrapper); err != nil {
		return err
	}
	var scaler pyobj.Value
	if ls := get(osd, "loss_scaler"); ls != nil {
		scaler = pyobj.TypeName(ls)
	}
	for _, f := range []struct {
		name string
		v    pyobj.Value
	}{
		{"ds_config", get(dec, "ds_config")},
		{"ds_version", get(dec, "ds_version")},
		{"loss scaler class", scaler},
		{"dynamic_loss_scale", get(osd, "dynamic_loss_scale")},
		{"clip_grad", get(osd, "clip_grad")},
		{"partition_count", get(osd, "partition_count")},
	} {
		if err := field(f.name, f.v); err != nil {
			return err
		}
	}
	// The torch optimizer: ZeRO-1/2 and BF16_Optimizer keep it as
	// base_optimizer_state, ZeRO-3 as optimizer_state_dict.
	inner, ok := osd.OptDict("base_optimizer_state")
	if !ok {
		inner, _ = osd.OptDict("optimizer_state_dict")
	}
	if err := field("optimizer hyper-parameters (param_groups)", get(inner, "param_groups")); err != nil {
		return err
	}
	for _, flat := range []string{"single_partition_of_fp32_groups", "fp32_flat_groups"} {
		if gs, ok := pyobj.Seq(get(osd, flat)); ok {
			dts := pyobj.Tuple{}
			for _, g := range gs {
				dts = append(dts, dtypeOf(g))
			}
			if err := field("dtype of the flat groups ("+flat+")", dts); err != nil {
				return err
			}
		}
	}
	states, _ := inner.OptDict("state")
	m := states.AsDict()
	for i := 0; i < m.Len(); i++ {
		g, _ := m.Item(i)
		sd := states.Dict(g).AsDict()
		if sd == nil {
			break // dec.Err() says what is wrong
		}
		keys := pyobj.Tuple{}
		for _, k := range sd.Keys() {
			keys = append(keys, k)
		}
		if err := field(fmt.Sprintf("optimizer state keys of param group %s", pyobj.Repr(g)), keys); err != nil {
			return err
		}
		step, ok := sd.Get("step")
		if !ok {
			continue
		}
		sv, err := Step(path, step)
		if err != nil {
			return err
		}
		if err := field(fmt.Sprintf("step of param group %s", pyobj.Repr(g)), sv); err != nil {
			return err
		}
	}
	return dec.Err()
}

func dtypeOf(v pyobj.Value) pyobj.Value {
	switch t := v.(type) {
	case *torchfile.Tensor:
		return pyobj.DType{DType: t.DType}
	}
	return pyobj.TypeName(v)
}
