"""Real megatron-core loads what `ucp reshard --to megatron` wrote from a Megatron-DeepSpeed source (the
--ckpt-format torch layout with the non-distributed optimizer) and must give the source's optimizer state
exactly, then train a step.

    python3 megatron_torch_load.py MEGATRON_SRC CASE_DIR TP [DP FORMAT]

CASE_DIR holds `written/` (ucp's save folder, written with --megatron-spec local --megatron-optimizer adamw)
and the Megatron-DeepSpeed fixture's `truth.pt` (testdata/fixtures/deepspeed/megatron_llama_tp2_z1_bf16_dp4:
llama family, hidden 9, 4 heads in 2 query groups of kv_channels 2, SwiGLU ffn 12, 2 layers, vocabulary 43
padded to 48, untied, bf16, torch AdamW at step 3; full tensors under Megatron-DeepSpeed's names, QKV as
[Q; K; V]). Each of TP ranks (gloo, one process each) builds megatron-core's GPTModel (local spec, RMSNorm,
RoPE) wrapped in Float16Module and Megatron's DDP as get_model() does, and get_megatron_optimizer (non-distributed: Float16OptimizerWithFloat16Params over
torch AdamW, as Megatron runs without TE/Apex), every parameter and optimizer state NaN first, then loads with
Megatron's own megatron/training/checkpointing.py load_checkpoint (megatron_load: the args of a pretrain_gpt.py
command line at TP parsed and validated by Megatron, `--no-load-rng`; the model strictly, the optimizer, the
iteration must be 3) and reads the scheduler state from the file. Every fp32 main
parameter, exp_avg and exp_avg_sq of the live optimizer is compared with the truth cut as Megatron-core
holds it on that rank (QKV regrouped per query group, fc1 as [gate_t; up_t], vocabulary rows padded with
zeros), bit for bit; every step must be 3, the model weights the truth's fp32 in bf16. Then one training step
(forward, backward, optimizer step) must succeed and move the weights. Prints "ok ..." and exits 0.
With FORMAT torch_dist (`--ckpt-format torch_dist`, fully_reshardable) the TP x DP ranks build Megatron's
DDP and distributed optimizer instead, and load_checkpoint takes the torch_dist path (the sharded state dicts
from the checkpoint's content_metadata; the fixture generator's load shims megatron_dist_fixtures.
nan_before_load, patch_dcp_load, patch_torch_adam_step); each rank's owned range of every main parameter and
Adam moment is compared with the truth's, bit for bit, and the step must be 3.
With UCP_FUSED_ADAM=1 (core 0.15, whose fully_reshardable load fails with torch AdamW's per-parameter
step) Megatron takes the CPU stand-in testdata/gen/cpu_shims/fused_adam.py as Apex's FusedAdam (ucp then
writes --megatron-optimizer fused) and the step is read from the param groups.
Run inside the torch 2.6 chroot by scripts/megatron-check.sh.
"""
import os
import sys

src, case_dir, TP = sys.argv[1], sys.argv[2], int(sys.argv[3])
DP = int(sys.argv[4]) if len(sys.argv) > 4 else 1
DIST = (sys.argv[5] if len(sys.argv) > 5 else "torch") == "torch_dist"
sys.path.insert(0, src)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_shims"))  # six for core 0.15
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import megatron_dist_fixtures as gen

H, HEADS, GROUPS, D, FFN, L, VOCAB, PADDED, STEP = 9, 4, 2, 2, 12, 2, 43, 48, 3


