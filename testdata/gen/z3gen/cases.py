"""The fixture cases. Each is a model, a parallel layout, a precision and an optimizer flavour."""
import dataclasses
import os

import torch

from .model import Alias, Buffer, Param

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "deepspeed-real")


@dataclasses.dataclass
class Case:
    name: str
    entries: list = None
    dp: int = 2
    tp: int = 1
    dtype: str = "fp32"                  # fp32 | fp16 | bf16 (bf16 => bf16_ optimizer file prefix)
    optimizer: str = "adamw"             # adamw (torch 1.13 AdamW) | adamw_t2 (torch 2.x AdamW) | fused_adam
    groups: list = None                  # per optimizer param group: user-given hyper-params (dict)
    sub_group_size: int = 1_000_000_000  # DeepSpeed's config default
    torch2_pickle: bool = False          # ds_id-carrying fp32 groups pickled via _rebuild_from_type_v2
    ds_version: str = "0.16.5"
    persistence_threshold: int = 20
    uci: dict = None                     # universal_checkpoint_info in the model-state files (None: absent)
    parallel_dims: bool = False          # write checkpoint_parallel_dimensions (DeepSpeed >= 2026 layout)
    module_versions: dict = None         # module prefix -> nn.Module._version when not 1 (BatchNorm: 2)
    truth_from: str = None               # take the full trainable state from this truth.pt
    seed: int = 0
    steps: int = 3
    micro_batch: int = 2
    notes: str = ""


MLP = [
    Param("embed.weight", (13, 7)),
    Param("fc1.weight", (9, 7)),
    Param("fc1.bias", (9,)),
    Param("ln.weight", (7,)),
    Param("ln.bias", (7,)),
    Param("fc2.weight", (5, 9)),
    Param("fc2.bias", (5,)),
]

PAPER = [
    Param("a.weight", (32, 32)),   # 1024 elements: D=3 pads to 1026, 342 per rank, 2 padding on rank 2
    Param("b.weight", (27, 38)),   # 1026 elements: 342 per rank, no padding (internal/formats/deepspeed/ZERO3.md, Partitions)
    Param("c.bias", (10,)),        # 10 elements: Pn 4, rank 2 holds c[8:10] + 2 padding (example B)
]

TINY = [
    Param("a.weight", (4, 5)),
    Param("scale", ()),            # 0-dim, 1 element
    Param("b.bias", (2,)),
    Param("c.weight", (0, 4)),     # no elements: Pn 0, nothing on any rank
    Param("d.weight", (3, 3)),
    Param("e.bias", (1,)),
]

# Two optimizer groups (decay / no decay): the flat order (group 0 then group 1) differs from module order.
TWO_GROUPS = [
    Param("embed.weight", (9, 5), group=0),
    Param("ln1.weight", (5,), group=1),
    Param("ln1.bias", (5,), group=1),
    Param("attn.weight", (18, 5), group=0),
    Param("attn.bias", (18,), group=1),
    Param("proj.weight", (5, 5), group=0),
    Param("proj.bias", (5,), group=1),
    Param("ln2.weight", (5,), group=1),
    Param("ln2.bias", (5,), group=1),
    Param("head.weight", (11, 5), group=0),
]

# AutoTP-style TP 2: fc_in column-parallel (dim 0, bias split too), fc_out row-parallel (dim 1, bias
# replicated), layer norm replicated. Every TP-local numel is odd, so ZeRO-3 pads at DP 2.
TP_MODEL = [
    Param("ln.weight", (7,), tp="rep"),
    Param("ln.bias", (7,), tp="rep"),
    Param("fc_in.weight", (10, 7), tp="col"),
    Param("fc_in.bias", (10,), tp="col"),
    Param("fc_out.weight", (7, 10), tp="row"),
    Param("fc_out.bias", (7,), tp="rep"),
]
TP_UCI = {
    "universal_checkpoint_version": 0.4,
    "tp_replicated_parameter_patterns": [r"ln\.weight", r"ln\.bias", r"fc_out\.bias"],
    "parameter_with_row_parallelism_patterns": [r"fc_out\.weight"],
}

# Frozen params, buffers (float and integer, one on the root module) and a tied weight.
FROZEN = [
    Buffer("pos_ids", (6,), torch.int64),
    Param("embed.weight", (11, 5), trainable=False),
    Param("norm.weight", (5,)),                          # a BatchNorm1d-like module (_version 2)
    Param("norm.bias", (5,), trainable=False),
    Buffer("norm.running_mean", (5,)),
    Buffer("norm.running_var", (5,)),
    Buffer("norm.num_batches_tracked", (), torch.int64),
    Param("fc.weight", (7, 5)),
    Param("fc.bias", (7,)),
    Alias("head.weight", "fc.weight"),
]

