package main

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// generateZero3 writes the model as DeepSpeed ZeRO-3 with bf16 saves it at
// DP ranks and no tensor parallelism (formats/deepspeed/ZERO3.md): per rank a model
// state file whose module holds released (empty) bf16 parameters and the
// param_shapes, and a bf16_ optimizer file with one fp32 sub-group: every
// parameter flattened, padded to a multiple of DP and cut evenly, the
// rank's Pn = ceil(n/DP) elements of each parameter concatenated.
func generateZero3(dir string, c Config) error {
	if c.TP != 1 {
		return fmt.Errorf("the ZeRO-3 benchmark checkpoint has no tensor parallelism (TP %d)", c.TP)
	}
	return c.writeTag(dir, func(g *errgroup.Group, td string, ps []param) {
		for dp := 0; dp < c.DP; dp++ {
			g.Go(func() error { return c.writeZero3Model(td, ps, dp) })
			g.Go(func() error { return c.writeZero3Optim(td, ps, dp) })
		}
	})
}

func (c Config) writeZero3Model(td string, ps []param, dp int) error {
	module := pyobj.NewDict(pyobj.OrderedDict)
	shapes := pyobj.NewDict(pyobj.OrderedDict)
	for _, p := range ps {
		module.Set(p.name, torchfile.NewBlob(dtype.BFloat16, []int64{0}, []byte{}))
		shapes.Set(p.name, pyobj.Size(p.full))
	}
	root := pyobj.DictOf(
		"module", module, "buffer_names", &pyobj.List{}, "optimizer", nil,
		"param_shapes", &pyobj.List{Items: []pyobj.Value{shapes}},
		"frozen_param_shapes", pyobj.NewDict(pyobj.OrderedDict), "shared_params", pyobj.NewDict(pyobj.PlainDict),
		"frozen_param_fragments", pyobj.NewDict(pyobj.OrderedDict),
		"lr_scheduler", pyobj.DictOf("last_batch_iteration", int64(99)), "data_sampler", nil, "random_ltd", nil,
		"sparse_tensor_module_names", &pyobj.Set{}, "skipped_steps", int64(0), "global_steps", int64(100),
		"global_samples", int64(100*4*c.DP), "dp_world_size", int64(c.DP), "mp_world_size", int64(1),
		"ds_config", dsConfig(3), "ds_version", "0.14.5")
	return torchfile.Save(filepath.Join(td, fmt.Sprintf("zero_pp_rank_%d_mp_rank_00_model_states.pt", dp)), root)
}

func (c Config) writeZero3Optim(td string, ps []param, dp int) error {
	D := int64(c.DP)
	var segs []segment
	var total int64
	for i, p := range ps {
		n := numel(p.full)
		pn := (n + D - 1) / D
		lo := int64(dp) * pn
		if hi := min(lo+pn, n); lo < hi {
			segs = append(segs, segment{param: i, p: p, lo: lo, hi: hi, at: total})
		}
		total += pn
	}
	fp32 := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{total}, RequiresGrad: true}
	expAvg := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{total}}
	expAvgSq := &torchfile.Blob{DType: dtype.Float32, Shape: []int64{total}}
	step := torchfile.NewBlob(dtype.Float32, nil, dtype.Float32Bytes([]float32{100}))
	group := pyobj.DictOf("lr", 1e-4, "betas", &pyobj.List{Items: []pyobj.Value{0.9, 0.95}}, "eps", 1e-8, "weight_decay", 0.1,
		"amsgrad", false, "foreach", nil, "maximize", false, "capturable", false, "params", &pyobj.List{Items: []pyobj.Value{int64(0)}})
	scaler := &pyobj.Object{Class: &pyobj.Global{Module: "deepspeed.runtime.fp16.loss_scaler", Name: "LossScaler"},
		Via: pyobj.ByNewObj, Built: true, State: pyobj.DictOf("cur_scale", 1.0, "dynamic", false)}
	osd := pyobj.DictOf(
		"zero_stage", pyobj.Enum{Class: &pyobj.Global{Module: "deepspeed.runtime.zero.config", Name: "ZeroStageEnum"}, Name: "weights", ByName: true},
		"loss_scaler", scaler, "dynamic_loss_scale", false, "overflow", false, "partition_count", D,
		"optimizer_state_dict", pyobj.DictOf(
			"state", pyobj.DictOf(int64(0), pyobj.DictOf("step", step, "exp_avg", expAvg, "exp_avg_sq", expAvgSq)),
			"param_groups", &pyobj.List{Items: []pyobj.Value{group}}),
		"fp32_flat_groups", &pyobj.List{Items: []pyobj.Value{fp32}})
	root := pyobj.DictOf("optimizer_state_dict", osd, "ds_config", dsConfig(3), "ds_version", "0.14.5")
	w, err := torchfile.Create(filepath.Join(td, fmt.Sprintf("bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt", dp)), root)
	if err != nil {
		return err
	}
	for i, b := range w.Layout.Blobs {
		if b.Data != nil {
			continue
		}
		state := map[*torchfile.Blob]int{fp32: StateFP32, expAvg: StateExpAvg, expAvgSq: StateExpAvgSq}[b]
		if err := c.fill(w, i, dtype.Float32, state, segs, 0, b.NBytes()); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Commit()
}
