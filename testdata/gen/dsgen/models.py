"""Model descriptions: which parameters exist, how tensor parallelism splits them, where they live.

A model is described once, at full (unsharded) size. Each parameter carries the rule that
Megatron-DeepSpeed / DeepSpeed's ds_to_universal uses to merge its tensor-parallel slices
(deepspeed/checkpoint/ds_to_universal.py merge_tp_slices); the generator uses the same rule in
reverse to split the full tensors, so the truth is by construction what a correct universal
checkpoint holds.

Rules (T = tensor-parallel degree):
  default     column parallel: torch.chunk(T, dim 0); universal {'cat_dim': 0}
  row         row parallel: chunk(T, dim 1); universal {'cat_dim': 1}
  replicated  every rank holds the whole tensor (bit-identical); universal {}
  average     every rank holds a different whole tensor; truth = sum(slices) / T; universal {}
  swiglu      [gate; up] stacked on dim 0, each half chunked over T; {'cat_dim': 0, 'param_n_sub_params': 2}
  subparams   fused sub-parameters along dim 0 (GQA q/k/v) with per-rank widths; {'sub_param_shape': ...}
"""
import dataclasses
from collections import OrderedDict
from typing import Optional

import torch


@dataclasses.dataclass
class PSpec:
    name: str                 # engine / universal name (named_parameters name)
    shape: tuple              # full logical shape; vocab params: padded vocab rows
    rule: str = "default"
    group: int = 0            # optimizer param group index
    vocab: bool = False       # vocabulary-parallel: truth truncated to original_vocab_size rows
    trainable: bool = True
    center: float = 0.0       # mean of generated weights (1.0 for norm weights)
    sub_widths: Optional[tuple] = None   # subparams: full widths of each sub-param along dim 0
    sub_shard_widths: Optional[tuple] = None  # subparams: per sub-param, per-rank widths (None: even)
    split_sizes: Optional[tuple] = None  # default/row: per-rank sizes along the split dim (None: torch.chunk)
    stages: tuple = (0,)      # pipeline stages holding the parameter
    diverge: bool = False     # pipeline replica on later stages holds different values
    layer: Optional[int] = None          # pipeline: LayerSpec index (layer file number)
    local: Optional[str] = None          # pipeline: key inside the layer file
    layer_file_stages: tuple = ()        # pipeline: stages that write the layer file

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclasses.dataclass
class ModelDef:
    kind: str                         # 'flat', 'megatron' (nested module dict), 'pipe'
    params: list                      # PSpec in named_parameters order (deduplicated)
    sd_items: list = None             # flat/megatron: state_dict order: ('param', n) | ('buffer', n) | ('alias', n, target)
    buffers: dict = dataclasses.field(default_factory=OrderedDict)  # persistent buffers: name -> tensor (full)
    groups: list = None               # user param-group dicts (hyper-parameters besides defaults), in order
    vocab: Optional[tuple] = None     # (original_vocab_size, padded_vocab_size)
    config: dict = dataclasses.field(default_factory=dict)
    uci_patterns: Optional[dict] = None  # model part of universal_checkpoint_info (Megatron style)

    def spec(self, name):
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


