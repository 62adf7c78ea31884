"""Writes Megatron-LM GroupedMLP (legacy grouped GEMM) fixtures with real megatron-core on CPU.

    python3 megatron_grouped_fixtures.py MEGATRON_SRC OUT_DIR [CASE ...]

Run by scripts/megatron-grouped-fixtures.sh inside the torch 2.6 chroot of scripts/torch2-chroot.sh, in a
work folder holding megatron-core's `megatron/` package (MEGATRON_SRC: a core_v0.15.3 or core_v0.14.0 tree;
GroupedMLP is gone from core_v0.17.0), megatron_dist_fixtures.py (its CPU shims for megatron-core) and
cpu_shims/ (the `grouped_gemm` stand-in). Not run by CI: the fixtures are committed.

Each case is a Megatron command line (pretrain_gpt.py's arguments: local spec, --moe-grouped-gemm, SwiGLU
experts, bf16), parsed and validated by Megatron's own parse_args / validate_args. One process per rank
(gloo) builds the model with megatron.training's get_model (Float16Module + DDP, as pretrain_gpt.py does)
from megatron-core's GPTModel and get_gpt_layer_local_spec(moe_grouped_gemm=True), whose MoE layers hold
GroupedMLP experts (`mlp.experts.weight1` / `weight2`); the optimizer is get_megatron_optimizer from the
args (torch AdamW on CPU), with its param scheduler. Two optimizer steps run on seeded synthetic gradients
(forward/backward through the pipeline schedules needs CUDA); then one forward pass through GroupedMLP's
own forward (grouped_gemm.ops.gmm, from the CPU shim) gives logits, kept in the truth. Megatron's own
save_checkpoint writes the checkpoint, in the case's --ckpt-format (torch: mp_rank_* folders with
model_optim_rng.pt [+ distrib_optim.pt]; torch_dist with the fully_reshardable optimizer).

Truth (truth.pt, rank 0) is gathered from the live run, never read back from the files: each rank's model
parameters and the fp32 main parameters and Adam moments its optimizer holds (the distributed optimizer:
the owned flat range, `_get_main_param_and_optimizer_states`; the Float16 optimizer: the fp32 copy and its
state), merged to the TP = EP = 1 model:
  * GroupedMLP, `--ckpt-format torch` names (`mlp.experts.weight1` / `weight2`): rank (ep e, expert-tp r)
    holds weight1 as view(nle, H, G, F/t) and weight2 as view(nle, F/t, H) (experts.py forward's views);
    concatenated over r on the F axis and over e on the expert axis they are Megatron's TP = EP = 1
    tensors weight1 [H, E*G*F] (memory [E, H, G*F]) and weight2 [E*F, H].
  * torch_dist names: GroupedMLP's sharded_state_dict saves SequentialMLP-compatible per-expert tensors
    (`mlp.experts.local_experts.<g>.linear_fc1.weight` [G*F, H], `linear_fc2.weight` [H, F]): the same
    values transposed per expert.
  * the rest merged over TP with Megatron's partition attributes (megatron_dist_fixtures.merge).
"""

import argparse
import os
import shutil
import subprocess
import sys
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB = 50
SEQ = 8
STEPS = 2

# name: degrees and geometry. H: hidden size, E: experts, F: expert ffn; etp defaults to tp.
# fmt: --ckpt-format; distopt: --use-distributed-optimizer.
CASES = {
    # EP divides H: an EP rank's weight1 is a block of rows of the TP = EP = 1 tensor.
    "gmm_tp2_ep2_torch": dict(tp=2, ep=2, dp=2, H=12, E=4, F=8, fmt="torch", distopt=True),
    "gmm_tp2_ep2_dist": dict(tp=2, ep=2, dp=2, H=12, E=4, F=8, fmt="torch_dist", distopt=True),
    # H 13 over EP 2 with 3 local experts: EP rank 1's weight1 starts inside a row (at line 39 of 78,
    # slot 3 of 6), rank 0's ends inside one.
    "gmm_tp2_ep2_h13_torch": dict(tp=2, ep=2, dp=2, H=13, E=6, F=4, fmt="torch", distopt=True),
    "gmm_tp2_ep2_h13_dist": dict(tp=2, ep=2, dp=2, H=13, E=6, F=4, fmt="torch_dist", distopt=True),
    # Expert TP 1 under TP 2 (whole experts per EP rank, dense layers split over TP), H 13 over EP 2.
    # ucp reads expert-TP != TP legacy checkpoints with the Float16 optimizer only.
    "gmm_tp2_etp1_ep2_h13_torch": dict(tp=2, etp=1, ep=2, dp=2, H=13, E=4, F=6, fmt="torch", distopt=False),
    "gmm_tp2_etp1_ep2_h13_dist": dict(tp=2, etp=1, ep=2, dp=2, H=13, E=4, F=6, fmt="torch_dist", distopt=True),
}


