"""Write small random Hugging Face models of each family with real transformers' save_pretrained.

Usage (torch 2.x chroot, transformers from source, offline; see ../shared/recipes/transformers-offline.md):
  PYTHONPATH=SHIMS:TRANSFORMERS/src python3 hf_family_fixtures.py OUT_DIR [CASE ...]
  PYTHONPATH=SHIMS:TRANSFORMERS/src python3 hf_family_fixtures.py --bin BIN_OUT_DIR OUT_DIR   (BIN_CASES)

One folder per case under OUT_DIR (testdata/fixtures/hf_family): config.json and model.safetensors, or
model-0000i-of-0000n.safetensors + model.safetensors.index.json (max_shard_size), exactly as
XForCausalLM.save_pretrained writes them. Weights are re-initialised with distinct values (a fixed seed,
normal(0, 0.5) + a per-tensor offset, norms around 1) so a swapped row or head shows. cases.json lists the
cases and the transformers version that wrote them.

huggingface_hub is not installed: the shim's split_torch_state_dict_into_shards raises, so this script gives
it an implementation of the contract of huggingface_hub serialization/_base.py
split_state_dict_into_shards_factory (v0.34): tensors in state-dict order, a new shard when the next one would
overflow max_shard_size, a tensor larger than the limit alone, names model-{i:05d}-of-{n:05d}; one shard is
model.safetensors, not sharded.
"""
import json
import os
import sys
from dataclasses import dataclass, field

import huggingface_hub
import torch


@dataclass
class StateDictSplit:
    is_sharded: bool = field(init=False)
    metadata: dict
    filename_to_tensors: dict
    tensor_to_filename: dict

    def __post_init__(self):
        self.is_sharded = len(self.filename_to_tensors) > 1


def split_torch_state_dict_into_shards(state_dict, *, filename_pattern="model{suffix}.safetensors", max_shard_size=5_000_000_000):
    if isinstance(max_shard_size, str):  # save_pretrained's default "5GB" (huggingface_hub parse_size_to_int)
        units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
        max_shard_size = int(float(max_shard_size[:-2]) * units[max_shard_size[-2:].upper()])
    shards, cur, size, total, seen = [], [], 0, 0, {}
    for name, t in state_dict.items():
        if isinstance(t, str):
            continue
        sid = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if sid in seen:  # shared storage goes with its first tensor
            seen[sid].append(name)
            continue
        n = t.numel() * t.element_size()
        total += n
        if n > max_shard_size:
            seen[sid] = [name]
            shards.append(seen[sid])
            continue
        if cur and size + n > max_shard_size:
            shards.append(cur)
            cur, size = [], 0
        seen[sid] = cur
        cur.append(name)
        size += n
    if cur:
        shards.append(cur)
    if len(shards) == 1:
        f = filename_pattern.format(suffix="")
        return StateDictSplit(metadata={"total_size": total}, filename_to_tensors={f: shards[0]},
                              tensor_to_filename={k: f for k in shards[0]})
    f2t, t2f = {}, {}
    for i, names in enumerate(shards):
        f = filename_pattern.format(suffix="-%05d-of-%05d" % (i + 1, len(shards)))
        f2t[f] = names
        for k in names:
            t2f[k] = f
    return StateDictSplit(metadata={"total_size": total}, filename_to_tensors=f2t, tensor_to_filename=t2f)


huggingface_hub.split_torch_state_dict_into_shards = split_torch_state_dict_into_shards

import transformers  # noqa: E402  (after the shim is completed)
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM)

GEOM = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=40, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0)

# name: (config class, model class, config overrides, dtype, max_shard_size or None)
CASES = {
    "llama31_untied_fp32": (LlamaConfig, LlamaForCausalLM,
                            dict(tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=131072,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
                            torch.float32, None),
    "llama_tied_bf16_sharded": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True), torch.bfloat16, 2000),
    "mistral_fp32": (MistralConfig, MistralForCausalLM, dict(tie_word_embeddings=False, sliding_window=None), torch.float32, None),
    "qwen2_tied_bf16_sharded": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True), torch.bfloat16, 3000),
    "qwen3_fp32": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=8), torch.float32, None),
    "qwen3_bf16_sharded": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True, head_dim=8), torch.bfloat16, 2500),
}

# The MoE families (internal/family/moe.go), seeded apart so that adding them left the cases above unchanged:
# 4 experts, top-2, every layer MoE.
MOE = dict(num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=12)
MOE_CASES = {
    "mixtral_bf16_sharded": (MixtralConfig, MixtralForCausalLM, dict(tie_word_embeddings=False, num_local_experts=4,
                                                                      num_experts_per_tok=2, sliding_window=None),
                             torch.bfloat16, 3000),
    "qwen2_moe_fp32": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(tie_word_embeddings=False, num_experts=4,
                                                                 shared_expert_intermediate_size=20, **MOE),
                       torch.float32, None),
    "qwen3_moe_bf16": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(tie_word_embeddings=False, head_dim=8, num_experts=4,
                                                                 norm_topk_prob=True, **MOE), torch.bfloat16, None),
}