WD_GROUPS = [{"weight_decay": 0.01}, {"weight_decay": 0.0}]

CASES = [
    Case("dp1_fp32", MLP, dp=1, seed=101, notes="DP 1: one rank, partitions are whole params, no padding."),
    Case("dp2_fp16", MLP, dp=2, dtype="fp16", seed=102,
         notes="fp16: DynamicLossScaler pickled in the optimizer files; module holds empty fp16 tensors."),
    Case("dp3_bf16", MLP, dp=3, dtype="bf16", seed=103,
         notes="bf16: optimizer files are bf16_zero_pp_rank_*; static LossScaler(1.0)."),
    Case("dp4_fp32", MLP, dp=4, seed=104, notes="DP 4: every param ragged (no numel divisible by 4)."),
    Case("dp2_fp32_torch2", MLP, dp=2, optimizer="adamw_t2", torch2_pickle=True, seed=105,
         notes="fp32_flat_groups pickled as torch>=2.0 does for tensors with a ds_id attribute "
               "(_rebuild_from_type_v2 wrapping, state {'ds_id': '0_6'}); torch 2.x AdamW param-group keys."),
    Case("paper_1024_dp3", PAPER, dp=3, seed=201,
         notes="a.weight has 1024 elements: padded to 1026, 342 per rank, 2 padding elements on rank 2; "
               "b.weight 1026 (no padding), c.bias 10 (Pn 4, 2 padding)."),
    Case("tiny_dp3", TINY, dp=3, seed=301,
         notes="Params smaller than DP: scale (0-dim) and e.bias (1 element) live on rank 0 only, ranks 1-2 "
               "hold one padding element each; b.bias (2) leaves rank 2 pure padding; c.weight has 0 elements."),
    Case("tiny_dp4", TINY, dp=4, seed=302, notes="As tiny_dp3 at DP 4: ranks 1-3 pure padding for 1-element params."),
    Case("subgroups_2pg_dp3", TWO_GROUPS, dp=3, optimizer="fused_adam", groups=WD_GROUPS, sub_group_size=12,
         torch2_pickle=True, seed=401,
         notes="Two optimizer param groups (decay / no decay) and sub_group_size 12: several sub-groups per "
               "group, numbered globally; flat order is group order, not module order. DeepSpeed FusedAdam: "
               "int step in state and step 0 in param groups. fp32 groups carry ds_id (torch 2 pickling)."),
    Case("tp2_dp2_bf16", TP_MODEL, dp=2, tp=2, dtype="bf16", uci=TP_UCI, parallel_dims=True,
         ds_version="0.19.6", seed=501,
         notes="TP 2 x DP 2 (AutoTP-style): files mp_rank_00/01; each TP-local shard ZeRO-3-partitioned over DP. "
               "fc_in column-parallel (cat dim 0), fc_out.weight row-parallel (cat dim 1), ln.* and fc_out.bias "
               "replicated (identical on both TP ranks)."),
    Case("frozen_buffers_dp3_fp16", FROZEN, dp=3, dtype="fp16", seed=601, module_versions={"norm": 2},
         notes="Frozen params (embed.weight, norm.bias: partitioned like trainable ones; fp16 fragments in "
               "frozen_param_fragments), buffers pos_ids (int64, root module), norm.running_mean/running_var "
               "(fp16), norm.num_batches_tracked (int64 0-dim), and head.weight tied to fc.weight "
               "(shared_params on global rank 0 only)."),
    Case("tinylm_dp2", None, dp=2, ds_version="0.14.5", uci={"universal_checkpoint_version": 0.2},
         truth_from=os.path.join(REAL, "z1_dp2_fp32", "truth.pt"),
         notes="Same state as deepspeed-real/z1_dp2_fp32 (ZeRO-1) resharded with ZeRO-3 rules. Apart from "
               "fp32 padding garbage this reproduces deepspeed-real/z3_dp2_fp32, which DeepSpeed wrote from "
               "the same training run."),
    Case("tinylm_dp3", None, dp=3, ds_version="0.14.5", uci={"universal_checkpoint_version": 0.2},
         truth_from=os.path.join(REAL, "z1_dp2_fp32", "truth.pt"),
         notes="Same state as deepspeed-real/z1_dp2_fp32, ZeRO-3 at DP 3."),
]

BY_NAME = {c.name: c for c in CASES}
