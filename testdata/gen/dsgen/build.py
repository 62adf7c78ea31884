"""Build one DeepSpeed ZeRO-1/2 checkpoint (all ranks) from known full tensors, and its truth.

Order of work, as the task requires:
1. full fp32 tensors, Adam exp_avg / exp_avg_sq and the step are generated first (seeded);
2. they are split per tensor-parallel rank (models.tp_slice) and pipeline stage;
3. each (pp, tp) rank's trainable params are flattened per optimizer param group in group order,
   padded to a multiple of 2*D and cut into D partitions exactly as
   deepspeed/runtime/zero/stage_1_and_2.py (DeepSpeedZeroOptimizer) and
   deepspeed/runtime/bf16_optimizer.py (BF16_Optimizer) do;
4. the state dicts are assembled with the key orders of DeepSpeedEngine._save_checkpoint,
   DeepSpeedEngine._save_zero_checkpoint and the optimizers' state_dict(), and written with torch.save.

The base optimizer's state_dict() is produced by a real torch optimizer (torch.optim.AdamW, or a
torch.optim.Optimizer with DeepSpeed FusedAdam's defaults) whose params are the flat fp32
partitions, so param_groups keys, 'params' indices and state layout are torch's own.
"""
import dataclasses
import math
import zlib
from collections import OrderedDict
from typing import Optional

import torch

from . import models, stubs

KEYS = ("fp32", "exp_avg", "exp_avg_sq")
LP = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass
class Case:
    name: str
    desc: str
    model: models.ModelDef
    stage: int                 # ZeRO stage 1 or 2
    dp: int
    dtype: str                 # 'fp32' | 'fp16' | 'bf16' (model / low precision dtype)
    opt: str = "zero"          # 'zero' = DeepSpeedZeroOptimizer, 'bf16opt' = BF16_Optimizer
    base: str = "adamw"        # 'adamw' | 'adam' (torch, 0-dim tensor step) | 'fused' (DeepSpeed FusedAdam, int step)
    tp: int = 1
    pp: int = 1
    steps: int = 3
    tag: Optional[str] = None
    uci: str = "basic"         # 'none' | 'basic' ({'universal_checkpoint_version': 0.2}) | 'megatron'
    ds_version: str = "0.16.5"
    new_layout: bool = False   # DeepSpeed >= 0.19 model-state keys (checkpoint_parallel_dimensions, no sparse_tensor_module_names)
    lr: float = 0.010000000000000002
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.95)
    loss_scale_power: int = 8
    micro_batch: int = 2
    save_rng: bool = True      # Megatron: client state carries rng_state (off = --no-save-rng)
    notes: list = dataclasses.field(default_factory=list)
    large: bool = False

    def __post_init__(self):
        if self.tag is None:
            self.tag = f"global_step{self.steps}"
        assert self.stage in (1, 2)
        assert not (self.opt == "bf16opt" and (self.stage != 1 or self.dtype != "bf16"))
        assert not (self.pp > 1 and self.stage != 1), "the pipeline engine asserts ZeRO stage < 2"

    @property
    def lp_dtype(self):
        return LP[self.dtype]

    @property
    def bf16_files(self):
        return self.dtype == "bf16"


# ----------------------------------------------------------------------------------------------
# Values


def _seed(*parts):
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def _randn(shape, *key):
    g = torch.Generator().manual_seed(_seed(*key))
    return torch.randn(shape, generator=g)


def _rand(shape, *key):
    g = torch.Generator().manual_seed(_seed(*key))
    return torch.rand(shape, generator=g)


def full_value(case, p, key, variant=0, rank=None):
    """The full (unsharded, vocab-padded) tensor of state `key` for param p.

    variant > 0: the pipeline replica held by later stages of a 'diverge' param.
    rank: the per-rank tensor of an 'average' param.
    """
    k = (case.name, p.name, key, variant, rank)
    if key == "fp32":
        return p.center + 0.02 * _randn(p.shape, *k)
    if key == "exp_avg":
        return 1e-3 * _randn(p.shape, *k)
    if key == "exp_avg_sq":
        return 1e-6 * _rand(p.shape, *k) + 1e-9
    raise KeyError(key)


