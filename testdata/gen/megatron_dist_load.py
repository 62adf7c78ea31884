"""Real megatron-core loads what `ucp reshard --to megatron` wrote (--ckpt-format torch_dist, or torch)
at the written degrees with its own training-loop load, and must give the source fixture's live truth
bit for bit, then train a step.

    python3 megatron_dist_load.py MEGATRON_SRC CASE_DIR CASE TP PP DP [SHARDING [EP]]

CASE_DIR holds `written/` (ucp's save folder) and the source fixture's `truth.pt`; CASE is the
source's generator case (megatron_dist_fixtures.CASES: the model geometry). Each of TP·PP·DP ranks
(gloo, one process each) builds the fixture's GPTModel with Megatron's DDP and optimizer at the new
degrees (EP: the expert-parallel size of an MoE case, default the case's; UCP_ETP: the expert
tensor-parallel size, default TP), every parameter and optimizer state NaN first, then loads with
Megatron's own `megatron.training.checkpointing.load_checkpoint` (megatron_load): the args are a
pretrain_gpt.py command line at the load degrees parsed and validated by Megatron's parse_args and
validate_args (`--ckpt-format`, `--use-distributed-optimizer`, `--no-load-rng`: ucp writes no rng
state), so load_checkpoint reads the tracker and common state, checks the args, builds the sharded
state dicts from the checkpoint's own `content_metadata` (SHARDING; a ChainedOptimizer's key prefix),
loads, and calls the model's (strict: a failing strict load fails the check) and the optimizer's
load_state_dict; the iteration it returns must be the source's.
SHARDING: torch_dist's fully_reshardable (default) or dp_reshardable; with UCP_CKPT_FORMAT=torch (a
legacy save, mp_rank_* files) "distributed" (distrib_optim.pt, Megatron's load_parameter_state) or
"plain" (Megatron's non-distributed optimizer inside model_optim_rng.pt). Bucket layouts
(dp_reshardable, distrib_optim.pt) wrap a bf16 model in Float16Module as pretrain_gpt.py wraps it, so
that DDP builds the buffers of a training run. UCP_DIRECT=1 (and UCP_OWN=1, Megatron's own fixture,
saved outside the training loop without content_metadata) takes load_checkpoint's torch_dist steps one
by one instead (direct_load): the load-time rounds of scripts/megatron-check.sh time both checkpoints so.
The live model and the optimizer's fp32 main parameters and Adam moments are gathered over every rank
(the fixture generator's local_truth/merge; routed experts over the expert-TP group) and compared with
truth.pt: states exactly, weights with the truth's fp32 cast to the dtype ucp saved (the training dtype,
as a Float16Module holds every parameter) and back. Then one optimizer step on seeded gradients must
succeed. Prints "ok ..." and exits 0 on success.
Run inside the torch 2.6 chroot by scripts/megatron-check.sh.
"""
import os
import statistics
import sys
import time

