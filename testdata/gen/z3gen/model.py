"""Model descriptions and the deterministic full (unsharded) state of each case.

A model is a list of state-dict entries in `module.state_dict()` order (root module's own params
and buffers first, then children depth first), which is also `named_parameters()` order for params
and `_get_buffer_names()` order for buffers:
  Param(name, shape, trainable, group, tp)   tp: None (TP 1), 'col' (split dim 0), 'row' (split dim 1), 'rep'
  Buffer(name, shape, dtype)                  dtype None = floating, saved in the low-precision dtype
  Alias(name, target)                         a tied weight: same Parameter under a second name
"""
import dataclasses
from collections import OrderedDict

import torch

LP_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass
class Param:
    name: str
    shape: tuple
    trainable: bool = True
    group: int = 0
    tp: str = None


@dataclasses.dataclass
class Buffer:
    name: str
    shape: tuple
    dtype: torch.dtype = None


@dataclasses.dataclass
class Alias:
    name: str
    target: str


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


@dataclasses.dataclass
class FullState:
    """Everything the checkpoint is cut from: full-shape tensors, TP-merged."""
    fp32: OrderedDict        # trainable name -> fp32 tensor (full shape)
    exp_avg: OrderedDict
    exp_avg_sq: OrderedDict
    step: object             # raw value: 0-dim float32 tensor (torch Adam/AdamW) or int (DeepSpeed FusedAdam)
    frozen: OrderedDict      # frozen name -> tensor in the low-precision dtype (full shape)
    buffers: OrderedDict     # buffer name -> tensor in its saved dtype


def generate(entries, lp_dtype, seed, step):
    """Deterministic full state from a seed. Values are arbitrary but distinct per tensor and element."""
    g = torch.Generator().manual_seed(seed)
    fp32, m, v, frozen, buffers = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
    for e in entries:
        if isinstance(e, Param) and e.trainable:
            fp32[e.name] = torch.randn(e.shape, generator=g) * 0.5
            m[e.name] = torch.randn(e.shape, generator=g) * 1e-2
            v[e.name] = torch.rand(e.shape, generator=g) * 1e-4 + 1e-9
        elif isinstance(e, Param):
            frozen[e.name] = (torch.randn(e.shape, generator=g) * 0.5).to(lp_dtype)
        elif isinstance(e, Buffer):
            if e.dtype is None or e.dtype.is_floating_point:
                buffers[e.name] = torch.randn(e.shape, generator=g).to(lp_dtype)
            else:
                n = numel(e.shape)
                buffers[e.name] = torch.arange(3, 3 + n, dtype=e.dtype).reshape(e.shape)
    return FullState(fp32, m, v, step, frozen, buffers)


def from_truth(path, step):
    """Full trainable state taken from an existing truth.pt (e.g. the real DeepSpeed ZeRO-1 run)."""
    t = torch.load(path)
    od = lambda d: OrderedDict((n, d[n].clone()) for n in t["param_names"])  # noqa: E731
    entries = [Param(n, tuple(t["shapes"][n])) for n in t["param_names"]]
    return entries, FullState(od(t["fp32"]), od(t["exp_avg"]), od(t["exp_avg_sq"]), step,
                              OrderedDict(), OrderedDict())


def tp_slice(tensor, rule, tp, rank):
    """The TP-local shard of a full tensor (AutoTP-style even split)."""
    if tp == 1 or rule in (None, "rep"):
        return tensor
    dim = {"col": 0, "row": 1}[rule]
    if tensor.dim() <= dim or tensor.shape[dim] % tp:
        raise ValueError(f"cannot split shape {tuple(tensor.shape)} on dim {dim} over {tp} ranks")
    return tensor.chunk(tp, dim)[rank].contiguous()