def expected(truth, key, name, t):
    """The truth of megatron-core parameter `name` as TP rank t holds it."""
    x = truth[key]
    lp = "language_model.encoder.layers."
    if name == "embedding.word_embeddings.weight" or name == "output_layer.weight":
        w = x["language_model.embedding.word_embeddings.weight" if name.startswith("embedding")
              else "language_model.output_layer.weight"]
        w = torch.cat([w, torch.zeros(PADDED - VOCAB, H)])
        return w.chunk(TP)[t]
    if name == "decoder.final_layernorm.weight":
        return x["language_model.encoder.final_layernorm.weight"]
    parts = name.split(".")
    layer, rest = int(parts[2]), ".".join(parts[3:])
    pre = f"{lp}{layer}."
    if rest == "input_layernorm.weight":
        return x[pre + "input_layernorm.weight"]
    if rest == "pre_mlp_layernorm.weight":
        return x[pre + "post_attention_layernorm.weight"]
    if rest == "self_attention.linear_proj.weight":
        return x[pre + "self_attention.dense.weight"].chunk(TP, dim=1)[t]
    if rest == "mlp.linear_fc2.weight":
        return x[pre + "mlp.dense_4h_to_h.weight"].chunk(TP, dim=1)[t]
    if rest == "mlp.linear_fc1.weight":
        w = x[pre + "mlp.dense_h_to_4h.weight"]
        gate, up = w[:FFN], w[FFN:]
        return torch.cat([gate.chunk(TP)[t], up.chunk(TP)[t]])
    if rest == "self_attention.linear_qkv.weight":
        w = x[pre + "self_attention.query_key_value.weight"]  # [Q; K; V]
        q, k, v = w[:HEADS * D], w[HEADS * D:(HEADS + GROUPS) * D], w[(HEADS + GROUPS) * D:]
        per = HEADS // GROUPS
        groups = [torch.cat([q[g * per * D:(g + 1) * per * D], k[g * D:(g + 1) * D], v[g * D:(g + 1) * D]])
                  for g in range(GROUPS)]
        return torch.cat(groups[t * GROUPS // TP:(t + 1) * GROUPS // TP])
    raise KeyError(name)


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo", LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    gen.install_shims()
    if DIST:
        gen.patch_dcp_load()
        gen.patch_torch_adam_step()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel as DDP, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.initialize_model_parallel(TP, 1)
    dt = torch.bfloat16
    cfg = TransformerConfig(num_layers=L, hidden_size=H, num_attention_heads=HEADS, num_query_groups=GROUPS,
                            kv_channels=D, ffn_hidden_size=FFN, gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, add_bias_linear=False, normalization="RMSNorm",
                            layernorm_epsilon=1e-5, tensor_model_parallel_size=TP, use_cpu_initialization=True,
                            hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=dt, pipeline_dtype=dt)
    torch.manual_seed(42)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=PADDED, max_sequence_length=7, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope")
    # As get_model() wraps a bf16 model: Float16Module (every parameter bf16, norms included), then DDP;
    # load_checkpoint loads into the unwrapped GPTModel.
    from megatron.core.transformer.module import Float16Module
    ddp = DDP(config=cfg, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=DIST),
              module=Float16Module(cfg, model))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=3e-4, min_lr=1e-5, weight_decay=0.1, bf16=True,
                                                 params_dtype=dt, use_distributed_optimizer=DIST), [ddp])
    t = ps.get_tensor_model_parallel_rank()
    truth = torch.load(os.path.join(case_dir, "truth.pt"), weights_only=False)
    names = {p: nm for nm, p in model.named_parameters()}
    if DIST:
        bad, n, sched = load_dist(ddp, model, opt, truth, names, t, rank)
    else:
        bad, n, sched = load_torch(ddp, model, opt, truth, names, t, rank)
    before = {nm: p.detach().clone() for nm, p in model.named_parameters()}
    # One optimizer step on seeded gradients (the fixture generator's synthetic_step: main_grad of every
    # parameter, then Megatron's step; a bf16 forward on CPU needs Megatron's Float16Module casts).
    gen.synthetic_step(ddp, model, opt, 99)
    moved = sum(not torch.equal(p.detach(), before[nm]) for nm, p in model.named_parameters())
    if moved == 0:
        bad.append(f"rank {rank} training step: {moved} parameters moved")
    print(f"{'ok' if not bad else 'FAIL'} rank {rank}: core loaded {'torch_dist' if DIST else 'torch'} TP {TP} DP {DP}: "
          f"{n} optimizer tensors and {len(names)} weights compared, step {STEP}, scheduler max_lr {sched['max_lr']}; "
          f"one step: {moved} parameters moved{' (cpu_shims FusedAdam)' if os.environ.get('UCP_FUSED_ADAM') == '1' else ''}",
          flush=True)
    for b in bad[:20]:
        print("  " + b, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


def load_dist(ddp, model, opt, truth, names, t, rank):
    """load_checkpoint's torch_dist path; every owned range of every state compared with the truth."""
    from megatron.core import dist_checkpointing

    gen.nan_before_load(model, opt)
    save = os.path.join(case_dir, "written")
    it = os.path.join(save, "iter_%07d" % int(open(os.path.join(save, "latest_checkpointed_iteration.txt")).read()))
    megatron_load(ddp, opt)
    sched = dist_checkpointing.load_common_state_dict(it)["opt_param_scheduler"]
    bad, n = [], 0
    for p, nm in names.items():
        want_w = expected(truth, "fp32", nm, t)
        if not torch.equal(p.detach(), want_w.to(p.dtype)):
            bad.append(f"rank {rank} {nm} model weight differs")
        owner = [o for o in getattr(opt, "chained_optimizers", [opt]) if p in o.model_param_group_index_map]
        if not owner:
            continue  # another DP rank owns all of it
        o = owner[0]
        gi, dt_, bi = o.model_param_gbuf_map[p]
        rng = o.gbuf_ranges[gi][dt_][bi]["param_map"][p]["param"]
        st = o._get_main_param_and_optimizer_states(p)
        for key, sk in (("fp32", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            want = expected(truth, key, nm, t).float().reshape(-1)[rng.start:rng.end]
            got = st[sk].detach().float().reshape(-1)
            n += 1
            if got.shape != want.shape or not torch.equal(got, want):
                bad.append(f"rank {rank} {nm} {key} differs")
    steps = gen.optimizer_steps(opt)
    if steps != {float(STEP)}:
        bad.append(f"rank {rank}: optimizer steps after the load {steps}, want {STEP}")
    return bad, n, sched


def megatron_load(ddp, opt):
    """Megatron's own load_checkpoint (megatron/training/checkpointing.py) of `written/` into the DDP model and
    the optimizer, with the args a pretrain_gpt.py run of this model at TP x DP parses (Megatron's parse_args
    and validate_args): it reads the tracker and the rank's file (--ckpt-format torch) or the common state and
    content_metadata (torch_dist), checks the args, loads the model strictly (a failing strict load, which
    load_checkpoint would retry non-strictly, fails the check) and the optimizer. The scheduler is read from
    the file by the caller (load_checkpoint is given none to fill). Fails unless the iteration is STEP."""
    import megatron.training.arguments as marguments
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_global_variables

    argv = ["pretrain_gpt.py", "--num-layers", L, "--hidden-size", H, "--num-attention-heads", HEADS,
            "--group-query-attention", "--num-query-groups", GROUPS, "--kv-channels", D, "--ffn-hidden-size", FFN,
            "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon", 1e-5,
            "--position-embedding-type", "rope", "--seq-length", 7, "--max-position-embeddings", 7,
            "--micro-batch-size", 1, "--lr", 3e-4, "--min-lr", 1e-5, "--weight-decay", 0.1, "--bf16",
            "--untie-embeddings-and-output-weights", "--transformer-impl", "local", "--use-cpu-initialization",
            "--no-gradient-accumulation-fusion", "--no-rope-fusion", "--no-bias-swiglu-fusion",
            "--no-masked-softmax-fusion", "--no-persist-layer-norm", "--hidden-dropout", 0, "--attention-dropout", 0,
            "--tensor-model-parallel-size", TP, "--ckpt-format", "torch_dist" if DIST else "torch",
            "--load", os.path.join(case_dir, "written"), "--no-load-rng"]
    if DIST:
        argv += ["--use-distributed-optimizer"]
    sys.argv = [str(a) for a in argv]
    marguments.get_device_arch_version = lambda: 9  # no GPU to ask; picks only which performance note applies
    args = parse_args()
    validate_args(args, {})
    set_global_variables(args, build_tokenizer=False)
    iteration = gen.load_checkpoint_strict([ddp], opt, case_dir)
    if iteration != STEP:
        sys.exit(f"FAIL {case_dir}: load_checkpoint returned iteration {iteration}, want {STEP}")


def load_torch(ddp, model, opt, truth, names, t, rank):
    """load_checkpoint's --ckpt-format torch path: the rank's model_optim_rng.pt."""
    gen.nan_before_load(model, opt)
    megatron_load(ddp, opt)
    path = os.path.join(case_dir, "written", "iter_%07d" % STEP, "mp_rank_%02d" % t, "model_optim_rng.pt")
    sched = torch.load(path, map_location="cpu", weights_only=False)["opt_param_scheduler"]
    bad, n = [], 0
    fopt = getattr(opt, "chained_optimizers", [opt])[0]  # Float16OptimizerWithFloat16Params
    inner = fopt.optimizer
    for g, (mains, lps) in enumerate(zip(fopt.fp32_from_float16_groups, fopt.float16_groups)):
        for main, lp in zip(mains, lps):
            nm = names[lp]
            st = inner.state[main]
            for key, got in (("fp32", main), ("exp_avg", st["exp_avg"]), ("exp_avg_sq", st["exp_avg_sq"])):
                want = expected(truth, key, nm, t)
                n += 1
                if got.shape != want.shape or not torch.equal(got.detach().float(), want.float()):
                    bad.append(f"rank {rank} {nm} {key} differs")
            step = st["step"] if gen.torch_adam(fopt) else inner.param_groups[g]["step"]
            if float(step) != STEP:
                bad.append(f"rank {rank} {nm} step {step}")
            if not torch.equal(lp.detach(), expected(truth, "fp32", nm, t).to(lp.dtype)):
                bad.append(f"rank {rank} {nm} model weight differs")
    if len(names) != sum(len(x) for x in fopt.float16_groups):
        bad.append(f"rank {rank}: {len(names)} parameters, {sum(len(x) for x in fopt.float16_groups)} in the optimizer")
    return bad, n, sched


if __name__ == "__main__":
    mp.spawn(worker, args=(TP * DP, 29500 + os.getpid() % 200), nprocs=TP * DP, join=True)