src, case_dir, case_name = sys.argv[1], sys.argv[2], sys.argv[3]
TP, PP, DP = (int(x) for x in sys.argv[4:7])
SHARDING = sys.argv[7] if len(sys.argv) > 7 else "fully_reshardable"
EP = int(sys.argv[8]) if len(sys.argv) > 8 else None
VPP = int(os.environ.get("UCP_VPP", "0")) or None  # model chunks per stage (--vpp)
# Layers of the first and last pipeline stage (--decoder-first/last-pipeline-num-layers; 0: not set).
FIRST, LAST = (int(x) or None for x in os.environ.get("UCP_FIRST_LAST", "0,0").split(","))
# UCP_OWN=1: `written/` is the fixture's own checkpoint (the load-time baseline); its model weights
# are the live ones (fp32 norms of the unwrapped bf16 model), compared with truth weight directly.
OWN = os.environ.get("UCP_OWN") == "1"
# UCP_DIRECT=1 (and UCP_OWN=1): the steps of load_checkpoint taken one by one (direct_load), as the
# load-time rounds do for both checkpoints; otherwise Megatron's own load_checkpoint (megatron_load).
DIRECT = os.environ.get("UCP_DIRECT") == "1"
# UCP_CKPT_FORMAT=torch: `written/` is a legacy --ckpt-format torch save (mp_rank_* files), loaded by
# load_checkpoint with --ckpt-format torch; SHARDING is then "distributed" (distrib_optim.pt beside each
# rank's file) or "plain" (Megatron's non-distributed optimizer inside model_optim_rng.pt).
FORMAT = os.environ.get("UCP_CKPT_FORMAT", "torch_dist")
ETP = int(os.environ.get("UCP_ETP", "0")) or None  # expert tensor-parallel size (default TP)
# UCP_TIME_ROUNDS=N: time Megatron's load of its own checkpoint against ucp's output, alternating
# (time_rounds; scripts/megatron-loadtime.sh).
TIME_ROUNDS = int(os.environ.get("UCP_TIME_ROUNDS", "0"))
STEPS = 2  # the fixtures' optimizer steps (megatron_dist_fixtures.STEPS)
sys.path.insert(0, src)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# cpu_shims/six.py: core 0.15's megatron.training imports `six`, which the torch 2.6 chroot lacks (last on
# the path: a real six wins).
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_shims"))
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import megatron_dist_fixtures as gen


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      USE_LIBUV="0", GLOO_SOCKET_IFNAME="lo", LOCAL_RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    gen.install_shims()
    gen.patch_dcp_load()
    gen.patch_torch_adam_step()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing

    case = dict(gen.CASES[case_name])
    # Bucket layouts (dp_reshardable, the legacy distrib_optim.pt) need DDP's buffers as a training run
    # builds them: a bf16 model wrapped in Float16Module as pretrain_gpt.py wraps it.
    buckets = SHARDING == "dp_reshardable" or FORMAT == "torch"
    case.update(tp=TP, pp=PP, dp=DP, vpp=VPP, first=FIRST, last=LAST, f16module=case.get("f16module") or buckets and not OWN,
                distopt=SHARDING != "plain")
    if ETP:
        case.update(etp=ETP)
    # The vocabulary as a run at TP pads it (ucp writes that padding, zeros).
    case["geom"] = dict(case.get("geom", {}), padded_vocab=gen.padded_vocab(TP))
    if EP is not None:
        case.update(ep=EP)
    cfg, ddp, model, opt = gen.build(case, rank, world)
    from megatron.core import parallel_state as ps

    if case.get("experts"):  # the run really has the expert degrees asked for
        got = (ps.get_expert_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size())
        if got != (case["ep"], ETP or TP):
            sys.exit(f"FAIL {case_dir}: built with EP, expert TP {got}, want {(case['ep'], ETP or TP)}")
    if TIME_ROUNDS:
        n, bad = time_rounds(rank, world, case, model, opt)
    else:
        gen.nan_before_load(model, opt)
        save = os.path.join(case_dir, "written")
        t0 = time.time()
        if DIRECT or OWN:
            direct_load(model, opt, iteration_dir(save), OWN)
        else:
            iteration = megatron_load(case, gen.chunks(ddp), opt, save, world)
            if iteration != STEPS:
                sys.exit(f"FAIL {case_dir}: load_checkpoint returned iteration {iteration}, want {STEPS}")
        load_s = time.time() - t0
        n, bad = compare(rank, world, case, model, opt, OWN)
    flag = torch.tensor([len(bad)])
    dist.broadcast(flag, 0)
    if flag.item() == 0:
        gen.synthetic_step(ddp, model, opt, 99)
        dist.barrier()
    if rank == 0:
        if bad:
            print("FAIL", case_dir, *bad[:20], sep="\n  ")
        else:
            uneven = f" (first, last stage layers {FIRST}, {LAST})" if FIRST or LAST else ""
            print(f"ok {case_dir}: core {gen.core_version(src)} loaded at TP {TP} PP {PP}{f' VPP {VPP}' if VPP else ''} DP {DP} EP {case.get('ep', 1)}{f' expert-TP {ETP}' if ETP else ''}{uneven}: "
                  f"{n} tensors equal to the truth ({FORMAT} {SHARDING}, {'dist_checkpointing.load' if DIRECT or OWN or TIME_ROUNDS else 'load_checkpoint'}), "
                  f"one training step taken{' (cpu_shims FusedAdam)' if os.environ.get('UCP_FUSED_ADAM') == '1' else ''}"
                  f"{'' if TIME_ROUNDS else f'; load {load_s:.2f}s'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


def iteration_dir(save):
    """The iteration folder the tracker of save folder `save` names."""
    with open(os.path.join(save, "latest_checkpointed_iteration.txt")) as f:
        return os.path.join(save, "iter_%07d" % int(f.read()))


def compare(rank, world, case, model, opt, own):
    """Gathers the live model and optimizer states of every rank and compares them on rank 0 with the
    case's truth.pt; own: the load was of the fixture's own checkpoint (weights compared as the live
    run held them). Returns (tensors compared, differences) on rank 0, (0, []) elsewhere."""
    n = 0
    steps = gen.optimizer_steps(opt)
    pieces = [None] * world
    dist.all_gather_object(pieces, gen.local_truth(model, opt, not case.get("impl")))
    bufs = [None] * world  # the routers' expert_bias buffers (--moe-router-enable-expert-bias)
    dist.all_gather_object(bufs, gen.local_buffers(model, not case.get("impl")))
    bad = []
    if rank == 0:
        truth = torch.load(os.path.join(case_dir, "truth.pt"), weights_only=False)
        full = gen.merge([e for p in pieces for e in p], TP)
        saved_dt = torch.bfloat16 if case["dtype"] == "bf16" else torch.float32
        for name, st in full.items():
            for k in ("weight", "fp32", "exp_avg", "exp_avg_sq"):
                if name not in truth[k]:
                    bad.append(f"{name}: no truth {k}")
                    continue
                want = truth[k][name]
                if k == "weight" and not own:
                    want = truth["fp32"][name].to(saved_dt).float()
                got = st[k]  # merge() cuts the vocabulary to the true rows
                n += 1
                if got.shape != want.shape:
                    bad.append(f"{name} {k}: shape {list(got.shape)}, want {list(want.shape)}")
                elif not torch.equal(got, want):
                    # The fixtures' bf16 model is not wrapped in Float16Module: its norms live in fp32,
                    # the distributed optimizer's main params are views of them, and loading the
                    # optimizer overwrites this rank's owned range with the fp32 main values. ucp saves
                    # model tensors in the training dtype (as a Float16Module holds them), so there each
                    # element is either the truth's fp32 value or its bf16 rounding.
                    exact = truth["fp32"][name]
                    mixed = k == "weight" and not own and torch.equal(torch.where(got == exact, want, got), want)
                    if not mixed:
                        bad.append(f"{name} {k} differs")
        for name, want in truth.get("buffers", {}).items():
            got = [d[name] for d in bufs if name in d]  # every rank holding the layer: float32, exact
            n += 1
            if not got or any(g.dtype != torch.float32 or not torch.equal(g, want) for g in got):
                bad.append(f"{name}: buffer {[(g.dtype, g.tolist()) for g in got]}, want float32 {want.tolist()}")
        if steps != {float(STEPS)}:
            bad.append(f"optimizer steps after the load: {steps}, want {STEPS}")
        if len(full) != len(truth["fp32"]):
            bad.append(f"{len(full)} parameters loaded, truth has {len(truth['fp32'])}")
    return n, bad


def time_rounds(rank, world, case, model, opt):
    """UCP_TIME_ROUNDS=N: CASE_DIR holds own/written (Megatron's own checkpoint of the case) and
    ucp/written (ucp's output at the same degrees); both are loaded N times into the one built model,
    alternating (own, ucp, then ucp, own, ...: neither always goes first), each load the steps of
    load_checkpoint's torch_dist path (direct_load) after every value was set to NaN. Wall time is the
    slowest rank's, CPU time (time.process_time: every thread of the process) the sum over the ranks;
    both loads of the last round are compared with the truth. Rank 0 prints one line per load and the
    medians' ratio ucp/own."""
    its = {k: iteration_dir(os.path.join(case_dir, k, "written")) for k in ("own", "ucp")}
    times = {"own": [], "ucp": []}
    n, bad = 0, []
    for r in range(TIME_ROUNDS):
        for kind in ("own", "ucp") if r % 2 == 0 else ("ucp", "own"):
            gen.nan_before_load(model, opt)
            dist.barrier()
            w0, c0 = time.perf_counter(), time.process_time()
            direct_load(model, opt, its[kind], kind == "own")
            w, c = time.perf_counter() - w0, time.process_time() - c0
            got = [None] * world
            dist.all_gather_object(got, (w, c))
            wall, cpu = max(g[0] for g in got), sum(g[1] for g in got)
            times[kind].append((wall, cpu))
            if rank == 0:
                print(f"round {r + 1} {kind}: wall {wall:.3f}s, CPU {cpu:.3f}s", flush=True)
            if r == TIME_ROUNDS - 1:
                k, b = compare(rank, world, case, model, opt, kind == "own")
                n, bad = n + k, bad + [f"{kind}: {x}" for x in b]
    if rank == 0:
        med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in times.items()}
        print(f"load time, median of {TIME_ROUNDS} alternating loads each (TP {TP} DP {DP}, {world} ranks; wall: "
              f"slowest rank, CPU: all ranks): Megatron's own checkpoint {med['own'][0]:.3f}s wall "
              f"{med['own'][1]:.3f}s CPU, ucp's output {med['ucp'][0]:.3f}s wall {med['ucp'][1]:.3f}s CPU; "
              f"ratio ucp/own wall {med['ucp'][0] / med['own'][0]:.2f}, CPU {med['ucp'][1] / med['own'][1]:.2f}",
              flush=True)
    return n, bad


