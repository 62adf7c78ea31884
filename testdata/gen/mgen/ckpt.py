"""Pieces of model_optim_rng.pt that are not tensors: args, rng state, scheduler; saving."""

import argparse
import contextlib
import enum
import io
import pickle
import random
import sys
import types

import numpy as np
import torch


def install_megatron_stubs():
    """Register megatron.core.transformer.enums.AttnBackend so that args.attention_backend
    pickles as the real global (GLOBAL 'megatron.core.transformer.enums AttnBackend'), exactly as
    in files Megatron writes (megatron/core/transformer/enums.py). Loading needs it too."""
    name = "megatron.core.transformer.enums"
    if name in sys.modules:
        return sys.modules[name]
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        if mod not in sys.modules:
            sys.modules[mod] = types.ModuleType(mod)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[mod])
    enums = sys.modules[name]

    class AttnBackend(enum.Enum):
        flash = 1
        fused = 2
        unfused = 3
        local = 4
        auto = 5

    AttnBackend.__module__ = name
    AttnBackend.__qualname__ = "AttnBackend"
    enums.AttnBackend = AttnBackend
    return enums


@contextlib.contextmanager
def location_tag(tag):
    """Record storages under `tag` (e.g. 'cuda:3'): Megatron saves GPU tensors, so the
    persistent ids of model_optim_rng.pt say cuda:N. torch.load needs map_location='cpu'."""
    if tag is None:
        yield
        return
    orig = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: tag
    try:
        yield
    finally:
        torch.serialization.location_tag = orig


def te_extra_state(flavour: str):
    """TransformerEngine module _extra_state without FP8: newer TE pickles `None` into a uint8
    tensor (torch.frombuffer(pickle.dumps(None))); old TE (<= 1.x) returned io.BytesIO holding
    torch.save(None)."""
    if flavour == "bytesio":
        b = io.BytesIO()
        torch.save(None, b)
        b.seek(0)
        return b
    return torch.frombuffer(bytearray(pickle.dumps(None)), dtype=torch.uint8).clone()


