"""Optimizer state as Megatron saves it: non-distributed mixed-precision optimizers and the
distributed optimizer's DDP buffer layout + distrib_optim.pt (F3 coalesced, F2 per bucket).

Sources (Megatron-LM d98e8a6 unless noted):
  * param groups: megatron/core/optimizer/__init__.py _get_param_groups (key
    (overrides, is_expert_parallel); keys sorted with None first, stable) with
    get_standard_config_overrides (wd_mult 0.0 for '*.bias' or 1-D params); dense and expert
    groups go to separate optimizers (get_megatron_optimizer -> ChainedOptimizer; a single
    optimizer's state_dict is returned bare, several as a list).
  * Float16OptimizerWithFloat16Params.state_dict (optimizer/optimizer.py):
    {'optimizer': torch state_dict, 'grad_scaler' (only if a scaler exists, i.e. fp16 or
    --loss-scale), 'fp32_from_fp16_params': [[fp32 main param per group]]}.
  * DistributedOptimizer.state_dict (optimizer/distrib_optimizer.py): param groups without
    'params' and with 'step' (torch Adam: float from state['step'].item(); TE/Apex FusedAdam:
    int); get_parameter_state_dp_zero: F3 'buckets_coalesced'.
  * buffer layout: DistributedOptimizer._compute_per_buffer_param_layout + param_layout.py
    (pad_param_start 64, pad_bucket_end lcm(D, 128)), grouping
    distributed/param_and_grad_buffer.py group_params_for_buffers
    (param_dtype, grad_dtype, is_expert_parallel) in first-seen order.
  * F2 / core_v0.6.0: distributed/param_and_grad_buffer.py (no param alignment, bucket ends
    padded to a multiple of D), distrib_optimizer.py get_parameter_state_dp_zero (per-bucket
    lists, torch.empty local shards, per_bucket_numel[_unpadded]).
  * legacy (core_v0.5.0 megatron/optimizer): get_param_groups (wd group first, then no-wd),
    Apex FusedAdam (group 'step', state without 'step').
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from .model import Entry


@dataclass
class PRec:
    """One model parameter as a rank holds it (a TP/EP-local shard)."""

    name: str  # named_parameters() name inside the chunk (no wrappers)
    entry: Entry
    fp32: torch.Tensor  # fp32 main param
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    dtype: torch.dtype  # model param dtype (bf16 / fp16)
    tp_attrs: Tuple[bool, int, int] = (False, -1, 1)  # tensor_model_parallel, partition_dim, stride

    @property
    def is_expert(self) -> bool:
        return self.entry.expert

    @property
    def shared_embedding(self) -> bool:
        return self.entry.shared_embedding

    @property
    def numel(self) -> int:
        return self.fp32.numel()


# ---------------------------------------------------------------------------------------------
# Param groups


def mcore_param_groups(chunks: List[List[PRec]], max_lr: float, min_lr: float):
    """Current MCore _get_param_groups: [(group dict without 'params', [PRec])]."""
    params_map: Dict[tuple, List[PRec]] = {}
    for chunk in chunks:
        for p in chunk:
            wd0 = p.fp32.dim() == 1 or p.name.endswith(".bias")
            key = ((("wd_mult", 0.0),) if wd0 else None, p.is_expert)
            params_map.setdefault(key, []).append(p)
    groups = []
    for key in sorted(params_map.keys(), key=lambda x: (x[0] is not None, x[0])):
        override, is_expert = key
        g = {
            "is_expert_parallel": is_expert,
            "default_config": True,  # no 'lr' key in the override
            "wd_mult": 1.0,
            "lr_mult": 1.0,
            "is_decoupled_lr": False,
            "max_lr": max_lr,
            "min_lr": min_lr,
        }
        g.update(dict(override or ()))
        groups.append((g, params_map[key]))
    return groups


def split_dense_expert(groups):
    dense = [g for g in groups if not g[0]["is_expert_parallel"]]
    expert = [g for g in groups if g[0]["is_expert_parallel"]]
    return dense, expert


class AttrTensor:
    """Pickles like torch >= 2.0 pickles a plain Tensor that carries Python attributes:
    torch._tensor._rebuild_from_type_v2(_rebuild_tensor_v2, Tensor, args, __dict__).
    Megatron's fp32 main params carry tensor_model_parallel / partition_dim / partition_stride
    (copy_tensor_model_parallel_attributes); torch 1.13 would silently drop them."""

    def __init__(self, t: torch.Tensor, attrs: dict):
        self.t, self.attrs = t, attrs

    def __reduce_ex__(self, proto):
        func, args = self.t._reduce_ex_internal(proto)
        return (torch._tensor._rebuild_from_type_v2, (func, torch.Tensor, args, dict(self.attrs)))


def torch_adamw_state_dict(groups, step: int, lr: float, wd: float):
    """A real torch.optim.AdamW state_dict over fp32 main params (what Megatron gets with torch's
    Adam, i.e. without Apex/TE): per-param 'step' tensors, ids numbered across groups."""
    mains = [[p.fp32.clone() for p in recs] for _, recs in groups]
    opt = torch.optim.AdamW(
        [dict(params=m, **g) for m, (g, _) in zip(mains, groups)],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd,
    )
    for pg, (g, _) in zip(opt.param_groups, groups):
        pg["lr"] = lr * g["lr_mult"]  # OptimizerParamScheduler.step sets both each iteration
        pg["weight_decay"] = wd * g["wd_mult"]
    for m, (_, recs) in zip(mains, groups):
        for t, p in zip(m, recs):
            opt.state[t] = {
                "step": torch.tensor(float(step)),
                "exp_avg": p.exp_avg.clone(),
                "exp_avg_sq": p.exp_avg_sq.clone(),
            }
    return opt.state_dict(), mains


def fused_adam_state_dict(groups, step: int, lr: float, wd: float):
    """Apex / TransformerEngine FusedAdam state_dict (Megatron's default optimizer when either is
    installed): per-param state {'exp_avg', 'exp_avg_sq'}, the step count as an int in each
    param group (FusedAdam.step: group['step'] += 1)."""
    state, pgs, mains, i = {}, [], [], 0
    for g, recs in groups:
        ids, m = [], []
        for p in recs:
            state[i] = {"exp_avg": p.exp_avg.clone(), "exp_avg_sq": p.exp_avg_sq.clone()}
            ids.append(i)
            m.append(p.fp32.clone())
            i += 1
        pg = dict(g)
        pg.update(lr=lr * g["lr_mult"], bias_correction=True, betas=(0.9, 0.95), eps=1e-8,
                  weight_decay=wd * g["wd_mult"], step=step, params=ids)
        pgs.append(pg)
        mains.append(m)
    return {"state": state, "param_groups": pgs}, mains


def float16_optimizer_state(groups, step, lr, wd, grad_scaler, attr_tensors: bool, adam="torch"):
    if adam == "fused":
        sd, mains = fused_adam_state_dict(groups, step, lr, wd)
    else:
        sd, mains = torch_adamw_state_dict(groups, step, lr, wd)
    out = {"optimizer": sd}
    if grad_scaler is not None:
        out["grad_scaler"] = grad_scaler
    fp32_groups = []
    for m, (_, recs) in zip(mains, groups):
        row = []
        for t, p in zip(m, recs):
            if attr_tensors:
                attrs = {
                    "tensor_model_parallel": p.tp_attrs[0],
                    "partition_dim": p.tp_attrs[1],
                    "partition_stride": p.tp_attrs[2],
                }
                if p.entry.tied_copy or p.shared_embedding:
                    attrs["shared"] = True
                row.append(AttrTensor(t, attrs))
            else:
                row.append(t)
        fp32_groups.append(row)
    out["fp32_from_fp16_params"] = fp32_groups
    return out


def distopt_state_dict(groups, step, lr, wd, grad_scaler, adam="torch"):
    """DistributedOptimizer.state_dict(): only param groups (no 'params', plus 'step': a float
    from state['step'].item() with torch Adam, an int with TE / Apex FusedAdam)."""
    if adam == "fused":
        sd, _ = fused_adam_state_dict(groups, int(step), lr, wd)
    else:
        sd, _ = torch_adamw_state_dict(groups, 0, lr, wd)
    pgs = []
    for g in sd["param_groups"]:
        g = dict(g)
        del g["params"]
        g["step"] = int(step) if adam == "fused" else float(step)
        pgs.append(g)
    out = {"optimizer": {"param_groups": pgs}}
    if grad_scaler is not None:
        out["grad_scaler"] = grad_scaler
    return out


def v06_param_groups(chunks: List[List[PRec]], max_lr: float, min_lr: float):
    """core_v0.6.0 megatron/core/optimizer/__init__.py _get_param_groups (first-seen order of
    (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr)) + _update_min_and_max_lr_in_param_groups."""
    params_map: Dict[tuple, List[PRec]] = {}
    for chunk in chunks:
        for p in chunk:
            no_wd = p.name.endswith(".bias") or p.fp32.dim() == 1
            key = (0.0 if no_wd else 1.0, 1.0, p.is_expert, False)
            params_map.setdefault(key, []).append(p)
    return [({"wd_mult": k[0], "lr_mult": k[1], "is_expert_parallel": k[2], "is_decoupled_lr": k[3],
              "max_lr": max_lr, "min_lr": min_lr}, v) for k, v in params_map.items()]


def legacy_param_groups(chunks: List[List[PRec]]):
    """core_v0.5.0 megatron/optimizer/__init__.py get_param_groups with lr_mult 1.0."""
    order = [(1.0, 1.0, False), (1.0, 1.0, True), (0.0, 1.0, False), (0.0, 1.0, True)]
    params_map = {k: [] for k in order}
    for chunk in chunks:
        for p in chunk:
            no_wd = p.name.endswith(".bias") or p.fp32.dim() == 1
            params_map[(0.0 if no_wd else 1.0, 1.0, p.is_expert)].append(p)
    return [({"wd_mult": k[0], "lr_mult": k[1], "is_expert_parallel": k[2]}, v)
            for k, v in params_map.items() if v]


def apex_optimizer_state(groups, step, lr, wd, grad_scaler):
    """Float16OptimizerWithFloat16Params over Apex FusedAdam (legacy Megatron)."""
    sd, mains = fused_adam_state_dict(groups, step, lr, wd)
    out = {"optimizer": sd}
    if grad_scaler is not None:
        out["grad_scaler"] = grad_scaler
    out["fp32_from_fp16_params"] = mains
    return out


# ---------------------------------------------------------------------------------------------
# DDP buffers and distrib_optim.pt


@dataclass
class Buffer:
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    is_expert: bool
    dp: int
    params: List[PRec] = field(default_factory=list)
    index: Dict[int, Tuple[int, int, int]] = field(default_factory=dict)  # i -> (start, end, bucket)
    buckets: List[Tuple[int, int, int]] = field(default_factory=list)  # (start, padded end, unpadded)

    @property
    def dtype_key(self):
        return (self.param_dtype, self.grad_dtype)

    @property
    def numel_unpadded(self) -> int:
        return sum(b[2] for b in self.buckets)


def _pad(x: int, d: int) -> int:
    return int(math.ceil(x / d) * d)


def group_buffers(recs: List[PRec], grad_fp32: bool, dp: int, expert_dp: int) -> List[Buffer]:
    bufs: Dict[tuple, Buffer] = {}
    for p in recs:
        gd = torch.float32 if grad_fp32 else p.dtype
        key = (p.dtype, gd, p.is_expert)
        if key not in bufs:
            bufs[key] = Buffer(p.dtype, gd, p.is_expert, expert_dp if p.is_expert else dp)
        bufs[key].params.append(p)
    return list(bufs.values())


def layout_head(buf: Buffer, bucket_size: Optional[int]):
    """DistributedOptimizer._compute_per_buffer_param_layout (core >= 0.13 semantics)."""
    div = math.lcm(buf.dp, 128)
    start = bucket_start = 0
    bucket_id = 0
    in_bucket = 0
    end = 0

    def finalize(e):
        nonlocal bucket_start, bucket_id, in_bucket
        padded = _pad(e, div)
        buf.buckets.append((bucket_start, padded, e - bucket_start))
        bucket_start, bucket_id, in_bucket = padded, bucket_id + 1, 0
        return padded

    for i in reversed(range(len(buf.params))):
        p = buf.params[i]
        start = _pad(start, 64)
        if p.shared_embedding and in_bucket:
            start = finalize(start)
        end = start + p.numel
        buf.index[i] = (start, end, bucket_id)
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or p.shared_embedding:
            start = finalize(end)
        else:
            start = end
    if in_bucket:
        finalize(end)


def layout_v06(buf: Buffer, bucket_size: Optional[int]):
    """core_v0.6.0 _ParamAndGradBuffer: no param alignment, bucket ends padded to a multiple of
    D (only with the distributed optimizer). Shared-embedding params are not supported here (the
    0.6 code asserted the previous bucket already ended on a multiple of D)."""
    assert not any(p.shared_embedding for p in buf.params)
    start = bucket_start = 0
    bucket_id = in_bucket = 0
    for i in reversed(range(len(buf.params))):
        p = buf.params[i]
        end = start + p.numel
        buf.index[i] = (start, end, bucket_id)
        in_bucket += 1
        if bucket_size is not None and end - bucket_start >= bucket_size:
            padded = _pad(end, buf.dp)
            buf.buckets.append((bucket_start, padded, end - bucket_start))
            bucket_start, bucket_id, in_bucket = padded, bucket_id + 1, 0
            end = padded
        start = end
    if in_bucket:
        padded = _pad(start, buf.dp)
        buf.buckets.append((bucket_start, padded, start - bucket_start))


STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")


def _tensor_of(p: PRec, key: str) -> torch.Tensor:
    return {"param": p.fp32, "exp_avg": p.exp_avg, "exp_avg_sq": p.exp_avg_sq}[key].reshape(-1)


def _gathered_bucket(buf: Buffer, b: int, fill: float) -> Dict[str, torch.Tensor]:
    """What DP rank 0 holds after gathering bucket b: each DP rank d owns the contiguous slice
    [d*S/D, (d+1)*S/D) of the padded bucket and copies the pieces of the params overlapping it
    into a local shard (distrib_optimizer.py _build_model_gbuf_param_range_map); the shards are
    concatenated in DP-rank order. `fill` is what the local shard holds where no param is
    (0 for torch.zeros in HEAD, a sentinel standing in for torch.empty garbage in core 0.6)."""
    bstart, bend, _ = buf.buckets[b]
    S = bend - bstart
    assert S % buf.dp == 0
    local = S // buf.dp
    out = {}
    for key in STATE_KEYS:
        shards = []
        for d in range(buf.dp):
            lo, hi = bstart + d * local, bstart + (d + 1) * local
            sh = torch.full((local,), fill, dtype=torch.float32)
            for i, p in enumerate(buf.params):
                ps, pe, _ = buf.index[i]
                a, z = max(ps, lo), min(pe, hi)
                if z > a:
                    sh[a - lo:z - lo] = _tensor_of(p, key)[a - ps:z - ps]
            shards.append(sh)
        out[key] = torch.cat(shards)
    return out


def f3_state(buffers: List[Buffer]) -> dict:
    """get_parameter_state_dp_zero (core >= 0.7): world tensors sized numel_unpadded, each bucket's
    gathered tensor truncated to its unpadded length and concatenated."""
    state = {"buckets_coalesced": True}
    for gi, buf in enumerate(buffers):
        world = {k: torch.zeros(buf.numel_unpadded, dtype=torch.float32) for k in STATE_KEYS}
        world["numel_unpadded"] = buf.numel_unpadded
        off = 0
        for b, (_, _, nu) in enumerate(buf.buckets):
            g = _gathered_bucket(buf, b, 0.0)
            for k in STATE_KEYS:
                world[k][off:off + nu] = g[k][:nu]
            off += nu
        state[gi] = {buf.dtype_key: world}
    return state


F2_FILL = -1234.5  # stands for torch.empty() garbage outside params in core 0.6 local shards


def f2_state(buffers: List[Buffer]) -> dict:
    """core_v0.6.0 get_parameter_state_dp_zero: padded per-bucket tensors in lists."""
    state = {
        "per_bucket_numel": [{b.dtype_key: [e - s for s, e, _ in b.buckets]} for b in buffers],
        "per_bucket_numel_unpadded": [{b.dtype_key: [nu for _, _, nu in b.buckets]} for b in buffers],
    }
    for gi, buf in enumerate(buffers):
        world = {k: [] for k in STATE_KEYS}
        for b in range(len(buf.buckets)):
            g = _gathered_bucket(buf, b, F2_FILL)
            for k in STATE_KEYS:
                world[k].append(g[k])
        state[gi] = {buf.dtype_key: world}
    return state


def describe_buffers(buffers: List[Buffer]) -> List[dict]:
    """Layout summary for truth meta (lets a reader test its own layout computation)."""
    out = []
    for buf in buffers:
        out.append({
            "dtype_key": (str(buf.param_dtype), str(buf.grad_dtype)),
            "is_expert": buf.is_expert,
            "dp": buf.dp,
            "buckets": [list(b) for b in buf.buckets],
            "params": [[p.name, list(buf.index[i])] for i, p in enumerate(buf.params)],
        })
    return out
