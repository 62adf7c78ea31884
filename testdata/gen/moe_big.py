#!/usr/bin/env python3
"""A large generated MoE checkpoint for the memory and throughput figures of the MoE issue (not a fixture).

    python3 testdata/gen/moe_big.py OUT [--layers 8] [--experts 64] [--hidden 1024] [--ffn 1024] [--vocab 32000]

A Mixtral-shaped Hugging Face folder (config.json, model-0000i-of-0000n.safetensors, one shard per layer plus one
for the embeddings, model.safetensors.index.json) of random finite bf16 values, written tensor by tensor (numpy only,
safetensors format by hand: 8-byte header length, JSON header with dtype/shape/data_offsets, raw little-endian data),
so the generator holds one tensor at a time. Generated, not written by transformers: only the memory and time of
`ucp convert --from hf` and `ucp export --to hf` are measured on it.
"""
import argparse
import json
import os

import numpy as np


def bf16(rng, n):
    # sign | exponent in [2^-8, 2^-1) | mantissa: finite, small values
    v = rng.integers(0x3B80, 0x3F00, size=n, dtype=np.uint16)
    return v | (rng.integers(0, 2, size=n, dtype=np.uint16) << 15)


def write_shard(path, tensors, rng):
    """tensors: list of (name, shape); data generated on the fly."""
    header, off = {}, 0
    for name, shape in tensors:
        n = int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for name, shape in tensors:
            n = int(np.prod(shape))
            for i in range(0, n, 1 << 24):  # 32 MiB at a time
                f.write(bf16(rng, min(1 << 24, n - i)).tobytes())
    return off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    H, F, L, E, V = a.hidden, a.ffn, a.layers, a.experts, a.vocab
    heads, kv = 8, 8
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    shards = [[("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]]
    for layer in range(L):
        p = f"model.layers.{layer}."
        t = [(p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (H // heads * kv, H)),
             (p + "self_attn.v_proj.weight", (H // heads * kv, H)), (p + "self_attn.o_proj.weight", (H, H)),
             (p + "block_sparse_moe.gate.weight", (E, H))]
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            t += [(q + "w1.weight", (F, H)), (q + "w2.weight", (H, F)), (q + "w3.weight", (F, H))]
        t += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
        shards.append(t)
    n = len(shards)
    wmap, total = {}, 0
    for i, t in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        total += write_shard(os.path.join(a.out, name), t, rng)
        for k, _ in t:
            wmap[k] = name
        print(f"{name}: {len(t)} tensors", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": H // heads,
           "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
           "tie_word_embeddings": False, "hidden_act": "silu", "num_local_experts": E, "num_experts_per_tok": 2,
           "sliding_window": None, "router_jitter_noise": 0.0, "output_router_logits": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
