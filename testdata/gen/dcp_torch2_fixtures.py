#!/usr/bin/env python3
"""DCP fixtures from a real FSDP2 training run (torch >= 2.6 on CPU, gloo), and the layouts of newer
torch releases built from the same run.

    scripts/torch2-chroot.sh run . python3 testdata/gen/dcp_torch2_fixtures.py [--out DIR]

Four processes train a model with FSDP2 (dp=2) x tensor parallelism (tp=2) and save it
(dcp/fsdp_tp_train_w4: real dcp.save). Two processes train a small model with FSDP2 (fully_shard, DTensor
Shard(0)) and AdamW for two steps, then, still live:

  dcp/fsdp2_train_w2   dcp.save({"model", "optim", "lr_scheduler", "step"}) through FileSystemWriter:
                       real torch.distributed.checkpoint, nothing imitated;
  dcp/zstd_w2          the same save with every item passed through the zstandard package's
                       stream_writer, as torch >= 2.7's _extension.ZStandard does, and .metadata
                       given the >= 2.7 fields (_StorageInfo.transform_descriptors = ['stream.zstd/1'],
                       Metadata.version = '1.0.0', StorageMeta.modules = []): a GENERATOR (torch 2.6
                       has no _extensions) working on the real save;
  dcp_hf/sharded_w2    dcp.save of the model state through a storage writer that does what
                       HuggingFaceStorageWriter(save_sharded=True, fqn_to_index_mapping) of torch >= 2.8
                       does (shard-<rank>-model-<k>-of-<n>.safetensors written by safetensors.torch.save
                       with DCP_SHARDING_INFO, no .metadata): real planning, dedup and DTensor chunks,
                       the writer re-implemented from the published source (torch 2.6 lacks it);
  dcp_hf/consolidated  those shards merged as _consolidate_hf_safetensors.consolidate_safetensors_files
                       does (model-<k>-of-<n>.safetensors + model.safetensors.index.json), also
                       re-implemented from the published source.

The truth (truth.pt) is gathered from the live run (DTensor.full_tensor(), the optimizer's state,
the scheduler's state_dict()), never read back from the files. The save_id is pinned and the
checkpoint path is relative, so reruns give the same .metadata.
"""

import argparse
import io
import json
import math
import os
import pickle
import shutil
import struct
import sys
import tempfile

sys.dont_write_bytecode = True

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from dcpgen.truth import classify  # noqa: E402
WORLD = 2
SAVE_ID = "5f0c3e2a-7d41-4b8e-9a65-1c2d3e4f5a6b"
TRAIN_ID = "outputs/checkpoint/fsdp2_train_w2"
TP_ID = "outputs/checkpoint/fsdp_tp_train_w4"
HF_ID = "outputs/hf/sharded_w2"
# fqn -> output file index, as a trainer passes fqn_to_index_mapping (1-based)
HF_FILE = {"embed.weight": 1, "layers.0": 1, "layers.1": 2, "head": 2, "pos": 2}