# DeepSeek-V3 (internal/family/deepseek.go), seeded apart again: multi-latent attention with q LoRA, layer 0
# dense, 4 routed experts top-2 in 2 groups (1 chosen), 2 shared experts, routed_scaling_factor 2.5, yarn RoPE;
# the routers' e_score_correction_bias buffers get distinct values too. fp32 (the Megatron round trip writes
# every weight in the training dtype).
DS_CASES = {
    "deepseek_v3_fp32": (DeepseekV3Config, DeepseekV3ForCausalLM,
                         dict(tie_word_embeddings=False, num_hidden_layers=4, num_key_value_heads=4, first_k_dense_replace=1,
                              n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=2,
                              moe_intermediate_size=12, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=12,
                              kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
                              rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
                         torch.float32, 6000),
}


# The torch.save layouts (save_pretrained with safe_serialization=False: pytorch_model.bin, or
# pytorch_model-0000i-of-0000n.bin + pytorch_model.bin.index.json) of some cases above: the same seed, so
# the same weights; testdata/fixtures/hf_family_bin/<case> holds them, and the script checks that the
# safetensors sibling in hf_family/<case> holds exactly the live tensors, so either layout's truth is the other's.
BIN_CASES = ["llama_tied_bf16_sharded", "qwen3_fp32", "qwen2_tied_bf16_sharded"]


def build(seed, ccls, mcls, over, dt):
    torch.manual_seed(seed)
    cfg = ccls(**{**GEOM, **over})
    model = mcls(cfg).eval()
    with torch.no_grad():
        for k, (pn, p) in enumerate(model.named_parameters()):
            if pn.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.5 * torch.randn_like(p) + 0.01 * k)
        for pn, b in model.named_buffers():
            if pn.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.rand_like(b))
    return cfg, model.to(dt)


def main_bin(out, sibling):
    from safetensors.torch import load_file
    os.makedirs(out, exist_ok=True)
    listing = {"transformers": transformers.__version__, "cases": {}}
    seeds = {n: 1000 + i for i, n in enumerate(sorted(CASES))}
    for name in BIN_CASES:
        ccls, mcls, over, dt, shard = CASES[name]
        cfg, model = build(seeds[name], ccls, mcls, over, dt)
        live = model.state_dict()
        saved = {}
        for fn in os.listdir(os.path.join(sibling, name)):
            if fn.endswith(".safetensors"):
                saved.update(load_file(os.path.join(sibling, name, fn)))
        for k, v in saved.items():  # the safetensors sibling is this very model
            assert v.dtype == live[k].dtype and torch.equal(v.view(torch.uint8) if v.dim() else v, live[k].view(torch.uint8) if v.dim() else live[k]), k
        assert set(live) - set(saved) <= {"lm_head.weight"}, set(live) ^ set(saved)
        d = os.path.join(out, name)
        kw = {"safe_serialization": False}
        if shard:
            kw["max_shard_size"] = shard
        model.save_pretrained(d, **kw)
        listing["cases"][name] = {"family": cfg.model_type, "dtype": str(dt).replace("torch.", ""),
                                  "sharded": bool(shard), "files": sorted(os.listdir(d)), "same_as": "hf_family/" + name}
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listing, f, indent=1, sort_keys=True)


def main(out, only=None):
    os.makedirs(out, exist_ok=True)
    listing = {"transformers": transformers.__version__, "cases": {}}
    if only and os.path.exists(os.path.join(out, "cases.json")):  # rewrite the named cases, keep the others
        listing = json.load(open(os.path.join(out, "cases.json")))
    todo = [(1000 + i, n, c) for i, (n, c) in enumerate(sorted(CASES.items()))]
    todo += [(2000 + i, n, c) for i, (n, c) in enumerate(sorted(MOE_CASES.items()))]
    todo += [(3000 + i, n, c) for i, (n, c) in enumerate(sorted(DS_CASES.items()))]
    for seed, name, (ccls, mcls, over, dt, shard) in todo:
        if only and name not in only:
            continue
        cfg, model = build(seed, ccls, mcls, over, dt)
        d = os.path.join(out, name)
        kw = {"safe_serialization": True}
        if shard:
            kw["max_shard_size"] = shard
        model.save_pretrained(d, **kw)
        listing["cases"][name] = {"family": cfg.model_type, "dtype": str(dt).replace("torch.", ""),
                                  "sharded": bool(shard), "files": sorted(os.listdir(d))}
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listing, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    if sys.argv[1] == "--bin":
        main_bin(sys.argv[2], sys.argv[3])  # --bin OUT_DIR SIBLING_DIR (hf_family_bin, hf_family)
    else:
        main(sys.argv[1], sys.argv[2:])  # OUT_DIR [CASE ...]: only those cases
