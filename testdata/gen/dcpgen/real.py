"""The same cases written by real torch.distributed.checkpoint (torch >= 2.4).

W processes on CPU join a gloo group, build the case's state dict with real DTensors
(distribute_tensor on a CPU DeviceMesh, the placements an FSDP2/TP/HSDP model would have) and call
dcp.save with FileSystemWriter. The save_id uuid is pinned and the checkpoint path is relative
(outputs/checkpoint/<case>) so that .metadata is reproducible.
"""

import importlib
import os
import re
import shutil
import tempfile

import torch

from . import cases as cases_mod
from . import sharding
from .engine import LAYOUTS


def torch_version():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def unavailable_reason():
    """None when real DCP can run here, else why not."""
    if torch_version() < (2, 4):
        return f"torch {torch.__version__} < 2.4"
    try:
        dist = importlib.import_module("torch.distributed")
        importlib.import_module("torch.distributed.checkpoint")
        importlib.import_module("torch.distributed.device_mesh")
    except Exception as e:  # depends on the installation
        return f"torch.distributed.checkpoint does not import: {e}"
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available"
    return None


def native_layout():
    """The stand-in layout closest to what the installed torch writes."""
    return "v2.7" if torch_version() >= (2, 7) else "v2.4"


def _dtensor_api():
    try:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import Replicate, Shard, distribute_tensor
    return Replicate, Shard, distribute_tensor


def _worker(rank, case_name, work, init_file, flatten_23):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as dcp_fs
    from torch.distributed.device_mesh import init_device_mesh

    case = cases_mod.get(case_name)
    os.chdir(work)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=case.world_size)
    try:
        Replicate, Shard, distribute_tensor = _dtensor_api()
        mesh = init_device_mesh("cpu", case.mesh_shape, mesh_dim_names=case.mesh_names)

        def dt(full, placements):
            pl = [Shard(p.dim) if isinstance(p, sharding.Shard) else Replicate()
                  for p in placements]
            # Scatter in fp32 (gloo may lack bf16), then cast locally: exact for bf16/fp16.
            d = distribute_tensor(full.to(torch.float32), mesh, pl)
            return d.to(full.dtype) if full.dtype != torch.float32 else d

        coord = sharding.mesh_coordinate(rank, case.mesh_shape)
        ctx = cases_mod.Ctx(case, rank, coord, dt=dt, plain=lambda t: t.clone())
        state = case.build(ctx)

        dcp_fs._generate_uuid = lambda: case.save_id  # FileSystemWriter.save_id
        if flatten_23:
            from torch.distributed.checkpoint import _version
            _version._derived_version = "2_3"  # flatten_state_dict then uses the <= 2.3 rules
        writer = dcp_fs.FileSystemWriter(case.checkpoint_id, thread_count=case.thread_count)
        dcp.save(state, checkpoint_id=case.checkpoint_id, storage_writer=writer)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_case(case, out_dir):
    """Write `case` with real DCP into out_dir (created). Returns a note for truth meta."""
    import torch.multiprocessing as mp

    layout = LAYOUTS[case.layout]
    flatten_23 = layout.flatten == "2.3"
    notes = [f"torch {torch.__version__} dcp.save, gloo, {case.world_size} processes"]
    if flatten_23:
        notes.append("<= 2.3 flattening via _version._derived_version='2_3'")
    if case.layout != native_layout():
        notes.append(f".metadata layout is this torch's own ({native_layout()}-like), not "
                     f"{case.layout}")
    old_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # the workers import dcpgen again
    if case.loader == "serial":
        # With CUDA present and one thread, FileSystemWriter sorts tensors by size.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif not torch.cuda.is_available():
        notes.append("no CUDA: tensors written in plan order, not the GPU writer's size order")
    try:
        with tempfile.TemporaryDirectory() as work:
            init_file = os.path.join(work, "pg_init")
            mp.spawn(_worker, args=(case.name, work, init_file, flatten_23),
                     nprocs=case.world_size, join=True)
            src = os.path.join(work, case.checkpoint_id)
            os.makedirs(out_dir, exist_ok=True)
            for name in os.listdir(src):
                shutil.move(os.path.join(src, name), os.path.join(out_dir, name))
    finally:
        if old_cuda is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old_cuda
    return "; ".join(notes)