def split_widths(total, parts):
    assert total % parts == 0, (total, parts)
    return [total // parts] * parts


def shard_widths(p, tp):
    """Per-sub-param, per-rank widths of a 'subparams' parameter (Megatron: even split)."""
    if p.sub_shard_widths is not None:
        return [list(w) for w in p.sub_shard_widths]
    return [split_widths(w, tp) for w in p.sub_widths]


def local_shape(p, tp, t):
    s = list(p.shape)
    if tp == 1 or p.rule in ("replicated", "average"):
        return tuple(s)
    if p.rule == "subparams":
        s[0] = sum(w[t] for w in shard_widths(p, tp))
    elif p.rule in ("default", "swiglu", "row"):
        dim = 1 if p.rule == "row" else 0
        if p.split_sizes is not None:
            s[dim] = p.split_sizes[t]
        else:
            assert s[dim] % tp == 0, (p.name, s, tp)
            s[dim] //= tp
    else:
        raise ValueError(p.rule)
    return tuple(s)


def tp_slice(p, full, t, tp):
    """Rank t's slice of the full tensor `full` (inverse of ds_to_universal's merge)."""
    if tp == 1 or p.rule == "replicated":
        return full.clone()
    if p.rule in ("default", "row"):
        dim = 1 if p.rule == "row" else 0
        if p.split_sizes is not None:
            return full.narrow(dim, sum(p.split_sizes[:t]), p.split_sizes[t]).clone()
        return full.chunk(tp, dim)[t].clone()
    if p.rule == "swiglu":
        gate, up = full.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]], 0)
    if p.rule == "subparams":
        pieces, off = [], 0
        for w, widths in zip(p.sub_widths, shard_widths(p, tp)):
            start = off + sum(widths[:t])
            pieces.append(full.narrow(0, start, widths[t]))
            off += w
        return torch.cat(pieces, 0)
    raise ValueError(p.rule)


def universal_keys(p, tp, uci):
    """Keys besides 'param' that ds_to_universal writes into fp32.pt / exp_avg.pt / exp_avg_sq.pt."""
    d = OrderedDict()
    if tp > 1 and p.rule in ("replicated", "average"):
        pass
    elif tp > 1 and p.rule == "swiglu":
        d["cat_dim"] = 0
        d["param_n_sub_params"] = 2
    elif p.rule == "subparams" and uci is not None and _subparam_entry(p, uci) is not None:
        e = _subparam_entry(p, uci)
        d["sub_param_shape"] = {"patterns": list(e["patterns"]), "shape": e["shape"],
                                "partition_dim": e["partition_dim"]}
    else:
        d["cat_dim"] = 1 if (tp > 1 and p.rule == "row") else 0
    if p.vocab and uci is not None:
        d["vocab_tensor"] = True
    return d


def _subparam_entry(p, uci):
    import re
    for e in uci.get("parameter_with_sub_params", []):
        for pat in e["patterns"]:
            if re.match(pat, p.name):
                return e
    return None


# ----------------------------------------------------------------------------------------------
# Plain PyTorch models (TP = PP = 1)


def tinylm(vocab=41, hidden=9, ffn=17, seq=7, layers=2, two_groups=False, frozen=(),
           buffers=False, tie_head=False, logit_scale=True):
    """The TinyLM of the real fixtures (Embedding, 2 blocks of LayerNorm + 2 Linear, head) plus an
    optional 1-element root parameter `logit_scale` that makes the element count odd, so every DP
    degree (1..4) leaves alignment padding.

    two_groups: param group 0 = 2-D weights (weight decay), group 1 = biases / norms / scalars.
    frozen: names with requires_grad=False (ZeRO-2 saves them in frozen_param_*).
    buffers: a persistent int64 root buffer `position_ids` and a persistent float buffer
      `blocks.0.ln_scale` (low precision after module.half()/bfloat16()).
    tie_head: head.weight is the same Parameter as embed.weight (only embed.weight is optimized;
      the state_dict carries both and shared_params maps head.weight -> embed.weight).
    """
    params, sd = [], []

    def add(name, shape, center=0.0):
        g = 0
        if two_groups and (len(shape) == 1):
            g = 1
        params.append(PSpec(name, tuple(shape), group=g, center=center, trainable=name not in frozen))
        sd.append(("param", name))

    bufs = OrderedDict()
    if logit_scale:
        add("logit_scale", (1,), center=1.0)
    if buffers:
        bufs["position_ids"] = torch.arange(seq, dtype=torch.int64).unsqueeze(0)
        sd.append(("buffer", "position_ids"))
    add("embed.weight", (vocab, hidden))
    add("pos.weight", (seq, hidden))
    for i in range(layers):
        b = f"blocks.{i}"
        add(f"{b}.ln.weight", (hidden,), center=1.0)
        add(f"{b}.ln.bias", (hidden,))
        add(f"{b}.fc1.weight", (ffn, hidden))
        add(f"{b}.fc1.bias", (ffn,))
        add(f"{b}.fc2.weight", (hidden, ffn))
        add(f"{b}.fc2.bias", (hidden,))
    add("ln_f.weight", (hidden,), center=1.0)
    add("ln_f.bias", (hidden,))
    if tie_head:
        sd.append(("alias", "head.weight", "embed.weight"))
    else:
        add("head.weight", (vocab, hidden))
    add("head.bias", (vocab,))
    if buffers:
        # A block-level buffer: state_dict() saves a module's own params and buffers before
        # its children, so it goes right before blocks.0's first child entry.
        bufs["blocks.0.ln_scale"] = torch.linspace(0.5, 1.5, hidden)  # cast like module.half()/bfloat16()
        i = sd.index(("param", "blocks.0.ln.weight"))
        sd.insert(i, ("buffer", "blocks.0.ln_scale"))
    groups = [{}] if not two_groups else [{"weight_decay": 0.1}, {"weight_decay": 0.0}]
    cfg = dict(vocab=vocab, hidden=hidden, ffn=ffn, seq=seq, layers=layers)
    return ModelDef("flat", params, sd, bufs, groups, config=cfg)