def argv(case, save):
    """The pretrain_gpt.py command line of a case."""
    c = CASES[case]
    a = ["pretrain_gpt.py", "--num-layers", "2", "--hidden-size", str(c["H"]), "--num-attention-heads", "2",
         "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "4", "--ffn-hidden-size", "16",
         "--num-experts", str(c["E"]), "--moe-ffn-hidden-size", str(c["F"]), "--moe-grouped-gemm",
         "--moe-router-topk", "2", "--moe-router-load-balancing-type", "none", "--moe-aux-loss-coeff", "0",
         "--moe-token-dispatcher-type", "allgather", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
         "--micro-batch-size", "1", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
         "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--bf16",
         "--transformer-impl", "local", "--use-cpu-initialization", "--no-gradient-accumulation-fusion",
         "--no-rope-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-masked-softmax-fusion",
         "--no-persist-layer-norm", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--vocab-size", str(VOCAB), "--make-vocab-size-divisible-by", "16", "--lr", "1e-2", "--min-lr", "1e-3",
         "--weight-decay", "0.01", "--train-iters", "10", "--lr-decay-style", "constant", "--seed", "1234",
         "--tensor-model-parallel-size", str(c["tp"]), "--expert-model-parallel-size", str(c["ep"]),
         "--expert-tensor-parallel-size", str(c.get("etp", c["tp"])),
         "--save", save, "--save-interval", "10", "--ckpt-format", c["fmt"], "--no-save-rng"]
    if c["distopt"]:
        a.append("--use-distributed-optimizer")
    if c["fmt"] == "torch_dist":
        a.append("--dist-ckpt-optim-fully-reshardable")
    return a


