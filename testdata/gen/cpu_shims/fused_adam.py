"""A CPU stand-in for `apex.optimizers.FusedAdam` (github:NVIDIA/apex, apex/optimizers/fused_adam.py), for
the real-consumer load checks only (testdata/gen/megatron_dist_load.py with UCP_FUSED_ADAM=1). Never used by
ucp. Written here from the optimizer's documented behaviour, not copied.

Why: megatron-core picks its Adam at import time (core_v0.15.3 megatron/core/optimizer/__init__.py and
distrib_optimizer.py: TE's FusedAdam, else Apex's, else torch's). Both fused optimizers keep the step in each
param group (an int, `group['step']`) and only `exp_avg`/`exp_avg_sq` per parameter; torch's AdamW keeps a 0-dim
`step` tensor per parameter. Core 0.15's `dp_reshardable` state dict asserts every per-parameter optimizer
state is a flat slice of the bucket (`sharded_param_state_dp_reshardable`), which torch's 0-dim step fails, so a
CPU run without TE/Apex cannot save or load that format. A GPU run has TE or Apex; this module gives a CPU run
the same optimizer interface: the class Megatron constructs (`FusedAdam(params, lr, weight_decay, betas, eps,
adam_w_mode)`), the param-group step and the two moments. The load driver serves it as `apex.optimizers` to
Megatron's optimizer package alone (megatron_dist_fixtures.install_shims), so that Megatron's own import picks
the Apex branch (`HAVE_APEX_OR_TE`, `USING_APEX_OPTIMIZER`) and nothing else sees an `apex` module (the layer
specs would otherwise pick Apex's fused norms).

The update is Apex's (multi_tensor_adam, fp32 math): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
update = (m / bc1) / (sqrt(v / bc2) + eps), plus wd * p in AdamW mode (decoupled decay), or g += wd * p first in
L2 mode; p -= lr * update; bc_i = 1 - b_i^step with bias correction, else 1. The checks compare loaded states,
not stepped ones: the step only has to run.
"""

import torch


class FusedAdam(torch.optim.Optimizer):
    """Adam/AdamW with the step in each param group (see the module docstring)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, capturable=False, master_weights=False):
        if amsgrad or capturable or master_weights:
            raise RuntimeError("cpu_shims FusedAdam: amsgrad, capturable and master_weights are not supported")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue  # as the fused kernels: an empty group's step does not advance
            group["step"] = group.get("step", 0) + 1
            b1, b2 = group["betas"]
            step = group["step"]
            bc1 = 1 - b1 ** step if group["bias_correction"] else 1.0
            bc2 = 1 - b2 ** step if group["bias_correction"] else 1.0
            for p in params:
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                g = p.grad.float()
                w = p.float()
                if not self.adam_w_mode and group["weight_decay"]:
                    g = g + group["weight_decay"] * w
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g.to(m.dtype), alpha=1 - b1)
                v.mul_(b2).addcmul_(g.to(v.dtype), g.to(v.dtype), value=1 - b2)
                update = (m.float() / bc1) / ((v.float() / bc2).sqrt() + group["eps"])
                if self.adam_w_mode and group["weight_decay"]:
                    update = update + group["weight_decay"] * w
                p.copy_((w - group["lr"] * update).to(p.dtype))
        return loss


class FusedSGD(torch.optim.SGD):
    """Imported beside FusedAdam by megatron-core's optimizer package; the checks never build it."""

