#!/usr/bin/python3
"""make bench: the Python load against its floor, in one process (torch import not counted).

    /usr/bin/python3 scripts/bench_load.py ATOMIC REPEAT

Alternates REPEAT times: the floor (every zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt read whole into a fresh
uint8 torch tensor with readinto) and ucp.load_state_dict(ATOMIC, states=(fp32, exp_avg, exp_avg_sq)); prints
the fastest of each in seconds and the process's peak RSS after each kind, as "floor S ucp S rss_floor B rss B".
"""
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ucp  # noqa: E402

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def floor(paths):
    out = []
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            t = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)
            f.readinto(memoryview(t.numpy()))
            out.append(t)
    return out


def main():
    atomic, repeat = sys.argv[1], int(sys.argv[2])
    zero = os.path.join(atomic, "zero")
    paths = [os.path.join(zero, d, s + ".pt") for d in sorted(os.listdir(zero))
             if os.path.isdir(os.path.join(zero, d)) for s in STATES if os.path.exists(os.path.join(zero, d, s + ".pt"))]
    best = {"floor": 1e9, "ucp": 1e9}
    rss = {}
    for _ in range(repeat):
        for kind in ("floor", "ucp"):
            t0 = time.perf_counter()
            got = floor(paths) if kind == "floor" else ucp.load_state_dict(atomic, states=STATES)
            best[kind] = min(best[kind], time.perf_counter() - t0)
            del got
            rss[kind] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"floor {best['floor']:.3f} ucp {best['ucp']:.3f} rss_floor {rss['floor']} rss {rss['ucp']}")


if __name__ == "__main__":
    main()
