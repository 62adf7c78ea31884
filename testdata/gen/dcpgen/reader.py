"""An independent DCP reader used to check what the generator wrote and to print layout.txt.

It does not use the stand-in classes: `.metadata` is unpickled with generic placeholder objects
for every DCP class (names checked against the expected set), accepting enum members pickled by
name or by value. Each item is cut out of its .distcp file by (offset, length) and opened with
torch.load as a zip stream of its own.
"""

import io
import os
import pickle
import zipfile

import torch

from .flatten import set_element

DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
        "TensorProperties", "_MEM_FORMAT_ENCODING", "MetadataIndex", "StorageMeta")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
}
ENUMS = {"_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING"}
ENCODING = ("TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT")
OTHER_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                 ("pathlib._local", "PosixPath"), ("builtins", "getattr")}


class Obj:
    """A placeholder for a DCP class instance: .cls is 'module.Name', .state what BUILD got."""
    module = name = None

    def __setstate__(self, state):
        self.state = state

    def get(self, key, default=None):
        state = getattr(self, "state", None)
        if isinstance(state, dict):
            return state.get(key, default)
        return default

    def __repr__(self):
        return f"<{self.name} {getattr(self, 'state', None)!r}>"


class EnumMember:
    def __init__(self, cls_name, name, by):
        self.cls_name, self.name, self.by = cls_name, name, by

    def __repr__(self):
        return f"{self.cls_name}.{self.name} (by {self.by})"


def _enum_class(module, name):
    class EnumCls:
        def __new__(cls, value):  # by-value pickles call cls(value)
            return EnumMember(name, ENCODING[value], "value")
    EnumCls.module, EnumCls.name_ = module, name
    return EnumCls


def _getattr(cls, attr):
    if getattr(cls, "name_", None) in ENUMS:
        if attr not in ENCODING:
            raise pickle.UnpicklingError(f"unknown {cls.name_} member {attr}")
        return EnumMember(cls.name_, attr, "name")
    raise pickle.UnpicklingError(f"getattr on {cls!r} not expected in .metadata")


class MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f):
        super().__init__(f)
        self.globals_seen = []
        self.classes = {}

    def find_class(self, module, name):
        if (module, name) not in self.globals_seen:
            self.globals_seen.append((module, name))
        if (module, name) in DCP_CLASSES:
            key = (module, name)
            if key not in self.classes:
                if name in ENUMS:
                    self.classes[key] = _enum_class(module, name)
                else:
                    self.classes[key] = type(name, (Obj,), {"module": module, "name": name})
            return self.classes[key]
        if (module, name) == ("builtins", "getattr"):
            return _getattr
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in OTHER_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name} in .metadata")


def load_metadata(path):
    with open(path, "rb") as f:
        data = f.read()
    u = MetadataUnpickler(io.BytesIO(data))
    md = u.load()
    return md, u.globals_seen, data


def _props(tsm):
    props = tsm.get("properties")
    state = props.state
    if not isinstance(state, tuple) or len(state) != 5:
        raise ValueError(f"TensorProperties state is not a 5-tuple: {state!r}")
    dtype, layout, requires_grad, mem_format, pin = state
    return {"class": f"{props.module}.{props.name}", "dtype": dtype, "layout": layout,
            "requires_grad": requires_grad, "memory_format": mem_format, "pin_memory": pin}


def read_item(ckpt_dir, info):
    path = os.path.join(ckpt_dir, info.get("relative_path"))
    with open(path, "rb") as f:
        f.seek(info.get("offset"))
        blob = f.read(info.get("length"))
    if len(blob) != info.get("length"):
        raise ValueError(f"{path}: item at {info.get('offset')} runs past the end of the file")
    names = zipfile.ZipFile(io.BytesIO(blob)).namelist()
    if not names or any(not n.startswith("archive/") for n in names):
        raise ValueError(f"{path}@{info.get('offset')}: zip entries not under archive/: {names}")
    return torch.load(io.BytesIO(blob), weights_only=False)


