"""GPU check of ucp's loader with torch (run by scripts/gpu-check.sh; needs torch with CUDA and a -tags cuda
libucp.so in UCP_LIBRARY).

    python3 scripts/gpu_check.py ATOMIC_DIR

Loads every state of ATOMIC_DIR into CUDA tensors with transport="ucp" on one rank (pinned host reads, one
copy to the device; then again through NCCL with UCP_FORCE_NCCL=1, and cast to bfloat16 on the host), checks
every tensor against a CPU load bit for bit, and prints GB/s for transport="ucp", for transport="torch" (CPU
load, then .to(device)) and for reading the files. With more than one GPU it repeats the "ucp" load as a group
of one process per GPU (gloo for the bootstrap, NCCL for the data).
"""

import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import ucp  # noqa: E402

CK = sys.argv[1]
STATES = ("fp32", "exp_avg", "exp_avg_sq")


def gbps(nbytes, secs):
    return f"{nbytes / secs / 1e9:6.2f} GB/s ({nbytes / 1e9:.2f} GB in {secs:.2f} s)"


def nbytes(sd):
    return sum(t.numel() * t.element_size() for d in sd.values() for t in d.values())


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                      b.reshape(-1).view(torch.uint8))


def files():
    t = time.perf_counter()
    n = 0
    for root, _, names in os.walk(CK):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while True:
                    b = f.read(64 << 20)
                    if not b:
                        break
                    n += len(b)
    return n, time.perf_counter() - t


def worker(rank, world, init):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ref = ucp.load_state_dict(CK, states=STATES)
    dist.barrier()
    got, secs = timed(lambda: ucp.load_state_dict(CK, states=STATES, device=f"cuda:{rank}", transport="ucp",
                                                 group=dist.group.WORLD))
    st = ucp.last_load_stats()
    bad = [n for s in STATES for n in ref[s] if not same(got[s][n].cpu(), ref[s][n])]
    print(f"GPUCHECK rank {rank}/{world}: ucp group load into cuda:{rank}: {gbps(nbytes(got), secs)}; "
          f"read {st['bytes_read'] / 1e9:.2f} GB, received {st['bytes_received'] / 1e9:.2f} GB; "
          f"{'all match' if not bad else 'MISMATCH ' + str(bad[:3])}; {st}", flush=True)
    dist.barrier()
    os._exit(1 if bad else 0)


def main():
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    n, secs = files()
    print(f"GPUCHECK read the files:                       {gbps(n, secs)}", flush=True)
    torch.cuda.init()
    ref, secs = timed(lambda: ucp.load_state_dict(CK, states=STATES))
    size = nbytes(ref)
    print(f"GPUCHECK CPU load (into host tensors):         {gbps(size, secs)}", flush=True)
    fails = 0
    runs = [("torch", "torch", {}, None), ("ucp", "ucp", {}, None), ("ucp (NCCL, 1 rank)", "ucp", {"UCP_FORCE_NCCL": "1"}, None),
            ("ucp bf16 (cast on host)", "ucp", {}, torch.bfloat16)]
    for name, transport, env, dtype in runs:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            got, secs = timed(lambda: ucp.load_state_dict(CK, states=STATES, device="cuda", transport=transport,
                                                         dtype=dtype))
        except ucp.UCPError as e:
            print(f"GPUCHECK {name}: FAILED: {e}", flush=True)
            fails += 1
            continue
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        st = ucp.last_load_stats()
        bad = []
        for s in STATES:
            for n, t in got[s].items():
                want = ref[s][n] if dtype is None or not ref[s][n].is_floating_point() else ref[s][n].to(dtype)
                if t.device.type != "cuda" or not same(t.cpu(), want):
                    bad.append(f"{s}/{n}")
        fails += bool(bad)
        print(f"GPUCHECK transport={name:26s} into CUDA: {gbps(nbytes(got), secs)}; "
              f"{'all ' + str(sum(len(d) for d in got.values())) + ' tensors match the CPU load' if not bad else 'MISMATCH ' + str(bad[:3])}"
              f"; phases {st['seconds']}", flush=True)
        del got
        torch.cuda.empty_cache()
    world = torch.cuda.device_count()
    if world > 1:
        with tempfile.TemporaryDirectory() as d:
            init = "file://" + os.path.join(d, "store")
            procs = [subprocess.Popen([sys.executable, __file__, CK, "--worker", str(r), str(world), init])
                     for r in range(world)]
            fails += sum(p.wait(timeout=200) != 0 for p in procs)
    else:
        print("GPUCHECK one GPU: the multi-rank NCCL load needs several GPUs (NCCL refuses two ranks on one GPU)",
              flush=True)
    print("GPUCHECK python: " + ("OK" if fails == 0 else f"{fails} FAILED"), flush=True)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        worker(int(sys.argv[i + 1]), int(sys.argv[i + 2]), sys.argv[i + 3])
    main()