def local_value(case, p, key, stage, t):
    variant = stage if (p.diverge and stage > 0) else 0
    if p.rule == "average" and case.tp > 1:
        return full_value(case, p, key, variant, rank=t)
    return models.tp_slice(p, full_value(case, p, key, variant), t, case.tp)


def truth_value(case, p, key):
    if p.rule == "average" and case.tp > 1:
        slices = [full_value(case, p, key, 0, rank=t) for t in range(case.tp)]
        full = sum(slices) / len(slices)  # as ds_to_universal: sum(slices) / len(slices)
    else:
        full = full_value(case, p, key, 0)
    if p.vocab:
        full = full[: case.model.vocab[0]]
    return full.clone()  # compact storage: truth.pt holds no views


def frozen_value(case, p):
    return (p.center + 0.02 * _randn(p.shape, case.name, p.name, "frozen")).to(case.lp_dtype)


def step_value(case):
    if case.base == "fused":
        return case.steps
    return torch.tensor(float(case.steps))


# ----------------------------------------------------------------------------------------------
# Flat layout (stage_1_and_2.py / bf16_optimizer.py)


@dataclasses.dataclass
class GroupLayout:
    names: list
    shapes: list
    offsets: list
    numels: list
    N: int
    A: int
    S: int

    def padding(self, r, D, opt):
        if opt == "bf16opt":  # BF16_Optimizer charges all padding to the last rank
            return self.A - self.N if r == D - 1 else 0
        return max(0, min(self.S, (r + 1) * self.S - self.N))

    def slice_mappings(self, r, fa_cls):
        """param_slice_mappings: walk in group order; keep params overlapping [rS, (r+1)S)."""
        lo, hi = r * self.S, (r + 1) * self.S
        out = OrderedDict()
        for name, o, n in zip(self.names, self.offsets, self.numels):
            if o < hi and o + n > lo:
                fs, fe = max(o, lo), min(o + n, hi)
                out[name] = fa_cls(numel=fe - fs, start=fs - lo)
        return out


