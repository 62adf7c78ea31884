"""The fixture cases.

Every case is a function of a `Ctx` (one rank's view) returning that rank's application state
dict, exactly as a trainer would hand it to dcp.save. The same builder serves the stand-in path
(ctx.dt makes a FakeDTensor) and the real path (ctx.dt makes a real DTensor), so both write the
same values. Full tensors come from an integer hash, not from torch's RNG, so they are the same on
every torch release.
"""

import hashlib
import io
import pickle
import uuid
import zlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch

from .sharding import Replicate, Shard

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
S0, S1, R = Shard(0), Shard(1), Replicate()


def det_tensor(shape, dtype, salt, kind):
    """Deterministic values from (salt, kind); exp_avg_sq is positive."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64)
    h = (i * 2654435761 + salt) % 2147483647
    h = (h * 48271 + 11) % 2147483647
    h = (h * 48271 + 7) % 2147483647
    u = h.to(torch.float64) / 2147483647.0
    if kind == "param":
        v = u * 2 - 1
    elif kind == "exp_avg":
        v = (u * 2 - 1) * 0.01
    elif kind == "exp_avg_sq":
        v = u * 1e-4 + 1e-8
    else:  # buffers
        v = u * 10
    return v.to(torch.float32).to(dtype).reshape(shape)


@dataclass(frozen=True)
class P:
    """A model entry: a parameter (with Adam state) or, when buffer=True, a persistent buffer
    saved as a plain (replicated) tensor."""
    fqn: str
    shape: Tuple[int, ...]
    dtype: torch.dtype = F32
    placements: Optional[tuple] = None  # per mesh dim; None = plain tensor on every rank
    buffer: bool = False
    step: float = 3.0


class Bank:
    """The full (global) tensors of a case, made once per process."""

    def __init__(self, case_name):
        self.case = case_name
        self.cache = {}

    def get(self, p, kind):
        key = (p.fqn, kind)
        if key not in self.cache:
            salt = zlib.crc32(f"{self.case}/{p.fqn}/{kind}".encode())
            dtype = p.dtype
            self.cache[key] = det_tensor(p.shape, dtype, salt, "buffer" if p.buffer else kind)
        return self.cache[key]


class Ctx:
    """One rank's view while a builder runs. `dt` wraps a full tensor as this rank's DTensor,
    `plain` gives this rank its own copy of a replicated plain tensor; `note` records where a
    parameter's values went (path tuples) for truth.pt."""

    def __init__(self, case, rank, coordinate, dt, plain):
        self.case = case
        self.rank = rank
        self.world_size = case.world_size
        self.coordinate = coordinate
        self.dt = dt
        self.plain = plain
        self.bank = Bank(case.name)
        self.notes = {}

    def note(self, fqn, kind, path):
        self.notes.setdefault(fqn, {})[kind] = path

    def tensor(self, p, kind="param"):
        full = self.bank.get(p, kind)
        if p.placements is None:
            return self.plain(full)
        return self.dt(full, p.placements)


def fresh(s):
    """An equal but distinct str object: model and optimizer FQNs are built separately in torch."""
    return (s + ".")[:-1]


ADAM_GROUP = (("lr", 0.00075), ("betas", (0.9, 0.95)), ("eps", 1e-08), ("weight_decay", 0.1),
              ("amsgrad", False), ("maximize", False), ("foreach", None), ("capturable", False),
              ("differentiable", False), ("fused", None), ("initial_lr", 0.001))


def lambda_lr_state(lr_lambdas):
    return {"base_lrs": [0.001], "last_epoch": 3, "verbose": False, "_step_count": 4,
            "_get_lr_called_within_step": False, "_last_lr": [0.00075], "lr_lambdas": lr_lambdas}


def model_state(ctx, model, prefix):
    sd = {}
    for p in model:
        key = fresh(p.fqn)
        sd[key] = ctx.tensor(p)
        ctx.note(p.fqn, "buffer" if p.buffer else "param", (prefix, key))
    return sd


def adam_state(ctx, p):
    return {"step": ctx.plain(torch.tensor(p.step, dtype=torch.float32)),
            "exp_avg": ctx.tensor(p, "exp_avg"), "exp_avg_sq": ctx.tensor(p, "exp_avg_sq")}


def optim_by_fqn(ctx, model, prefix):
    """get_state_dict / get_optimizer_state_dict: state keyed by clean FQN, params as FQN lists."""
    state = {}
    names = []
    for p in model:
        if p.buffer:
            continue
        key = fresh(p.fqn)
        names.append(key)
        state[key] = adam_state(ctx, p)
        for kind in ("step", "exp_avg", "exp_avg_sq"):
            ctx.note(p.fqn, kind, (prefix, "state", key, kind))
    group = dict(ADAM_GROUP)
    group["params"] = names
    return {"state": state, "param_groups": [group]}


