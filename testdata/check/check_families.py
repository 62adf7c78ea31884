"""Real-consumer check of the model-family mappings: transformers <-> ucp <-> megatron-core, logits in fp32.

Run by scripts/check-families.sh (make check-families MEGATRON_SRC=... TRANSFORMERS_SRC=...) inside the
torch 2.6 chroot, with PYTHONPATH = transformers shims : transformers/src : megatron-core source. Phases:

  hf WORK               for each case, a random fp32 model written by real transformers' save_pretrained
                        (WORK/CASE/hf) and its logits on a fixed batch (WORK/CASE/hf_logits.pt)
  megatron WORK CASE MG VARIANT
                        real megatron-core GPTModel (local spec, TP 2 over gloo, one process per rank) built
                        from the case's config, with VARIANT's options (plain, interleaved), loads the
                        model_optim_rng.pt files ucp wrote in MG (strict load_state_dict of the 'model' dict),
                        or, when MG is a --ckpt-format torch_dist save (variant dist), its args from the common
                        state (dist_checkpointing.load_common_state_dict) and the model through
                        dist_checkpointing.load({'model': model.sharded_state_dict()}), then strict load_state_dict;
                        runs forward on the batch; rank 0 writes WORK/CASE/mg_logits_VARIANT.pt. For the plain
                        and dist variants the logits must equal transformers' (import check)
  export WORK CASE DIR VARIANT
                        XForCausalLM.from_pretrained(DIR) (no missing/unexpected/mismatched keys) must give
                        megatron-core's logits of the variant (export check)
  setargs MG KEY=VALUE...
                        rewrite args in every model_optim_rng.pt of MG (a Megatron checkpoint trained with
                        that option: its weights are taken as they are, its math is the option's)

Pass: max |diff| <= 1e-4 and equal argmax at every position. Prints one line per comparison; exit 1 on failure.
"""
import glob
import json
import os
import sys

import torch

TOL = 1e-4
BATCH = torch.tensor([[3, 17, 5, 9, 33, 2, 11, 25, 7, 30, 1, 14, 8, 21, 36, 4],
                      [12, 6, 39, 0, 22, 15, 27, 10, 31, 19, 24, 13, 18, 28, 35, 16]])

GEOM = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=40, max_position_embeddings=64, rms_norm_eps=1e-6)


def cases():
    import transformers as tf
    return {
        "llama31": (tf.LlamaConfig, tf.LlamaForCausalLM,
                    dict(tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(tie_word_embeddings=False, sliding_window=None)),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(tie_word_embeddings=True, rope_theta=1000000.0)),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=16)),
    }


def compare(what, got, want):
    d = (got - want).abs().max().item()
    same = torch.equal(got.argmax(-1), want.argmax(-1))
    ok = d <= TOL and same
    print("%s %s: max|diff| %.3g, argmax %s" % ("PASS" if ok else "FAIL", what, d, "equal" if same else "DIFFERS"))
    return ok


def phase_hf(work):
    for i, (name, (ccls, mcls, over)) in enumerate(sorted(cases().items())):
        torch.manual_seed(7 + i)
        model = mcls(ccls(**{**GEOM, **over})).eval()
        with torch.no_grad():
            for k, (pn, p) in enumerate(model.named_parameters()):
                if pn.endswith("norm.weight"):
                    p.copy_(1 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p) + 0.001 * k)
            logits = model(BATCH).logits.float()
        d = os.path.join(work, name)
        model.save_pretrained(os.path.join(d, "hf"), safe_serialization=True)
        torch.save(logits, os.path.join(d, "hf_logits.pt"))
    return True


