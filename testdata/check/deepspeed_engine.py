#!/usr/bin/python3
"""Check `ucp reshard --to deepspeed` with DeepSpeed's own engine (make check-deepspeed DS_SRC=...).

    /usr/bin/python3 testdata/check/deepspeed_engine.py --ds-src /path/to/DeepSpeed-v0.14.5 --ucp bin/ucp [--work DIR] [--case NAME]

For every case (A -> B):
  1. train: DeepSpeed's engine trains TinyLM for 3 AdamW steps at layout A (N gloo ranks on CPU) and saves
     its checkpoint; the live optimizer's full fp32 weights, exp_avg, exp_avg_sq, the step and the module's
     low-precision weights are gathered with DeepSpeed's safe_get_full_* and saved as truth.pt.
  2. ucp convert the checkpoint, then ucp reshard it to layout B.
  3. load: a fresh engine at layout B runs a plain engine.load_checkpoint(dir, tag) (no universal loading);
     every rank compares its own flat fp32 partition, exp_avg and exp_avg_sq partitions and step with the
     ones DeepSpeed's partitioning of the truth gives, bit for bit; the full parameters and moments read back
     with safe_get_full_* and the module weights must equal the truth; then one training step must run and
     give a finite loss and new weights.
Nothing from DeepSpeed is copied into this repository: the source tree is used in place (PYTHONPATH).
Environment per the recipe: DS_ACCELERATOR=cpu, gloo, Debian's torch 1.13, whose gloo lacks 16-bit and
*_base / reduce_scatter collectives: those torch.distributed calls are wrapped (fp32 on the wire,
all_gather/all_reduce based); checkpoint contents and layout stay DeepSpeed's.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (layout A, layout B); a layout is (zero stage, dp, dtype, bf16_optimizer)
CASES = {
    "z2_fp32_dp2_to_dp3": ((2, 2, "fp32", False), (2, 3, "fp32", False)),
    "z1_bf16_dp3_to_dp2": ((1, 3, "bf16", False), (1, 2, "bf16", False)),
    "z1_fp32_dp2_to_z2_dp3": ((1, 2, "fp32", False), (2, 3, "fp32", False)),
    "z2_bf16_dp2_to_bf16opt_dp3": ((2, 2, "bf16", False), (1, 3, "bf16", True)),
    "bf16opt_dp3_to_z2_dp2": ((1, 3, "bf16", True), (2, 2, "bf16", False)),
    "z2_fp32_dp2_to_z3_dp3": ((2, 2, "fp32", False), (3, 3, "fp32", False)),
    "z3_bf16_dp3_to_dp2": ((3, 3, "bf16", False), (3, 2, "bf16", False)),
    "z3_fp32_dp2_to_z2_dp3": ((3, 2, "fp32", False), (2, 3, "fp32", False)),
    # Two param groups (weight decay 0.1 on 2-D weights, 0.0 elsewhere) and a frozen parameter (pos.weight).
    "groups_frozen_z2_bf16_dp2_to_z3_dp3": ((2, 2, "bf16", False), (3, 3, "bf16", False), "groups"),
    "groups_frozen_z2_fp32_dp3_to_z1_dp2": ((2, 3, "fp32", False), (1, 2, "fp32", False), "groups"),
}
# A Hugging Face Llama (HF names, GQA, SwiGLU, RMSNorm; tied or not) written as pytorch_model.bin +
# config.json, `ucp convert --from hf`, `ucp reshard --to deepspeed` (the family's HF module order, weights
# only): a plain engine.load_checkpoint at B must give exactly the weights as module and fp32 partitions and
# a fresh optimizer (no moments), and train. Layout A is unused (no DeepSpeed run writes the source).
HF_CASES = {
    "hf_llama_to_z1_fp32_dp2": ((0, 1, "fp32", False), (1, 2, "fp32", False), "hf_llama"),
    "hf_llama_tied_to_z2_fp32_dp3": ((0, 1, "fp32", False), (2, 3, "fp32", False), "hf_llama_tied"),
    "hf_llama_to_z3_fp32_dp2": ((0, 1, "fp32", False), (3, 2, "fp32", False), "hf_llama"),
    "hf_llama_tied_to_z1_bf16_dp2": ((0, 1, "fp32", False), (1, 2, "bf16", False), "hf_llama_tied"),
}
CASES.update(HF_CASES)
# Universal loading (checkpoint.load_universal) of what ucp convert writes, no reshard: ZeRO-3 at a new dp
# needs --deepspeed-version 0.14 (bare tensors); the default dict layout must fail in v0.14.5 as the issue says.
UNIVERSAL = {
    "universal_z3_fp32_dp2_to_dp3": ((3, 2, "fp32", False), (3, 3, "fp32", False)),
    "universal_z3_bf16_dp3_to_dp2": ((3, 3, "bf16", False), (3, 2, "bf16", False)),
}


def ds_config(stage, dtype, bf16opt, universal=False):
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        "gradient_clipping": 1.0,
        "zero_allow_untested_optimizer": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01,
                                                     "warmup_num_steps": 2, "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage},
    }
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
        if bf16opt:
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


# ---------------------------------------------------------------- per-rank work (child processes)

def setup_deepspeed(ds_src):
    """Import DeepSpeed from a source tree as `pip install` would have configured it on this CPU machine."""
    import collections
    stub = types.ModuleType("hjson")  # only used for JSON config files; configs here are dicts
    from json import load, loads, dump, dumps
    stub.load, stub.loads, stub.dump, stub.dumps = load, loads, dump, dumps
    sys.modules.setdefault("hjson", stub)
    info = types.ModuleType("deepspeed.git_version_info_installed")
    with open(os.path.join(ds_src, "version.txt")) as f:
        info.version = f.read().strip()
    info.git_hash, info.git_branch = "[none]", "[none]"
    info.installed_ops = collections.defaultdict(bool)  # every op off
    info.accelerator_name = "cpu"
    info.torch_info = {"version": "1.13", "bf16_support": False, "cuda_version": "0.0", "nccl_version": "0.0",
                       "hip_version": "0.0"}
    sys.modules["deepspeed.git_version_info_installed"] = info
    sys.path.insert(0, ds_src)
    wrap_gloo()
    import deepspeed
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


def wrap_gloo():
    """torch 1.13's gloo: 16-bit tensors travel as fp32; the *_base, reduce_scatter and AVG collectives
    are built from all_gather / all_reduce; async calls complete at once."""
    import torch
    import torch.distributed as dist

    class Done:
        def wait(self, *a, **k):
            return True

        def is_completed(self):
            return True

    def wire(t):
        return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t

    def back(w, t):
        if w is not t:
            t.copy_(w)

    def ret(async_op):
        return Done() if async_op else None

    orig = {k: getattr(dist, k) for k in ("all_reduce", "reduce", "broadcast", "all_gather")}

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        avg = op == dist.ReduceOp.AVG
        w = wire(tensor)
        orig["all_reduce"](w, op=dist.ReduceOp.SUM if avg else op, group=group)
        if avg:
            w.div_(dist.get_world_size(group))
        back(w, tensor)
        return ret(async_op)

    def reduce(tensor, dst, op=dist.ReduceOp.SUM, group=None, async_op=False):
        avg = op == dist.ReduceOp.AVG
        w = wire(tensor)
        orig["reduce"](w, dst, op=dist.ReduceOp.SUM if avg else op, group=group)
        if avg:
            w.div_(dist.get_world_size(group))
        back(w, tensor)
        return ret(async_op)

    def broadcast(tensor, src, group=None, async_op=False):
        w = wire(tensor)
        orig["broadcast"](w, src, group=group)
        back(w, tensor)
        return ret(async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        ws = [wire(t) for t in tensor_list]
        orig["all_gather"](ws, wire(tensor), group=group)
        for w, t in zip(ws, tensor_list):
            back(w, t)
        return ret(async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        n = dist.get_world_size(group)
        ws = [torch.empty_like(wire(input_tensor)) for _ in range(n)]
        orig["all_gather"](ws, wire(input_tensor), group=group)
        output_tensor.copy_(torch.cat([w.reshape(-1) for w in ws]).view_as(output_tensor))
        return ret(async_op)

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        w = wire(input).clone()
        all_reduce(w, op=op, group=group)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        output.copy_(w.reshape(n, -1)[r].view_as(output))
        return ret(async_op)

    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        r = dist.get_rank(group)
        for i, t in enumerate(input_list):
            w = wire(t).clone()
            all_reduce(w, op=op, group=group)
            if i == r:
                output.copy_(w)
        return ret(async_op)

    def all_reduce_coalesced(tensors, op=dist.ReduceOp.SUM, group=None, async_op=False):
        for t in tensors:
            all_reduce(t, op=op, group=group)
        return ret(async_op)

    dist.all_reduce, dist.reduce, dist.broadcast, dist.all_gather = all_reduce, reduce, broadcast, all_gather
    dist.all_gather_into_tensor = dist._all_gather_base = all_gather_into_tensor
    dist.distributed_c10d.all_gather_into_tensor = dist.distributed_c10d._all_gather_base = all_gather_into_tensor
    dist.reduce_scatter_tensor = dist._reduce_scatter_base = reduce_scatter_tensor
    dist.reduce_scatter = reduce_scatter
    dist.all_reduce_coalesced = all_reduce_coalesced


def tiny_lm():
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, h, f):
            super().__init__()
            self.ln = nn.LayerNorm(h)
            self.fc1 = nn.Linear(h, f)
            self.fc2 = nn.Linear(f, h)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

    class TinyLM(nn.Module):
        # No parameter's size divides by 2 or 3: every partition is ragged and padded.
        def __init__(self, vocab=37, hidden=11, ffn=29, seq=7):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.pos = nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList([Block(hidden, ffn) for _ in range(2)])
            self.ln_f = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, ids):
            x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln_f(x)).float()
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1))

    torch.manual_seed(1234)
    return TinyLM()


HF_LLAMA = dict(vocab_size=37, hidden_size=12, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=3, rms_norm_eps=1e-06, rope_theta=10000.0, max_position_embeddings=16)


def hf_llama(tied):
    """A module with LlamaForCausalLM's parameter names, shapes and registration order (transformers
    v4.57.1 models/llama/modeling_llama.py: model.embed_tokens, model.layers.L.self_attn.{q,k,v,o}_proj,
    mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm, model.norm, lm_head tied or not),
    in plain torch 1.13 (transformers 4.57 needs torch 2): the forward is a small causal GQA transformer
    (no RoPE) that uses every parameter, enough to train a step."""
    import torch
    import torch.nn as nn
    c = HF_LLAMA

    class RMSNorm(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"])

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            h, d, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
            self.q_proj = nn.Linear(h, nh * d, bias=False)
            self.k_proj = nn.Linear(h, nkv * d, bias=False)
            self.v_proj = nn.Linear(h, nkv * d, bias=False)
            self.o_proj = nn.Linear(nh * d, h, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            d, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
            q = self.q_proj(x).view(b, s, nh, d).transpose(1, 2)
            k = self.k_proj(x).view(b, s, nkv, d).transpose(1, 2).repeat_interleave(nh // nkv, 1)
            v = self.v_proj(x).view(b, s, nkv, d).transpose(1, 2).repeat_interleave(nh // nkv, 1)
            a = (q @ k.transpose(-1, -2)) / d ** 0.5
            a = a.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            return self.o_proj((a @ v).transpose(1, 2).reshape(b, s, nh * d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            h, f = c["hidden_size"], c["intermediate_size"]
            self.gate_proj = nn.Linear(h, f, bias=False)
            self.up_proj = nn.Linear(h, f, bias=False)
            self.down_proj = nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()
            self.mlp = MLP()
            self.input_layernorm = RMSNorm(c["hidden_size"])
            self.post_attention_layernorm = RMSNorm(c["hidden_size"])

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
            self.layers = nn.ModuleList([Layer() for _ in range(c["num_hidden_layers"])])
            self.norm = RMSNorm(c["hidden_size"])

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, ids):
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x)
            logits = self.lm_head(self.model.norm(x)).float()
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1))

    return LlamaForCausalLM()


def write_hf_llama(folder, truth, tied):
    """The source: a randomly initialised hf_llama as save_pretrained(safe_serialization=False) lays it out
    (pytorch_model.bin, config.json), and the truth the load phase compares with."""
    import torch
    torch.manual_seed(4321)
    m = hf_llama(tied)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("layernorm.weight") or n.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)  # norms off 1: a wrong mapping shows
    os.makedirs(folder)
    sd = m.state_dict()
    torch.save(sd, os.path.join(folder, "pytorch_model.bin"))
    cfg = dict(HF_LLAMA, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               attention_bias=False, mlp_bias=False, tie_word_embeddings=tied, rope_scaling=None,
               torch_dtype="float32", pretraining_tp=1)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    weights = {n: p.detach().clone() for n, p in m.named_parameters()}
    torch.save({"fp32": weights, "lp": weights}, truth)


def batch(step, rank, dtype_unused=None):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, 37, (2, 7), generator=g)


def engine_for(deepspeed, layout, universal=False, variant=""):
    stage, dp, dtype, bf16opt = layout
    if variant.startswith("hf_llama"):
        model = hf_llama(variant == "hf_llama_tied")
        eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                            config=ds_config(stage, dtype, bf16opt, universal))
        return eng
    model = tiny_lm()
    params = model.parameters()
    if variant == "groups":
        model.pos.weight.requires_grad_(False)
        trained = [p for p in model.parameters() if p.requires_grad]
        params = [{"params": [p for p in trained if p.dim() == 2], "weight_decay": 0.1},
                  {"params": [p for p in trained if p.dim() != 2], "weight_decay": 0.0}]
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=params,
                                        config=ds_config(stage, dtype, bf16opt, universal))
    return eng


def full_state(deepspeed, eng):
    """Full fp32 weights and moments per parameter through DeepSpeed's own accessors (collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    out = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for name, p in eng.module.named_parameters():
        if not p.requires_grad:
            continue  # frozen: no optimizer state
        out["fp32"][name] = safe_get_full_fp32_param(p).detach().clone().float()
        for k in ("exp_avg", "exp_avg_sq"):
            out[k][name] = safe_get_full_optimizer_state(p, k).detach().clone().float()
    return out