def optim_by_id(ctx, model, prefix):
    """A plain optimizer.state_dict(): state keyed by integer param id."""
    state = {}
    ids = []
    for i, p in enumerate([p for p in model if not p.buffer]):
        ids.append(i)
        state[i] = adam_state(ctx, p)
        for kind in ("step", "exp_avg", "exp_avg_sq"):
            ctx.note(p.fqn, kind, (prefix, "state", str(i), kind))
    group = dict(ADAM_GROUP)
    group["params"] = ids
    return {"state": state, "param_groups": [group]}


def optim_flattened(ctx, model, prefix):
    """get_optimizer_state_dict(..., StateDictOptions(flatten_optimizer_state_dict=True)) as
    torchtitan saves it: 'state.<fqn>.<k>' and one 'param_groups.<fqn>.<k>' per parameter."""
    out = {}
    names = []
    for p in model:
        if p.buffer:
            continue
        names.append(p.fqn)
        for kind, value in adam_state(ctx, p).items():
            key = f"state.{p.fqn}.{kind}"
            out[key] = value
            ctx.note(p.fqn, kind, (prefix, key))
    for name in names:
        for k, v in ADAM_GROUP:
            out[f"param_groups.{name}.{k}"] = v
    return out


# ---------------------------------------------------------------------------------------------
# Builders


def build_dsd(optimizer="fqn", lr_lambdas=None):
    """The torch.distributed.checkpoint.state_dict recipe: {'model', 'optim', 'lr_scheduler',
    'step'}."""
    def build(ctx):
        model = ctx.case.model
        sd = {"model": model_state(ctx, model, "model")}
        if optimizer == "fqn":
            sd["optim"] = optim_by_fqn(ctx, model, "optim")
        elif optimizer == "id":
            sd["optim"] = optim_by_id(ctx, model, "optim")
        sd["lr_scheduler"] = lambda_lr_state(lr_lambdas if lr_lambdas is not None else [None])
        sd["step"] = 3
        return sd
    return build


def build_model_only(ctx):
    return {"model": model_state(ctx, ctx.case.model, "model")}


def build_torchtitan(ctx):
    model = ctx.case.model
    losses = io.BytesIO()
    torch.save([2.5, 2.25, 2.0], losses)  # position left at the end, as torchtitan leaves it
    dp_rank = ctx.rank
    return {
        "model": model_state(ctx, model, "model"),
        "optimizer": optim_flattened(ctx, model, "optimizer"),
        # LambdaLR with a functools.partial: lr_lambdas holds the partial's (empty) __dict__, so
        # >= 2.4 flattening drops the key altogether.
        "lr_scheduler": lambda_lr_state([{}]),
        "dataloader": {f"dp_rank_{dp_rank}": pickle.dumps({"sample_idx": 12 + dp_rank, "epoch": 0}),
                       "world_size": ctx.world_size},
        "train_state": {"step": ctx.plain(torch.tensor(3, dtype=torch.int32)),
                        "global_avg_losses": losses},
    }


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    name: str
    about: str
    world_size: int
    mesh_shape: Tuple[int, ...]
    mesh_names: Tuple[str, ...]
    model: List[P]
    build: Callable
    layout: str = "v2.4"  # what torch 2.4 to 2.6 write
    thread_count: int = 1
    loader: str = "serial"  # "sorted": the GPU writer's ascending-size tensor order
    pinned: bool = False  # an old torch layout: the real path cannot reproduce it

    @property
    def checkpoint_id(self):
        return f"outputs/checkpoint/{self.name}"

    @property
    def save_id(self):
        digest = hashlib.sha256(f"ucp-dcp-fixture/{self.name}".encode()).digest()
        return str(uuid.UUID(bytes=digest[:16], version=4))


TINY = [
    P("embed.weight", (10, 4), placements=(S0,)),
    P("layers.0.attn.rope_freqs", (4,), buffer=True),
    P("layers.0.attn.wqkv.weight", (9, 4), placements=(S0,)),
    P("layers.0.attn.wqkv.bias", (9,), placements=(S0,)),
    P("layers.0.attn.gate", (2,), placements=(S0,)),  # W=4: 1,1,0,0 - two empty chunks at 2
    P("layers.0.mlp.w1.weight", (5, 3), BF16, placements=(S0,), step=2.0),
    P("norm.weight", (3,), placements=(S0,)),
]

SMALL = [
    P("embed.weight", (5, 3), placements=(S0,)),
    P("proj.weight", (4, 3), BF16, placements=(S0,)),
    P("norm.weight", (3,), placements=(S0,)),
]

TP2D = [  # mesh (dp=2, tp=2)
    P("tok_embeddings.weight", (8, 6), placements=(S0, S1)),
    P("layers.0.attention.wq.weight", (8, 6), placements=(S0, S0)),
    P("layers.0.attention.wo.weight", (7, 6), BF16, placements=(S0, S1)),
    P("layers.0.attention_norm.weight", (6,), placements=(S0, R)),
    P("layers.0.feed_forward.w2.weight", (4, 6), placements=(R, S1)),
    P("output.weight", (5, 6), F16, placements=(S0, S1)),
]

