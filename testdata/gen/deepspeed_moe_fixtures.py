#!/usr/bin/python3
"""Real DeepSpeed-MoE checkpoints with expert parallelism (testdata/fixtures/deepspeed-moe).

    /usr/bin/python3 testdata/gen/deepspeed_moe_fixtures.py --ds-src /path/to/DeepSpeed-v0.14.5 [--case NAME]

DeepSpeed v0.14.5's own engine trains TinyMoE (two blocks whose MLP is `deepspeed.moe.layer.MoE`, 6 experts,
top-2) for 3 AdamW steps on CPU (gloo, one process per rank, Debian's torch 1.13; the launcher, gloo wrappers
and source set-up are testdata/check/deepspeed_engine.py's, per the deepspeed-on-cpu recipe) with the optimizer
groups DeepSpeed's `split_params_into_different_moe_groups_for_optimizer` makes, and saves with
`engine.save_checkpoint`. Every rank then writes the full state of the parameters it holds, gathered with
DeepSpeed's own safe_get_full_fp32_param / safe_get_full_optimizer_state (an expert's moments are gathered over
its expert-data-parallel group), its local expert names renamed to the global ones DeepSpeed's expert files use
(global = expert-parallel rank * local experts + local); the driver merges them into truth.pt. Nothing from
DeepSpeed is copied into this repository.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "check"))
import deepspeed_engine as dse  # noqa: E402

OUT = os.path.normpath(os.path.join(HERE, "..", "fixtures", "deepspeed-moe"))

# name: (world size, expert-parallel size, zero stage, dtype)
CASES = {
    "moe_ep2_edp2_z2_fp32": (4, 2, 2, "fp32"),
    "moe_ep2_edp1_z1_bf16": (2, 2, 1, "bf16"),
}
EXPERTS, TOPK = 6, 2


def tiny_moe(deepspeed, ep):
    import torch
    import torch.nn as nn
    from deepspeed.moe.layer import MoE

    class Expert(nn.Module):
        def __init__(self, h, f):
            super().__init__()
            self.fc1 = nn.Linear(h, f)
            self.fc2 = nn.Linear(f, h)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, h, f):
            super().__init__()
            self.ln = nn.LayerNorm(h)
            self.moe = MoE(h, Expert(h, f), num_experts=EXPERTS, ep_size=ep, k=TOPK, capacity_factor=2.0,
                           min_capacity=8)

        def forward(self, x):
            y, aux, _ = self.moe(self.ln(x))
            return x + y, aux

    class TinyMoE(nn.Module):
        # An expert holds 333 elements: the expert group (6 of them per rank) and the dense one are padded.
        def __init__(self, vocab=37, hidden=11, ffn=14, seq=7):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList([Block(hidden, ffn) for _ in range(2)])
            self.ln_f = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, ids):
            x = self.embed(ids)
            aux = 0
            for b in self.blocks:
                x, a = b(x)
                aux = aux + a
            logits = self.head(self.ln_f(x)).float()
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1)) + 0.01 * aux.float()

    torch.manual_seed(1234)
    m = TinyMoE()
    # Distinct values per expert (MoE deep-copies one expert), seeded by the global expert number.
    from deepspeed.utils import groups
    for bi, blk in enumerate(m.blocks):
        ep_rank = groups._get_expert_parallel_rank(blk.moe.expert_group_name)
        nl = blk.moe.num_local_experts
        for local, e in enumerate(blk.moe.deepspeed_moe.experts.deepspeed_experts):
            g = torch.Generator().manual_seed(100 * bi + ep_rank * nl + local)
            for p in e.parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def wrap_all_to_all():
    """torch 1.13's gloo has no 16-bit all_to_all either: bf16 travels as fp32 (exact), as in dse.wrap_gloo."""
    import torch
    import torch.distributed as dist
    orig = dist.all_to_all_single

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        if input.dtype not in (torch.bfloat16, torch.float16):
            return orig(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
        w = torch.empty_like(output, dtype=torch.float32)
        orig(w, input.float(), output_split_sizes, input_split_sizes, group=group)
        output.copy_(w)
        return None

    dist.all_to_all_single = all_to_all_single


def global_name(model, name):
    """The name DeepSpeed's expert files give a local expert parameter."""
    from deepspeed.utils import groups
    marker = ".deepspeed_moe.experts.deepspeed_experts."
    if marker not in name:
        return name
    head, tail = name.split(marker)
    local, rest = tail.split(".", 1)
    mod = model.get_submodule(head)
    ep_rank = groups._get_expert_parallel_rank(mod.expert_group_name)
    return f"{head}{marker}{ep_rank * mod.num_local_experts + int(local)}.{rest}"


def rank_main(args):
    import torch
    import torch.distributed as dist
    deepspeed = dse.setup_deepspeed(args.ds_src)
    wrap_all_to_all()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    world, ep, stage, dtype = CASES[args.case]
    from deepspeed.utils import groups
    groups._create_expert_and_data_parallel(ep)  # MoE() creates them on first use in the engine; the seed needs them
    model = tiny_moe(deepspeed, ep)
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    params = split_params_into_different_moe_groups_for_optimizer(
        {"params": [p for p in model.parameters()], "name": "dense"})
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=params,
                                        config=dse.ds_config(stage, dtype, False))
    for step in range(3):
        loss = eng(dse.batch(step, rank))
        eng.backward(loss)
        eng.step()
    eng.save_checkpoint(args.ckpt, tag="global_step3")
    dse.relink(eng)
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    st = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}, "lp": {}, "shapes": {}}
    for name, p in eng.module.named_parameters():
        g = global_name(eng.module, name)
        st["fp32"][g] = safe_get_full_fp32_param(p).detach().clone().float()
        for k in ("exp_avg", "exp_avg_sq"):
            st[k][g] = safe_get_full_optimizer_state(p, k).detach().clone().float()
        st["lp"][g] = p.detach().clone()
        st["shapes"][g] = list(p.shape)
    opt = eng.optimizer
    st["step"] = opt.optimizer.state[opt.optimizer.param_groups[0]["params"][0]]["step"]
    st["meta"] = {"world": world, "ep": ep, "expert_dp": world // ep, "stage": stage, "dtype": dtype,
                  "experts": EXPERTS, "topk": TOPK, "ds_version": deepspeed.__version__,
                  "torch": torch.__version__, "rank": rank,
                  "ep_rank": groups._get_expert_parallel_rank(f"ep_size_{ep}"),
                  "expert_dp_rank": groups._get_expert_data_parallel_rank(f"ep_size_{ep}")}
    torch.save(st, os.path.join(args.work, f"truth_rank{rank}.pt"))
    dist.barrier()