def tiny(frozen=()):
    """Five elements: w (2x2) and b (1). At D=4: A=8, S=2, rank 2 holds b plus one padding
    element, rank 3 holds padding only (spec §4.1 edge example)."""
    params = [PSpec("w", (2, 2)), PSpec("b", (1,))]
    sd = [("param", "w"), ("param", "b")]
    return ModelDef("flat", params, sd, OrderedDict(), [{}], config=dict(numel=5))


def hf_llama(vocab=41, hidden=9, ffn=20, heads=3, kv_heads=1, layers=2):
    """Hugging Face Llama-style naming (what the HF Trainer + DeepSpeed saves). lm_head is tied
    to model.embed_tokens (shared_params). rotary inv_freq is a non-persistent buffer, so it
    appears nowhere in the checkpoint."""
    hd = hidden // heads
    params, sd = [], []

    def add(name, shape, center=0.0):
        params.append(PSpec(name, tuple(shape), center=center))
        sd.append(("param", name))

    add("model.embed_tokens.weight", (vocab, hidden))
    for i in range(layers):
        b = f"model.layers.{i}"
        add(f"{b}.self_attn.q_proj.weight", (heads * hd, hidden))
        add(f"{b}.self_attn.k_proj.weight", (kv_heads * hd, hidden))
        add(f"{b}.self_attn.v_proj.weight", (kv_heads * hd, hidden))
        add(f"{b}.self_attn.o_proj.weight", (hidden, heads * hd))
        add(f"{b}.mlp.gate_proj.weight", (ffn, hidden))
        add(f"{b}.mlp.up_proj.weight", (ffn, hidden))
        add(f"{b}.mlp.down_proj.weight", (hidden, ffn))
        add(f"{b}.input_layernorm.weight", (hidden,), center=1.0)
        add(f"{b}.post_attention_layernorm.weight", (hidden,), center=1.0)
    add("model.norm.weight", (hidden,), center=1.0)
    sd.append(("alias", "lm_head.weight", "model.embed_tokens.weight"))
    cfg = dict(vocab=vocab, hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, layers=layers)
    return ModelDef("flat", params, sd, OrderedDict(), [{}], config=cfg)


# ----------------------------------------------------------------------------------------------
# Megatron-DeepSpeed GPT


def padded_vocab(orig, divisible_by, tp):
    """megatron/tokenizer: _vocab_size_with_padding."""
    multiple = divisible_by * tp
    after = orig
    while after % multiple != 0:
        after += 1
    return after


