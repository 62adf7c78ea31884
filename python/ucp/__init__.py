"""ucp: load an atomic checkpoint into any parallelism at resume time, from PyTorch.

An atomic checkpoint (written by ``ucp convert`` from DeepSpeed, Megatron-LM or DCP checkpoints) holds one
consolidated float32 tensor per parameter and optimizer state. This package slices it for the rank that
calls it, reading only the bytes that rank needs, straight into the buffers of the torch tensors it returns
(the slicing and reading are ucp's Go loader, ``libucp.so``, called through ctypes). Its only dependency is
torch (1.13 or 2.x).

Example::

    import ucp
    ck = ucp.open("/ckpt/global_step1000_universal")
    print(ck.names[:3], ck.params[ck.names[0]].shape)
    sd = ucp.load_state_dict(ck, tp=2, tp_rank=0, states=("fp32", "exp_avg"), dtype=torch.bfloat16)
    ucp.load_into(model, optimizer, path="/ckpt/global_step1000_universal")

With ``group=`` a torch.distributed process group whose ranks need the same tensors (a data-parallel
group), each rank reads about 1/N of the bytes and the group exchanges the rest, layer by layer.
"""

import builtins
import collections
import ctypes
import hashlib
import json
import operator
import socket
import time
import os
import re
import sys

try:
    import torch
except ImportError as _e:  # say which interpreter lacks torch and what to do
    raise ModuleNotFoundError(
        f"ucp needs PyTorch, and this Python ({sys.executable}, {sys.version.split()[0]}) cannot import torch: "
        f"{_e}. Run ucp with a Python that has torch (on Debian: /usr/bin/python3 with the python3-torch "
        f"package), or install torch into this environment (pip install torch).", name="torch") from _e

from . import _lib
from ._lib import UCPError

__all__ = ["UCPError", "Checkpoint", "Param", "open", "load_state_dict", "load_zero_partition",
           "load_fsdp_chunk", "load_into", "last_load_stats", "LoadResult"]

Param = collections.namedtuple("Param", "name shape dtype pattern split_dims states frozen vocab_size padded_vocab_size")
Param.__doc__ = """One parameter of an atomic checkpoint (from its manifest): the full shape, the source dtype, how
the source sharded it (pattern: Unique, Replicate, Partial, Shard-V/H/Hy/NC; split_dims) and its states."""

LoadResult = collections.namedtuple("LoadResult", "missing_keys unexpected_keys")

_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_STORED = -1  # ucp_read: the state's own dtype (integer buffers such as num_batches_tracked)
STEP = "step"

TRANSPORTS = ("torch", "ucp")
DEFAULT_TIMEOUT = 60.0
MAX_RANKS = 1 << 20  # as libucp's load.MaxRanks: larger degrees are refused before anything is allocated

_stats = {"transport": None, "ranks": 1, "bytes_read": 0, "bytes_received": 0, "bytes_sent": 0, "seconds": {}}


def last_load_stats():
    """Returns how the last load of this process went: ``{"transport": "torch" or "ucp" (None without a
    group), "ranks": the group's size, "bytes_read": bytes read from storage by this rank, "bytes_received":
    bytes received from the other ranks of its group, "bytes_sent": bytes this rank sent, "seconds": {phase:
    seconds}}`` (phases: "agree", "read", "exchange", "total", and "connect" with transport="ucp").

    Example::

        ucp.load_state_dict(path, group=dp_group, transport="ucp")
        print(ucp.last_load_stats())   # {'transport': 'ucp', 'bytes_read': 1048576, 'bytes_received': ...}
    """
    out = dict(_stats)
    out["seconds"] = dict(_stats["seconds"])
    return out