def install_grouped_gemm():
    """Serve cpu_shims/grouped_gemm (next to this file) as `grouped_gemm`."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "cpu_shims"))
    import grouped_gemm  # noqa: F401

    assert grouped_gemm.__file__.startswith(os.path.join(here, "cpu_shims")), grouped_gemm.__file__


def global_name(model, name, ep_rank):
    """A live parameter name (local spec, the names --ckpt-format torch saves) with the global layer
    number; SequentialMLP-style expert numbers are not needed (GroupedMLP names none)."""
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        layer = model.decoder.layers[int(parts[2])]
        return f"decoder.layers.{layer.layer_number - 1}." + ".".join(parts[3:])
    return name


def local_truth(model, opt):
    """This rank's pieces: every parameter (TP- or expert-TP-local, whole), and the fp32 main parameter and
    Adam moments of the part its optimizer holds."""
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_rank()
    out = []
    subs = getattr(opt, "chained_optimizers", [opt])
    for name, p in model.named_parameters():
        grouped = name.endswith(".mlp.experts.weight1") or name.endswith(".mlp.experts.weight2")
        e = dict(name=global_name(model, name, ep), local=name, grouped=grouped,
                 tp=ps.get_expert_tensor_parallel_rank() if ".mlp.experts." in name else ps.get_tensor_model_parallel_rank(),
                 ep=ep, dp=ps.get_data_parallel_rank(), pp=0,
                 tp_split=bool(getattr(p, "tensor_model_parallel", False)), dim=getattr(p, "partition_dim", -1),
                 shape=tuple(p.shape), weight=p.detach().float().clone(), tied_copy=False)
        for o in subs:
            if hasattr(o, "model_param_gbuf_map"):  # distributed optimizer
                if p not in o.model_param_group_index_map:
                    continue
                gi, dt, bi = o.model_param_gbuf_map[p]
                rng = o.gbuf_ranges[gi][dt][bi]["param_map"][p]["param"]
                st = o._get_main_param_and_optimizer_states(p)
                e["range"] = (rng.start, rng.end)
                e["states"] = {k: v.detach().float().clone().view(-1) for k, v in st.items()}
            else:  # Float16OptimizerWithFloat16Params: fp32 copies of the bf16 params
                for mg, fg in zip(o.float16_groups, o.fp32_from_float16_groups):
                    for mp_, fp in zip(mg, fg):
                        if mp_ is p:
                            s = o.optimizer.state[fp]
                            e["range"] = (0, p.numel())
                            e["states"] = {"param": fp.detach().float().clone().view(-1),
                                           "exp_avg": s["exp_avg"].detach().float().clone().view(-1),
                                           "exp_avg_sq": s["exp_avg_sq"].detach().float().clone().view(-1)}
        out.append(e)
    return out


def full_states(es, numel):
    """Per (ep, tp) rank of one parameter: the weight and the three states, each covered exactly once."""
    per = {}
    for e in es:
        d = per.setdefault((e["ep"], e["tp"]), {"weight": e["weight"], "fp32": None, "exp_avg": None, "exp_avg_sq": None})
        if "range" in e:
            for k, src in (("fp32", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                if d[k] is None:
                    d[k] = torch.full((numel,), float("nan"))
                lo, hi = e["range"]
                d[k][lo:hi] = e["states"][src]
    return per


def merge_grouped(es, c, fmt):
    """GroupedMLP weight1 / weight2 of every (ep, expert-tp) rank -> the TP = EP = 1 tensor (torch) or the
    per-expert SequentialMLP tensors (torch_dist); name -> {state: tensor}."""
    H, E, F, ep = c["H"], c["E"], c["F"], c["ep"]
    t, nle, G = c.get("etp", c["tp"]), c["E"] // c["ep"], 2
    w1 = es[0]["name"].endswith("weight1")
    per = full_states(es, es[0]["weight"].numel())
    out = {}
    for k in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
        blocks = []
        for e in range(ep):
            ranks = []
            for r in range(t):
                v = per[(e, r)][k]
                assert v is not None and not torch.isnan(v).any(), (es[0]["name"], k, e, r, "not covered")
                ranks.append(v.reshape(nle, H, G, F // t) if w1 else v.reshape(nle, F // t, H))
            blocks.append(torch.cat(ranks, dim=3 if w1 else 1))
        full = torch.cat(blocks, dim=0)  # [E, H, G, F] or [E, F, H]
        if fmt == "torch":
            out.setdefault(es[0]["name"], {})[k] = full.reshape(H, E * G * F) if w1 else full.reshape(E * F, H)
        else:
            base = es[0]["name"].rsplit(".", 1)[0]  # ...mlp.experts
            for g in range(E):
                if w1:
                    n, v = f"{base}.local_experts.{g}.linear_fc1.weight", full[g].reshape(H, G * F).t()
                else:
                    n, v = f"{base}.local_experts.{g}.linear_fc2.weight", full[g].t()
                out.setdefault(n, {})[k] = v.contiguous()
    return out


def grouped_pattern(name, c, fmt):
    """The pattern ucp gives a GroupedMLP tensor saved at the case's degrees (NOTES.md §4.1)."""
    t, ep, nle = c.get("etp", c["tp"]), c["ep"], c["E"] // c["ep"]
    if fmt != "torch":  # per expert, like SequentialMLP: fc1 gated halves, fc2 columns, over expert TP
        if t == 1:
            # fc1 is saved as two chunks (gate and up halves of 2t = 2), which ucp's classifier reads as a
            # whole tensor fed by several flat ranges (Shard-V, its ZeRO rule); fc2 as one.
            return "Shard-V" if name.endswith("linear_fc1.weight") else "Unique"
        return "Shard-NC" if name.endswith("linear_fc1.weight") else "Shard-H"
    if t == 1:
        if ep == 1:
            return "Unique"
        if name.endswith("weight2") or c["H"] % ep == 0:
            return "Shard-V"
        return "Shard-Hy"  # contiguous flat ranges that start and end inside rows
    if name.endswith("weight2") and nle == 1:
        return "Shard-V"
    return "Shard-NC"


