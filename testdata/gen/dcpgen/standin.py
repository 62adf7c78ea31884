"""Stand-ins for the classes that a DCP ``.metadata`` pickle names.

Debian's torch 1.13 cannot import ``torch.distributed.checkpoint``, so the generator pickles its own
dataclasses registered under DCP's exact module paths and class names, with the same fields, field
order, defaults and ``__getstate__`` behaviour as the torch release being imitated. The pickler then
emits the same opcodes for them as it does for torch's own classes (see ../../../internal/formats/dcp/NOTES.md
for the source of every rule).

One ``ClassSet`` exists per layout; ``installed(classes)`` puts a set into ``sys.modules`` for the
duration of a save (or a read-back), creating stub modules where torch has none, and restores what
was there before.
"""

import contextlib
import enum
import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

META_MOD = "torch.distributed.checkpoint.metadata"
FS_MOD = "torch.distributed.checkpoint.filesystem"
SHARD_MOD = "torch.distributed._shard.sharded_tensor.metadata"

_ENCODING_NAMES = ("TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT")


def _place(cls, module, name):
    cls.__module__ = module
    cls.__qualname__ = name
    cls.__name__ = name
    return cls


def _make_encoding_enum(module, name, by_value):
    """The memory-format encoding enum. Python <= 3.10 pickles members by value (cls(0)),
    3.11+ by name (getattr(cls, 'TORCH_...')); both are pinned here so the output does not
    depend on the Python running the generator."""
    members = [(n, i) for i, n in enumerate(_ENCODING_NAMES)]
    cls = enum.Enum(name, members, module=module, qualname=name)
    if by_value:
        def reduce_ex(self, proto):
            return self.__class__, (self._value_,)
    else:
        def reduce_ex(self, proto):
            return getattr, (self.__class__, self._name_)
    cls.__reduce_ex__ = reduce_ex
    return cls


def _make_tensor_properties(module, encoding):
    contiguous, channels_last, preserve = (encoding[n] for n in _ENCODING_NAMES)

    @dataclass
    class TensorProperties:
        dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
        layout: torch.layout = field(default=torch.strided)
        requires_grad: bool = False
        memory_format: torch.memory_format = field(default=torch.contiguous_format)
        pin_memory: bool = False

        # torch.memory_format does not pickle, so the state is a 5-tuple with the format encoded.
        def __getstate__(self):
            fmt = self.memory_format
            if fmt == torch.contiguous_format:
                code = contiguous
            elif fmt == torch.channels_last:
                code = channels_last
            elif fmt == torch.preserve_format:
                code = preserve
            else:
                raise RuntimeError(f"unknown memory format {fmt}")
            return (self.dtype, self.layout, self.requires_grad, code, self.pin_memory)

        def __setstate__(self, state):
            self.dtype, self.layout, self.requires_grad, code, self.pin_memory = state
            formats = {contiguous: torch.contiguous_format, channels_last: torch.channels_last,
                       preserve: torch.preserve_format}
            if code not in formats:
                raise RuntimeError(f"unknown memory format encoding {code}")
            self.memory_format = formats[code]

        @staticmethod
        def create_from_tensor(t):
            return TensorProperties(dtype=t.dtype, layout=t.layout, requires_grad=t.requires_grad,
                                    memory_format=torch.contiguous_format, pin_memory=t.is_pinned())

    return _place(TensorProperties, module, "TensorProperties")


@dataclass
class ClassSet:
    """The classes one torch layout pickles, and where (module, name) each one lives."""
    name: str
    Metadata: type
    TensorStorageMetadata: type
    ChunkStorageMetadata: type
    BytesStorageMetadata: type
    TensorProperties: type
    MemFormat: type
    MetadataIndex: type
    StorageInfo: type
    StorageMeta: Optional[type]
    placements: Dict[str, Any]  # "module:name" -> class

    def install_map(self):
        return dict(self.placements)