def _only_ucperror(fn):
    """The training process sees UCPError only: ctypes' argument errors, integer overflows and failed
    allocations from bad sizes become UCPError naming the call (KeyboardInterrupt and the like pass)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UCPError:
            raise
        except (ctypes.ArgumentError, OverflowError, MemoryError, ValueError, TypeError, RuntimeError) as e:
            raise UCPError(f"{fn.__name__}: {type(e).__name__}: {e}") from e
    return wrapper


class Checkpoint:
    """An opened atomic checkpoint: what its manifest says, and a handle the loaders read through.

    Attributes: ``path``; ``names`` (parameter names in manifest order); ``params`` (name -> Param);
    ``source`` (the converted checkpoint's format, path, tag); ``degrees`` (its tp, pp, dp, ep, vpp, zero);
    ``model`` (for Megatron sources: heads, query_groups, vocab_divisor, which tensor-parallel targets
    must respect). Close it (or use it as a context manager) to release the handle.

    Example::

        with ucp.open("out/atomic") as ck:
            for name in ck.names:
                p = ck.params[name]
                print(name, p.shape, p.pattern, p.states)
    """

    def __init__(self, path, verify=False):
        self.path = os.fspath(path)
        self._h = _lib.Handle(self.path, verify)
        info = self._h.info()
        m = info["manifest"]
        self.source = {k: v for k, v in m["source"].items() if k != "degrees"}
        self.degrees = dict(m["source"]["degrees"])
        mod = info["model"]
        self.model = {"megatron": mod["Megatron"], "heads": mod["Heads"], "query_groups": mod["QueryGroups"],
                      "vocab_divisor": mod["VocabDivisor"]}
        self.params = collections.OrderedDict()
        for p in m["params"]:
            self.params[p["name"]] = Param(p["name"], tuple(p["shape"]), p["dtype"], p["pattern"],
                                           tuple(p.get("split_dims") or ()), tuple(f["state"] for f in p["files"]),
                                           bool(p.get("frozen")), p.get("vocab_size", 0), p.get("padded_vocab_size", 0))
        self.names = list(self.params)

    def close(self):
        """Releases the handle; the Checkpoint cannot load afterwards."""
        self._h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ucp.Checkpoint({self.path!r}, {len(self.names)} parameters, from {self.source.get('format')})"


def open(path, verify=False):  # noqa: A001 (ucp.open is the API the issue names)
    """Opens an atomic checkpoint folder (the one holding ``ucp.json``) and returns a :class:`Checkpoint`.

    ``verify=True`` checks each file's size and CRC-32 against the manifest before its first use.
    Raises :class:`UCPError` when ``path`` is not an atomic checkpoint.

    Example::

        ck = ucp.open("/ckpt/global_step1000_universal")
        ck.params["decoder.layers.0.mlp.linear_fc1.weight"].shape   # (32, 8)
    """
    return Checkpoint(path, verify)


class _Opened:
    """Accepts a path or a Checkpoint; closes only what it opened."""

    def __init__(self, ck):
        self.own = not isinstance(ck, Checkpoint)
        self.ck = Checkpoint(ck) if self.own else ck

    def __enter__(self):
        return self.ck

    def __exit__(self, *exc):
        if self.own:
            self.ck.close()


# One read: elements [start, start+count) of a shard (layout, n, rank) of a state into `out` (contiguous CPU).
_Req = collections.namedtuple("_Req", "param state layout n rank padded start count out")


def _dtype_code(dtype):
    if dtype is None:
        return torch.float32, 0
    if dtype in _DTYPES:
        return dtype, _DTYPES[dtype]
    if not dtype.is_floating_point:
        raise UCPError(f"cannot load into {dtype}: a floating-point dtype is needed")
    return torch.float32, 0  # read as float32, then cast by torch


def _out_dtype(ck, name, want):
    """The dtype a parameter loads in: its stored one when that is not floating point (integer and bool
    buffers, which the atomic checkpoint keeps as stored, as module.to(dtype) keeps them), else want."""
    stored = getattr(torch, ck.params[name].dtype or "float32", None)
    if isinstance(stored, torch.dtype) and not stored.is_floating_point and not stored.is_complex:
        return stored
    return want


def _cast(v, dtype):
    return v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v


_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def _layer(name):
    """The layer a parameter belongs to: its name up to the first number (decoder.layers.3), else itself."""
    m = _LAYER.match(name)
    return m.group(1) if m else name


def _bytes(t):
    return t.reshape(-1).view(torch.uint8)


def _global_rank(group, k):
    import torch.distributed as dist
    if group is None or group is dist.group.WORLD:
        return k
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, k)
    return dist.distributed_c10d._get_global_rank(group, k)


def _read_one(h, q):
    if q.out.device.type != "cpu":
        raise UCPError(f"{q.param}: reading into a {q.out.device} tensor needs transport='ucp' (internal error)")
    return h.read(q.param, q.state, q.layout, q.n, q.rank, q.padded, q.start, q.count,
                  _DTYPES.get(q.out.dtype, _STORED), q.out.data_ptr(), q.out.numel() * q.out.element_size())


def _digest(reqs):
    """A digest of what the requests ask for, without the destinations' addresses or devices."""
    h = hashlib.sha256()
    for q in reqs:
        h.update(f"{q.param}\0{q.state}\0{q.layout} {q.n} {q.rank} {q.padded or 0} {q.start} {q.count} "
                 f"{q.out.dtype}\n".encode())
    return h.hexdigest()


def _agree(group, args, reqs, extra=None):
    """Gathers every rank's request (its arguments and a digest of the tensors it asks for, plus extra, e.g.
    its ring address) and raises the same UCPError on every rank, naming the ranks and the arguments that
    differ, before anything moves. Returns every rank's extra."""
    import torch.distributed as dist
    mine = {"args": args, "digest": _digest(reqs), "tensors": len(reqs), "extra": extra}
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    odd = [k for k, r in enumerate(every) if (r["args"], r["digest"]) != (every[0]["args"], every[0]["digest"])]
    if odd:
        keys = sorted({k for r in every for k in r["args"]})
        diff = [k for k in keys if any(r["args"].get(k) != every[0]["args"].get(k) for r in every)]
        what = "; ".join(f"{k} (" + ", ".join(f"rank {i}: {r['args'].get(k)!r}" for i, r in enumerate(every)) + ")"
                         for k in diff)
        if not what:
            what = "the tensors asked for (" + ", ".join(
                f"rank {i}: {r['tensors']} tensors, digest {r['digest'][:12]}" for i, r in enumerate(every)) + ")"
        raise UCPError(f"the group's ranks asked for different tensors: ranks {odd} differ from rank 0 in {what}; "
                       f"every rank of a group must make the same call")
    return [r["extra"] for r in every]


def _ring_host():
    """An address of this machine the group's other ranks can reach: UCP_RING_HOST, else the interface that
    routes to MASTER_ADDR, else the host name's address, else loopback."""
    if os.environ.get("UCP_RING_HOST"):
        return os.environ["UCP_RING_HOST"]
    master = os.environ.get("MASTER_ADDR")
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.connect((master, 9))
                return u.getsockname()[0]
        except OSError:
            pass
    if master in ("localhost", "127.0.0.1"):
        return "127.0.0.1"
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    return "127.0.0.1"


def _check_transport(transport, timeout):
    if transport not in TRANSPORTS:
        raise UCPError(f"transport={transport!r}: use 'torch' (torch.distributed broadcasts) or 'ucp' (ucp's own ring)")
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        raise UCPError(f"timeout={timeout!r} must be a number of seconds") from None
    if not 0 < timeout <= 1e6:
        raise UCPError(f"timeout={timeout!r} must be a positive number of seconds")
    return timeout


def _run(ck, reqs, group, args, transport="torch", timeout=DEFAULT_TIMEOUT):
    """Reads every request into its output; with a group, the ranks first agree on the request, then each
    reads the requests Balance gives it and the others arrive from their owner, one layer at a time: through
    torch.distributed broadcasts (transport="torch") or ucp's own ring in Go (transport="ucp": straight into
    the outputs' memory, CPU or CUDA, Python only passes their addresses)."""
    t0 = time.perf_counter()
    read = recv = 0
    h = ck._h
    if group is None and transport == "ucp":
        return _run_ucp(ck, reqs, None, args, timeout, 1, 0, t0)
    if group is None:
        for q in reqs:
            read += _read_one(h, q)
        _stats.update(transport=None, ranks=1, bytes_read=read, bytes_received=0, bytes_sent=0,
                      seconds={"read": time.perf_counter() - t0, "total": time.perf_counter() - t0})
        return
    import torch.distributed as dist
    world, me = dist.get_world_size(group), dist.get_rank(group)
    if transport == "ucp":
        return _run_ucp(ck, reqs, group, args, timeout, world, me, t0)
    if any(q.out.device.type != "cpu" for q in reqs):
        raise UCPError("transport='torch' loads into CPU tensors (internal error)")
    _agree(group, args, reqs)
    t_agree = time.perf_counter() - t0
    owners = _lib.balance([q.count * q.out.element_size() for q in reqs], world)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    layers = collections.OrderedDict()
    for q, o in zip(reqs, owners):
        layers.setdefault(_layer(q.param), []).append((q, o))
    sent = 0
    for items in layers.values():
        for k in range(world):
            mine = [q for q, o in items if o == k]
            size = sum(q.out.numel() * q.out.element_size() for q in mine)
            if size == 0:
                continue
            if k == me:
                for q in mine:
                    read += _read_one(h, q)
                buf = torch.cat([_bytes(q.out) for q in mine]).to(device)
                dist.broadcast(buf, src=_global_rank(group, k), group=group)
                sent += size
                continue
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            dist.broadcast(buf, src=_global_rank(group, k), group=group)
            buf = buf.cpu()
            off = 0
            for q in mine:
                nb = q.out.numel() * q.out.element_size()
                _bytes(q.out).copy_(buf[off:off + nb])
                off += nb
            recv += size
    total = time.perf_counter() - t0
    _stats.update(transport="torch", ranks=world, bytes_read=read, bytes_received=recv, bytes_sent=sent,
                  seconds={"agree": t_agree, "exchange": total - t_agree, "total": total})


builtins_open = builtins.open  # ucp.open shadows open in this module


def _find_nccl():
    """The NCCL libucp opens: UCP_NCCL_LIBRARY, else the one this process already loaded (torch's), else ""
    (libucp then tries the system's libnccl.so.2)."""
    if os.environ.get("UCP_NCCL_LIBRARY"):
        return os.environ["UCP_NCCL_LIBRARY"]
    try:
        with builtins_open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libnccl.so" in path and os.path.exists(path):
                    return path
    except OSError:
        pass
    return ""


def _run_ucp(ck, reqs, group, args, timeout, world, me, t0):
    devices = {q.out.device for q in reqs}
    if len(devices) > 1:
        raise UCPError(f"transport='ucp' loads into one device per rank, not {sorted(map(str, devices))}")
    dev = devices.pop() if devices else torch.device("cpu")
    if dev.type not in ("cpu", "cuda"):
        raise UCPError(f"transport='ucp' loads into CPU or CUDA tensors, not {dev}")
    for q in reqs:
        if not q.out.is_contiguous():
            raise UCPError(f"{q.param}: transport='ucp' needs contiguous outputs (internal error)")
    listener, addr = _lib.listen("127.0.0.1" if group is None else _ring_host())
    try:
        addrs = [addr] if group is None else _agree(group, args, reqs, extra=addr)
    except BaseException:
        _lib.listener_close(listener)
        raise
    index = 0 if dev.type == "cpu" else (dev.index if dev.index is not None else torch.cuda.current_device())
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # the outputs' allocation is done before another stream writes them
    spec = {"rank": me, "world": world, "addrs": addrs, "timeout_s": timeout, "args": args,
            "device": -1 if dev.type == "cpu" else index,
            # Go reads its environment once, when libucp loads: pass what may be set later.
            "nccl_library": _find_nccl() if dev.type == "cuda" else "",
            "force_nccl": os.environ.get("UCP_FORCE_NCCL") == "1",
            "items": [{"param": q.param, "state": q.state, "layout": q.layout, "n": q.n, "rank": q.rank,
                       "padded": q.padded or 0, "start": q.start, "count": q.count,
                       "dtype": _DTYPES.get(q.out.dtype, _STORED)} for q in reqs]}
    ptrs = [q.out.data_ptr() for q in reqs]
    sizes = [q.out.numel() * q.out.element_size() for q in reqs]
    st, err = _lib.group_load(ck._h, listener, json.dumps(spec), ptrs, sizes)
    st = st or {}
    sec = dict(st.get("seconds") or {})
    sec["python"] = time.perf_counter() - t0 - sec.get("total", 0) - sec.get("connect", 0)
    _stats.update(transport="ucp", ranks=world, bytes_read=st.get("bytes_read", 0),
                  bytes_received=st.get("bytes_received", 0), bytes_sent=st.get("bytes_sent", 0), seconds=sec)
    if err is not None:
        raise err


def _args(fn, **kw):
    """The arguments every rank of a group must share, as JSON-able values (long name lists as a digest)."""
    out = {"fn": fn}
    for k, v in kw.items():
        if k == "params" and v is not None:
            v = list(v)
            if len(v) > 8:
                v = f"{len(v)} names, sha256 {hashlib.sha256(chr(0).join(v).encode()).hexdigest()[:12]}"
        elif isinstance(v, torch.dtype) or isinstance(v, torch.device):
            v = str(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return json.loads(json.dumps(out, default=str))


def _device(device, transport):
    """The device outputs are allocated on: CPU by default; a CUDA device needs transport='ucp' to land there
    directly (with 'torch' the tensors are loaded on CPU and moved)."""
    if device is None:
        return torch.device("cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UCPError(f"device={device!r}: {e}") from None
    if d.type not in ("cpu", "cuda"):
        raise UCPError(f"device={device!r}: ucp loads into CPU or CUDA tensors")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise UCPError(f"device={device!r}: this torch ({torch.__version__}) has no usable CUDA")
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _names(ck, params):
    if params is None:
        return list(ck.names)
    params = list(params)
    unknown = [p for p in params if p not in ck.params]
    if unknown:
        raise UCPError(f"{ck.path}: no parameter {unknown[0]!r} in the checkpoint "
                       f"({len(unknown)} unknown of {len(params)} asked; it has {len(ck.names)}, e.g. {ck.names[:3]})")
    return params


def _states(states):
    """The states argument as a tuple of names: a single string is one state ("fp32")."""
    if isinstance(states, str):
        return (states,)
    try:
        states = tuple(states)
    except TypeError:
        raise UCPError(f"states={states!r}: give a state name or a sequence of them, "
                       f"e.g. 'fp32' or ('fp32', 'exp_avg')") from None
    for s in states:
        if not isinstance(s, str):
            raise UCPError(f"states={states!r}: {s!r} is not a state name (a string such as 'fp32' or 'exp_avg')")
    return states


def _int_arg(fn, name, v):
    if isinstance(v, bool):
        raise UCPError(f"{fn}: {name}={v!r} must be an integer")
    try:
        return operator.index(v)
    except TypeError:
        raise UCPError(f"{fn}: {name}={v!r} must be an integer") from None


def _rank_args(fn, size_name, size, rank_name, rank):
    """Checks a (size, rank) pair such as tp/tp_rank and says which argument is wrong and why."""
    size, rank = _int_arg(fn, size_name, size), _int_arg(fn, rank_name, rank)
    if size < 1:
        raise UCPError(f"{fn}: {size_name}={size}: the number of ranks must be at least 1")
    if size > MAX_RANKS:
        raise UCPError(f"{fn}: {size_name}={size}: more than {MAX_RANKS} ranks is not a parallelism ucp can load")
    if not 0 <= rank < size:
        raise UCPError(f"{fn}: {rank_name}={rank} is out of range for {size_name}={size}: "
                       f"ranks are 0 to {size - 1}")
    return size, rank


def _check_states(ck, names, states):
    for n in names:
        for s in states:
            if s not in ck.params[n].states:
                raise UCPError(f"{ck.path}: parameter {n} has no state {s!r} (it has {', '.join(ck.params[n].states)})")


def _step_value(ck, name):
    kind, v = ck._h.step(name)
    if kind == _lib.STEP_NONE:
        raise UCPError(f"{ck.path}: parameter {name} has no step")
    if kind == _lib.STEP_INT:
        return int(v)
    if kind == _lib.STEP_TENSOR:
        return torch.tensor(v, dtype=torch.float32)
    return v


@_only_ucperror
def load_state_dict(path, tp=1, tp_rank=0, states=("fp32",), dtype=None, params=None, group=None,
                    padded_vocab_size=None, transport="torch", timeout=DEFAULT_TIMEOUT, device=None):
    """Loads every parameter's tensor-parallel slice for rank ``tp_rank`` of ``tp``, as the target framework
    shards it, and returns ``{state: {name: tensor}}`` (CPU tensors, filled in place by the reader).

    Column-parallel parameters are cut on dim 0 and row-parallel ones on dim 1 (torch.chunk), Megatron's
    fused QKV per query group, SwiGLU ``fc1`` as ``[gate_r; up_r]``, vocabulary parameters re-padded with
    zero rows for the target (Megatron's rule: a multiple of make_vocab_size_divisible_by x tp; or
    ``padded_vocab_size``); replicated parameters come whole. For Megatron sources ``tp`` must divide the
    heads, the query groups and every split dimension. ``dtype`` (default float32) casts on the way;
    bfloat16 and float16 round to nearest even exactly as torch; integer and bool buffers (int64
    ``num_batches_tracked``, position ids), which the atomic checkpoint keeps as stored, load in their own
    dtype, as ``module.to(dtype)`` leaves them. ``states`` may include ``"step"``, which
    gives each parameter's step (int, float or 0-dim tensor). ``params`` restricts the names. ``group``: a
    torch.distributed group whose ranks all make this same call: each reads about 1/N of the bytes; the
    ranks first compare their requests and all raise UCPError, naming the ranks and arguments that differ,
    when they are not the same. ``transport``: how the group exchanges what each read: ``"torch"``
    (default: torch.distributed broadcasts through Python) or ``"ucp"`` (ucp's own exchange in Go: a TCP
    ring writing straight into the tensors' memory, or with CUDA tensors and a ``-tags cuda`` libucp, pinned
    host reads, one copy to the device and NCCL; Python only exchanges the ring's addresses over
    ``group``). With ``"ucp"``, a rank that dies or a link that drops makes every other rank raise UCPError
    within ``timeout`` seconds (default 60). ``device``: where the tensors are allocated (default CPU); a
    CUDA device with ``transport="ucp"`` loads straight into device memory, with ``"torch"`` the tensors are
    loaded on CPU and moved.

    Example::

        sd = ucp.load_state_dict("out/atomic", tp=2, tp_rank=1, states=("fp32", "exp_avg", "exp_avg_sq"))
        model.load_state_dict(sd["fp32"])
    """
    tp, tp_rank = _rank_args("load_state_dict", "tp", tp, "tp_rank", tp_rank)
    states = _states(states)
    timeout = _check_transport(transport, timeout)
    if padded_vocab_size is not None:
        padded_vocab_size = _int_arg("load_state_dict", "padded_vocab_size", padded_vocab_size)
        if not 0 <= padded_vocab_size <= 1 << 40:
            raise UCPError(f"load_state_dict: padded_vocab_size={padded_vocab_size} is out of range")
    dev = _device(device, transport)
    alloc = dev if transport == "ucp" else torch.device("cpu")
    args = _args("load_state_dict", tp=tp, tp_rank=tp_rank, states=states, dtype=dtype, params=params,
                 padded_vocab_size=padded_vocab_size, transport=transport)
    with _Opened(path) as ck:
        names = _names(ck, params)
        _check_states(ck, names, states)
        want, code = _dtype_code(dtype)
        out, reqs = {}, []
        for s in states:
            if s == STEP:
                out[s] = {n: _step_value(ck, n) for n in names}
                continue
            out[s] = {}
            for n in names:
                shape = ck._h.shard_shape(n, s, _lib.LAYOUT_TP, tp, tp_rank, padded_vocab_size)
                t = torch.empty(shape, dtype=_out_dtype(ck, n, want), device=alloc)
                out[s][n] = t
                reqs.append(_Req(n, s, _lib.LAYOUT_TP, tp, tp_rank, padded_vocab_size, 0, t.numel(), t))
        _run(ck, reqs, group, args, transport, timeout)
        if dev != alloc:
            out = {s: {n: (v.to(dev) if torch.is_tensor(v) and s != STEP else v) for n, v in d.items()}
                   for s, d in out.items()}
        if dtype is not None and dtype not in _DTYPES:
            out = {s: {n: (_cast(v, dtype) if s != STEP else v) for n, v in d.items()} for s, d in out.items()}
        return out


@_only_ucperror
def load_fsdp_chunk(path, rank, world, states=("fp32",), dtype=None, params=None, group=None, transport="torch",
                    timeout=DEFAULT_TIMEOUT, device=None):
    """Loads rank ``rank`` of ``world``'s dim-0 chunk of every parameter, as FSDP2 / DTensor ``Shard(0)``
    splits a tensor (torch.chunk: the first ranks get ceil(rows/world) rows, the last may get fewer or
    none), and returns ``{state: {name: tensor}}``. ``dtype``, ``params``, ``group``, ``transport``,
    ``timeout`` and ``device`` as in :func:`load_state_dict`.

    Example::

        local = ucp.load_fsdp_chunk("out/atomic", rank=dist.get_rank(), world=dist.get_world_size())
    """
    world, rank = _rank_args("load_fsdp_chunk", "world", world, "rank", rank)
    states = _states(states)
    timeout = _check_transport(transport, timeout)
    dev = _device(device, transport)
    alloc = dev if transport == "ucp" else torch.device("cpu")
    args = _args("load_fsdp_chunk", rank=rank, world=world, states=states, dtype=dtype, params=params,
                 transport=transport)
    with _Opened(path) as ck:
        names = _names(ck, params)
        _check_states(ck, names, states)
        want, code = _dtype_code(dtype)
        out, reqs = {}, []
        for s in states:
            out[s] = {}
            for n in names:
                t = torch.empty(ck._h.shard_shape(n, s, _lib.LAYOUT_CHUNK, world, rank, 0), dtype=_out_dtype(ck, n, want),
                                device=alloc)
                out[s][n] = t
                reqs.append(_Req(n, s, _lib.LAYOUT_CHUNK, world, rank, 0, 0, t.numel(), t))
        _run(ck, reqs, group, args, transport, timeout)
        if dev != alloc:
            out = {s: {n: v.to(dev) for n, v in d.items()} for s, d in out.items()}
        if dtype is not None and dtype not in _DTYPES:
            out = {s: {n: _cast(v, dtype) for n, v in d.items()} for s, d in out.items()}
        return out


@_only_ucperror
def load_zero_partition(path, dp, dp_rank, stage, param_order, states=("fp32", "exp_avg", "exp_avg_sq"),
                        tp=1, tp_rank=0, padded_vocab_size=None, group=None, transport="torch",
                        timeout=DEFAULT_TIMEOUT, device=None):
    """Loads data-parallel rank ``dp_rank`` of ``dp``'s flat fp32 partition of one DeepSpeed ZeRO parameter
    group, laid out as DeepSpeed lays it out, and returns ``{state: 1-D float32 tensor}``.

    ``param_order`` lists the group's parameter names in the order of the optimizer's param group (each
    parameter taken as its tensor-parallel slice ``tp_rank`` of ``tp``). Stage 1 or 2: the slices
    flattened in order, padded at the end to a multiple of 2 x dp, split evenly. Stage 3: each parameter
    padded to dp x ceil(numel/dp) and split evenly, the rank's parts concatenated. Padding is zero.
    ``group``: the ranks of the group (e.g. a tensor-parallel group's DP peers) share the reading;
    ``transport``, ``timeout`` and ``device`` as in :func:`load_state_dict`.

    Example::

        parts = ucp.load_zero_partition("out/atomic", dp=4, dp_rank=1, stage=2, param_order=names)
        parts["fp32"].shape   # torch.Size([partition size])
    """
    if stage not in (1, 2, 3):
        raise UCPError(f"load_zero_partition: stage={stage!r}: ZeRO stage {stage} is not 1, 2 or 3")
    dp, dp_rank = _rank_args("load_zero_partition", "dp", dp, "dp_rank", dp_rank)
    tp, tp_rank = _rank_args("load_zero_partition", "tp", tp, "tp_rank", tp_rank)
    states = _states(states)
    timeout = _check_transport(transport, timeout)
    if padded_vocab_size is not None:
        padded_vocab_size = _int_arg("load_zero_partition", "padded_vocab_size", padded_vocab_size)
        if not 0 <= padded_vocab_size <= 1 << 40:
            raise UCPError(f"load_zero_partition: padded_vocab_size={padded_vocab_size} is out of range")
    dev = _device(device, transport)
    alloc = dev if transport == "ucp" else torch.device("cpu")
    args = _args("load_zero_partition", dp=dp, dp_rank=dp_rank, stage=stage, params=param_order, states=states,
                 tp=tp, tp_rank=tp_rank, padded_vocab_size=padded_vocab_size, transport=transport)
    with _Opened(path) as ck:
        names = _names(ck, param_order)
        if STEP in states:
            raise UCPError("the step is not part of a flat partition: load it with load_state_dict(states=('step',))")
        _check_states(ck, names, states)
        numels = []
        for n in names:
            shape = ck._h.shard_shape(n, states[0] if states else "fp32", _lib.LAYOUT_TP, tp, tp_rank, padded_vocab_size)
            k = 1
            for d in shape:
                k *= d
            numels.append(k)
        size, pieces = _lib.zero_pieces(stage, dp, dp_rank, numels)
        out, reqs = {}, []
        for s in states:
            flat = torch.zeros(size, dtype=torch.float32, device=alloc)
            out[s] = flat
            for i, local, n, at in pieces:
                reqs.append(_Req(names[i], s, _lib.LAYOUT_TP, tp, tp_rank, padded_vocab_size, local, n,
                                 flat[at:at + n]))
        _run(ck, reqs, group, args, transport, timeout)
        if dev != alloc:
            out = {s: v.to(dev) for s, v in out.items()}
        return out


@_only_ucperror
def load_into(model, optimizer=None, path=None, strict=True, group=None, transport="torch",
              timeout=DEFAULT_TIMEOUT, stage=True):
    """Resumes a plain ``torch.nn.Module`` and, optionally, a ``torch.optim.Adam``/``AdamW`` from an atomic
    checkpoint by parameter name: the fp32 weights (cast to each parameter's dtype, copied to its device)
    and, for the optimizer, ``exp_avg``, ``exp_avg_sq`` (``max_exp_avg_sq`` with amsgrad) and ``step``.
    The optimizer's hyper-parameters (lr, betas, weight decay) stay those it was built with.

    ``strict=True`` requires the model's ``named_parameters()`` and the checkpoint's names to match
    exactly; with ``strict=False`` only the common names load. Returns ``LoadResult(missing_keys,
    unexpected_keys)``. ``group``, ``transport`` and ``timeout`` as in :func:`load_state_dict` (all ranks
    load the same model; with ``transport="ucp"`` CUDA parameters are filled on their device).

    The load is all or nothing: when it fails (a truncated or corrupt file, a rank of the group that dies)
    the model and the optimizer are left as they were. ``stage=True`` (the default) loads every tensor into
    new buffers first (one extra copy of the parameters, on their device with ``transport="ucp"``, else in
    host memory; the optimizer's moments are new tensors either way) and copies into the model only once
    everything arrived. ``stage=False`` saves that memory: it first checks the size and CRC-32 of every
    file the load reads against the manifest (one extra read of the files), then loads the parameters in
    place; it cannot undo a failure of the group's exchange halfway.

    Example (trained with ZeRO-3 on 64 GPUs, continued on one, no DeepSpeed needed)::

        model = TinyLM(); opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ucp.load_into(model, opt, path="ckpt/global_step1000_universal")
        loss = model(x).sum(); loss.backward(); opt.step()
    """
    if path is None:
        raise UCPError("load_into needs path=, the atomic checkpoint folder")
    if optimizer is not None and not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise UCPError(f"load_into resumes torch.optim.Adam or AdamW, not {type(optimizer).__name__}")
    with _Opened(path) as ck:
        named = list(model.named_parameters())
        have = set(ck.names)
        missing = [n for n, _ in named if n not in have]
        mine = {n for n, _ in named}
        unexpected = [n for n in ck.names if n not in mine]
        if strict and (missing or unexpected):
            raise UCPError(f"{ck.path}: the model's parameter names do not match the checkpoint's (strict=True): "
                           f"{len(missing)} missing from the checkpoint {missing[:5]}, "
                           f"{len(unexpected)} in the checkpoint but not in the model {unexpected[:5]}")
        load = [(n, p) for n, p in named if n in have]
        for n, p in load:
            if tuple(p.shape) != ck.params[n].shape:
                raise UCPError(f"{ck.path}: parameter {n} has shape {tuple(ck.params[n].shape)} in the checkpoint, "
                               f"{tuple(p.shape)} in the model")
        opt_states = ()
        byid = {id(p): n for n, p in load}
        if optimizer is not None:
            opt_states = ["exp_avg", "exp_avg_sq"]
            if any(g.get("amsgrad") for g in optimizer.param_groups):
                opt_states.append("max_exp_avg_sq")
            _check_states(ck, [n for n, _ in load], ["fp32"] + opt_states)
            for n, _ in load:
                if STEP not in ck.params[n].states:
                    raise UCPError(f"{ck.path}: parameter {n} has no step, which the optimizer state needs")
        else:
            _check_states(ck, [n for n, _ in load], ["fp32"])
        timeout = _check_transport(transport, timeout)
        args = _args("load_into", params=[n for n, _ in load], states=["fp32"] + list(opt_states),
                     dtypes=[str(p.dtype) for _, p in load], transport=transport, stage=bool(stage))
        if not stage:
            # Everything the load will read is checked before the first byte lands in the model.
            for n, _ in load:
                for s in ["fp32"] + list(opt_states):
                    ck._h.verify_state(n, s)
        reqs, after = [], []  # after: (target, staged) copies, done once every read succeeded

        def target(n, s, like, fresh):
            """Loads into like itself when it is a fresh tensor (or stage=False) the reader can fill, else into
            a staging tensor copied into like at the end."""
            dev = like.device if transport == "ucp" else torch.device("cpu")
            if (fresh or not stage) and like.device == dev and like.dtype in _DTYPES and like.is_contiguous():
                t = like
            else:
                t = torch.empty(like.shape, dtype=like.dtype if like.dtype in _DTYPES else torch.float32, device=dev)
                after.append((like, t))
            reqs.append(_Req(n, s, _lib.LAYOUT_TP, 1, 0, 0, 0, t.numel(), t))

        with torch.no_grad():
            for n, p in load:
                target(n, "fp32", p.data, False)
            new_state = {}
            if optimizer is not None:
                for g in optimizer.param_groups:
                    for p in g["params"]:
                        n = byid.get(id(p))
                        if n is None:
                            continue
                        on_dev = g.get("capturable") or g.get("fused")
                        kind_v = _step_value(ck, n)
                        step = torch.tensor(float(kind_v), dtype=torch.float32,
                                            device=p.device if on_dev else "cpu")
                        st = {"step": step}
                        for s in opt_states:
                            st[s] = torch.zeros_like(p, memory_format=torch.preserve_format)
                            target(n, s, st[s], True)
                        new_state[p] = st
            _run(ck, reqs, group, args, transport, timeout)
            for dst, src in after:
                dst.copy_(src)
            for p, st in new_state.items():
                optimizer.state[p] = st
        return LoadResult(missing, unexpected)
