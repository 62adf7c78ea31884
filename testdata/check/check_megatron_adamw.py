"""Load the optimizer of folders written by `ucp reshard --to megatron` (non-distributed
optimizer) into real torch.optim.AdamW, as Megatron without TE/Apex builds it
(megatron/core/optimizer/__init__.py falls back to torch.optim.AdamW), and take one step.

Usage: check_megatron_adamw.py STEP CHECKPOINT...   (STEP: the source's step count)

For every mp_rank_*/model_optim_rng.pt: the torch state dict (Float16OptimizerWithFloat16Params'
'optimizer', or FP32Optimizer's bare one) is loaded with AdamW.load_state_dict into parameters
shaped like its exp_avg tensors; every state must come back exactly, every parameter's step must
be STEP, and after one step with unit gradients every step must be STEP+1 and every exp_avg must
equal the update computed here as that torch's AdamW computes it. Runs under torch 1.13 (host) and 2.6 (chroot).
Prints "ok N" (files checked) and exits 0 when all pass.
"""

import glob
import os
import sys

import torch

import _megatron_stub  # testdata/check/_megatron_stub.py: megatron.* without its source


_megatron_stub.install()


def check(path, want_step):
    kw = {} if torch.__version__ < "2" else {"weights_only": False}
    sd = torch.load(path, map_location="cpu", **kw)
    o = sd["optimizer"]
    inner = o["optimizer"] if "fp32_from_fp16_params" in o else o
    groups = []
    for g in inner["param_groups"]:
        params = [torch.zeros_like(inner["state"][i]["exp_avg"]) for i in g["params"]]
        groups.append({k: v for k, v in g.items() if k != "params"} | {"params": params})
    opt = torch.optim.AdamW(groups)
    opt.load_state_dict(inner)
    want = {}
    for g, sg in zip(opt.param_groups, inner["param_groups"]):
        for p, i in zip(g["params"], sg["params"]):
            st = opt.state[p]
            for k in ("exp_avg", "exp_avg_sq"):
                if not torch.equal(st[k], inner["state"][i][k]):
                    raise SystemExit(f"{path}: state {i} {k} differs after load_state_dict")
            if float(st["step"]) != want_step:
                raise SystemExit(f"{path}: state {i} step {st['step']} != {want_step}")
            b1, ones = g["betas"][0], torch.ones_like(p)
            if torch.__version__ < "2":  # _single_tensor_adamw: mul_(beta1).add_(grad, alpha=1-beta1)
                want[p] = st["exp_avg"].mul(b1).add(ones, alpha=1 - b1)
            else:  # torch 2: exp_avg.lerp_(grad, 1 - beta1)
                want[p] = st["exp_avg"].lerp(ones, 1 - b1)
            p.grad = torch.ones_like(p)
    opt.step()
    for g in opt.param_groups:
        for p in g["params"]:
            st = opt.state[p]
            if float(st["step"]) != want_step + 1:
                raise SystemExit(f"{path}: step after one step is {st['step']}")
            if not torch.equal(st["exp_avg"], want[p]):
                raise SystemExit(f"{path}: exp_avg after one step differs")


def main():
    want_step = float(sys.argv[1])
    n = 0
    for ckpt in sys.argv[2:]:
        files = sorted(glob.glob(os.path.join(ckpt, "iter_*", "mp_rank_*", "model_optim_rng.pt")))
        if not files:
            raise SystemExit(f"{ckpt}: no model_optim_rng.pt")
        for f in files:
            check(f, want_step)
            n += 1
    print(f"ok {n} torch {torch.__version__}")


if __name__ == "__main__":
    main()
