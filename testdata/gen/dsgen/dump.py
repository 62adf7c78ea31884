"""Print the structure of torch.save files (keys, types, shapes, views, pickle GLOBALs), in the
style of the real fixtures' structure.txt, for comparing generated files with real ones."""
import argparse
import dataclasses
import enum
import os
import zipfile
from collections import OrderedDict

import torch

from . import stubs
from .verify import pickle_globals


def _tensor(t):
    s = f"Tensor shape={list(t.shape)} dtype={str(t.dtype).replace('torch.', '')}"
    if t.requires_grad:
        s += " requires_grad=True"
    if t.dim() == 0:
        s += f" value={t.item():g}"
    st = t.storage()
    if st.size() != t.numel() or t.storage_offset() != 0:
        s += f" (view: storage numel={st.size()}, offset={t.storage_offset()})"
    return s


def describe(v, limit, indent=0):
    """Lines describing v: the first is its header (to follow a key), the rest are indented."""
    pad = "  " * (indent + 1)
    if torch.is_tensor(v):
        return [_tensor(v)]
    if isinstance(v, (dict, OrderedDict)):
        kind = "collections.OrderedDict" if type(v) is OrderedDict else "dict"
        lines = [f"{kind} ({len(v)} keys)"]
        for i, (k, x) in enumerate(v.items()):
            if i >= limit:
                lines.append(f"{pad}... {len(v) - limit} more keys")
                break
            sub = describe(x, limit, indent + 1)
            lines.append(f"{pad}[{k!r}]: {sub[0]}")
            lines += sub[1:]
        return lines
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        lines = [f"{type(v).__name__} (len {len(v)})"]
        for i, x in enumerate(v):
            if i >= limit:
                lines.append(f"{pad}... {len(v) - limit} more items")
                break
            sub = describe(x, limit, indent + 1)
            lines.append(f"{pad}[{i}]: {sub[0]}")
            lines += sub[1:]
        return lines
    if isinstance(v, enum.Enum):
        return [f"{type(v).__name__} {v!r}"]
    if isinstance(v, torch.Size):
        return [f"Size {v!r}"]
    if dataclasses.is_dataclass(v):
        return [f"{type(v).__module__}.{type(v).__name__} (dataclass) {v!r}"]
    if hasattr(v, "__dict__") and not isinstance(v, type):
        lines = [f"{type(v).__module__}.{type(v).__name__} (object) attrs:"]
        for k, x in vars(v).items():
            sub = describe(x, limit, indent + 1)
            lines.append(f"{pad}.{k} = {sub[0]}")
            lines += sub[1:]
        return lines
    r = repr(v)
    if len(r) > 200:
        r = r[:200] + "..."
    return [f"{type(v).__name__} {r}"]


def dump_file(path, limit=1000):
    stubs.register()
    obj = torch.load(path, map_location="cpu")
    out = [f"### {path}  ({os.path.getsize(path)} bytes)"]
    out += describe(obj, limit)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    storages = [n for n in names if "/data/" in n]
    out.append(f"zip members: {len(names)} ({len(storages)} tensor storage records); archive dir "
               f"'{names[0].split('/')[0]}/'")
    out.append("pickle GLOBALs: " + ", ".join(sorted(g.replace(" ", ".") for g in pickle_globals(path))))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--limit", type=int, default=1000)
    a = ap.parse_args(argv)
    for p in a.paths:
        files = [p] if os.path.isfile(p) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if f.endswith(".pt"))
        for f in files:
            print(dump_file(f, a.limit))
            print()
