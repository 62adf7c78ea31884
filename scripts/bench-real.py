#!/usr/bin/python3
"""The real-engine benchmark checkpoint (make bench with UCP_BENCH_REAL=DIR).

    /usr/bin/python3 scripts/bench-real.py --ds-src /path/to/DeepSpeed-v0.14.5 --out /work/scratch/bench-real

DeepSpeed's own engine (v0.14.5 source tree run in place on CPU, Debian's torch 1.13, gloo; the environment of
testdata/check/deepspeed_engine.py, whose setup is imported, not copied) builds a GPT-like model of 255M
parameters (vocabulary 50257, hidden 1024, 16 layers, ffn 4096, tied embeddings), trains it for one AdamW step
with ZeRO-2 and bf16 at DP 2 and saves it: about 3.6 GB (bf16 model states, fp32 master partitions, Adam
moments). About a minute and 10 GB of RAM. The output folder is refused if it exists.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testdata", "check"))
import deepspeed_engine as dse  # noqa: E402  (setup_deepspeed, free_port)

VOCAB, HIDDEN, LAYERS, FFN, HEADS, SEQ, DP = 50257, 1024, 16, 4096, 16, 64, 2


def gpt():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.fc1, self.fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
            a = a.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, s, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
            self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(HIDDEN)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            logits = (self.ln_f(x) @ self.wte.weight.t()).float()  # tied output layer
            return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    torch.manual_seed(1234)
    return GPT()


def rank_main(args):
    import torch
    import torch.distributed as dist
    deepspeed = dse.setup_deepspeed(args.ds_src)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    model = gpt()
    cfg = dse.ds_config(2, "bf16", False)
    cfg["train_micro_batch_size_per_gpu"] = 1
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(rank))
    loss = eng(ids)
    eng.backward(loss)
    eng.step()
    eng.save_checkpoint(args.out, tag="global_step1")
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"saved {args.out}/global_step1: {n} parameters, loss {loss.item():.4f}", flush=True)
    dist.barrier()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ds-src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank-main", action="store_true")
    args = ap.parse_args()
    args.ds_src, args.out = os.path.abspath(args.ds_src), os.path.abspath(args.out)
    if args.rank_main:
        return rank_main(args)
    if os.path.exists(args.out):
        sys.exit(f"{args.out}: exists; remove it or name another folder")
    port = str(dse.free_port())
    procs = []
    for r in range(DP):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(DP), LOCAL_WORLD_SIZE=str(DP),
                   LOCAL_SIZE=str(DP), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu",
                   DS_BUILD_OPS="0", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank-main", "--ds-src",
                                       args.ds_src, "--out", args.out], env=env))
    bad = [p.wait() for p in procs]
    if any(bad):
        sys.exit(f"bench-real: a rank failed ({bad})")


if __name__ == "__main__":
    main()
