"""Check Hugging Face folders written by `ucp export --to hf|torch` with the
real loaders: the safetensors package (safetensors.torch.load_file, safe_open)
and torch.load(weights_only=True).

Usage: check_hf.py CASES.json   (run in the torch 2.x chroot; paths relative to cwd)

CASES.json is a list of {"dir", "truth", "format" ("safetensors"|"torch"),
"dtype", "arch" ("" or "llama"), "params" (regexp or ""), "config" (expected
config.json values not derivable from the truth)}. The expected tensors are
the truth's fp32 weights cast with torch's .to(dtype); for llama they are
split by hand here: QKV per query group into q/k/v, fc1 into gate/up, names
renamed. Every file must load, hold exactly the expected names, and equal
them bit for bit; the index must map every name to the file holding it.
Exits non-zero with one line per problem.
"""
import json
import os
import re
import sys

import torch

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
errors = []


def err(case, msg):
    errors.append("%s: %s" % (case["dir"], msg))


def llama_expected(fp32, meta, dt):
    ng, hn = meta["num_query_groups"], meta["kv_channels"]
    out = {}
    layers = sorted({int(m.group(1)) for n in fp32 for m in [re.match(r"decoder\.layers\.(\d+)\.", n)] if m})
    out["model.embed_tokens.weight"] = fp32["embedding.word_embeddings.weight"]
    for i in layers:
        p, h = "decoder.layers.%d." % i, "model.layers.%d." % i
        ln = fp32.get(p + "input_layernorm.weight", fp32.get(p + "self_attention.linear_qkv.layer_norm_weight"))
        out[h + "input_layernorm.weight"] = ln
        qkv = fp32[p + "self_attention.linear_qkv.weight"]
        hidden = qkv.shape[1]
        heads = qkv.shape[0] // hn - 2 * ng
        g = qkv.view(ng, (heads // ng + 2) * hn, hidden)
        q, k, v = torch.split(g, [heads // ng * hn, hn, hn], dim=1)
        out[h + "self_attn.q_proj.weight"] = q.reshape(-1, hidden)
        out[h + "self_attn.k_proj.weight"] = k.reshape(-1, hidden)
        out[h + "self_attn.v_proj.weight"] = v.reshape(-1, hidden)
        out[h + "self_attn.o_proj.weight"] = fp32[p + "self_attention.linear_proj.weight"]
        post = fp32.get(p + "pre_mlp_layernorm.weight", fp32.get(p + "mlp.linear_fc1.layer_norm_weight"))
        out[h + "post_attention_layernorm.weight"] = post
        gate, up = fp32[p + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = fp32[p + "mlp.linear_fc2.weight"]
    out["model.norm.weight"] = fp32["decoder.final_layernorm.weight"]
    if "output_layer.weight" in fp32:
        out["lm_head.weight"] = fp32["output_layer.weight"]
    return {k: v.contiguous().to(dt) for k, v in out.items()}, heads, len(layers)


def same_bits(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    iv = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(iv), b.contiguous().view(iv))


def load_files(case):
    d = case["dir"]
    torch_fmt = case["format"] == "torch"
    single = "pytorch_model.bin" if torch_fmt else "model.safetensors"
    index = single + ".index.json"
    names = os.listdir(d)
    got, where = {}, {}
    if single in names:
        files = [single]
        if index in names:
            err(case, "both %s and %s" % (single, index))
    else:
        with open(os.path.join(d, index)) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
        stem, ext = ("pytorch_model", ".bin") if torch_fmt else ("model", ".safetensors")
        want = ["%s-%05d-of-%05d%s" % (stem, i + 1, len(files), ext) for i in range(len(files))]
        if files != want:
            err(case, "shard files %s, want %s" % (files, want))
    for fn in files:
        path = os.path.join(d, fn)
        if torch_fmt:
            sd = torch.load(path, weights_only=True)
        else:
            from safetensors import safe_open
            from safetensors.torch import load_file
            sd = load_file(path)
            with safe_open(path, framework="pt") as f:
                if f.metadata() != {"format": "pt"}:
                    err(case, "%s metadata %r" % (fn, f.metadata()))
        for k, v in sd.items():
            if k in got:
                err(case, "%s in two files" % k)
            got[k], where[k] = v, fn
    if single not in names:
        if idx["weight_map"] != where:
            err(case, "the index's weight_map differs from the files' contents")
        total = sum(v.numel() * v.element_size() for v in got.values())
        if idx["metadata"].get("total_size") != total:
            err(case, "total_size %r, tensors hold %d bytes" % (idx["metadata"].get("total_size"), total))
    return got, files


def check(case):
    truth = torch.load(case["truth"], map_location="cpu", weights_only=False)
    fp32, meta = truth["fp32"], truth["meta"]
    dt = DT[case["dtype"]]
    if case["arch"] == "llama":
        want, heads, layers = llama_expected(fp32, meta, dt)
        if "qkv_parts" in truth:  # the generator's own separate projections
            for n, parts in truth["qkv_parts"].items():
                i = int(re.match(r"decoder\.layers\.(\d+)\.", n).group(1))
                for p in "qkv":
                    if not torch.equal(parts[p].reshape(-1, parts[p].shape[-1]).to(dt),
                                       want["model.layers.%d.self_attn.%s_proj.weight" % (i, p)]):
                        err(case, "hand split of %s %s differs from the generator's qkv_parts" % (n, p))
    else:
        want = {k: v.contiguous().to(dt) for k, v in fp32.items()}
    if case.get("params"):
        want = {k: v for k, v in want.items() if re.search(case["params"], k)}
    got, files = load_files(case)
    if set(got) != set(want):
        err(case, "names: missing %s, extra %s" % (sorted(set(want) - set(got)), sorted(set(got) - set(want))))
    for k in sorted(set(got) & set(want)):
        if not same_bits(got[k], want[k]):
            err(case, "%s: %s%s differs from the truth cast with torch (%s%s)" % (
                k, got[k].dtype, tuple(got[k].shape), want[k].dtype, tuple(want[k].shape)))
    if case["arch"] == "llama":
        with open(os.path.join(case["dir"], "config.json")) as f:
            cfg = json.load(f)
        emb = fp32["embedding.word_embeddings.weight"]
        expect = dict(case["config"])
        expect.update({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "hidden_size": emb.shape[1], "vocab_size": meta["vocab_size"], "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": meta["num_query_groups"],
            "head_dim": meta["kv_channels"],
            "intermediate_size": fp32["decoder.layers.0.mlp.linear_fc1.weight"].shape[0] // 2,
            "tie_word_embeddings": "output_layer.weight" not in fp32, "torch_dtype": case["dtype"]})
        for k, v in expect.items():
            if cfg.get(k) != v:
                err(case, "config.json %s = %r, want %r" % (k, cfg.get(k), v))
        if emb.shape[0] != meta["vocab_size"]:
            err(case, "truth embedding has %d rows, vocab_size %d" % (emb.shape[0], meta["vocab_size"]))
    print("%s: %d tensors in %d files ok" % (case["dir"], len(got), len(files)))


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for c in cases:
        try:
            check(c)
        except Exception as e:  # a loader refusing a file is a failure, reported per case
            err(c, "%s: %s" % (type(e).__name__, e))
    for e in errors:
        print("FAIL", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