def build(case, rank, world, save):
    """The CPU shims, gloo, Megatron's args for the case and its model (get_model): (DDP list, GPTModel, args)."""
    os.environ.update(CUDA_DEVICE_MAX_CONNECTIONS="1")
    torch.set_num_threads(1)
    import torch._dynamo as dynamo

    dynamo.config.disable = True  # jit_fuser is torch.compile, whose inductor needs a C++ compiler
    install_grouped_gemm()
    import megatron_dist_fixtures as mdf

    mdf.install_shims()
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # validate_args asks for >= 8 with grouped GEMM
    torch.cuda.is_available = lambda: False
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    c = CASES[case]
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe.experts import GroupedMLP
    from megatron.training.arguments import parse_args, validate_args, core_transformer_config_from_args
    from megatron.training.global_vars import set_args
    from megatron.training.training import get_model
    import megatron.training.arguments as marguments
    import megatron.training.global_vars as mglobal

    import warnings
    import megatron.core.model_parallel_config as mpc

    # core 0.15.3's ModelParallelConfig.__post_init__ warns about EP x TP without sequence parallelism
    # through a `warnings` it never imports (NameError): give the module its import.
    mpc.warnings = warnings
    import megatron.core.transformer.moe.moe_utils as moe_utils

    # core 0.15.3's router_gating_linear tests `te_general_gemm is not None`, a name bound only when
    # Transformer Engine imports: without TE it is unbound (NameError); None is what it means.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if hasattr(marguments, "get_device_arch_version"):
        marguments.get_device_arch_version = lambda: 9
    sys.argv = argv(case, save)
    args = parse_args()
    args.rank, args.world_size = rank, world
    validate_args(args, {})
    args.padded_vocab_size = 64  # vocab_utils: 50 padded to a multiple of 16 x TP 2
    set_args(args)
    mglobal._GLOBAL_TIMERS = None
    ps.initialize_model_parallel(c["tp"], 1, expert_model_parallel_size=c["ep"],
                                 expert_tensor_parallel_size=c.get("etp", c["tp"]))
    model_parallel_cuda_manual_seed(1234)
    torch.manual_seed(1234)  # as _set_random_seed: one seed on every TP / DP rank (PP 1)
    cfg = core_transformer_config_from_args(args)

    def provider(pre_process=True, post_process=True, vp_stage=None, **kw):
        spec = get_gpt_layer_local_spec(args.num_experts, moe_grouped_gemm=True, normalization=args.normalization)
        return GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                        max_sequence_length=SEQ, pre_process=pre_process, post_process=post_process,
                        share_embeddings_and_output_weights=False, position_embedding_type="rope",
                        rotary_percent=1.0, rotary_base=args.rotary_base)

    ddp = get_model(provider)
    model = ddp[0].module.module  # DDP(Float16Module(GPTModel))
    assert all(isinstance(l.mlp.experts, GroupedMLP) for l in model.decoder.layers), "no GroupedMLP experts"
    return ddp, model, args


