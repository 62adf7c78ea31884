"""The full (unsharded) model: geometry, parameter catalogue in Megatron's module order, values.

Module order matters twice: it is the key order of the saved `model` dict (Module.state_dict:
own params, own buffers, own `_extra_state`, then children in registration order) and the
`named_parameters()` order that drives optimizer param ids and the DDP buffer layout.
Registration orders mirrored here (Megatron-LM d98e8a6 unless noted):
  GPTModel: embedding, decoder, output_layer            (models/gpt/gpt_model.py __init__)
  LanguageModelEmbedding: word_embeddings, position_embeddings
  TransformerLayer: input_layernorm, self_attention, pre_mlp_layernorm, mlp
                                                        (transformer/transformer_layer.py __init__)
  SelfAttention: core_attention, linear_proj, linear_qkv (attention.py: Attention.__init__ builds
                 core_attention and linear_proj, SelfAttention.__init__ then builds linear_qkv)
  MLP: linear_fc1, linear_fc2                            (transformer/mlp.py)
  MoELayer: router, experts                              (transformer/moe/moe_layer.py)
  TE LayerNormLinear: layer_norm_weight, layer_norm_bias, weight, bias   (TransformerEngine)
  legacy ParallelTransformerLayer: input_norm, self_attention(query_key_value, dense),
                 post_attention_norm, mlp(dense_h_to_4h, dense_4h_to_h)   (core_v0.5.0
                 megatron/model/transformer.py)
"""

import math
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class ModelCfg:
    hidden: int = 16
    heads: int = 4
    groups: int = 0  # num_query_groups; 0 = no GQA (groups == heads)
    kv_channels: int = 0  # 0 = hidden // heads
    ffn: int = 32
    layers: int = 2
    vocab: int = 100  # true vocabulary size
    divisor: int = 128  # make_vocab_size_divisible_by
    swiglu: bool = False
    untie: bool = False
    norm: str = "LayerNorm"  # or RMSNorm (no norm biases)
    bias: bool = True  # add_bias_linear
    qkv_bias: bool = False  # add_qkv_bias
    pos: str = "learned_absolute"  # or rope (no position embedding param)
    max_pos: int = 16
    spec: str = "te"  # te | local | legacy
    experts: int = 0
    moe_ffn: int = 0
    moe_impl: str = "grouped"  # grouped (TEGroupedMLP weight{j}) | sequential (local_experts.{j}) |
    #                            legacy_grouped (GroupedMLP: experts fused in weight1 / weight2)
    expert_bias: bool = False  # router.expert_bias persistent fp32 buffer

    @property
    def ng(self) -> int:
        return self.groups or self.heads

    @property
    def hn(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.ng) * self.hn

    @property
    def gqa(self) -> bool:
        return self.ng != self.heads

    @property
    def fc1_rows(self) -> int:
        return 2 * self.ffn if self.swiglu else self.ffn

    @property
    def efc1_rows(self) -> int:
        return 2 * self.moe_ffn if self.swiglu else self.moe_ffn

    @property
    def norm_bias(self) -> bool:
        return self.norm == "LayerNorm"


def padded_vocab(cfg: ModelCfg, tp: int) -> int:
    """megatron/training/vocab_utils.py calculate_padded_vocab_size."""
    multiple = cfg.divisor * tp
    return int(math.ceil(cfg.vocab / multiple) * multiple)


@dataclass
class Entry:
    """One key of a saved `model` dict."""

    path: Tuple[str, ...]  # nested dict path; mcore: 1 element
    kind: str  # param | buffer | extra
    atomic: Optional[str] = None  # global name of the param/buffer (global layer, global expert)
    split: str = "rep"  # vocab | col | qkv | swiglu | row | rep | gmm1 | gmm2 (GroupedMLP)
    expert: bool = False  # split over EP (and ETP instead of TP)
    shape: Tuple[int, ...] = ()  # global shape (vocab rows padded)
    extra: str = ""  # extra-state flavour: te | none
    tied_copy: bool = False  # last-stage output_layer copy of the tied word embedding
    shared_embedding: bool = False  # param.shared_embedding (own DDP bucket), set by the layout

    @property
    def local_name(self) -> str:
        return ".".join(self.path)