def relink(eng):
    # v0.14.5: after a native ZeRO-1/2 or BF16 load the hp views of safe_get_full_* are stale until
    # DeepSpeed's own relinking methods run (the flat partitions themselves are loaded right).
    opt = eng.optimizer
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state"):
        opt._link_all_hp_params()
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()


def flat_groups(eng):
    """This rank's flat fp32 partitions (ZeRO-3: per sub-group), their torch optimizer state, and the
    parameter names per group."""
    opt = eng.optimizer
    names = {p: n for n, p in eng.module.named_parameters()}
    if hasattr(opt, "fp32_partitioned_groups_flat"):  # ZeRO-3
        return [(flat, opt.optimizer.state[flat], [names[p] for p in params])
                for flat, params in zip(opt.fp32_partitioned_groups_flat, opt.fp16_groups)]
    if hasattr(opt, "bf16_groups"):  # BF16_Optimizer
        fp32, groups = opt.fp32_groups_flat_partition, opt.bf16_groups
    else:
        fp32, groups = opt.single_partition_of_fp32_groups, opt.bit16_groups
    out = []
    for g, (flat, params) in enumerate(zip(fp32, groups)):
        st = opt.optimizer.state[opt.optimizer.param_groups[g]["params"][0]]
        out.append((flat, st, [names[p] for p in params]))
    return out