def hf_index(fqn):
    for prefix, i in HF_FILE.items():
        if fqn == prefix or fqn.startswith(prefix + "."):
            return i
    raise KeyError(fqn)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.attn = nn.Linear(6, 9)  # weight [9, 6]: rows 5 + 4 on two ranks
        self.proj = nn.Linear(9, 6, bias=False)

    def forward(self, x):
        return x + self.proj(torch.tanh(self.attn(self.norm(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)  # [11, 6]: rows 6 + 5
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 5)  # [5, 6]: rows 3 + 2; bias [5]: 3 + 2
        self.register_buffer("pos", torch.linspace(-1.0, 1.0, 6))  # a persistent buffer

    def forward(self, ids):
        x = self.embed(ids) + self.pos
        for b in self.layers:
            x = b(x)
        return self.head(x)


class TPBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 12)  # ColwiseParallel: weight [12, 8] Shard(0) on tp
        self.proj = nn.Linear(12, 8, bias=False)  # RowwiseParallel: weight [8, 12] Shard(1) on tp

    def forward(self, x):
        return x + self.proj(torch.tanh(self.attn(x)))


class TPModel(nn.Module):
    """A block whose attn is column-parallel and proj row-parallel over tp, all of it FSDP2 over dp."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.block = TPBlock()
        self.head = nn.Linear(8, 6)

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def cpu_streams_for_fsdp2():
    # FSDP2 in torch 2.6 records and waits on stream events, which torch.cpu.Stream lacks
    # (upstream added the same no-ops in 2.7).
    if not hasattr(torch.cpu.Stream, "record_event"):
        torch.cpu.Stream.record_event = lambda self, event=None: event
    if not hasattr(torch.cpu.Stream, "wait_event"):
        torch.cpu.Stream.wait_event = lambda self, event: None
    if not hasattr(torch.cpu.Stream, "wait_stream"):
        torch.cpu.Stream.wait_stream = lambda self, stream: None


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


class HFShardedWriter:
    """What HuggingFaceStorageWriter(save_sharded=True) does in torch >= 2.8, on torch 2.6's
    FileSystemWriter: per rank (shard_index = plan position + 1) one safetensors file per
    fqn_to_index_mapping index, written by safetensors.torch.save with DCP_SHARDING_INFO; the
    sharded save writes no metadata file."""

    @staticmethod
    def make(path, mapping):
        import dataclasses

        from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult
        from torch.futures import Future
        from safetensors.torch import save as st_save

        class Writer(FileSystemWriter):
            def prepare_global_plan(self, plans):
                return [dataclasses.replace(p, storage_data={"fqn_to_index_mapping": mapping,
                                                              "shard_index": i})
                        for i, p in enumerate(plans, start=1)]

            def write_data(self, plan, planner):
                results = []
                if plan.items:
                    sd = plan.storage_data
                    n = max(sd["fqn_to_index_mapping"].values())
                    buckets = {}
                    for item in plan.items:
                        buckets.setdefault(sd["fqn_to_index_mapping"][item.index.fqn], []).append(item)
                    for idx, items in buckets.items():
                        name = (f"shard-{str(sd['shard_index']).zfill(5)}-model-{str(idx).zfill(5)}"
                                f"-of-{str(n).zfill(5)}.safetensors")
                        tensors, info, out = {}, {}, io.BytesIO()
                        for item in items:
                            if item.type == WriteItemType.BYTE_IO:
                                raise SystemExit("the HF layout holds tensors only")
                            t = planner.resolve_data(item).detach().cpu()
                            if t.untyped_storage().size() != t.numel() * t.itemsize:
                                t = t.clone()
                            tensors[item.index.fqn] = t
                            info[item.index.fqn] = {"saved_offsets": item.tensor_data.chunk.offsets}
                            results.append(WriteResult(index=item.index,
                                                       size_in_bytes=t.numel() * t.element_size(),
                                                       storage_data=_StorageInfo(name, 0, t.numel() * t.element_size())))
                        out.write(st_save(tensors, metadata={"DCP_SHARDING_INFO": json.dumps(info),
                                                             "DCP_VERSION": str(1.0), "format": "pt"}))
                        with open(os.path.join(self.path, name), "wb") as f:
                            f.write(out.getvalue())
                fut = Future()
                fut.set_result(results)
                return fut

            def finish(self, metadata, results):
                return None  # save_sharded without consolidated_output_path: no metadata file

        return Writer(path)


def worker(rank, work, init_file):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as dcp_fs
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    os.chdir(work)
    cpu_streams_for_fsdp2()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
        torch.manual_seed(0)
        model = Model()
        fully_shard = fully_shard_fn()
        for b in model.layers:
            fully_shard(b, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(2):
            ids = torch.randint(0, 11, (4, 3), generator=g)
            loss = model(ids).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()

        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "lr_scheduler": sched.state_dict(), "step": 2}

        # truth from the live run: every flattened value, full tensors gathered
        live = gather_live(state, WORLD)

        dcp_fs._generate_uuid = lambda: SAVE_ID
        dcp.save(state, storage_writer=dcp_fs.FileSystemWriter(TRAIN_ID))
        dist.barrier()

        # the Hugging Face sharded layout: the model state only, keyed by FQN
        os.makedirs(HF_ID, exist_ok=True)
        mapping = {k: hf_index(k) for k in msd}
        dcp.save(dict(msd), storage_writer=HFShardedWriter.make(HF_ID, mapping))
        dist.barrier()

        if rank == 0:
            live.update({"msd": list(msd), "params": [n for n, _ in model.named_parameters()],
                         "buffers": [n for n, _ in model.named_buffers()], "mapping": mapping})
            torch.save(live, os.path.join(work, "live.pt"))
    finally:
        dist.destroy_process_group()


def tp_worker(rank, work, init_file):
    """FSDP2 over dp=2 x tensor parallelism over tp=2 (the torchtitan recipe), 4 processes."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as dcp_fs
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    os.chdir(work)
    cpu_streams_for_fsdp2()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        model = TPModel()
        parallelize_module(model.block, mesh["tp"], {"attn": ColwiseParallel(), "proj": RowwiseParallel()})
        fully_shard = fully_shard_fn()
        fully_shard(model.block, mesh=mesh["dp"], reshard_after_forward=False)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(200 + rank // 2)  # the same batch on both tp ranks
        for _ in range(2):
            ids = torch.randint(0, 10, (4, 3), generator=g)
            model(ids).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        live = gather_live(state, 4)
        dcp_fs._generate_uuid = lambda: SAVE_ID
        dcp.save(state, storage_writer=dcp_fs.FileSystemWriter(TP_ID))
        dist.barrier()
        if rank == 0:
            live.update({"msd": list(msd), "params": [n for n, _ in model.named_parameters()],
                         "buffers": [n for n, _ in model.named_buffers()]})
            torch.save(live, os.path.join(work, "live_tp.pt"))
    finally:
        dist.destroy_process_group()


def gather_live(state, world):
    """Every flattened value of state, full tensors gathered (collective), chunk boxes of all ranks."""
    import torch.distributed as dist
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    flat, mappings = flatten_state_dict(state)
    tensors, extra, boxes, placements = {}, {}, {}, {}
    for k, v in flat.items():
        if isinstance(v, DTensor):
            tensors[k] = v.full_tensor().detach().clone()
            shape, off = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
            boxes[k] = (tuple(off), tuple(shape))
            placements[k] = [str(p) for p in v.placements]
        elif isinstance(v, torch.Tensor):
            tensors[k] = v.detach().clone()
            boxes[k] = (tuple(0 for _ in v.shape), tuple(v.shape))
            placements[k] = "plain"
        else:
            extra[k] = v
    all_boxes = [None] * world
    dist.all_gather_object(all_boxes, boxes)
    return {"tensors": tensors, "extra": extra, "paths": {k: mappings[k] for k in flat},
            "boxes": all_boxes, "placements": placements}


def dcp_truth(live, case, about, layout, producer, note, mesh=(WORLD,), names=("dp",), ckpt=TRAIN_ID):
    t = live["tensors"]
    truth = {"fp32": {}, "params": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": {}, "buffers": {},
             "param_names": [], "shapes": {}, "dtypes": {}, "keys": {}}
    for fqn in live["msd"]:
        truth["shapes"][fqn] = list(t["model." + fqn].shape)
        truth["dtypes"][fqn] = str(t["model." + fqn].dtype).replace("torch.", "")
        if fqn in live["buffers"]:
            truth["buffers"][fqn] = t["model." + fqn]
            truth["keys"][fqn] = {"buffer": "model." + fqn}
            continue
        truth["param_names"].append(fqn)
        truth["params"][fqn] = t["model." + fqn]
        truth["fp32"][fqn] = t["model." + fqn].to(torch.float32)
        where = {"param": "model." + fqn}
        for kind in ("exp_avg", "exp_avg_sq", "step"):
            k = f"optim.state.{fqn}.{kind}"
            if k in t:
                truth[kind][fqn] = t[k]
                where[kind] = k
        truth["keys"][fqn] = where
    truth["tensors"] = t
    truth["extra"] = live["extra"]
    truth["paths"] = live["paths"]
    patterns = {}
    for k in t:
        bs = [b[k] for b in live["boxes"] if k in b]
        patterns[k] = classify(tuple(t[k].shape), bs, len(bs))
    truth["patterns"] = patterns
    truth["meta"] = {
        "case": case, "about": about, "world_size": math.prod(mesh), "mesh_shape": list(mesh),
        "mesh_names": list(names),
        "layout": layout, "layout_about": {"v2.4": "what torch 2.4 to 2.6 write",
                                           "v2.7": "torch >= 2.7 fields"}[layout],
        "flatten_rules": "2.4", "thread_count": 1, "tensor_order": "serial",
        "placements": live["placements"], "checkpoint_id": ckpt, "save_id": SAVE_ID,
        "producer": producer, "producer_note": note, "generator_torch": torch.__version__,
        "generator_python": sys.version.split()[0],
    }
    return truth


def zstd_transform(src, dst):
    """Compress every item of a real save as torch >= 2.7's ZStandard extension does."""
    import zstandard

    with open(os.path.join(src, ".metadata"), "rb") as f:
        md = pickle.load(f)
    by_file = {}
    for idx, info in md.storage_data.items():
        by_file.setdefault(info.relative_path, []).append(info)
    os.makedirs(dst)
    for name, infos in by_file.items():
        with open(os.path.join(src, name), "rb") as f:
            data = f.read()
        out = io.BytesIO()
        for info in sorted(infos, key=lambda i: i.offset):
            plain = data[info.offset:info.offset + info.length]
            start = out.tell()
            # FileSystemWriter wraps the file in the extension's stream_writer and torch.save()s
            # into it; closing it ends the frame (NoCloseWriter keeps the file open).
            w = zstandard.ZstdCompressor().stream_writer(out, closefd=False)
            w.write(plain)
            w.close()
            info.offset, info.length = start, out.tell() - start
            info.transform_descriptors = ["stream.zstd/1"]
        with open(os.path.join(dst, name), "wb") as f:
            f.write(out.getvalue())
    for name in os.listdir(src):  # files no item points to (empty ones) stay as they are
        if name not in by_file and name != ".metadata":
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    md.version = "1.0.0"
    md.storage_meta.modules = []
    with open(os.path.join(dst, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def consolidate(src, dst, mapping):
    """_consolidate_hf_safetensors.consolidate_safetensors_files with fqn_to_index_mapping,
    re-implemented from the published source: one header per output file (json.dumps of
    {fqn: {shape, dtype, data_offsets}}, no __metadata__, no padding), full tensors assembled
    from the shards' bytes, and model.safetensors.index.json."""
    inputs = []
    for name in sorted(os.listdir(src)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(src, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            body = f.read()
        inputs.append((name, header, body))
    total = max(mapping.values())
    sizes = {}
    for _, header, _ in inputs:
        info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
        for k, v in header.items():
            if k == "__metadata__":
                continue
            off = info[k]["saved_offsets"]
            cur = [s + o for s, o in zip(v["shape"], off)]
            if k in sizes:
                sizes[k] = ([max(a, b) for a, b in zip(sizes[k][0], cur)], v["dtype"])
            else:
                sizes[k] = (cur, v["dtype"])
    esize = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8}
    DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    os.makedirs(dst)
    weight_map, total_size = {}, 0
    files = {}
    for fqn, idx in mapping.items():  # output order: the mapping's
        files.setdefault(idx, []).append(fqn)
    for idx in sorted(files):
        name = f"model-{str(idx).zfill(5)}-of-{str(total).zfill(5)}.safetensors"
        meta, cur, bufs = {}, 0, {}
        for fqn in files[idx]:
            shape, dt = sizes[fqn]
            end = cur + math.prod(shape) * esize[dt]
            meta[fqn] = {"shape": shape, "dtype": dt, "data_offsets": [cur, end]}
            bufs[fqn] = bytearray(end - cur)
            cur = end
            weight_map[fqn] = name
            total_size += end - meta[fqn]["data_offsets"][0]
        for _, header, body in inputs:
            info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
            for k, v in header.items():
                if k == "__metadata__" or k not in bufs:
                    continue
                full_shape, dt = sizes[k]
                a, b = v["data_offsets"]
                off, shp = info[k]["saved_offsets"], v["shape"]
                full = torch.frombuffer(bufs[k], dtype=DTYPES[dt]).view(full_shape) if bufs[k] else None
                if full is None or math.prod(shp) == 0:
                    continue
                part = torch.frombuffer(bytearray(body[a:b]), dtype=DTYPES[dt]).view(shp)
                full[tuple(slice(o, o + n) for o, n in zip(off, shp))] = part
        hb = json.dumps(meta).encode()
        with open(os.path.join(dst, name), "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for fqn in files[idx]:
                f.write(bufs[fqn])
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, indent=2)


def hf_truth(live, case, about, note):
    t = live["tensors"]
    names = list(live["msd"])
    return {"param_names": names, "fp32": {n: t["model." + n].to(torch.float32) for n in names},
            "params": {n: t["model." + n] for n in names},
            "meta": {"case": case, "about": about, "producer": "generator", "producer_note": note,
                     "world_size": WORLD, "file_index": live["mapping"],
                     "generator_torch": torch.__version__, "generator_python": sys.version.split()[0]}}


def check_hf(ckpt, truth, sharded):
    """The safetensors package reads every file back; consolidated tensors equal the truth."""
    from safetensors.torch import load_file
    for name in os.listdir(ckpt):
        if name.endswith(".safetensors"):
            got = load_file(os.path.join(ckpt, name))
            if not sharded:
                for k, v in got.items():
                    if not torch.equal(v, truth["params"][k]):
                        raise SystemExit(f"{ckpt}/{name}: {k} differs from the live value")


def publish(tmp, dest):
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.move(tmp, dest)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(dest) for f in fs)
    print(f"{os.path.relpath(dest):<45} {size:>8} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "testdata", "fixtures"))
    ap.add_argument("--only", choices=("all", "fsdp2", "tp"), default="all",
                    help="fsdp2: the 2-rank run and what is built from it; tp: the FSDP2 x TP run")
    args = ap.parse_args()
    import torch.multiprocessing as mp

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    with tempfile.TemporaryDirectory() as work:
        if args.only in ("all", "tp"):
            mp.spawn(tp_worker, args=(work, os.path.join(work, "pg_init_tp")), nprocs=4, join=True)
            live = torch.load(os.path.join(work, "live_tp.pt"), weights_only=False)
            tmp = os.path.join(work, "fsdp_tp_train_w4")
            os.makedirs(tmp)
            shutil.copytree(os.path.join(work, TP_ID), os.path.join(tmp, "checkpoint"))
            torch.save(dcp_truth(live, "fsdp_tp_train_w4",
                                 "real FSDP2 (dp=2) x TP (tp=2) training: ColwiseParallel attn, "
                                 "RowwiseParallel proj, AdamW, 2 steps; 2-D chunks from _StridedShard",
                                 "v2.4", "real-dcp",
                                 f"torch {torch.__version__} dcp.save of get_state_dict(FSDP2 x TP model, "
                                 "AdamW) after 2 training steps, gloo, 4 processes; truth gathered live",
                                 mesh=(2, 2), names=("dp", "tp"), ckpt=TP_ID),
                       os.path.join(tmp, "truth.pt"))
            publish(tmp, os.path.join(args.out, "dcp", "fsdp_tp_train_w4"))
        if args.only == "tp":
            return 0
        mp.spawn(worker, args=(work, os.path.join(work, "pg_init")), nprocs=WORLD, join=True)
        live = torch.load(os.path.join(work, "live.pt"), weights_only=False)

        real_note = (f"torch {torch.__version__} dcp.save of get_state_dict(FSDP2 model, AdamW) after "
                     f"2 training steps, gloo, {WORLD} processes; truth gathered live (full_tensor())")
        tmp = os.path.join(work, "fsdp2_train_w2")
        os.makedirs(tmp)
        shutil.copytree(os.path.join(work, TRAIN_ID), os.path.join(tmp, "checkpoint"))
        torch.save(dcp_truth(live, "fsdp2_train_w2",
                             "real FSDP2 training (fully_shard per block and root, AdamW, StepLR) on 2 "
                             "ranks: uneven Shard(0) rows, a replicated buffer, steps, param groups",
                             "v2.4", "real-dcp", real_note), os.path.join(tmp, "truth.pt"))
        publish(tmp, os.path.join(args.out, "dcp", "fsdp2_train_w2"))

        tmp = os.path.join(work, "zstd_w2")
        os.makedirs(tmp)
        zstd_transform(os.path.join(work, TRAIN_ID), os.path.join(tmp, "checkpoint"))
        torch.save(dcp_truth(live, "zstd_w2",
                             "fsdp2_train_w2's save with every item zstd-compressed and the torch >= 2.7 "
                             ".metadata fields (transform_descriptors, version, StorageMeta.modules)",
                             "v2.7", "generator",
                             real_note + "; then items compressed with zstandard " +
                             __import__("zstandard").__version__ +
                             " as torch >= 2.7's ZStandard extension does and .metadata given the "
                             ">= 2.7 fields by the generator (torch 2.6 has no _extensions)"),
                   os.path.join(tmp, "truth.pt"))
        publish(tmp, os.path.join(args.out, "dcp", "zstd_w2"))

        hf_note = ("real dcp.save planning, dedup and DTensor chunks (torch " + torch.__version__ +
                   ", FSDP2, 2 ranks); the storage writer re-implements torch >= 2.8's "
                   "HuggingFaceStorageWriter(save_sharded=True) from its published source")
        tmp = os.path.join(work, "sharded_w2")
        os.makedirs(tmp)
        shutil.copytree(os.path.join(work, HF_ID), os.path.join(tmp, "checkpoint"))
        tr = hf_truth(live, "sharded_w2", "HuggingFaceStorageWriter(save_sharded=True, "
                      "fqn_to_index_mapping) on 2 ranks: shard-R-model-K-of-2.safetensors", hf_note)
        check_hf(os.path.join(tmp, "checkpoint"), tr, True)
        torch.save(tr, os.path.join(tmp, "truth.pt"))
        publish(tmp, os.path.join(args.out, "dcp_hf", "sharded_w2"))

        tmp = os.path.join(work, "consolidated")
        os.makedirs(tmp)
        consolidate(os.path.join(args.out, "dcp_hf", "sharded_w2", "checkpoint"), os.path.join(tmp, "checkpoint"),
                    live["mapping"])
        tr = hf_truth(live, "consolidated", "sharded_w2 consolidated as consolidate_safetensors_files "
                      "does: model-K-of-2.safetensors + model.safetensors.index.json",
                      hf_note + "; consolidation re-implemented from _consolidate_hf_safetensors.py")
        check_hf(os.path.join(tmp, "checkpoint"), tr, False)
        torch.save(tr, os.path.join(tmp, "truth.pt"))
        publish(tmp, os.path.join(args.out, "dcp_hf", "consolidated"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