def build_classes(layout):
    """layout: 'v2.2', 'v2.3', 'v2.4' or 'v2.7' (see engine.LAYOUTS for what each means)."""
    old_props = layout == "v2.2"
    enum_by_value = layout == "v2.2"  # torch 2.2 era imitated on Python 3.10
    with_storage_meta = layout in ("v2.4", "v2.7")
    with_modules = layout == "v2.7"
    with_version = layout == "v2.7"
    storage_info_getstate = layout == "v2.7"

    if old_props:
        enc = _make_encoding_enum(SHARD_MOD, "MEM_FORMAT_ENCODING", enum_by_value)
        props = _make_tensor_properties(SHARD_MOD, enc)
    else:
        enc = _make_encoding_enum(META_MOD, "_MEM_FORMAT_ENCODING", enum_by_value)
        props = _make_tensor_properties(META_MOD, enc)

    @dataclass
    class ChunkStorageMetadata:
        offsets: torch.Size
        sizes: torch.Size

    @dataclass
    class TensorStorageMetadata:
        properties: Any
        size: torch.Size
        chunks: List[Any]

    @dataclass
    class BytesStorageMetadata:
        pass

    @dataclass(frozen=True)
    class MetadataIndex:
        fqn: str
        offset: Optional[torch.Size] = None
        index: Optional[int] = field(hash=False, compare=False, default=None)

        # Hand-written __init__ as in torch: fqn and index are always set, offset only when
        # given, so a bytes item's pickled state has no 'offset' key at all.
        def __init__(self, fqn, offset=None, index=None):
            object.__setattr__(self, "fqn", fqn)
            object.__setattr__(self, "index", index)
            if offset is not None:
                object.__setattr__(self, "offset", torch.Size(offset))

    if storage_info_getstate:
        @dataclass
        class _StorageInfo:
            relative_path: str
            offset: int
            length: int
            transform_descriptors: Optional[List[str]] = None

            # Unset fields (transform_descriptors without stream extensions) stay out of the pickle.
            def __getstate__(self):
                return {k: v for k, v in self.__dict__.items() if v is not None}
    else:
        @dataclass
        class _StorageInfo:
            relative_path: str
            offset: int
            length: int

    storage_meta = None
    if with_storage_meta and with_modules:
        @dataclass
        class StorageMeta:
            checkpoint_id: Any = None
            save_id: Optional[str] = None
            load_id: Optional[str] = None
            modules: List[str] = field(default_factory=list)
        storage_meta = StorageMeta
    elif with_storage_meta:
        @dataclass
        class StorageMeta:
            checkpoint_id: Any = None
            save_id: Optional[str] = None
            load_id: Optional[str] = None
        storage_meta = StorageMeta

    if with_version:
        @dataclass
        class Metadata:
            state_dict_metadata: Dict[str, Any]
            planner_data: Any = None
            storage_data: Any = None
            storage_meta: Any = None
            version: Optional[str] = None
    elif with_storage_meta:
        @dataclass
        class Metadata:
            state_dict_metadata: Dict[str, Any]
            planner_data: Any = None
            storage_data: Any = None
            storage_meta: Any = None
    else:
        @dataclass
        class Metadata:
            state_dict_metadata: Dict[str, Any]
            planner_data: Any = None
            storage_data: Any = None

    for cls, name in ((ChunkStorageMetadata, "ChunkStorageMetadata"),
                      (TensorStorageMetadata, "TensorStorageMetadata"),
                      (BytesStorageMetadata, "BytesStorageMetadata"),
                      (MetadataIndex, "MetadataIndex"),
                      (Metadata, "Metadata")):
        _place(cls, META_MOD, name)
    _place(_StorageInfo, FS_MOD, "_StorageInfo")
    if storage_meta is not None:
        _place(storage_meta, META_MOD, "StorageMeta")

    placements = {
        f"{META_MOD}:ChunkStorageMetadata": ChunkStorageMetadata,
        f"{META_MOD}:TensorStorageMetadata": TensorStorageMetadata,
        f"{META_MOD}:BytesStorageMetadata": BytesStorageMetadata,
        f"{META_MOD}:MetadataIndex": MetadataIndex,
        f"{META_MOD}:Metadata": Metadata,
        f"{FS_MOD}:_StorageInfo": _StorageInfo,
        f"{props.__module__}:TensorProperties": props,
        f"{enc.__module__}:{enc.__qualname__}": enc,
    }
    if storage_meta is not None:
        placements[f"{META_MOD}:StorageMeta"] = storage_meta

    return ClassSet(layout, Metadata, TensorStorageMetadata, ChunkStorageMetadata,
                    BytesStorageMetadata, props, enc, MetadataIndex, _StorageInfo, storage_meta,
                    placements)


_MISSING = object()


def _module_for(name, created):
    """The live module called `name`: torch's own when it imports, else a stub."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        return importlib.import_module(name)
    except Exception:  # torch 1.13 has no DCP; its _shard package fails on Python 3.11
        pass
    mod = types.ModuleType(name)
    mod.__doc__ = "stand-in module created by testdata/gen/dcpgen/standin.py"
    sys.modules[name] = mod
    created.append(name)
    return mod


@contextlib.contextmanager
def installed(classes):
    """Make pickle find `classes` under their DCP names while the block runs."""
    created = []
    saved = []
    try:
        for key, cls in classes.install_map().items():
            mod_name, attr = key.split(":")
            mod = _module_for(mod_name, created)
            saved.append((mod, attr, getattr(mod, attr, _MISSING)))
            setattr(mod, attr, cls)
        yield classes
    finally:
        for mod, attr, old in reversed(saved):
            if old is _MISSING:
                delattr(mod, attr)
            else:
                setattr(mod, attr, old)
        for name in created:
            sys.modules.pop(name, None)
