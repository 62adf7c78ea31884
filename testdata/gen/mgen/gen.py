"""Build one fixture case: full model -> Megatron shards -> files + truth.pt."""

import os
import shutil
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from . import ckpt, layout, model, optim
from .layout import Topo
from .model import ModelCfg


@dataclass
class Case:
    name: str
    desc: str
    cfg: ModelCfg
    topo: Topo
    optimizer: str  # fp16opt | distopt_f3 | distopt_f2 | legacy_apex
    fp16: bool = False
    iteration: int = 10
    bucket_size: Optional[int] = None  # args.ddp_bucket_size (elements)
    overlap: bool = False  # args.overlap_grad_reduce (bucketing needs it)
    with_vocab: bool = True  # args.vocab_size present
    seed: int = 1
    attr_tensors: bool = False  # fp32_from_fp16_params pickled like torch >= 2 (attributes kept)
    extra_state: str = "tensor"  # TE _extra_state flavour: tensor | bytesio
    save_rng: bool = True  # False = --no-save-rng: no 'rng_state' key
    adam: str = "torch"  # torch AdamW (per-param 'step' tensors; float distributed step) |
    #                      fused (Apex/TE FusedAdam: int group 'step')
    notes: List[str] = field(default_factory=list)

    @property
    def legacy(self) -> bool:
        return self.cfg.spec == "legacy"

    @property
    def era(self) -> str:
        if self.legacy:
            return "legacy"
        return "core_v0.6" if self.optimizer == "distopt_f2" else "current"


LR, MIN_LR, WD = 3e-4, 3e-5, 0.1


def _tp_attrs(e: model.Entry):
    # GroupedMLP: _initialize_affine_weight_gpu(weight1, partition_dim=1) / (weight2, 0)
    if e.split == "gmm1":
        return (True, 1, 1)
    if e.split == "gmm2":
        return (True, 0, 1)
    if e.split in ("col", "qkv", "vocab", "swiglu"):
        return (True, 0, 1)
    if e.split == "row":
        return (True, 1, 1)
    return (False, -1, 1)


