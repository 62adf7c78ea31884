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
  * GroupedMLP (core_v0.16.1 megatron/core/transformer/moe/experts.py, the last tag that has it):
    weight1 [H, nle * G*F/t] is used as weight1.view(nle, H, -1) (forward, and real_shape in
    sharded_state_dict): expert j's [H, G*F/t] block is its fc1 TP slice transposed, gated halves
    [gate_r | up_r] along the last dim (glu: torch.chunk(x, 2, -1)); weight2 [nle * F/t, H] as
    view(nle, -1, H): expert j's [F/t, H] is its fc2 TP slice transposed. sharded_state_dict
    places them in the global [E, G*F, H] / [E, H, F] tensors at expert ep_rank * nle + j, gate
    rows at tp_rank of 2t, up rows at t + tp_rank of 2t, fc2 columns at tp_rank of t.
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


def shard(x: torch.Tensor, split: str, rank: int, size: int, ep=(0, 1), experts=0,
          gated=False) -> torch.Tensor:
    """Rank `rank` of `size` (TP, or ETP for experts) of the full tensor x. ep = (EP rank, EP
    size), experts (E) and gated (SwiGLU) are used only by the GroupedMLP weights."""
    if split in ("gmm1", "gmm2"):
        return _shard_grouped(x, split, rank, size, ep, experts, gated)
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


def _shard_grouped(x, split, rank, size, ep, E, gated):
    """GroupedMLP: the EP rank's whole experts, each cut like a dense MLP's fc1 / fc2, stored in
    Megatron's 2-D shapes. x is Megatron's TP = EP = 1 tensor: weight1 [H, E*G*F] (memory
    [E, H, G*F]) or weight2 [E*F, H] (memory [E, F, H])."""
    e, n_ep = ep
    nle = E // n_ep
    mine = slice(e * nle, (e + 1) * nle)
    if split == "gmm1":
        H = x.shape[0]
        w = x.reshape(E, H, -1)[mine]  # [nle, H, G*F]
        parts = w.chunk(2, -1) if gated else (w,)  # [gate | up]
        local = torch.cat([p.chunk(size, -1)[rank] for p in parts], -1)  # [nle, H, G*F/t]
        return local.reshape(H, -1).clone()  # [H, nle*G*F/t], memory [nle, H, G*F/t]
    H = x.shape[1]
    w = x.reshape(E, -1, H)[mine]  # [nle, F, H]
    return w.chunk(size, 1)[rank].reshape(-1, H).clone()  # [nle*F/t, H]


def pattern(split: str, size: int, copies: int, ep: int = 1, experts: int = 0,
            gated: bool = False) -> str:
    """Pattern of an atomic tensor as the save-time placements show it (ucp design.md)."""
    if split in ("gmm1", "gmm2"):
        # Boxes per (EP, ETP) rank in Megatron's 2-D full shape (internal/formats/megatron/NOTES.md):
        # weight1: one per (row slot i < E, gated half) at ETP > 1, else one row block (H/EP
        # rows); weight2: one per local expert at ETP > 1, else one row block.
        if size == 1:
            return "Shard-V" if ep > 1 else "Unique"
        boxes = experts * (2 if gated else 1) if split == "gmm1" else experts // ep
        if boxes > 1:
            return "Shard-NC"
        return "Shard-H" if split == "gmm1" else "Shard-V"  # one expert, not gated / EP = E
    if size > 1:
        if split in ("vocab", "col", "qkv"):
            return "Shard-V"
        if split == "row":
            return "Shard-H"
        if split == "swiglu":
            return "Shard-NC"
    return "Replicate" if copies > 1 else "Unique"