def lp_weights(deepspeed, eng, stage):
    """The module's low-precision weights (gathered under ZeRO-3: collective)."""
    params = list(eng.module.named_parameters())
    if stage != 3:
        return {n: p.detach().clone() for n, p in params}
    with deepspeed.zero.GatheredParameters([p for _, p in params]):
        return {n: p.detach().clone() for n, p in params}


def expected_partition(full_by_name, names, stage, dp, rank):
    """What rank `rank` must hold of a flat group: ZeRO-1/2 pad the group to a multiple of 2*dp and split it
    evenly; ZeRO-3 splits every parameter alone in ceil(n/dp) pieces."""
    import torch
    if stage == 3:
        parts = []
        for n in names:
            t = full_by_name[n].reshape(-1)
            pn = (t.numel() + dp - 1) // dp
            parts.append(torch.nn.functional.pad(t, (0, pn * dp - t.numel()))[rank * pn:(rank + 1) * pn])
        return torch.cat(parts)
    full = torch.cat([full_by_name[n].reshape(-1) for n in names])
    align = 2 * dp
    A = (full.numel() + align - 1) // align * align
    S = A // dp
    return torch.nn.functional.pad(full, (0, A - full.numel()))[rank * S:(rank + 1) * S]


def zero_to_fp32_main(args):
    """DeepSpeed's own zero_to_fp32 reconstruction of the resharded folder must equal the truth."""
    import torch
    setup_deepspeed(args.ds_src)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    sd = get_fp32_state_dict_from_zero_checkpoint(args.ckpt)
    truth = torch.load(args.truth)
    bad = [n for n, t in truth["fp32"].items() if n not in sd or not torch.equal(sd[n].float(), t)]
    print(f"zero_to_fp32: {len(truth['fp32'])} fp32 weights {'equal the truth' if not bad else 'differ: ' + str(bad[:5])}",
          flush=True)
    sys.exit(1 if bad else 0)