def _layer(cfg: ModelCfg, Vp: int, experts: List[Tuple[int, int]]):
    """(suffix, kind, split, shape, expert, extra) for one transformer layer in module order.

    Expert suffixes contain '{j}' (local index) which the caller formats; the atomic name uses
    the global index. `experts` is the list of (local j, global e) held by this EP rank.
    """
    H, ln_b, b = cfg.hidden, cfg.norm_bias, cfg.bias
    qkv_b = cfg.bias or cfg.qkv_bias
    proj_in = cfg.heads * cfg.hn
    out = []

    def add(suffix, kind, split="rep", shape=(), expert=False, extra=""):
        out.append((suffix, kind, split, tuple(shape), expert, extra))

    if cfg.spec == "legacy":
        add("input_norm.weight", "param", "rep", (H,))
        if ln_b:
            add("input_norm.bias", "param", "rep", (H,))
        add("self_attention.query_key_value.weight", "param", "qkv", (cfg.qkv_rows, H))
        if qkv_b:
            add("self_attention.query_key_value.bias", "param", "qkv", (cfg.qkv_rows,))
        add("self_attention.query_key_value._extra_state", "extra", extra="none")
        add("self_attention.dense.weight", "param", "row", (H, proj_in))
        if b:
            add("self_attention.dense.bias", "param", "rep", (H,))
        add("self_attention.dense._extra_state", "extra", extra="none")
        add("post_attention_norm.weight", "param", "rep", (H,))
        if ln_b:
            add("post_attention_norm.bias", "param", "rep", (H,))
        fc1 = "swiglu" if cfg.swiglu else "col"
        add("mlp.dense_h_to_4h.weight", "param", fc1, (cfg.fc1_rows, H))
        if b:
            add("mlp.dense_h_to_4h.bias", "param", fc1, (cfg.fc1_rows,))
        add("mlp.dense_h_to_4h._extra_state", "extra", extra="none")
        add("mlp.dense_4h_to_h.weight", "param", "row", (H, cfg.ffn))
        if b:
            add("mlp.dense_4h_to_h.bias", "param", "rep", (H,))
        add("mlp.dense_4h_to_h._extra_state", "extra", extra="none")
        return out

    te = cfg.spec == "te"
    lin_extra = "te" if te else "none"
    if not te:
        add("input_layernorm.weight", "param", "rep", (H,))
        if ln_b:
            add("input_layernorm.bias", "param", "rep", (H,))
    else:
        add("self_attention.core_attention._extra_state", "extra", extra="te")
    add("self_attention.linear_proj.weight", "param", "row", (H, proj_in))
    if b:
        add("self_attention.linear_proj.bias", "param", "rep", (H,))
    add("self_attention.linear_proj._extra_state", "extra", extra=lin_extra)
    if te:
        add("self_attention.linear_qkv.layer_norm_weight", "param", "rep", (H,))
        if ln_b:
            add("self_attention.linear_qkv.layer_norm_bias", "param", "rep", (H,))
    add("self_attention.linear_qkv.weight", "param", "qkv", (cfg.qkv_rows, H))
    if qkv_b:
        add("self_attention.linear_qkv.bias", "param", "qkv", (cfg.qkv_rows,))
    add("self_attention.linear_qkv._extra_state", "extra", extra=lin_extra)

    fc1 = "swiglu" if cfg.swiglu else "col"
    if cfg.experts:
        # TE spec: pre_mlp_layernorm is TENorm for MoE; local spec: the local norm.
        add("pre_mlp_layernorm.weight", "param", "rep", (H,))
        if ln_b:
            add("pre_mlp_layernorm.bias", "param", "rep", (H,))
        add("mlp.router.weight", "param", "rep", (cfg.experts, H))
        if cfg.expert_bias:
            add("mlp.router.expert_bias", "buffer", "rep", (cfg.experts,))
        Fe = cfg.moe_ffn
        if cfg.moe_impl == "legacy_grouped":
            # GroupedMLP (moe/experts.py, core <= 0.16.1): all local experts in two params
            # registered weight1, weight2; no _extra_state. Global (TP = EP = 1) shapes:
            # weight1 [H, E * fc1_rows] stored as [E, H, fc1_rows] (forward:
            # weight1.view(num_local_experts, hidden, -1)), weight2 [E * Fe, H] as [E, Fe, H].
            add("mlp.experts.weight1", "param", "gmm1", (H, cfg.experts * cfg.efc1_rows), True)
            add("mlp.experts.weight2", "param", "gmm2", (cfg.experts * Fe, H), True)
        elif cfg.moe_impl == "grouped":
            for j, e in experts:
                add(f"mlp.experts.linear_fc1.weight{j}|{e}", "param", fc1, (cfg.efc1_rows, H), True)
            add("mlp.experts.linear_fc1._extra_state", "extra", extra="te")
            for j, e in experts:
                add(f"mlp.experts.linear_fc2.weight{j}|{e}", "param", "row", (H, Fe), True)
            add("mlp.experts.linear_fc2._extra_state", "extra", extra="te")
        else:
            for j, e in experts:
                p = f"mlp.experts.local_experts.{j}"
                add(f"{p}.linear_fc1.weight|{e}", "param", fc1, (cfg.efc1_rows, H), True)
                add(f"{p}.linear_fc1._extra_state", "extra", extra=lin_extra)
                add(f"{p}.linear_fc2.weight|{e}", "param", "row", (H, Fe), True)
                add(f"{p}.linear_fc2._extra_state", "extra", extra=lin_extra)
        return out

    if not te:
        add("pre_mlp_layernorm.weight", "param", "rep", (H,))
        if ln_b:
            add("pre_mlp_layernorm.bias", "param", "rep", (H,))
    else:
        add("mlp.linear_fc1.layer_norm_weight", "param", "rep", (H,))
        if ln_b:
            add("mlp.linear_fc1.layer_norm_bias", "param", "rep", (H,))
    add("mlp.linear_fc1.weight", "param", fc1, (cfg.fc1_rows, H))
    if b:
        add("mlp.linear_fc1.bias", "param", fc1, (cfg.fc1_rows,))
    add("mlp.linear_fc1._extra_state", "extra", extra=lin_extra)
    add("mlp.linear_fc2.weight", "param", "row", (H, cfg.ffn))
    if b:
        add("mlp.linear_fc2.bias", "param", "rep", (H,))
    add("mlp.linear_fc2._extra_state", "extra", extra=lin_extra)
    return out