def load_hf(d):
    import transformers as tf
    cfg = json.load(open(os.path.join(d, "config.json")))
    cls = getattr(tf, cfg["architectures"][0])
    model, info = cls.from_pretrained(d, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit("%s: loading info %s" % (d, bad))
    return model.eval()


def megatron_worker(rank, world, work, case, mg, variant, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo", LOCAL_RANK=str(rank))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gen"))
    import megatron_dist_fixtures as gen
    gen.install_shims()
    gen.patch_dcp_load()
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(world, 1)
    # Attention forks the CUDA RNG tracker for dropout (0 here): no RNG on CPU.
    import contextlib
    from megatron.core.tensor_parallel import random as tp_random
    tp_random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    release = os.path.join(mg, "release")
    torch_dist = os.path.exists(os.path.join(release, "metadata.json"))  # --ckpt-format torch_dist
    if torch_dist:
        from megatron.core import dist_checkpointing
        a = dist_checkpointing.load_common_state_dict(release)["args"]
    else:
        sd = torch.load(os.path.join(release, "mp_rank_%02d" % rank, "model_optim_rng.pt"), weights_only=False)
        a = sd["args"]
    cfg = TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        num_query_groups=a.num_query_groups, kv_channels=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, bias_activation_fusion=False,
        add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm,
        normalization="RMSNorm", layernorm_epsilon=a.norm_epsilon, rotary_interleaved=a.rotary_interleaved,
        apply_rope_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, tensor_model_parallel_size=world, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32)
    model = GPTModel(
        config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=a.qk_layernorm, normalization="RMSNorm"),
        vocab_size=a.padded_vocab_size, max_sequence_length=64, position_embedding_type="rope",
        rotary_base=int(a.rotary_base), rope_scaling=a.use_rope_scaling,
        rope_scaling_factor=getattr(a, "rope_scaling_factor", 8.0),
        share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights).eval()
    if torch_dist:
        # load_checkpoint's torch_dist path (release: the model only): {'model': the model's sharded state dict}.
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, release)
        model.load_state_dict(loaded["model"], strict=True)
    else:
        model.load_state_dict(sd["model"], strict=True)
    s = BATCH.shape[1]
    pos = torch.arange(s).unsqueeze(0).expand_as(BATCH)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        out = model(BATCH, pos, mask)  # [b, s, V/TP]
    parts = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(parts, out.contiguous())
    logits = torch.cat(parts, dim=-1)[..., :a.vocab_size].float()
    if rank == 0:
        torch.save(logits, os.path.join(work, case, "mg_logits_%s.pt" % variant))
    dist.barrier()
    dist.destroy_process_group()


def phase_megatron(work, case, mg, variant):
    import torch.multiprocessing as mp
    port = 29500 + (os.getpid() % 1000)
    mp.spawn(megatron_worker, args=(2, work, case, mg, variant, port), nprocs=2, join=True)
    got = torch.load(os.path.join(work, case, "mg_logits_%s.pt" % variant))
    if variant not in ("plain", "dist"):
        print("INFO %s/%s: megatron-core logits computed (the export must match them)" % (case, variant))
        return True
    want = torch.load(os.path.join(work, case, "hf_logits.pt"))
    fmt = " --ckpt-format torch_dist" if variant == "dist" else ""
    return compare("import %s: transformers -> ucp convert --from hf -> reshard --to megatron%s --tp 2 -> megatron-core TP 2" % (
        case, fmt), got, want)


def phase_export(work, case, d, variant):
    model = load_hf(d)
    with torch.no_grad():
        got = model(BATCH).logits.float()
    want = torch.load(os.path.join(work, case, "mg_logits_%s.pt" % variant))
    return compare("export %s/%s: megatron-core TP 2 -> ucp convert -> export --to hf -> transformers %s" % (
        case, variant, type(model).__name__), got, want)


def phase_setargs(mg, kvs):
    for p in glob.glob(os.path.join(mg, "release", "mp_rank_*", "model_optim_rng.pt")):
        sd = torch.load(p, weights_only=False)
        for kv in kvs:
            k, v = kv.split("=", 1)
            setattr(sd["args"], k, json.loads(v))
        torch.save(sd, p)
    return True


def main():
    # hf_family_fixtures completes the huggingface_hub shim (save_pretrained's shard split) before transformers loads.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gen"))
    import hf_family_fixtures  # noqa: F401
    phase, rest = sys.argv[1], sys.argv[2:]
    ok = {"hf": lambda: phase_hf(*rest), "megatron": lambda: phase_megatron(*rest),
          "export": lambda: phase_export(*rest), "setargs": lambda: phase_setargs(rest[0], rest[1:])}[phase]()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