def rank_main(args):
    import torch
    import torch.distributed as dist
    deepspeed = setup_deepspeed(args.ds_src)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    layout = tuple(json.loads(args.layout))
    eng = engine_for(deepspeed, layout, args.phase == "universal", args.variant)
    if args.phase == "train":
        for step in range(3):
            loss = eng(batch(step, rank))
            eng.backward(loss)
            eng.step()
        eng.save_checkpoint(args.ckpt, tag="global_step3")
        relink(eng)  # with several param groups v0.14.5's accessors miss states linked before the first step
        st = full_state(deepspeed, eng)
        st["lp"] = lp_weights(deepspeed, eng, layout[0])
        if rank == 0:
            st["step"] = flat_groups(eng)[0][1]["step"]
            torch.save(st, args.truth)
        dist.barrier()
        return
    # load
    truth = torch.load(args.truth)
    # An HF source has no scheduler state: the run keeps its own (load_lr_scheduler_states=False).
    path, _ = eng.load_checkpoint(args.ckpt, tag=args.tag, load_lr_scheduler_states=not args.variant.startswith("hf_llama"))
    assert path is not None, f"load_checkpoint({args.ckpt}, {args.tag}) loaded nothing"
    bad = []
    stage, dp, dtype, bf16opt = layout
    compared = 0
    if args.variant.startswith("hf_llama"):
        return hf_load_check(deepspeed, eng, truth, layout, rank)
    for g, (flat, st, names) in enumerate(flat_groups(eng)):
        for key, got in (("fp32", flat), ("exp_avg", st["exp_avg"]), ("exp_avg_sq", st["exp_avg_sq"])):
            want = expected_partition(truth[key], names, stage, dp, rank).contiguous()
            got = got.detach().float()
            if got.numel() != want.numel() or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
                bad.append(f"rank {rank} group {g} {key}: partition of {got.numel()} differs (want {want.numel()})")
            compared += 1
        if not torch.equal(torch.as_tensor(st["step"]), torch.as_tensor(truth["step"])):
            bad.append(f"rank {rank} group {g} step {st['step']} want {truth['step']}")
    relink(eng)
    full = full_state(deepspeed, eng)
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        for n, t in truth[key].items():
            if not torch.equal(full[key][n].view(torch.int32), t.view(torch.int32)):
                bad.append(f"rank {rank} full {key} of {n} differs")
    for n, w in lp_weights(deepspeed, eng, stage).items():
        if not torch.equal(w, truth["lp"][n].to(w.dtype)):
            bad.append(f"rank {rank} module weight {n} differs")
    loss = eng(batch(7, rank))
    eng.backward(loss)
    eng.step()
    after = full_state(deepspeed, eng)
    moved = sum(not torch.equal(after["fp32"][n], truth["fp32"][n]) for n in truth["fp32"])
    if not torch.isfinite(loss) or moved == 0:
        bad.append(f"rank {rank} training step: loss {loss.item()}, {moved} parameters changed")
    print(f"rank {rank}: {compared} flat partitions + steps, {3 * len(truth['fp32'])} full states, "
          f"{len(truth['lp'])} module weights compared; step after load: loss {loss.item():.4f}, {moved} parameters "
          f"changed; {'OK' if not bad else 'FAIL'}", flush=True)
    for b in bad[:20]:
        print("  " + b, flush=True)
    dist.barrier()
    if bad:
        sys.exit(1)