def megatron_args(case, world, save):
    """The case's pretrain_gpt.py command line at the load degrees, parsed and validated by Megatron's own
    parse_args/validate_args (megatron/training/arguments.py) and installed as the global args
    (set_global_variables, no tokenizer) that load_checkpoint reads."""
    import megatron.training.arguments as marguments
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_global_variables

    g = gen.geometry(case)
    argv = ["pretrain_gpt.py", "--num-layers", g["layers"], "--hidden-size", g["hidden"],
            "--num-attention-heads", g["heads"], "--group-query-attention", "--num-query-groups", g["groups"],
            "--kv-channels", g["kv"], "--ffn-hidden-size", g["ffn"], "--swiglu", "--disable-bias-linear",
            "--position-embedding-type", "rope", "--seq-length", gen.SEQ, "--max-position-embeddings", gen.SEQ,
            "--micro-batch-size", 1, "--lr", 1e-2, "--weight-decay", 0.01, "--transformer-impl", "local",
            "--use-cpu-initialization", "--no-gradient-accumulation-fusion", "--no-rope-fusion",
            "--no-bias-swiglu-fusion", "--no-masked-softmax-fusion", "--no-persist-layer-norm",
            "--hidden-dropout", 0, "--attention-dropout", 0, "--make-vocab-size-divisible-by", 32,
            "--tensor-model-parallel-size", TP, "--pipeline-model-parallel-size", PP,
            "--ckpt-format", FORMAT, "--load", save,
            # ucp writes no rng state (DISTWRITE.md): a resume at new degrees does not load one either.
            "--no-load-rng"]
    if case["distopt"]:
        argv += ["--use-distributed-optimizer"]
    if not case["tied"]:
        argv += ["--untie-embeddings-and-output-weights"]
    if case["dtype"] == "bf16":
        argv += ["--bf16"]
    if VPP:
        argv += ["--num-virtual-stages-per-pipeline-rank", VPP]
    if FIRST:
        argv += ["--decoder-first-pipeline-num-layers", FIRST]
    if LAST:
        argv += ["--decoder-last-pipeline-num-layers", LAST]
    for k, v in case.get("cfg", {}).items():  # the case's TransformerConfig extras, as the flags that set them
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [v])
    if case.get("experts"):
        argv += ["--num-experts", case["experts"], "--moe-router-topk", 2, "--moe-ffn-hidden-size", g["ffn"],
                 "--expert-model-parallel-size", case.get("ep", 1), "--moe-token-dispatcher-type", "allgather",
                 "--expert-tensor-parallel-size", case.get("etp") or TP]
    sys.argv = [str(a) for a in argv]
    marguments.get_device_arch_version = lambda: 9  # no GPU to ask; picks only which performance note applies
    args = parse_args()
    validate_args(args, {})
    set_global_variables(args, build_tokenizer=False)
    return args