HSDP = [  # mesh (replicate=2, shard=2)
    P("embed.weight", (10, 4), placements=(R, S0)),
    P("layers.0.w.weight", (7, 4), BF16, placements=(R, S0)),
    P("norm.weight", (3,), placements=(R, S0)),
]

DDP = [
    P("fc1.weight", (4, 3)),
    P("fc1.bias", (4,)),
    P("fc2.weight", (2, 4), BF16),
]

THREE = [
    P("a.weight", (3, 2)),
    P("b.weight", (2, 2)),
    P("c.bias", (2,)),
]

TITAN = [
    P("tok_embeddings.weight", (11, 4), placements=(S0,)),
    P("layers.0.attention.wq.weight", (4, 4), placements=(S0,)),
    P("layers.0.attention.wo.weight", (4, 4), placements=(S0,)),
    P("layers.0.attention_norm.weight", (4,), placements=(S0,)),
    P("layers.0.feed_forward.w1.weight", (7, 4), placements=(S0,)),
    P("norm.weight", (4,), placements=(S0,)),
    P("output.weight", (11, 4), placements=(S0,)),
]

CASES = [
    Case("fsdp2_w2", "FSDP2 (DTensor Shard(0)) on 2 ranks, get_state_dict keys, uneven rows",
         2, (2,), ("dp",), TINY, build_dsd()),
    Case("fsdp2_w4", "FSDP2 (DTensor Shard(0)) on 4 ranks: rows 10->3,3,3,1; 9->3,3,3,0; "
         "5->2,2,1,0; 3->1,1,1,0; 2->1,1,0,0 (zero-size chunks; the two at the same "
         "offset are one MetadataIndex, so dedup keeps one)", 4, (4,), ("dp",), TINY, build_dsd()),
    Case("fsdp_tp_w4", "2-D DTensor on mesh dp=2 x tp=2: [S0,S1] boxes, [S0,S0] nested rows, "
         "[S0,R] and [R,S1] replicated over one mesh dim (deduplicated)", 4, (2, 2),
         ("dp", "tp"), TP2D, build_dsd()),
    Case("ddp_w3", "plain (replicated) tensors on 3 ranks, deduplicated onto the least-loaded "
         "rank", 3, (3,), ("dp",), DDP, build_dsd()),
    Case("hsdp_w4", "HSDP: mesh replicate=2 x shard=2, placements [R, S0]; replicas deduplicated",
         4, (2, 2), ("replicate", "shard"), HSDP, build_dsd()),
    Case("variant_v22_w2", "torch-2.2-like .metadata (no storage_meta, TensorProperties from "
         "torch.distributed._shard, enums by value), <= 2.3 flattening, bytes planned by rank 0, "
         "replicated tensors kept by rank 0",
         2, (2,), ("dp",), SMALL, build_dsd(), layout="v2.2",
         pinned=True),
    Case("variant_v23_w2", "torch-2.3-like: <= 2.3 flattening (tensor-free dicts/lists stored "
         "whole), TensorProperties in checkpoint.metadata, no storage_meta", 2, (2,), ("dp",),
         SMALL, build_dsd(), layout="v2.3",
         pinned=True),
    Case("variant_v24_w2", "torch 2.4-2.6 .metadata: storage_meta without modules, no version",
         2, (2,), ("dp",), SMALL, build_dsd(), layout="v2.4"),
    Case("variant_v27_w2", "torch-2.7+-like .metadata: version '1.0.0', StorageMeta.modules "
         "(torch 2.6 cannot write it: stand-in)",
         2, (2,), ("dp",), SMALL, build_dsd(), layout="v2.7",
         pinned=True),
    Case("torchtitan_w2", "torchtitan-like: flattened optimizer (optimizer.state.<fqn>.<k>, "
         "optimizer.param_groups.<fqn>.<k>), lr_scheduler, per-rank dataloader keys, "
         "train_state with an int32 step and a BytesIO; tensors in GPU-writer order",
         2, (2,), ("dp",), TITAN, build_torchtitan, loader="sorted"),
    Case("optim_ids_w2", "FSDP2 on 2 ranks with a plain optimizer.state_dict(): "
         "optim.state.<id>.<k>, optim.param_groups.0.params = [0, 1, ...]", 2, (2,), ("dp",),
         TINY, build_dsd(optimizer="id")),
    Case("multifile_w2_t3", "FSDP2 on 2 ranks written with FileSystemWriter(thread_count=3): "
         "__r_0/__r_1/__r_2.distcp per rank", 2, (2,), ("dp",), TINY, build_dsd(),
         thread_count=3),
    Case("emptyrank_w4", "3 plain replicated tensors on 4 ranks: dedup leaves rank 3 nothing, "
         "its __3_0.distcp is empty", 4, (4,), ("dp",), THREE, build_model_only),
]


def get(name):
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(name)