def hf_load_check(deepspeed, eng, truth, layout, rank):
    """After load_checkpoint of an HF-derived folder: every flat fp32 partition is the HF weights exactly,
    the optimizer state is empty (a fresh AdamW: no moments, no step), the module holds the weights in the
    training dtype, DeepSpeed's full fp32 accessor gives them back; one step trains (step 1 afterwards)."""
    import torch
    import torch.distributed as dist
    stage, dp, dtype, _ = layout
    bad = []
    groups = flat_groups(eng)
    for g, (flat, st, names) in enumerate(groups):
        want = expected_partition(truth["fp32"], names, stage, dp, rank).contiguous()
        got = flat.detach().float()
        if got.numel() != want.numel() or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            bad.append(f"rank {rank} group {g} fp32: partition of {got.numel()} differs (want {want.numel()})")
        if len(st) != 0:
            bad.append(f"rank {rank} group {g}: optimizer state {sorted(st)} loaded, want none (fresh)")
    from deepspeed.utils import safe_get_full_fp32_param
    relink(eng)
    for n, p in eng.module.named_parameters():
        if not torch.equal(safe_get_full_fp32_param(p).detach().float(), truth["fp32"][n]):
            bad.append(f"rank {rank} full fp32 of {n} differs")
    for n, w in lp_weights(deepspeed, eng, stage).items():
        if not torch.equal(w, truth["lp"][n].to(w.dtype)):
            bad.append(f"rank {rank} module weight {n} differs")
    import copy
    before = {n: safe_get_full_fp32_param(p).detach().clone() for n, p in eng.module.named_parameters()}
    loss = eng(batch(7, rank) % HF_LLAMA["vocab_size"])
    eng.backward(loss)
    eng.step()
    moved = sum(not torch.equal(safe_get_full_fp32_param(p).detach(), before[n]) for n, p in eng.module.named_parameters())
    steps = {str(torch.as_tensor(st.get("step", -1)).item()) for _, st, _ in flat_groups(eng)}
    if not torch.isfinite(loss) or moved == 0 or steps != {"1.0"} and steps != {"1"}:
        bad.append(f"rank {rank} training step: loss {loss.item()}, {moved} parameters changed, steps {steps}")
    del copy
    print(f"rank {rank}: {len(groups)} flat fp32 partitions (fresh optimizer state), {len(truth['fp32'])} full fp32 "
          f"weights and module weights compared; step after load: loss {loss.item():.4f}, {moved} parameters "
          f"changed, step {steps}; {'OK' if not bad else 'FAIL'}", flush=True)
    for b in bad[:20]:
        print("  " + b, flush=True)
    dist.barrier()
    if bad:
        sys.exit(1)


