"""Parallel layout: which ranks hold which layers/experts, and how a global tensor is cut.

Sources (Megatron-LM d98e8a6):
  * layer offsets: megatron/core/transformer/transformer_layer.py get_transformer_layer_offset
    (uniform split: pp_rank * L/p; with VPP v: vp_stage * (L/v) + pp_rank * (L/p/v)).
  * directory names: megatron/training/checkpointing.py get_checkpoint_name
    ('mp_rank_{tp:02d}', '_{pp:03d}' iff PP > 1, '_{ep:03d}' iff EP > 1).
  * TP splits: megatron/core/tensor_parallel/layers.py (ColumnParallelLinear dim 0,
    RowParallelLinear dim 1, VocabParallelEmbedding rows), row-parallel biases and norms
    replicated; SwiGLU fc1 per rank [W_r; V_r] (transformer/mlp.py glu: torch.chunk(x, 2, -1) of
    the local output; apply_swiglu_sharded_factory); fused QKV: plain dim-0 split of the grouped
    layout (attention.py get_query_key_value_tensors, incl. the ng < tp all-gather branch).
  * experts: EP rank e holds global experts [e*E/EP, (e+1)*E/EP) as local 0..E/EP-1
    (moe/experts.py: local_expert_indices_offset = ep_rank * num_local_experts), each split over
    ETP (expert_tensor_parallel_size, defaults to TP) like a dense MLP.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


@dataclass(frozen=True)
class Topo:
    tp: int = 1
    pp: int = 1
    vpp: Optional[int] = None  # virtual pipeline size (model chunks per pp rank)
    dp: int = 1  # dense data-parallel size (DP x CP with CP = 1)
    ep: int = 1
    etp: int = 0  # 0 = tp

    @property
    def etp_(self) -> int:
        return self.etp or self.tp

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: world / (ETP * EP * PP) (parallel_state expert grid)."""
        n = self.etp_ * self.ep * self.pp
        assert self.world % n == 0, "EP x ETP must divide TP x DP"
        return self.world // n

    @property
    def chunks(self) -> int:
        return self.vpp or 1


def chunk_layers(L: int, topo: Topo, pp_rank: int, vp_stage: int) -> List[Tuple[int, int]]:
    """(local, global) layer indices of one model chunk (uniform split)."""
    v = topo.chunks
    assert L % (topo.pp * v) == 0
    n = L // (topo.pp * v)
    if topo.vpp:
        offset = vp_stage * (L // v) + pp_rank * n
    else:
        offset = pp_rank * n
    return [(i, offset + i) for i in range(n)]


def rank_dir(topo: Topo, tp_rank: int, pp_rank: int, ep_rank: int) -> str:
    d = f"mp_rank_{tp_rank:02d}"
    if topo.pp > 1:
        d += f"_{pp_rank:03d}"
    if topo.ep > 1:
        d += f"_{ep_rank:03d}"
    return d


def global_rank(topo: Topo, tp_rank: int, pp_rank: int, ep_rank: int) -> int:
    """Rank of the file's writer (dense DP rank 0 .. with EP, dense DP rank = ep_rank) under
    Megatron's default order tp-cp-ep-dp-pp; only used for the cuda:N location tag."""
    return tp_rank + topo.tp * ep_rank + topo.tp * topo.dp * pp_rank


def shard(x: torch.Tensor, split: str, rank: int, size: int) -> torch.Tensor:
    if size == 1 or split == "rep":
        return x.clone()
    if split in ("vocab", "col", "qkv"):
        return x.chunk(size, 0)[rank].clone()
    if split == "row":
        return x.chunk(size, 1)[rank].clone()
    if split == "swiglu":
        w, v = x.chunk(2, 0)
        return torch.cat([w.chunk(size, 0)[rank], v.chunk(size, 0)[rank]]).clone()
    raise ValueError(split)


def pattern(split: str, size: int, copies: int) -> str:
    """Pattern of an atomic tensor as the save-time placements show it (ucp design.md)."""
    if size > 1:
        if split in ("vocab", "col", "qkv"):
            return "Shard-V"
        if split == "row":
            return "Shard-H"
        if split == "swiglu":
            return "Shard-NC"
    return "Replicate" if copies > 1 else "Unique"