def rng_state(seed: int):
    """get_rng_state (checkpointing.py) without --data-parallel-random-init: a 1-element list."""
    r = random.Random(seed)
    nps = np.random.RandomState(seed % (2 ** 32))
    g = torch.Generator()
    g.manual_seed(seed)
    cuda = torch.tensor(list(seed.to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8)
    return [{
        "random_rng_state": r.getstate(),
        "np_rng_state": nps.get_state(),
        "torch_rng_state": g.get_state(),
        "cuda_rng_state": cuda,
        "rng_tracker_states": {"model-parallel-rng": (cuda + 1).clone()},
    }]


def opt_param_scheduler(lr, min_lr, iteration, gbs):
    """OptimizerParamScheduler.state_dict (megatron/core/optimizer_param_scheduler.py)."""
    return {
        "max_lr": lr,
        "lr_warmup_steps": 2 * gbs,
        "num_steps": iteration * gbs,
        "lr_decay_style": "cosine",
        "lr_decay_steps": 1000 * gbs,
        "min_lr": min_lr,
        "start_wd": 0.1,
        "end_wd": 0.1,
        "wd_incr_style": "constant",
        "wd_incr_steps": 1000 * gbs,
    }


def make_args(cfg, topo, Vp, *, iteration, fp16, distopt, bucket_size, overlap, with_vocab,
              legacy, ckpt_format="torch", lr=3e-4, min_lr=3e-5, gbs=8, era="current"):
    """A realistic argparse.Namespace (a subset of megatron/training/arguments.py's attributes,
    with the values validate_args derives: params_dtype, padded_vocab_size, data_parallel_size,
    world_size, ...)."""
    enums = install_megatron_stubs()
    a = argparse.Namespace()
    s = a.__dict__
    s.update(
        num_layers=cfg.layers,
        hidden_size=cfg.hidden,
        ffn_hidden_size=cfg.ffn,
        num_attention_heads=cfg.heads,
        kv_channels=cfg.hn,
        group_query_attention=cfg.gqa,
        num_query_groups=cfg.ng if cfg.gqa else 1,
        max_position_embeddings=cfg.max_pos,
        position_embedding_type=cfg.pos,
        make_vocab_size_divisible_by=cfg.divisor,
        normalization=cfg.norm,
        swiglu=cfg.swiglu,
        untie_embeddings_and_output_weights=cfg.untie,
        add_bias_linear=cfg.bias,
        add_qkv_bias=cfg.qkv_bias,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        micro_batch_size=1,
        global_batch_size=gbs,
        seed=1234,
        lr=lr,
        min_lr=min_lr,
        optimizer="adam",
        no_save_optim=None,
        no_save_rng=None,
        fp16=fp16,
        bf16=not fp16,
        loss_scale=None,
        accumulate_allreduce_grads_in_fp32=not fp16,
        tensor_model_parallel_size=topo.tp,
        pipeline_model_parallel_size=topo.pp,
        virtual_pipeline_model_parallel_size=topo.vpp,
        num_layers_per_virtual_pipeline_stage=(cfg.layers // (topo.pp * topo.vpp)) if topo.vpp else None,
        sequence_parallel=topo.tp > 1,
        context_parallel_size=1,
        use_distributed_optimizer=distopt,
        overlap_grad_reduce=overlap,
        overlap_param_gather=overlap and distopt,
        tokenizer_type="NullTokenizer",
        seq_length=cfg.max_pos,
        ckpt_format=ckpt_format,
        transformer_impl="local" if cfg.spec in ("local", "legacy") else "transformer_engine",
        rank=0,
        local_rank=0,
        world_size=topo.world,
        data_parallel_size=topo.dp,
        padded_vocab_size=Vp,
        consumed_train_samples=iteration * gbs,
        iteration=iteration,
    )
    if with_vocab:
        s["vocab_size"] = cfg.vocab
    if era != "current":
        del s["ckpt_format"]  # --ckpt-format arrived after core 0.8 (0.6-0.8: --use-dist-ckpt)
    else:
        s.update(
            ddp_bucket_size=bucket_size,
            ddp_num_buckets=None,
            num_distributed_optimizer_instances=1,
        )
    if not legacy and era == "current":
        s.update(
            expert_model_parallel_size=topo.ep,
            expert_tensor_parallel_size=topo.etp_,
            num_experts=cfg.experts or None,
            moe_ffn_hidden_size=cfg.moe_ffn or None,
            moe_router_topk=2,
            moe_grouped_gemm=cfg.experts > 0 and cfg.moe_impl in ("grouped", "legacy_grouped"),
            moe_router_enable_expert_bias=cfg.expert_bias,
            attention_backend=enums.AttnBackend.auto,
            use_legacy_models=False,
            main_grads_dtype=torch.float32,
        )
        if cfg.experts and cfg.moe_impl == "legacy_grouped":
            # TE spec picks GroupedMLP over TEGroupedMLP with --moe-use-legacy-grouped-gemm
            # (core_v0.16.1 transformer_engine_spec_provider.py grouped_mlp_modules).
            s["moe_use_legacy_grouped_gemm"] = True
    elif era == "core_v0.6":
        s.update(expert_model_parallel_size=topo.ep, num_experts=cfg.experts or None,
                 use_mcore_models=True, use_dist_ckpt=False, dist_ckpt_format="torch_dist")
    else:  # legacy (core 0.5 era)
        s.update(expert_model_parallel_size=topo.ep, num_experts=None, use_mcore_models=False)
    s["params_dtype"] = torch.float16 if fp16 else torch.bfloat16
    return a


def dynamic_grad_scaler():
    """DynamicGradScaler.state_dict (megatron/core/optimizer/grad_scaler.py)."""
    return {"scale": torch.tensor(65536.0), "growth_tracker": 37, "hysteresis_tracker": 2}