def megatron_load(case, ddps, opt, save, world):
    """Megatron's own load_checkpoint (megatron/training/checkpointing.py) of `save` into the DDP model
    chunks and the optimizer, with the args a pretrain_gpt.py run at the load degrees parses: it reads the
    tracker and the common state, checks the args, builds the sharded state dicts from the checkpoint's
    content_metadata (sharding type; chained-optimizer key prefix), dist_checkpointing.load, then the
    model's and the optimizer's load_state_dict. Returns the iteration it loaded."""
    megatron_args(case, world, save)
    return gen.load_checkpoint_strict(ddps, opt, case_dir)


def direct_load(model, opt, it, own):
    """The steps of load_checkpoint's torch_dist path, taken one by one (the load-time rounds, where
    Megatron's own fixture has no content_metadata: it was saved outside the training loop)."""
    from megatron.core import dist_checkpointing
    # The training loop's load takes the metadata the checkpoint was saved with (content_metadata);
    # the fixtures themselves (UCP_OWN) were saved without it, as before core 0.13.
    meta = dist_checkpointing.load_content_metadata(it)
    if meta is None and own:
        meta = {"distrib_optim_sharding_type": SHARDING}
    if meta is None or meta.get("distrib_optim_sharding_type") != SHARDING:
        sys.exit(f"FAIL {case_dir}: content_metadata {meta}, want distrib_optim_sharding_type {SHARDING}")
    from megatron.core import parallel_state as ps

    meta = dict(meta, dp_cp_group=ps.get_data_parallel_group(with_context_parallel=True))
    # Model chunks under 'model0', 'model1', ... with a virtual pipeline, as the training loop's
    # generate_state_dict names them (megatron/training/checkpointing.py, core_v0.19.0).
    ms = gen.chunks(model)
    keys = [f"model{i}" for i in range(len(ms))] if VPP else ["model"]
    state = {k: m.sharded_state_dict(metadata=meta) for k, m in zip(keys, ms)}
    state["optimizer"] = opt.sharded_state_dict(dict(state) if VPP else state["model"], is_loading=True, metadata=meta)
    loaded = dist_checkpointing.load(state, it)
    for k, m in zip(keys, ms):
        m.load_state_dict(loaded[k])
    # core 0.19's load_parameter_state_from_dp_reshardable lacks the @torch.no_grad() of
    # load_parameter_state_from_fully_reshardable: with fp32 parameters (no Float16Module) the main
    # params are views of the model's, and its copy_ raises "a view of a leaf Variable that requires
    # grad is being used in an in-place operation"; Megatron's own fp32 dp_reshardable fixture
    # fails the same way (UCP_OWN=1). The load runs under no_grad, as the fully_reshardable one does.
    with torch.no_grad():
        opt.load_state_dict(loaded["optimizer"])


if __name__ == "__main__":
    world = TP * PP * DP
    mp.spawn(worker, args=(world, 29700 + os.getpid() % 200), nprocs=world, join=True)