def read_checkpoint(ckpt_dir):
    """Returns dict with flat values (full tensors / Python objects), the nested state dict
    rebuilt from planner_data, and the parsed metadata."""
    md, globals_seen, raw = load_metadata(os.path.join(ckpt_dir, ".metadata"))
    sdm = md.get("state_dict_metadata")
    storage = {}
    for idx, info in md.get("storage_data").items():
        offset = idx.get("offset")
        key = (idx.get("fqn"), None if offset is None else tuple(offset))
        if key in storage:
            raise ValueError(f"{ckpt_dir}: storage_data lists {key} twice")
        storage[key] = info
    used = set()
    flat = {}
    for fqn, entry in sdm.items():
        if entry.name == "BytesStorageMetadata":
            if getattr(entry, "state", None) is not None:
                raise ValueError(f"{fqn}: BytesStorageMetadata with state {entry.state!r}")
            key = (fqn, None)
            flat[fqn] = read_item(ckpt_dir, storage[key])
            used.add(key)
            continue
        props = _props(entry)
        size = tuple(entry.get("size"))
        full = torch.zeros(size, dtype=props["dtype"])
        covered = 0
        for chunk in entry.get("chunks"):
            offs, sizes = tuple(chunk.get("offsets")), tuple(chunk.get("sizes"))
            key = (fqn, offs)
            t = read_item(ckpt_dir, storage[key])
            used.add(key)
            if tuple(t.shape) != sizes or t.dtype != props["dtype"]:
                raise ValueError(f"{fqn}{list(offs)}: item is {t.dtype}{list(t.shape)}, chunk "
                                 f"says {props['dtype']}{list(sizes)}")
            box = tuple(slice(o, o + s) for o, s in zip(offs, sizes))
            if size:
                full[box] = t
            else:
                full = t.clone()
            n = 1
            for s in sizes:
                n *= s
            covered += n
        total = 1
        for s in size:
            total *= s
        if covered != total:
            raise ValueError(f"{fqn}: chunks cover {covered} of {total} elements")
        flat[fqn] = full
    if set(storage) - used:
        raise ValueError(f"{ckpt_dir}: storage_data entries nobody reads: {set(storage) - used}")
    nested = {}
    planner_data = md.get("planner_data") or {}
    for k, v in flat.items():
        if k in planner_data:
            set_element(nested, planner_data[k], v)
        else:
            nested[k] = v
    return {"flat": flat, "nested": nested, "metadata": md, "globals": globals_seen,
            "storage": storage, "raw": raw}


def _fmt(v):
    if isinstance(v, torch.Size):
        return str(list(v))
    return repr(v)


def layout_text(ckpt_dir, title):
    """A human-readable account of the checkpoint: files, metadata fields, every item's place."""
    res = read_checkpoint(ckpt_dir)
    md = res["metadata"]
    lines = [f"# {title}", ""]
    lines.append("files:")
    for name in sorted(os.listdir(ckpt_dir)):
        lines.append(f"  {name:<16} {os.path.getsize(os.path.join(ckpt_dir, name)):>7} bytes")
    lines.append("")
    fields = list(md.state.keys())
    lines.append(f".metadata: pickle protocol {res['raw'][1]}, Metadata fields {fields}")
    lines.append("globals: " + ", ".join(f"{m}.{n}" for m, n in res["globals"]))
    sm = md.get("storage_meta")
    if sm is not None:
        lines.append(f"storage_meta: {sm.state!r}")
    if "version" in md.state:
        lines.append(f"version: {md.get('version')!r}")
    lines.append("")
    lines.append("state_dict_metadata (in pickle order) -> storage_data:")
    planner = md.get("planner_data") or {}
    for fqn, entry in md.get("state_dict_metadata").items():
        path = planner.get(fqn)
        if entry.name == "BytesStorageMetadata":
            info = res["storage"][(fqn, None)]
            lines.append(f"  {fqn}  bytes  path={path!r}")
            lines.append(f"      -> {info.get('relative_path')} @{info.get('offset')} "
                         f"+{info.get('length')}")
            continue
        p = _props(entry)
        enc = p["memory_format"]
        lines.append(f"  {fqn}  {str(p['dtype']).replace('torch.', '')}{_fmt(entry.get('size'))}"
                     f"  path={path!r}  props={p['class'].rsplit('.', 1)[0]} {enc!r}")
        for chunk in entry.get("chunks"):
            offs = tuple(chunk.get("offsets"))
            info = res["storage"][(fqn, offs)]
            lines.append(f"      offsets={list(offs)} sizes={_fmt(chunk.get('sizes'))} -> "
                         f"{info.get('relative_path')} @{info.get('offset')} +{info.get('length')}")
    lines.append("")
    lines.append("storage_data (in pickle order):")
    for idx, info in md.get("storage_data").items():
        off = idx.get("offset")
        lines.append(f"  ({idx.get('fqn')}, {'-' if off is None else list(off)}, "
                     f"index={idx.get('index')}) -> {info.state!r}")
    return "\n".join(lines) + "\n"
