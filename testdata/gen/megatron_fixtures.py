#!/usr/bin/python3
"""Generate Megatron-LM legacy (--ckpt-format torch) checkpoint fixtures with known truth.

Each case first builds the full model (global fp32 params with global layer numbers, fp32 Adam
exp_avg / exp_avg_sq, a step), then shards it the way Megatron does (TP / PP / VPP / EP, vocab
padding, grouped GQA QKV, SwiGLU [W_r; V_r], tied embeddings, DDP buffers of the distributed
optimizer) and writes real torch.save files. The rules and their Megatron sources are listed
in internal/formats/megatron/NOTES.md.

Usage (Debian's torch 1.13):
  /usr/bin/python3 testdata/gen/megatron_fixtures.py [--out DIR] [--case NAME ...] [--check]
  --check re-reads the written checkpoints with an independent reader (mgen/check.py) and
  compares every reconstructed tensor with truth.pt.
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from mgen.gen import Case, build  # noqa: E402
from mgen.layout import Topo  # noqa: E402
from mgen.model import ModelCfg  # noqa: E402

# Most structural cases use a narrower model (hidden 8, ffn 16) to keep the fixtures small.
SMALL = dict(hidden=8, heads=2, ffn=16)

# Shared geometry of the two layouts of one model state (same_tp2_pp2 / same_tp4_pp1).
# make_vocab_size_divisible_by 64: vocab 100 pads to 128 at TP2 and 256 at TP4.
SAME_CFG = ModelCfg(hidden=8, heads=8, groups=2, kv_channels=2, swiglu=True, norm="RMSNorm",
                    bias=False, pos="rope", untie=True, layers=2, ffn=16, divisor=64)

CASES = [
    Case("tp1_pp1",
         "TP1 PP1, MCore TE names, LayerNorm + biases, learned positions, tied embeddings, "
         "old-TE io.BytesIO _extra_state, bf16, Float16 optimizer over torch AdamW (per-param "
         "step tensors), rng_state saved",
         ModelCfg(), Topo(), "fp16opt", extra_state="bytesio", seed=11),
    Case("tp2_gqa_swiglu",
         "TP2, GQA 8 heads / 2 groups (kv_channels 4, one group per rank), SwiGLU, RMSNorm, "
         "no biases, RoPE, tied, MCore local-spec names (input_layernorm, _extra_state None), "
         "fp16 with DynamicGradScaler state, make_vocab_size_divisible_by 64 (100 -> 128), "
         "fp32 main params pickled with their attributes (torch >= 2 _rebuild_from_type_v2)",
         ModelCfg(heads=8, groups=2, kv_channels=4, ffn=16, swiglu=True, norm="RMSNorm",
                  bias=False, pos="rope", spec="local", divisor=64),
         Topo(tp=2), "fp16opt", fp16=True, attr_tensors=True, seed=12),
    Case("tp4_gqa_qkvbias",
         "TP4, GQA 8 heads / 2 groups (each group spans two ranks: plain row split of the "
         "grouped layout), --add-qkv-bias without linear biases, tied, "
         "make_vocab_size_divisible_by 32 (100 -> 128), FusedAdam-style group step",
         ModelCfg(hidden=8, heads=8, groups=2, kv_channels=2, ffn=16, divisor=32, bias=False,
                  qkv_bias=True),
         Topo(tp=4), "fp16opt", adam="fused", save_rng=False, seed=13),
    Case("tp1_pp2",
         "PP2, tied embeddings: the last stage saves output_layer.weight, a copy of the word "
         "embedding with its own (equal) optimizer state",
         ModelCfg(**SMALL, divisor=32),
         Topo(pp=2), "fp16opt", adam="fused", save_rng=False, seed=14),
    Case("tp1_pp4_untied",
         "PP4, 4 layers (one per stage), untied output layer, RoPE, RMSNorm, no biases",
         ModelCfg(**SMALL, layers=4, untie=True, pos="rope", norm="RMSNorm", bias=False,
                  divisor=32),
         Topo(pp=4), "fp16opt", adam="fused", save_rng=False, seed=15),
    Case("pp2_vpp2_distopt",
         "PP2 x VPP2 (model0/model1; pp0 holds layers 0 and 2, pp1 layers 1 and 3), hidden 12, "
         "tied, make_vocab_size_divisible_by 8 (100 -> 104: the 1248-element embedding is not "
         "64-aligned), DP2 distributed optimizer F3 with int group step; shared-embedding "
         "buckets on pp0/model0 and pp1/model1, several buckets on pp0/model0 "
         "(ddp_bucket_size 300), one bucket elsewhere",
         ModelCfg(hidden=12, heads=2, ffn=16, layers=4, norm="RMSNorm", bias=False, divisor=8),
         Topo(pp=2, vpp=2, dp=2), "distopt_f3", bucket_size=300, overlap=True, adam="fused",
         save_rng=False, seed=16),
    Case("tp2_dp2_distopt",
         "TP2 DP2 distributed optimizer F3 (core >= 0.13 layout) with float group step, SwiGLU, "
         "LayerNorm + biases, 8 buckets (ddp_bucket_size 200)",
         ModelCfg(**SMALL, swiglu=True, divisor=32),
         Topo(tp=2, dp=2), "distopt_f3", bucket_size=200, overlap=True, save_rng=False, seed=17),
    Case("tp2_dp2_distopt_f2",
         "TP2 DP2 distributed optimizer in the core 0.6 per-bucket F2 format (no 64-element "
         "alignment, buckets padded to a multiple of DP, -1234.5 where 0.6 left torch.empty "
         "garbage, one bucket per buffer as 0.6 had no --ddp-bucket-size)",
         ModelCfg(**SMALL, swiglu=True, divisor=32),
         Topo(tp=2, dp=2), "distopt_f2", overlap=True, save_rng=False, seed=18),
    Case("moe_ep2",
         "MoE, 4 experts over EP2 (SequentialMLP local_experts.{j}, 2 per rank), SwiGLU experts, "
         "router + persistent fp32 expert_bias buffer, TP1 DP2, MCore local spec, untied, "
         "non-distributed optimizer -> ChainedOptimizer list [dense, expert]",
         ModelCfg(**SMALL, experts=4, moe_ffn=8, swiglu=True, spec="local", norm="RMSNorm",
                  bias=False, pos="rope", untie=True, moe_impl="sequential", expert_bias=True,
                  divisor=32),
         Topo(dp=2, ep=2), "fp16opt", attr_tensors=True, adam="fused", save_rng=False, seed=19),
    Case("moe_tp2_pp2_ep2_distopt",
         "MoE, 4 experts as TEGroupedMLP weight{j}, TP2 PP2 EP2 (ETP 2) DP2, tied, distributed "
         "optimizer: chained [dense, expert] (distrib_optim.pt lists with None for the dense "
         "part on EP rank 1), dirs mp_rank_TT_PPP_EEE",
         ModelCfg(**SMALL, experts=4, moe_ffn=8, swiglu=True, norm="RMSNorm", bias=False,
                  pos="rope", divisor=32),
         Topo(tp=2, pp=2, dp=2, ep=2), "distopt_f3", save_rng=False, seed=20),
    Case("moe_groupedmlp_tp2_ep2_distopt",
         "MoE with the legacy GroupedMLP (--moe-grouped-gemm --moe-use-legacy-grouped-gemm, "
         "core <= 0.16): 4 experts fused per layer into mlp.experts.weight1 [H, E/EP * 2F/TP] "
         "(memory [E/EP, H, 2F/TP], [gate_r | up_r] per expert) and mlp.experts.weight2 "
         "[E/EP * F/TP, H], TP2 (ETP2) EP2 DP2, SwiGLU, TE spec, untied, distributed optimizer "
         "chained [dense, expert] F3 with 2 expert buckets (ddp_bucket_size 200)",
         ModelCfg(**SMALL, experts=4, moe_ffn=8, swiglu=True, norm="RMSNorm", bias=False,
                  pos="rope", untie=True, moe_impl="legacy_grouped", divisor=32),
         Topo(tp=2, dp=2, ep=2), "distopt_f3", bucket_size=200, overlap=True, save_rng=False,
         seed=24),
    Case("legacy_tp2_pp2",
         "Legacy megatron/model names (nested language_model.{embedding,encoder}, "
         "layers.N.self_attention.query_key_value, _extra_state None), TP2 PP2, LayerNorm, no "
         "linear biases, learned positions, tied (word_embeddings_for_head on the last stage), "
         "Apex FusedAdam (core 0.5 param groups)",
         ModelCfg(**SMALL, spec="legacy", bias=False),
         Topo(tp=2, pp=2), "legacy_apex", save_rng=False, seed=21),
    Case("same_tp2_pp2",
         "The model state of same_tp4_pp1 saved at TP2 x PP2 (DP2 distributed optimizer F3); "
         "both must convert to identical atomic tensors",
         SAME_CFG, Topo(tp=2, pp=2, dp=2), "distopt_f3", save_rng=False, seed=42),
    Case("same_tp4_pp1",
         "The model state of same_tp2_pp2 saved at TP4 x PP1 (non-distributed optimizer); the "
         "two query groups span ranks",
         SAME_CFG, Topo(tp=4), "fp16opt", attr_tensors=True, adam="fused", save_rng=False, seed=42),
    Case("novocab_tp2",
         "TP2 without args.vocab_size: the true vocabulary is unknown, so the truth keeps all "
         "256 padded rows (meta vocab_padding_stripped False)",
         ModelCfg(**SMALL, bias=False),
         Topo(tp=2), "fp16opt", with_vocab=False, adam="fused", save_rng=False, seed=23),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "fixtures", "megatron")))
    ap.add_argument("--case", action="append", help="only this case (repeatable)")
    ap.add_argument("--check", action="store_true", help="verify written cases against truth.pt")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    cases = CASES
    if a.list:
        for c in cases:
            print(f"{c.name}: {c.desc}")
        return
    if a.case:
        unknown = set(a.case) - {c.name for c in cases}
        if unknown:
            sys.exit(f"unknown case(s): {', '.join(sorted(unknown))}")
        cases = [c for c in cases if c.name in a.case]
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    for c in cases:
        if not a.check:
            build(c, os.path.join(a.out, c.name))
            print(f"wrote {c.name}")
    if a.check:
        from mgen import check
        bad = 0
        for c in cases:
            errs = check.check_case(os.path.join(a.out, c.name))
            print(f"{c.name}: {'ok' if not errs else 'FAIL'}")
            for e in errs[:20]:
                print("   ", e)
            bad += bool(errs)
        if {"same_tp2_pp2", "same_tp4_pp1"} <= {c.name for c in cases}:
            errs = check.compare_truths(os.path.join(a.out, "same_tp2_pp2"),
                                        os.path.join(a.out, "same_tp4_pp1"))
            print(f"same_tp2_pp2 == same_tp4_pp1: {'ok' if not errs else 'FAIL'}")
            for e in errs[:20]:
                print("   ", e)
            bad += bool(errs)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
