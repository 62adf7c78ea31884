"""truth.pt for a case, computed from the builders' full tensors (never from the written files)."""

import sys

import torch

from .cases import Ctx
from .engine import LAYOUTS
from .flatten import flatten_state_dict
from .sharding import FakeDTensor, describe, is_tensor, mesh_coordinate


def fake_states(case):
    """Every rank's state dict with FakeDTensors, and the Ctx that recorded its notes."""
    out = []
    for r in range(case.world_size):
        coord = mesh_coordinate(r, case.mesh_shape)

        def dt(full, placements, coord=coord):
            return FakeDTensor(full, case.mesh_shape, coord, placements)

        ctx = Ctx(case, r, coord, dt=dt, plain=lambda t: t.clone())
        out.append((case.build(ctx), ctx))
    return out


def same_value(a, b):
    if hasattr(a, "getvalue") and hasattr(b, "getvalue"):
        return type(a) is type(b) and a.getvalue() == b.getvalue() and a.tell() == b.tell()
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def classify(shape, boxes, holders):
    """Sharding pattern as the chunks show it (names as in the patterns package)."""
    whole = (tuple(0 for _ in shape), tuple(shape))
    distinct = set(boxes)
    if distinct == {whole}:
        return "Replicate" if holders > 1 else "Unique"
    split = [d for d in range(len(shape)) if any(b[1][d] != shape[d] for b in distinct)]
    if split == [0]:
        return "Shard-V"
    if len(split) == 1:
        return "Shard-H"
    return "Shard-Hy"


def build_truth(case, states, producer, generator_note=""):
    layout = LAYOUTS[case.layout]
    tensors, extra, placements, paths = {}, {}, {}, {}
    boxes, holders = {}, {}
    for r, (sd, _) in enumerate(states):
        flat, mappings = flatten_state_dict(sd, is_tensor, layout.flatten)
        for key, v in flat.items():
            if not is_tensor(v):
                if not (layout.bytes_on_all_ranks or r == 0):
                    continue  # never planned, so never saved
                paths.setdefault(key, mappings[key])
                if key in extra:
                    if not same_value(extra[key], v):
                        raise ValueError(f"{case.name}: {key} differs between ranks")
                else:
                    extra[key] = v
                continue
            paths.setdefault(key, mappings[key])
            if isinstance(v, FakeDTensor):
                full = v.full
                placements[key] = describe(v.placements)
                if v.coordinate is not None:
                    boxes.setdefault(key, []).append((v.offsets, v.sizes))
                    holders[key] = holders.get(key, 0) + 1
            else:
                full = v
                placements[key] = "plain"
                boxes.setdefault(key, []).append((tuple(0 for _ in v.shape), tuple(v.shape)))
                holders[key] = holders.get(key, 0) + 1
            if key in tensors:
                if not same_value(tensors[key], full):
                    raise ValueError(f"{case.name}: {key} differs between ranks")
            else:
                tensors[key] = full.clone()

    notes = states[0][1].notes
    truth = {"fp32": {}, "params": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": {},
             "buffers": {}, "param_names": [], "shapes": {}, "dtypes": {}, "keys": {}}
    for p in case.model:
        where = {kind: ".".join(map(str, path)) for kind, path in notes[p.fqn].items()}
        truth["keys"][p.fqn] = where
        truth["shapes"][p.fqn] = list(p.shape)
        truth["dtypes"][p.fqn] = str(p.dtype).replace("torch.", "")
        if p.buffer:
            truth["buffers"][p.fqn] = tensors[where["buffer"]]
            continue
        truth["param_names"].append(p.fqn)
        truth["params"][p.fqn] = tensors[where["param"]]
        truth["fp32"][p.fqn] = tensors[where["param"]].to(torch.float32)
        for kind in ("exp_avg", "exp_avg_sq", "step"):
            if kind in where:
                truth[kind][p.fqn] = tensors[where[kind]]

    truth["tensors"] = tensors
    truth["extra"] = extra
    truth["paths"] = paths
    truth["patterns"] = {k: classify(tuple(tensors[k].shape), boxes[k], holders[k])
                         for k in tensors}
    truth["meta"] = {
        "case": case.name,
        "about": case.about,
        "world_size": case.world_size,
        "mesh_shape": list(case.mesh_shape),
        "mesh_names": list(case.mesh_names),
        "layout": case.layout,
        "layout_about": layout.about,
        "flatten_rules": layout.flatten,
        "thread_count": case.thread_count,
        "tensor_order": case.loader,
        "placements": placements,
        "checkpoint_id": case.checkpoint_id,
        "save_id": case.save_id,
        "producer": producer,
        "producer_note": generator_note,
        "generator_torch": torch.__version__,
        "generator_python": sys.version.split()[0],
    }
    return truth
