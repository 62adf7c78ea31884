"""Measures transport="ucp"'s CPU TCP ring between processes on one machine (issue 27: at least 1 GB/s), against
transport="torch" (gloo broadcasts) and a plain single-process load, on an atomic checkpoint:

    PYTHONPATH=python /usr/bin/python3 scripts/ring_bench.py ATOMIC [RANKS]

Each rank loads every fp32, exp_avg and exp_avg_sq tensor (TP 1) as one group; printed per transport: the
wall time of the load, and for "ucp" the ring's own rate (bytes received / seconds of the exchange phase,
which excludes the wait for this rank's reads).
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import ucp  # noqa: E402

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def worker(ck, rank, world, init):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for transport in ("ucp", "torch", "ucp"):
        dist.barrier()
        t = time.perf_counter()
        sd = ucp.load_state_dict(ck, states=STATES, group=dist.group.WORLD, transport=transport)
        wall = time.perf_counter() - t
        st = ucp.last_load_stats()
        size = sum(v.numel() * v.element_size() for d in sd.values() for v in d.values())
        ex = st["seconds"].get("exchange", 0)
        del sd
        ring = f", ring {st['bytes_received'] / ex / 1e9:.2f} GB/s received ({st['bytes_received'] / 1e9:.2f} GB in {ex:.2f} s of exchange)" if transport == "ucp" and ex else ""
        print(f"rank {rank}/{world} {transport:5s}: {size / 1e9:.2f} GB in {wall:.2f} s = {size / wall / 1e9:.2f} GB/s "
              f"(read {st['bytes_read'] / 1e9:.2f} GB){ring}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ck = sys.argv[1]
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    t = time.perf_counter()
    sd = ucp.load_state_dict(ck, states=STATES)
    wall = time.perf_counter() - t
    size = sum(v.numel() * v.element_size() for d in sd.values() for v in d.values())
    del sd
    print(f"one process, no group: {size / 1e9:.2f} GB in {wall:.2f} s = {size / wall / 1e9:.2f} GB/s", flush=True)
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "store")
        procs = [subprocess.Popen([sys.executable, __file__, ck, "--worker", str(r), str(world), init])
                 for r in range(world)]
        sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(sys.argv[1], int(sys.argv[i + 1]), int(sys.argv[i + 2]), sys.argv[i + 3])
    else:
        main()