def _expert_global_suffix(suffix: str) -> Tuple[str, str]:
    """Split 'a.weight0|2' into (local suffix 'a.weight0', global suffix 'a.weight2')."""
    if "|" not in suffix:
        return suffix, suffix
    local, e = suffix.split("|")
    if ".local_experts." in local:
        head, rest = local.split(".local_experts.", 1)
        _, tail = rest.split(".", 1)
        return local, f"{head}.local_experts.{e}.{tail}"
    base = local.rstrip("0123456789")
    return local, f"{base}{e}"


def chunk_entries(
    cfg: ModelCfg,
    Vp: int,
    layers: List[Tuple[int, int]],
    first: bool,
    last: bool,
    pp_size: int,
    experts: List[Tuple[int, int]],
) -> List[Entry]:
    """Entries of one model chunk (one pp stage / one virtual chunk) in state-dict order.

    layers: (local index, global index) pairs; first/last: holds embedding / final norm+head.
    """
    H = cfg.hidden
    tied_copy = (not cfg.untie) and last and not first and pp_size > 1
    out: List[Entry] = []
    if cfg.spec == "legacy":
        # core_v0.5.0 megatron/model: GPTModel.state_dict_for_save_checkpoint nests
        # language_model.{embedding,encoder,output_layer} and word_embeddings_for_head.
        if first:
            out.append(Entry(("language_model", "embedding", "word_embeddings", "weight"), "param",
                             "language_model.embedding.word_embeddings.weight", "vocab", False, (Vp, H)))
            if cfg.pos == "learned_absolute":
                out.append(Entry(("language_model", "embedding", "position_embeddings", "weight"), "param",
                                 "language_model.embedding.position_embeddings.weight", "rep", False,
                                 (cfg.max_pos, H)))
        for li, gi in layers:
            for suffix, kind, split, shape, expert, extra in _layer(cfg, Vp, experts):
                out.append(Entry(("language_model", "encoder", f"layers.{li}.{suffix}"), kind,
                                 None if kind == "extra" else f"language_model.encoder.layers.{gi}.{suffix}",
                                 split, expert, shape, extra))
        if last:
            out.append(Entry(("language_model", "encoder", "final_norm.weight"), "param",
                             "language_model.encoder.final_norm.weight", "rep", False, (H,)))
            if cfg.norm_bias:
                out.append(Entry(("language_model", "encoder", "final_norm.bias"), "param",
                                 "language_model.encoder.final_norm.bias", "rep", False, (H,)))
            if cfg.untie:
                out.append(Entry(("language_model", "output_layer", "weight"), "param",
                                 "language_model.output_layer.weight", "vocab", False, (Vp, H)))
                out.append(Entry(("language_model", "output_layer", "_extra_state"), "extra", extra="none"))
        if tied_copy:
            out.append(Entry(("word_embeddings_for_head", "weight"), "param",
                             "language_model.embedding.word_embeddings.weight", "vocab", False, (Vp, H),
                             tied_copy=True))
        return out

    if first:
        out.append(Entry(("embedding.word_embeddings.weight",), "param", "embedding.word_embeddings.weight",
                         "vocab", False, (Vp, H)))
        if cfg.pos == "learned_absolute":
            out.append(Entry(("embedding.position_embeddings.weight",), "param",
                             "embedding.position_embeddings.weight", "rep", False, (cfg.max_pos, H)))
    for li, gi in layers:
        for suffix, kind, split, shape, expert, extra in _layer(cfg, Vp, experts):
            lsuf, gsuf = _expert_global_suffix(suffix)
            out.append(Entry((f"decoder.layers.{li}.{lsuf}",), kind,
                             None if kind == "extra" else f"decoder.layers.{gi}.{gsuf}",
                             split, expert, shape, extra))
    if last:
        out.append(Entry(("decoder.final_layernorm.weight",), "param", "decoder.final_layernorm.weight",
                         "rep", False, (H,)))
        if cfg.norm_bias:
            out.append(Entry(("decoder.final_layernorm.bias",), "param", "decoder.final_layernorm.bias",
                             "rep", False, (H,)))
        # output_layer is tensor_parallel.ColumnParallelLinear (get_extra_state -> None) even with
        # TE; with tied embeddings on the first stage its weight is not allocated.
        if cfg.untie or tied_copy:
            out.append(Entry(("output_layer.weight",), "param",
                             "output_layer.weight" if cfg.untie else "embedding.word_embeddings.weight",
                             "vocab", False, (Vp, H), tied_copy=tied_copy))
        out.append(Entry(("output_layer._extra_state",), "extra", extra="none"))
    return out