# ---------------------------------------------------------------- driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, phase, layout, ckpt, truth, tag="", variant=""):
    n = layout[1]
    port = str(free_port())
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   LOCAL_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu",
                   DS_BUILD_OPS="0", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--ds-src", args.ds_src, "--phase", phase,
               "--layout", json.dumps(list(layout)), "--ckpt", ckpt, "--truth", truth, "--tag", tag,
               "--variant", variant]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    ok = True
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outs.append(out)
        ok = ok and p.returncode == 0
    return ok, outs


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}")
    return r.stdout


def universal_case(args, work, name):
    """Train at A, ucp convert (default layout and --deepspeed-version 0.14), universal load at B."""
    a, b = UNIVERSAL[name]
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src, truth = os.path.join(d, "source"), os.path.join(d, "truth.pt")
    ok, outs = launch(args, "train", a, src, truth)
    if not ok:
        print(f"FAIL {name}: training at {a} failed:\n" + "\n".join(o[-3000:] for o in outs))
        return False
    try:
        run([args.ucp, "convert", src, os.path.join(d, "atomic_dict")])
        run([args.ucp, "convert", "--deepspeed-version", "0.14", src, os.path.join(d, "atomic_014")])
    except RuntimeError as e:
        print(f"FAIL {name}: {e}")
        return False
    ok_dict, outs = launch(args, "universal", b, d, truth, tag="atomic_dict")
    want = "'dict' object has no attribute 'view'"
    dict_fails = not ok_dict and any(want in o for o in outs)
    ok, outs = launch(args, "universal", b, d, truth, tag="atomic_014")
    lines = [l for o in outs for l in o.splitlines() if l.startswith("rank ") or l.startswith("  rank")]
    good = ok and dict_fails
    print(f"{'ok  ' if good else 'FAIL'} {name}: {a} -> universal load at {b}")
    print(f"    default (dict) layout: {'fails in the ZeRO-3 loader as expected (' + want + ')' if dict_fails else 'did not fail as expected'}")
    print("    --deepspeed-version 0.14 layout:")
    for l in lines:
        print("   ", l)
    if not ok and not lines:
        print("\n".join(o[-3000:] for o in outs))
    return good


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-src", required=True)
    ap.add_argument("--ucp", default="bin/ucp")
    ap.add_argument("--work", default="")
    ap.add_argument("--case", action="append")
    ap.add_argument("--rank-main", action="store_true")
    ap.add_argument("--zero-to-fp32", action="store_true")
    ap.add_argument("--phase")
    ap.add_argument("--layout")
    ap.add_argument("--ckpt")
    ap.add_argument("--truth")
    ap.add_argument("--tag", default="")
    ap.add_argument("--variant", default="")
    args = ap.parse_args()
    args.ds_src = os.path.abspath(args.ds_src)
    if args.rank_main:
        return rank_main(args)
    if args.zero_to_fp32:
        return zero_to_fp32_main(args)
    if not os.path.isfile(os.path.join(args.ds_src, "deepspeed", "runtime", "engine.py")):
        sys.exit(f"{args.ds_src}: not a DeepSpeed source tree (no deepspeed/runtime/engine.py)")
    work = args.work or tempfile.mkdtemp(prefix="ucp-check-deepspeed-")
    failed = 0
    names = args.case or list(CASES) + list(UNIVERSAL)
    for name in names:
        if name in UNIVERSAL:
            failed += 0 if universal_case(args, work, name) else 1
            continue
        a, b, variant = (CASES[name] + ("",))[:3]
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        src, truth, atomic, dst = (os.path.join(d, x) for x in ("source", "truth.pt", "atomic", "resharded"))
        if variant.startswith("hf_llama"):
            write_hf_llama(src, truth, variant == "hf_llama_tied")
            ok, outs = True, []
        else:
            ok, outs = launch(args, "train", a, src, truth, variant=variant)
        if not ok:
            print(f"FAIL {name}: training at {a} failed:\n" + "\n".join(o[-3000:] for o in outs))
            failed += 1
            continue
        try:
            run([args.ucp, "convert", src, atomic] + (["--from", "hf"] if variant.startswith("hf_llama") else []))
            stage, dp, dtype, bf16opt = b
            cmd = [args.ucp, "reshard", atomic, os.path.join(dst, "global_step3"), "--to", "deepspeed",
                   "--dp", str(dp), "--zero", str(stage), "--dtype", {"fp32": "float32", "bf16": "bfloat16"}[dtype]]
            if bf16opt:
                cmd.append("--bf16-optimizer")
            out = run(cmd)
            print(run([args.ucp, "inspect", dst]).splitlines()[1])
            for line in out.splitlines():
                if "note: the module layout" in line:
                    print("   ", line.strip())
        except RuntimeError as e:
            print(f"FAIL {name}: {e}")
            failed += 1
            continue
        ok, outs = launch(args, "load", b, dst, truth, tag="global_step3", variant=variant)
        lines = [l for o in outs for l in o.splitlines() if l.startswith("rank ") or l.startswith("  rank")]
        if not b[3]:  # zero_to_fp32 refuses BF16_Optimizer files ("not a zero checkpoint")
            z = subprocess.run([sys.executable, os.path.abspath(__file__), "--zero-to-fp32", "--ds-src", args.ds_src,
                                "--ckpt", dst, "--truth", truth], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(os.environ, DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1"))
            zl = [l for l in z.stdout.splitlines() if l.startswith("zero_to_fp32")]
            lines += zl or [z.stdout[-2000:]]
            ok = ok and z.returncode == 0
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {a} -> {b}")
        for l in lines:
            print("   ", l)
        if not ok:
            failed += 1
            if not any(l.startswith("rank ") for l in lines):
                print("\n".join(o[-3000:] for o in outs))
    print(f"{len(names) - failed} of {len(names)} cases passed (work folder {work})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