def megatron_gpt(tp, pipe=False, pp=1, hidden=9, heads=4, kv_heads=2, kv_channels=2, ffn=12, layers=2, seq=7,
                 vocab=43, divisible_by=8, swiglu=True, untie=False, average_final_ln_bias=False,
                 uneven_heads=False, llama=False):
    """GPTModel (pipe=False, names language_model.*) or GPTModelPipe (pipe=True, names
    tied_modules.embed.* / '{idx}.*'), layer norm, biases on, learned position embeddings.
    llama=True: Megatron-DeepSpeed's Llama set-up instead (--normalization rmsnorm,
    --disable-bias-linear, --no-position-embedding --use-rotary-position-embeddings, --swiglu):
    norm weights only, no biases, no position embeddings (the llama model family).

    Param groups follow megatron/optimizer get_param_groups: group 0 'wd_no_scale_lr' holds the
    2-D weights, group 1 'no_wd_no_scale_lr' the biases and 1-D params, each in
    named_parameters order.
    """
    # --kv-channels decouples the head size from hidden/heads (projection_size = kv_channels * heads);
    # an odd hidden size keeps every flat group's element count off multiples of 2*D
    q, kv = heads * kv_channels, kv_heads * kv_channels
    vpad = padded_vocab(vocab, divisible_by, tp)
    gqa = kv_heads != heads
    qkv_widths = dense_sizes = None
    if uneven_heads:
        # AutoTP's KV-head-aligned split for kv_heads % tp != 0: rank t gets kv//tp + (t < kv%tp)
        # KV heads and the query heads of those groups (Megatron itself requires an even split).
        per = [kv_heads // tp + (t < kv_heads % tp) for t in range(tp)]
        group = heads // kv_heads
        qw = [n * group * kv_channels for n in per]
        kw = [n * kv_channels for n in per]
        qkv_widths = (tuple(qw), tuple(kw), tuple(kw))
        dense_sizes = tuple(qw)
    h4 = 2 * ffn if swiglu else ffn
    params = []

    def add(name, shape, rule, center=0.0, **kw):
        if llama and (name.endswith(".bias") or "position_embeddings" in name):
            return
        g = 1 if (name.endswith(".bias") or len(shape) == 1) else 0
        params.append(PSpec(name, tuple(shape), rule=rule, group=g, center=center, **kw))

    def layer(prefix, **kw):
        add(f"{prefix}input_layernorm.weight", (hidden,), "replicated", 1.0, **_loc(kw, "input_layernorm.weight"))
        add(f"{prefix}input_layernorm.bias", (hidden,), "replicated", **_loc(kw, "input_layernorm.bias"))
        qkv_rule = "subparams" if gqa else "default"
        widths = (q, kv, kv) if gqa else None
        add(f"{prefix}self_attention.query_key_value.weight", (q + 2 * kv, hidden), qkv_rule,
            sub_widths=widths, sub_shard_widths=qkv_widths, **_loc(kw, "self_attention.query_key_value.weight"))
        add(f"{prefix}self_attention.query_key_value.bias", (q + 2 * kv,), qkv_rule,
            sub_widths=widths, sub_shard_widths=qkv_widths, **_loc(kw, "self_attention.query_key_value.bias"))
        add(f"{prefix}self_attention.dense.weight", (hidden, q), "row", split_sizes=dense_sizes,
            **_loc(kw, "self_attention.dense.weight"))
        add(f"{prefix}self_attention.dense.bias", (hidden,), "replicated", **_loc(kw, "self_attention.dense.bias"))
        add(f"{prefix}post_attention_layernorm.weight", (hidden,), "replicated", 1.0,
            **_loc(kw, "post_attention_layernorm.weight"))
        add(f"{prefix}post_attention_layernorm.bias", (hidden,), "replicated",
            **_loc(kw, "post_attention_layernorm.bias"))
        mlp_rule = "swiglu" if swiglu else "default"
        add(f"{prefix}mlp.dense_h_to_4h.weight", (h4, hidden), mlp_rule, **_loc(kw, "mlp.dense_h_to_4h.weight"))
        add(f"{prefix}mlp.dense_h_to_4h.bias", (h4,), mlp_rule, **_loc(kw, "mlp.dense_h_to_4h.bias"))
        add(f"{prefix}mlp.dense_4h_to_h.weight", (hidden, ffn), "row", **_loc(kw, "mlp.dense_4h_to_h.weight"))
        add(f"{prefix}mlp.dense_4h_to_h.bias", (hidden,), "replicated", **_loc(kw, "mlp.dense_4h_to_h.bias"))

    if not pipe:
        add("language_model.embedding.word_embeddings.weight", (vpad, hidden), "default", vocab=True)
        add("language_model.embedding.position_embeddings.weight", (seq, hidden), "replicated")
        for i in range(layers):
            layer(f"language_model.encoder.layers.{i}.")
        add("language_model.encoder.final_layernorm.weight", (hidden,), "replicated", 1.0)
        add("language_model.encoder.final_layernorm.bias", (hidden,),
            "average" if average_final_ln_bias else "replicated")
        if untie:
            add("language_model.output_layer.weight", (vpad, hidden), "default", vocab=True)
        kind = "megatron"
    else:
        assert not untie and pp == 2
        # specs: 0 _to_float16, 1 TiedLayerSpec('embed'), 2..L+1 transformer layers,
        # L+2 final LayerNorm, L+3 TiedLayerSpec('embed', forward_fn=_logits_helper), L+4 float16_to_fp32.
        # partition_method='type:transformer' puts the first half of the layers on stage 0.
        first = 2
        last_stage_start = first + layers // 2
        both = (0, 1)
        # PipelineModule registers tied_modules before the numbered layers, so on every stage
        # the tied embedding comes first in named_parameters.
        add("tied_modules.embed.word_embeddings.weight", (vpad, hidden), "default", vocab=True,
            stages=both, layer=1, local="word_embeddings.weight", layer_file_stages=(0,))
        add("tied_modules.embed.position_embeddings.weight", (seq, hidden), "replicated", stages=both,
            diverge=True, layer=1, local="position_embeddings.weight", layer_file_stages=(0,))
        for i in range(layers):
            idx = first + i
            st = 0 if idx < last_stage_start else 1
            layer(f"{idx}.", stages=(st,), layer=idx, layer_file_stages=(st,))
        fin = first + layers
        add(f"{fin}.weight", (hidden,), "replicated", 1.0, stages=(1,), layer=fin, local="weight",
            layer_file_stages=(1,))
        add(f"{fin}.bias", (hidden,), "replicated", stages=(1,), layer=fin, local="bias", layer_file_stages=(1,))
        kind = "pipe"

    sd = [("param", p.name) for p in params]
    groups = [{"name": "wd_no_scale_lr", "wd_mult": 1.0, "lr_mult": 1.0},
              {"name": "no_wd_no_scale_lr", "wd_mult": 0.0, "lr_mult": 1.0}]
    cfg = dict(hidden=hidden, heads=heads, kv_heads=kv_heads, kv_channels=kv_channels, ffn=ffn, layers=layers, seq=seq, vocab=vocab,
               padded_vocab=vpad, divisible_by=divisible_by, swiglu=swiglu, untie=untie, tp=tp, pp=pp,
               pipe=pipe, gqa=gqa, q=q, kv=kv, uneven_heads=uneven_heads,
               qkv_shard_widths=[list(w) for w in qkv_widths] if qkv_widths else None)
    if llama:
        cfg["llama"] = True
    m = ModelDef(kind, params, sd, OrderedDict(), groups, vocab=(vocab, vpad), config=cfg)
    m.uci_patterns = megatron_uci_patterns(m, tp, pipe, swiglu, average_final_ln_bias)
    if llama:
        keep = {p.name for p in params}
        for k in ("tp_replicated_parameter_patterns", "parameter_with_2_sub_params_cat_dim_0"):
            if k in m.uci_patterns:
                m.uci_patterns[k] = [x for x in m.uci_patterns[k] if "bias" not in x and "position_embeddings" not in x]
        subs = m.uci_patterns.get("parameter_with_sub_params")
        if subs:
            m.uci_patterns["parameter_with_sub_params"] = [x for x in subs if not x["patterns"][0].endswith("bias")]
            m.uci_patterns["sub_param_shard_widths"] = {k: v for k, v in m.uci_patterns["sub_param_shard_widths"].items()
                                                       if not k.endswith("bias")}
        del keep
    return m


def _loc(kw, local):
    if not kw:
        return {}
    d = dict(kw)
    d["local"] = local
    return d


def megatron_uci_patterns(m, tp, pipe, swiglu, average_final_ln_bias):
    """Model part of universal_checkpoint_info, in the key order of Megatron-DeepSpeed's
    UniversalCheckpointInfo._build_universal_checkpoint_info (megatron/model/gpt_model.py), plus
    the entries Megatron-DeepSpeed does not emit but DeepSpeed understands (averaging, GQA
    sub-params), appended after them."""
    info = OrderedDict()
    cfg = m.config
    if pipe:
        vocab_pats = [r"tied_modules.embed.word_embeddings.weight"]
    else:
        vocab_pats = ["language_model.embedding.word_embeddings.weight"]
        if cfg["untie"]:
            vocab_pats.append("language_model.output_layer.weight")
    info["vocabulary_parameter_patterns"] = vocab_pats
    if pipe:
        info["pipeline_replicated_parameter_patterns"] = list(vocab_pats) + [
            r"tied_modules.embed.position_embeddings.weight"]
    lp = "" if pipe else "language_model.encoder.layers."
    if tp > 1:
        rep = [lp + r"\d+.input_layernorm.weight", lp + r"\d+.post_attention_layernorm.weight"]
        rep.append(r"\d+.weight" if pipe else "language_model.encoder.final_layernorm.weight")
        if not average_final_ln_bias:
            rep.append(r"\d+.bias" if pipe else "language_model.encoder.final_layernorm.bias")
        rep.append("tied_modules.embed.position_embeddings.weight" if pipe
                   else "language_model.embedding.position_embeddings.weight")
        rep += [lp + r"\d+.self_attention.dense.bias", lp + r"\d+.mlp.dense_4h_to_h.bias"]
        rep += [lp + r"\d+.input_layernorm.bias", lp + r"\d+.post_attention_layernorm.bias"]
        info["tp_replicated_parameter_patterns"] = rep
        info["parameter_with_row_parallelism_patterns"] = [lp + r"\d+.mlp.dense_4h_to_h.weight",
                                                           lp + r"\d+.self_attention.dense.weight"]
    sw = []
    if swiglu:
        sw = [lp + r"\d+.mlp.dense_h_to_4h.weight", lp + r"\d+.mlp.dense_h_to_4h.bias"]
    info["parameter_with_2_sub_params_cat_dim_0"] = sw
    if average_final_ln_bias:
        assert not pipe
        info["parameter_to_average_patterns"] = ["language_model.encoder.final_layernorm.bias"]
    if cfg["gqa"]:
        q, kv, hidden = cfg["q"], cfg["kv"], cfg["hidden"]
        wpat = lp + r"\d+.self_attention.query_key_value.weight"
        bpat = lp + r"\d+.self_attention.query_key_value.bias"
        info["parameter_with_sub_params"] = [
            {"patterns": [wpat], "shape": [(q, kv, kv), hidden], "partition_dim": 0},
            {"patterns": [bpat], "shape": [(q, kv, kv)], "partition_dim": 0},
        ]
        widths = cfg["qkv_shard_widths"] or [split_widths(w, tp) for w in (q, kv, kv)]
        info["sub_param_shard_widths"] = {wpat: [list(w) for w in widths], bpat: [list(w) for w in widths]}
    return info