def worker(rank, world, case, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo")
    c = CASES[case]
    ddp, model, args = build(case, rank, world, os.path.abspath(os.path.join(out, case, "checkpoint")))
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.training.checkpointing import save_checkpoint
    from megatron.training.training import get_optimizer_param_scheduler
    import megatron_dist_fixtures as mdf

    kwargs = {f: getattr(args, f) for f in OptimizerConfig.__dataclass_fields__ if hasattr(args, f)}
    ocfg = OptimizerConfig(**kwargs)
    opt = get_megatron_optimizer(ocfg, ddp, use_gloo_process_groups=args.enable_gloo_process_groups)
    sched = get_optimizer_param_scheduler(opt)
    tp_of = lambda n: ps.get_expert_tensor_parallel_rank() if ".mlp.experts." in n else ps.get_tensor_model_parallel_rank()
    for step in range(STEPS):
        ddp[0].zero_grad_buffer()
        for n, p in model.named_parameters():
            # Equal on the replicas of a parameter (DP, and TP for replicated ones); per (EP, expert-TP)
            # rank for experts, which every EP rank holds different ones of.
            split = getattr(p, "tensor_model_parallel", False)
            who = f"{tp_of(n) if split else -1}/{ps.get_expert_model_parallel_rank() if '.mlp.experts.' in n else -1}"
            g = torch.Generator().manual_seed(zlib.crc32(f"{global_name(model, n, 0)}/{step}/{who}".encode()))
            p.main_grad.copy_(torch.randn(p.shape, generator=g) * 0.1)
        ok, _, _ = opt.step()
        assert ok, "optimizer step skipped"
        sched.step(increment=1)
    # GroupedMLP's own forward (grouped_gemm.ops.gmm from the CPU shim) on the trained weights.
    model.eval()
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(7))
    pos = torch.arange(SEQ).unsqueeze(0)
    with torch.no_grad():
        logits = ddp[0](ids, pos, None).float()
    parts = [torch.empty_like(logits) for _ in range(c["tp"])]
    dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
    logits = torch.cat(parts, dim=-1)[..., :VOCAB]
    save_checkpoint(STEPS, ddp, opt, sched, 0)
    step = None
    for o in getattr(opt, "chained_optimizers", [opt]):
        # The step as the optimizer's own state_dict (what save_checkpoint stores) gives it: the
        # distributed optimizer moves torch AdamW's per-parameter step into its param groups.
        inner = o.state_dict()["optimizer"]
        for grp in inner["param_groups"]:
            step = grp.get("step", step)
        if step is None:
            for st in inner["state"].values():
                step = st.get("step", step)
    pieces = [None] * world
    dist.all_gather_object(pieces, local_truth(model, opt))
    if rank == 0:
        entries = [e for p in pieces for e in p]
        full = {}
        names = []
        for e in entries:
            if e["name"] not in names:
                names.append(e["name"])
        dense = [e for e in entries if not e["grouped"]]
        # merge keys dense TP ranks by "tp"; EP copies of dense parameters fill the same slots.
        for n, st in mdf.merge(dense, c["tp"]).items():
            full[n] = st
        pats = {n: st.pop("pattern") for n, st in full.items()}
        order = []
        for n in names:
            es = [e for e in entries if e["name"] == n]
            if es[0]["grouped"]:
                g = merge_grouped(es, c, c["fmt"])
                full.update(g)
                for gn in g:
                    pats[gn] = grouped_pattern(gn, c, c["fmt"])
                order += list(g)
            else:
                order.append(n)
        if c["fmt"] == "torch_dist":
            # The dist reader orders a layer's experts together (every expert's fc1, fc2 in turn).
            def key(n):
                i = order.index(n)
                if ".local_experts." in n:
                    pre, rest = n.split(".local_experts.")
                    g, tail = rest.split(".", 1)
                    first = min(order.index(m) for m in order if m.startswith(pre + ".local_experts."))
                    return (first, int(g), tail)
                return (i, -1, "")
            order = sorted(order, key=key)
            # Names stay the live module's: the saved args record transformer_impl 'local', from which
            # ucp names the norms as the model does (the dist README's `_local` rule).
        etp = c.get("etp", c["tp"])
        truth = {"param_names": order, "vocab_size": VOCAB, "padded_vocab_size": args.padded_vocab_size,
                 "step": step, "patterns": pats, "buffers": {}, "logits": logits, "ids": ids,
                 "degrees": dict(tp=c["tp"], pp=1, dp=c["dp"], ep=c["ep"], etp=etp),
                 "dtype": "bf16", "ckpt_format": c["fmt"],
                 "sharding": "fully_reshardable" if c["fmt"] == "torch_dist" else None,
                 "meta": dict(case=case, hidden=c["H"], experts=c["E"], moe_ffn=c["F"], tp=c["tp"], ep=c["ep"],
                              etp=etp, dp=c["dp"], distopt=c["distopt"], ckpt_format=c["fmt"],
                              megatron_core=mdf.core_version(os.path.join(os.path.dirname(os.path.abspath(__file__)), "src")))}
        for k in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
            truth[k] = {n: st[k].contiguous() for n, st in full.items()}
        torch.save(truth, os.path.join(out, case, "truth.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    src, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(CASES)
    sys.path.insert(0, os.path.abspath(src))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import megatron_dist_fixtures as mdf

    version = mdf.core_version(src)
    if os.environ.get("UCP_ONE_CASE"):
        c = CASES[names[0]]
        world = c["tp"] * c["dp"]
        mp.spawn(worker, args=(world, names[0], out, 29700 + list(CASES).index(names[0])), nprocs=world, join=True)
        return
    failed = []
    for name in names:
        final = os.path.join(out, f"core{version}_{name}")
        for attempt in range(3):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
            try:
                r = subprocess.run([sys.executable, __file__, src, out, name], env=dict(os.environ, UCP_ONE_CASE="1"),
                                   timeout=int(os.environ.get("UCP_CASE_TIMEOUT", "400")), start_new_session=True)
                if r.returncode == 0:
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(os.path.join(out, name), final)
                    print("wrote", final, flush=True)
                    break
                print(f"{name}: exit {r.returncode}, attempt {attempt + 1}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{name}: timed out, attempt {attempt + 1}", flush=True)
        else:
            failed.append(name)
    if failed:
        sys.exit(f"failed 3 times: {failed}")


if __name__ == "__main__":
    main()