def layout(names, shapes, D):
    offsets, numels, o = [], [], 0
    for s in shapes:
        n = math.prod(s)
        assert n > 0, "zero-sized params are not generated (pitfall P4)"
        offsets.append(o)
        numels.append(n)
        o += n
    align = 2 * D  # nccl_start_alignment_factor * dp world size
    A = (o + align - 1) // align * align
    return GroupLayout(list(names), [tuple(s) for s in shapes], offsets, numels, o, A, A // D)


# ----------------------------------------------------------------------------------------------
# Torch optimizers that produce base_optimizer_state


class _FusedAdamLike(torch.optim.Optimizer):
    """DeepSpeed FusedAdam's param-group defaults and state layout (deepspeed/ops/adam/fused_adam.py):
    defaults lr, bias_correction, betas, eps, weight_decay; step() adds group['step'] = 0 (never
    advanced) and keeps an int state['step'] per param."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, bias_correction=True, betas=betas, eps=eps, weight_decay=weight_decay))


def base_optimizer_state(case, fp32_parts, exp_avg_parts, exp_avg_sq_parts):
    groups = []
    for g, part in enumerate(fp32_parts):
        d = {"params": [part]}
        d.update(case.model.groups[g])
        groups.append(d)
    betas = list(case.betas) if case.model.kind == "flat" else tuple(case.betas)
    if case.base == "adamw":
        opt = torch.optim.AdamW(groups, lr=case.lr, betas=betas, eps=1e-8, weight_decay=case.weight_decay)
    elif case.base == "adam":
        opt = torch.optim.Adam(groups, lr=case.lr, betas=betas, eps=1e-8, weight_decay=case.weight_decay)
    elif case.base == "fused":
        opt = _FusedAdamLike(groups, lr=case.lr, betas=betas, eps=1e-8, weight_decay=case.weight_decay)
    else:
        raise ValueError(case.base)
    for g, group in enumerate(opt.param_groups):
        group["lr"] = case.lr  # the LR scheduler writes the current lr into every group
        if "wd_mult" in group:  # Megatron's scheduler: weight_decay = wd * wd_mult
            group["weight_decay"] = case.weight_decay * group["wd_mult"]
        if case.base == "fused":
            group["step"] = 0
        p = group["params"][0]
        st = opt.state[p]
        st["step"] = step_value(case)
        st["exp_avg"] = exp_avg_parts[g]
        st["exp_avg_sq"] = exp_avg_sq_parts[g]
    return opt.state_dict()


# ----------------------------------------------------------------------------------------------
# One (pp, tp) model-parallel rank


@dataclasses.dataclass
class MPRank:
    pp: int
    tp: int
    specs: list                 # PSpec on this stage, named_parameters order
    groups: list                # per group: list of PSpec
    layouts: list               # per group: GroupLayout
    flat: list                  # per group: {key: fp32 flat tensor of A elements}
    lp_flat: list               # per group: low-precision flat buffer (A elements)
    lp: dict                    # name -> low-precision tensor (views into lp_flat for trainables)
    frozen: dict                # name -> low-precision frozen tensor


def build_mp_rank(case, pp, t):
    m = case.model
    specs = [p for p in m.params if pp in p.stages]
    train = [p for p in specs if p.trainable]
    groups = [[p for p in train if p.group == g] for g in range(len(m.groups))]
    assert all(groups), f"{case.name}: empty param group on pp={pp}"
    lp_dtype = case.lp_dtype
    layouts, flats, lp_flats, lp = [], [], [], OrderedDict()
    for plist in groups:
        shapes = [models.local_shape(p, case.tp, t) for p in plist]
        lay = layout([p.name for p in plist], shapes, case.dp)
        flat = {k: torch.zeros(lay.A) for k in KEYS}
        lp_flat = torch.zeros(lay.A, dtype=lp_dtype)
        for p, shape, o, n in zip(plist, shapes, lay.offsets, lay.numels):
            for k in KEYS:
                v = local_value(case, p, k, pp, t)
                assert tuple(v.shape) == shape, (p.name, v.shape, shape)
                flat[k][o:o + n] = v.reshape(-1)
            # after every step DeepSpeed copies the fp32 master back into the bit16 params
            lp_flat[o:o + n] = flat["fp32"][o:o + n].to(lp_dtype)
            lp[p.name] = lp_flat[o:o + n].view(shape)
        if not case.large:
            assert lay.A > lay.N, f"{case.name}: pp={pp} tp={t} group of {lay.N} elements has no padding at D={case.dp}"
        layouts.append(lay)
        flats.append(flat)
        lp_flats.append(lp_flat)
    frozen = OrderedDict((p.name, frozen_value(case, p)) for p in specs if not p.trainable)
    return MPRank(pp, t, specs, groups, layouts, flats, lp_flats, lp, frozen)


def optimizer_file_state(case, r, rank):
    """The dict DeepSpeedEngine._save_zero_checkpoint saves for dp rank r of this mp rank."""
    reg = stubs.register()
    D = case.dp
    fp32_parts, ea_parts, eas_parts, saved_fp32, paddings, mappings = [], [], [], [], [], []
    for lay, flat in zip(rank.layouts, rank.flat):
        lo, hi = r * lay.S, (r + 1) * lay.S
        part = flat["fp32"][lo:hi].clone()
        part.requires_grad = True  # DeepSpeed: "keep this in case internal optimizer uses it"
        fp32_parts.append(part)
        ea_parts.append(flat["exp_avg"][lo:hi].clone())
        eas_parts.append(flat["exp_avg_sq"][lo:hi].clone())
        pad = lay.padding(r, D, case.opt)
        paddings.append(pad)
        mappings.append(lay.slice_mappings(r, reg["fragment_address"]))
        if case.opt == "zero":
            # _get_groups_without_padding: group[:numel - padding], a view of the padded storage
            saved_fp32.append(part[: part.numel() - pad])
        else:
            saved_fp32.append(part)
    bos = base_optimizer_state(case, fp32_parts, ea_parts, eas_parts)
    osd = {}
    if case.opt == "zero":
        if case.dtype == "fp16":
            sc = reg["DynamicLossScaler"](init_scale=2 ** case.loss_scale_power, scale_factor=2.0, scale_window=1000,
                                          min_scale=1, delayed_shift=2, consecutive_hysteresis=False,
                                          raise_error_at_min_scale=True, dtype=torch.float16)
            sc.cur_iter = case.steps
            osd["loss_scaler"] = sc
            osd["dynamic_loss_scale"] = True
        else:
            osd["loss_scaler"] = reg["LossScaler"](scale=1.0)
            osd["dynamic_loss_scale"] = False
        osd["overflow"] = False
        osd["clip_grad"] = 1.0
        osd["base_optimizer_state"] = bos
        osd["single_partition_of_fp32_groups"] = saved_fp32
        zse = reg["ZeroStageEnum"]
        osd["zero_stage"] = zse.gradients if case.stage == 2 else zse.optimizer_states
        osd["group_paddings"] = paddings
        osd["partition_count"] = [D] * len(rank.layouts)
        osd["ds_version"] = case.ds_version
        osd["param_slice_mappings"] = mappings
    else:
        osd["clip_grad"] = 1.0
        osd["base_optimizer_state"] = bos
        osd["single_partition_of_fp32_groups"] = saved_fp32
        osd["group_paddings"] = paddings
        osd["partition_count"] = [D] * len(rank.layouts)
        osd["ds_version"] = case.ds_version
        osd["param_slice_mappings"] = mappings
    return {"optimizer_state_dict": osd, "ds_config": ds_config(case), "ds_version": case.ds_version}


# ----------------------------------------------------------------------------------------------
# Config / client state


def ds_config(case):
    cfg = OrderedDict()
    if case.model.kind != "flat":
        cfg["train_batch_size"] = case.micro_batch * case.dp
    cfg["train_micro_batch_size_per_gpu"] = case.micro_batch
    cfg["gradient_accumulation_steps"] = 1
    cfg["steps_per_print"] = 1
    cfg["gradient_clipping"] = 1.0
    if case.model.kind == "flat":
        cfg["zero_allow_untested_optimizer"] = True
        if case.base == "fused":
            cfg["optimizer"] = {"type": "Adam", "params": {"lr": case.lr, "betas": list(case.betas), "eps": 1e-08,
                                                          "weight_decay": case.weight_decay, "adam_w_mode": True}}
        else:
            cfg["optimizer"] = {"type": "AdamW", "params": {"lr": case.lr, "betas": list(case.betas), "eps": 1e-08,
                                                            "weight_decay": case.weight_decay}}
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01,
                                                           "warmup_num_steps": 2, "warmup_type": "linear"}}
    cfg["zero_optimization"] = {"stage": case.stage}
    if case.dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": case.loss_scale_power}
    elif case.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
        if case.opt == "bf16opt":
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if case.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 0}
    if case.model.kind != "flat":
        cfg["wall_clock_breakdown"] = False
    return dict(cfg)


def universal_checkpoint_info(case):
    if case.uci == "none":
        return None
    if case.uci == "basic":
        return {"universal_checkpoint_version": 0.2}
    m = case.model
    info = {"universal_checkpoint_version": 0.4, "original_vocab_size": m.vocab[0], "padded_vocab_size": m.vocab[1]}
    info.update(m.uci_patterns)
    return info


def lr_scheduler_state(case):
    if case.model.kind == "flat":
        return {"last_batch_iteration": case.steps - 1}
    # megatron/optimizer_param_scheduler.py OptimizerParamScheduler.state_dict()
    return {"max_lr": case.lr, "lr_warmup_steps": 2, "num_steps": case.steps * case.micro_batch * case.dp,
            "lr_decay_style": "cosine", "lr_decay_steps": 1000, "min_lr": 1e-05, "start_wd": case.weight_decay,
            "end_wd": case.weight_decay, "wd_incr_style": "constant", "wd_incr_steps": 1000}