def _nest(d: dict, path, value):
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def build(case: Case, out_dir: str) -> dict:
    cfg, topo = case.cfg, case.topo
    assert topo.etp_ in (topo.tp, 1)
    # Experts are expert-parallel params (allreduce = False: own optimizer and DDP buffers) only
    # with EP > 1 (layers.py / experts.py: allreduce = not (is_expert and expert_parallel)); the
    # generator models that case only.
    assert not cfg.experts or topo.ep > 1
    Vp = model.padded_vocab(cfg, topo.tp)
    st = model.build_full_state(cfg, Vp, case.seed)
    dtype = torch.float16 if case.fp16 else torch.bfloat16
    distopt = case.optimizer.startswith("distopt")
    E_local = cfg.experts // topo.ep if cfg.experts else 0
    embed_name = ("language_model.embedding.word_embeddings.weight" if case.legacy
                  else "embedding.word_embeddings.weight")

    ckpt_root = os.path.join(out_dir, "checkpoint")
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    iter_dir = os.path.join(ckpt_root, f"iter_{case.iteration:07d}")
    os.makedirs(iter_dir)

    holders = {}  # atomic -> number of files holding it (tied copies excluded)
    files = []
    buffer_meta = {}
    first_step = None
    for p in range(topo.pp):
        for e in range(topo.ep):
            experts = [(j, e * E_local + j) for j in range(E_local)]
            chunk_ents = []
            for v in range(topo.chunks):
                layers = layout.chunk_layers(cfg.layers, topo, p, v)
                first = p == 0 and v == 0
                last = p == topo.pp - 1 and v == topo.chunks - 1
                ents = model.chunk_entries(cfg, Vp, layers, first, last, topo.pp, experts)
                for en in ents:
                    # language_module.py setup_embeddings_and_output_layer: tied, PP > 1
                    if not cfg.untie and topo.pp > 1 and en.kind == "param":
                        if (en.atomic == embed_name and first and not last) or en.tied_copy:
                            en.shared_embedding = True
                chunk_ents.append(ents)
            for r in range(topo.tp):
                sd_models, chunk_recs = [], []
                for ents in chunk_ents:
                    mdict, recs = {}, []
                    for en in ents:
                        if en.kind == "extra":
                            val = None if en.extra == "none" else ckpt.te_extra_state(case.extra_state)
                            _nest(mdict, en.path, val)
                            continue
                        if en.kind == "buffer":
                            _nest(mdict, en.path, st.buffers[en.atomic].clone())
                            holders[en.atomic] = holders.get(en.atomic, 0) + 1
                            continue
                        size, rank = (topo.etp_, r % topo.etp_) if en.expert else (topo.tp, r)
                        cut = dict(ep=(e, topo.ep), experts=cfg.experts, gated=cfg.swiglu)
                        f32 = layout.shard(st.fp32[en.atomic], en.split, rank, size, **cut)
                        rec = optim.PRec(
                            name=en.local_name, entry=en, fp32=f32,
                            exp_avg=layout.shard(st.exp_avg[en.atomic], en.split, rank, size, **cut),
                            exp_avg_sq=layout.shard(st.exp_avg_sq[en.atomic], en.split, rank, size,
                                                    **cut),
                            dtype=dtype, tp_attrs=_tp_attrs(en))
                        recs.append(rec)
                        _nest(mdict, en.path, f32.to(dtype))
                        if not en.tied_copy:
                            holders[en.atomic] = holders.get(en.atomic, 0) + 1
                    sd_models.append(mdict)
                    chunk_recs.append(recs)

                opt_sd, distrib, bufdesc = _optimizer(case, topo, p, e, chunk_recs)
                if bufdesc is not None:
                    buffer_meta[layout.rank_dir(topo, r, p, e)] = bufdesc
                if first_step is None:
                    first_step = _find_step(case, opt_sd)

                args = ckpt.make_args(
                    cfg, topo, Vp, iteration=case.iteration, fp16=case.fp16, distopt=distopt,
                    bucket_size=case.bucket_size, overlap=case.overlap, with_vocab=case.with_vocab,
                    legacy=case.legacy, era=case.era, lr=LR, min_lr=MIN_LR)
                if not case.save_rng:
                    args.no_save_rng = True
                sd = {"args": args, "checkpoint_version": 3.0, "iteration": case.iteration}
                if len(sd_models) == 1:
                    sd["model"] = sd_models[0]
                else:
                    for v, m in enumerate(sd_models):
                        sd[f"model{v}"] = m
                sd["optimizer"] = opt_sd
                sd["opt_param_scheduler"] = ckpt.opt_param_scheduler(LR, MIN_LR, case.iteration, 8)
                rank = layout.global_rank(topo, r, p, e)
                if case.save_rng:
                    sd["rng_state"] = ckpt.rng_state(case.seed * 7919 + rank)
                if not case.legacy:
                    sd["num_floating_point_operations_so_far"] = 1.5e12 * case.iteration

                d = os.path.join(iter_dir, layout.rank_dir(topo, r, p, e))
                os.makedirs(d)
                with ckpt.location_tag(f"cuda:{rank % 8}"):
                    torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
                files.append(os.path.relpath(os.path.join(d, "model_optim_rng.pt"), out_dir))
                if distrib is not None:
                    torch.save(distrib, os.path.join(d, "distrib_optim.pt"))
                    files.append(os.path.relpath(os.path.join(d, "distrib_optim.pt"), out_dir))

    with open(os.path.join(ckpt_root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(case.iteration))

    truth = _truth(case, cfg, topo, Vp, st, holders, files, buffer_meta, first_step)
    torch.save(truth, os.path.join(out_dir, "truth.pt"))
    return truth


def _optimizer(case: Case, topo: Topo, p: int, e: int, chunk_recs):
    scaler = ckpt.dynamic_grad_scaler() if case.fp16 else None
    if case.optimizer == "legacy_apex":
        groups = optim.legacy_param_groups(chunk_recs)
        return optim.apex_optimizer_state(groups, case.iteration, LR, WD, scaler), None, None

    if case.optimizer == "distopt_f2":
        groups = optim.v06_param_groups(chunk_recs, LR, MIN_LR)
    else:
        groups = optim.mcore_param_groups(chunk_recs, LR, MIN_LR)
    dense, expert = optim.split_dense_expert(groups)
    subs = [g for g in (dense, expert) if g]
    if case.optimizer == "fp16opt":
        states = [optim.float16_optimizer_state(g, case.iteration, LR, WD, scaler, case.attr_tensors,
                                                case.adam)
                  for g in subs]
        return (states[0] if len(states) == 1 else states), None, None

    # Distributed optimizer (core 0.6 used Apex FusedAdam: int group step).
    adam = "fused" if case.optimizer == "distopt_f2" else case.adam
    states = [optim.distopt_state_dict(g, case.iteration, LR, WD, scaler, adam) for g in subs]
    opt_sd = states[0] if len(states) == 1 else states

    dense_bufs, expert_bufs = [], []
    for v, recs in enumerate(chunk_recs):
        # training.py: bucketing only on pp rank 0, first model chunk, with overlap_grad_reduce.
        bsz = case.bucket_size if (case.overlap and p == 0 and v == 0) else None
        bufs = optim.group_buffers(recs, grad_fp32=not case.fp16, dp=topo.dp,
                                   expert_dp=topo.expert_dp)
        for b in bufs:
            (optim.layout_v06 if case.optimizer == "distopt_f2" else optim.layout_head)(b, bsz)
            (expert_bufs if b.is_expert else dense_bufs).append(b)
    fmt = optim.f2_state if case.optimizer == "distopt_f2" else optim.f3_state
    # The file's writer is dense DP rank == ep rank (edp = 1 in these fixtures) and expert DP
    # rank 0; ChainedOptimizer.save_parameter_state puts None for sub-optimizers where this rank
    # is not DP rank 0.
    parts = []
    if dense_bufs:
        parts.append(fmt(dense_bufs) if e == 0 else None)
    if expert_bufs:
        assert topo.expert_dp == 1
        parts.append(fmt(expert_bufs))
    distrib = parts[0] if len(parts) == 1 else parts
    desc = {"dense": optim.describe_buffers(dense_bufs), "expert": optim.describe_buffers(expert_bufs)}
    return opt_sd, distrib, desc


def _find_step(case, opt_sd):
    o = opt_sd[0] if isinstance(opt_sd, list) else opt_sd
    inner = o["optimizer"]
    if case.optimizer == "fp16opt" and case.adam == "torch":
        return inner["state"][0]["step"].clone()
    return inner["param_groups"][0]["step"]


def _packed(d):
    """Views into one flat fp32 storage per dict: torch.save then writes one record instead of
    one per tensor (keeps the fixtures small; readers must honour storage offsets)."""
    flat = torch.cat([t.reshape(-1) for t in d.values()]) if d else torch.zeros(0)
    out, off = {}, 0
    for k, t in d.items():
        out[k] = flat[off:off + t.numel()].view(t.shape)
        off += t.numel()
    return out


def _truth(case, cfg, topo, Vp, st, holders, files, buffer_meta, step):
    strip = case.with_vocab
    V = cfg.vocab if strip else Vp
    names, shapes, patterns = [], {}, {}
    fp32, m, v = {}, {}, {}
    splits = {}
    for en in model.full_entries(cfg, Vp):
        if en.kind != "param":
            continue
        n = en.atomic
        names.append(n)
        cut = (lambda t: t[:V].clone()) if en.split == "vocab" else (lambda t: t.clone())
        fp32[n], m[n], v[n] = cut(st.fp32[n]), cut(st.exp_avg[n]), cut(st.exp_avg_sq[n])
        shapes[n] = list(fp32[n].shape)
        size = topo.etp_ if en.expert else topo.tp
        patterns[n] = layout.pattern(en.split, size, holders[n], ep=topo.ep, experts=cfg.experts,
                                     gated=cfg.swiglu)
        splits[n] = en.split
    tied = not cfg.untie
    notes = list(case.notes)
    if not strip:
        notes.append(f"args.vocab_size absent: truth keeps all {Vp} padded vocab rows")
    meta = {
        "case": case.name,
        "description": case.desc,
        "tp": topo.tp, "pp": topo.pp, "vpp": topo.vpp, "dp": topo.dp, "ep": topo.ep,
        "etp": topo.etp_, "expert_dp": topo.expert_dp if cfg.experts else None,
        "world_size": topo.world,
        "naming": "legacy" if case.legacy else "mcore",
        "layer_spec": cfg.spec,
        "expert_layout": (cfg.moe_impl if cfg.experts else None),
        "optimizer": case.optimizer,
        "megatron_era": case.era,
        "dtype": "fp16" if case.fp16 else "bf16",
        "iteration": case.iteration,
        "vocab_size": cfg.vocab if strip else None,
        "true_vocab_size": cfg.vocab,
        "padded_vocab_size": Vp,
        "vocab_padding_stripped": strip,
        "tied_embeddings": tied,
        "tied_copy": ("last pp stage holds a synchronized copy of the word embedding ("
                      + ("word_embeddings_for_head.weight" if case.legacy else "output_layer.weight")
                      + "); not a separate atomic parameter") if tied and topo.pp > 1 else None,
        "num_query_groups": cfg.ng, "kv_channels": cfg.hn,
        "swiglu": cfg.swiglu, "num_experts": cfg.experts,
        "splits": splits,
        "step_location": ("optimizer.state[i]['step'] (0-d float tensor per param, torch Adam)"
                          if case.optimizer == "fp16opt" and case.adam == "torch"
                          else "optimizer.param_groups[*]['step']"),
        "adam": "fused" if case.optimizer in ("legacy_apex", "distopt_f2") else case.adam,
        "files": files,
        "ddp_buffers": buffer_meta or None,
        "notes": notes,
    }
    truth = {
        "fp32": _packed(fp32), "exp_avg": _packed(m), "exp_avg_sq": _packed(v), "step": step,
        "param_names": names, "shapes": shapes, "patterns": patterns,
        "vocab_size": V, "meta": meta,
        "buffers": dict(st.buffers),
    }
    if cfg.moe_impl == "legacy_grouped" and cfg.experts:
        truth["expert_parts"] = _expert_parts(cfg, fp32)
    if cfg.gqa:
        # separate q/k/v (what an HF-style q_proj/k_proj/v_proj split of the fused tensor gives)
        truth["qkv_parts"] = st.qkv_parts
    return truth


def _expert_parts(cfg, fp32):
    """GroupedMLP weights as per-expert linear weights: what SequentialMLP / TEGroupedMLP hold and
    what GroupedMLP.sharded_state_dict saves under experts.linear_fc1.weight [E, G*F, H] (gated
    rows [gate; up]) and experts.linear_fc2.weight [E, H, F]: weight1.view(E, H, -1) and
    weight2.view(E, -1, H), each transposed."""
    out = {}
    for n, t in fp32.items():
        if n.endswith(".mlp.experts.weight1"):
            out[n] = t.reshape(cfg.experts, t.shape[0], -1).transpose(1, 2).contiguous()
        elif n.endswith(".mlp.experts.weight2"):
            out[n] = t.reshape(cfg.experts, -1, t.shape[1]).transpose(1, 2).contiguous()
    return out