def launch(args, case):
    world = CASES[case][0]
    port = str(dse.free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   LOCAL_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu",
                   DS_BUILD_OPS="0", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--ds-src", args.ds_src, "--case", case,
               "--ckpt", args.ckpt, "--work", args.work]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    ok, outs = True, []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=600)  # watchdog: a vanished peer must not block forever
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out = "timed out"
        outs.append(out)
        ok = ok and p.returncode == 0
    return ok, outs


def merge(work, world, dst):
    """truth.pt: every parameter once; replicated copies (dense parameters on every rank, an expert on every
    rank of its expert-data-parallel group) must agree bit for bit."""
    import torch
    truth = None
    for r in range(world):
        st = torch.load(os.path.join(work, f"truth_rank{r}.pt"))
        if truth is None:
            truth = {k: {} for k in ("fp32", "exp_avg", "exp_avg_sq", "lp", "shapes")}
            truth["step"], truth["meta"], truth["ranks"] = st["step"], dict(st["meta"]), {}
            del truth["meta"]["rank"], truth["meta"]["ep_rank"], truth["meta"]["expert_dp_rank"]
        truth["ranks"][r] = (st["meta"]["ep_rank"], st["meta"]["expert_dp_rank"])
        for k in ("fp32", "exp_avg", "exp_avg_sq", "lp", "shapes"):
            for n, t in st[k].items():
                if n in truth[k]:
                    same = t == truth[k][n] if k == "shapes" else torch.equal(t, truth[k][n])
                    if not same:
                        raise SystemExit(f"rank {r}: {k} of {n} differs from another rank's copy")
                else:
                    truth[k][n] = t
    truth["param_names"] = sorted(truth["fp32"])
    torch.save(truth, dst)
    return truth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-src", required=True)
    ap.add_argument("--case", action="append")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--rank-main", action="store_true")
    ap.add_argument("--ckpt")
    ap.add_argument("--work")
    args = ap.parse_args()
    args.ds_src = os.path.abspath(args.ds_src)
    if args.rank_main:
        args.case = args.case[0]
        return rank_main(args)
    for case in args.case or list(CASES):
        d = os.path.join(args.out, case)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        args.ckpt, args.work = os.path.join(d, "checkpoint"), os.path.join(d, "work")
        os.makedirs(args.work)
        ok, outs = launch(args, case)
        if not ok:
            print(f"FAIL {case}:\n" + "\n".join(o[-4000:] for o in outs))
            sys.exit(1)
        truth = merge(args.work, CASES[case][0], os.path.join(d, "truth.pt"))
        shutil.rmtree(args.work)
        for f in ("zero_to_fp32.py",):
            p = os.path.join(args.ckpt, f)
            if os.path.exists(p):
                os.remove(p)  # DeepSpeed copies its recovery script into the save folder: source, not data
        world, ep, stage, dtype = CASES[case]
        with open(os.path.join(d, "ds_config.json"), "w") as f:
            json.dump(dse.ds_config(stage, dtype, False), f, indent=1)
        print(f"ok {case}: {len(truth['fp32'])} parameters, ranks (ep, expert-dp) {truth['ranks']}")


if __name__ == "__main__":
    main()