def full_entries(cfg: ModelCfg, Vp: int) -> List[Entry]:
    """The whole model as one TP=PP=EP=1 chunk: the canonical parameter order and shapes."""
    return chunk_entries(cfg, Vp, [(i, i) for i in range(cfg.layers)], True, True, 1,
                         [(e, e) for e in range(cfg.experts)])


# ---------------------------------------------------------------------------------------------
# Values


def _gen(seed: int, name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1000003 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFFFFFF)
    return g


def _randn(seed, name, shape, scale=1.0, offset=0.0):
    return torch.randn(*shape, generator=_gen(seed, name)) * scale + offset


@dataclass
class FullState:
    """Global fp32 main params, Adam moments and buffers, with vocab rows padded to Vp."""

    fp32: Dict[str, torch.Tensor] = field(default_factory=dict)
    exp_avg: Dict[str, torch.Tensor] = field(default_factory=dict)
    exp_avg_sq: Dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: Dict[str, torch.Tensor] = field(default_factory=dict)
    qkv_parts: Dict[str, Dict[str, torch.Tensor]] = field(default_factory=dict)


def fuse_qkv_grouped(q, k, v, np_, ng, hn):
    """Megatron's fused QKV row order: per query group g, its np/ng query heads, then k_g, v_g.

    (attention.py SelfAttention.get_query_key_value_tensors views the output as
    [.., ng, (np/ng + 2) * hn] and splits [np/ng*hn, hn, hn].) Works for weights [rows, H] and
    biases [rows].
    """
    tail = q.shape[1:]
    qg = q.reshape(ng, (np_ // ng) * hn, *tail)
    kg = k.reshape(ng, hn, *tail)
    vg = v.reshape(ng, hn, *tail)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *tail)


def build_full_state(cfg: ModelCfg, Vp: int, seed: int) -> FullState:
    """Deterministic values from (seed, atomic name). Vocab rows < V do not depend on Vp, so the
    same model saved at different TP agrees on every real row; padding rows get their own values
    (Megatron pads with initialised, trained rows; none of them may leak into the output)."""
    st = FullState()
    for e in full_entries(cfg, Vp):
        if e.kind == "buffer":
            st.buffers[e.atomic] = _randn(seed, e.atomic + "/buf", e.shape, 0.05)
            continue
        if e.kind != "param":
            continue
        name, shape = e.atomic, e.shape
        leaf = name.rsplit(".", 1)[1]
        if e.split == "vocab":
            real = _randn(seed, name, (cfg.vocab, shape[1]), 0.02)
            pad = _randn(seed, f"{name}/pad/{Vp}", (Vp - cfg.vocab, shape[1]), 0.02, 0.5)
            w = torch.cat([real, pad])
        elif e.split == "qkv":
            rows_q = cfg.heads * cfg.hn
            rows_kv = cfg.ng * cfg.hn
            tail = shape[1:]
            sc = 0.02 if tail else 0.01
            q = _randn(seed, name + "/q", (rows_q, *tail), sc)
            k = _randn(seed, name + "/k", (rows_kv, *tail), sc)
            v = _randn(seed, name + "/v", (rows_kv, *tail), sc)
            w = fuse_qkv_grouped(q, k, v, cfg.heads, cfg.ng, cfg.hn)
            st.qkv_parts[name] = {"q": q, "k": k, "v": v}
        elif "norm" in name and leaf in ("weight", "layer_norm_weight"):
            w = _randn(seed, name, shape, 0.1, 1.0)
        elif len(shape) == 1:
            w = _randn(seed, name, shape, 0.01)
        else:
            w = _randn(seed, name, shape, 0.02)
        st.fp32[name] = w.contiguous()

        def moment(tag):
            if e.split != "vocab":
                return _randn(seed, f"{name}/{tag}", shape, 1e-3)
            real = _randn(seed, f"{name}/{tag}", (cfg.vocab, shape[1]), 1e-3)
            pad = _randn(seed, f"{name}/{tag}/pad/{Vp}", (Vp - cfg.vocab, shape[1]), 1e-3)
            return torch.cat([real, pad])

        st.exp_avg[name] = moment("exp_avg")
        st.exp_avg_sq[name] = moment("exp_avg_sq").square() + 1e-8
    return st
