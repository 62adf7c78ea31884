package megatron

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// torchAdamOnly are the hyper-parameters torch.optim.Adam/AdamW keep in
// every param group (torch 2.6 torch/optim/adam.py, adamw.py) that TE/Apex
// FusedAdam's groups lack (apex/optimizers/fused_adam.py,
// transformer_engine/pytorch/optimizers/fused_adam.py: lr,
// bias_correction, betas, eps, weight_decay). Of these, amsgrad and
// maximize change the update.
var torchAdamOnly = []string{"amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused", "decoupled_weight_decay"}

// adamGroups gives the param groups the keys the loading run's Adam keeps
// (style), since a loaded group replaces the live one whole (torch
// Optimizer.load_state_dict keeps only 'params'): FusedAdam's step reads
// group['bias_correction'] (a KeyError from a torch AdamW group, found by
// core 0.15's load with a FusedAdam, DISTWRITE.md), torch AdamW's
// __setstate__ fills its own defaults. A group of the other Adam is
// converted when that keeps the math (torch Adam always corrects the bias,
// FusedAdam has no amsgrad or maximize), else refused by name.
func adamGroups(dir string, groups []*pyobj.Dict, style stepStyle) ([]*pyobj.Dict, error) {
	out := make([]*pyobj.Dict, len(groups))
	for i, g := range groups {
		gd := g.Clone()
		if style == stepFused {
			if _, ok := gd.Get("bias_correction"); !ok {
				for _, k := range []string{"amsgrad", "maximize"} {
					if v, ok := gd.Get(k); ok && v != false && v != nil {
						return nil, fmt.Errorf("%s: param group %d has %s=%v, which TE/Apex FusedAdam (--megatron-optimizer fused) does not do", dir, i, k, v)
					}
				}
				for _, k := range torchAdamOnly {
					gd.Delete(k)
				}
				gd.Set("bias_correction", true)
			}
		} else if v, ok := gd.Get("bias_correction"); ok {
			if v != true {
				return nil, fmt.Errorf("%s: param group %d has bias_correction=%v, which torch AdamW (--megatron-optimizer adamw) does not do", dir, i, v)
			}
			gd.Delete("bias_correction")
		}
		out[i] = gd
	}
	return out, nil
}
