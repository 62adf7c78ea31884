"""A single-process re-enactment of dcp.save(state_dict, FileSystemWriter(...)) on W ranks.

The steps and their order follow torch/distributed/checkpoint (state_dict_saver._save_state_dict,
default_planner, planner_helpers, _dedup_save_plans, filesystem):

1. every rank flattens its state dict and makes a local SavePlan (one WriteItem per DTensor shard,
   plain tensor or non-tensor value);
2. the plans travel to the coordinator (a pickle round trip, as dist.gather_object does), which
   deduplicates them, builds the global plan and the Metadata, merges planner_data and gives each
   plan its file prefix "__{rank}_";
3. each plan travels back (a round trip, as scatter_object_list does) and its rank writes its
   .distcp files: bytes items first, then tensors, each a complete torch.save stream;
4. the write results travel to the coordinator (a round trip) which fills storage_data and
   storage_meta and pickles the Metadata to .metadata with the default protocol.

The round trips matter: they decide which strings and objects are shared inside the final
pickle (memo references), just as in a real multi-process save.
"""

import dataclasses
import io
import os
import pathlib
import pickle
from collections import ChainMap
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, List, Optional

import torch

from . import flatten as flat_mod
from .sharding import FakeDTensor, is_tensor
from .standin import build_classes, installed


@dataclass(frozen=True)
class Layout:
    """What a torch release does differently when saving."""
    name: str
    flatten: str              # "2.3" or "2.4" traversal rules
    bytes_on_all_ranks: bool  # False: only the coordinator plans non-tensor values
    version: Optional[str]    # Metadata.version
    about: str
    dedup_lowest: bool = False  # old dedup_tensors: a replicated item stays with the lowest rank


LAYOUTS = {
    "v2.2": Layout("v2.2", "2.3", False, None,
                   "torch ~2.2 on Python 3.10: Metadata(state_dict_metadata, planner_data, "
                   "storage_data); TensorProperties/MEM_FORMAT_ENCODING from "
                   "torch.distributed._shard.sharded_tensor.metadata; enum members pickled by "
                   "value; <= 2.3 flattening; non-tensor values planned by rank 0 only; "
                   "replicated tensors kept by the lowest rank (dedup_tensors)", True),
    "v2.3": Layout("v2.3", "2.3", True, None,
                   "torch ~2.3: TensorProperties/_MEM_FORMAT_ENCODING moved to "
                   "torch.distributed.checkpoint.metadata; no storage_meta yet; <= 2.3 flattening"),
    "v2.4": Layout("v2.4", "2.4", True, None,
                   "torch 2.4 to 2.6: Metadata.storage_meta = StorageMeta(checkpoint_id, save_id, "
                   "load_id); >= 2.4 flattening; no version, no StorageMeta.modules (real torch "
                   "2.6 writes exactly this)"),
    "v2.7": Layout("v2.7", "2.4", True, "1.0.0",
                   "torch >= 2.7 (after 2.6; the exact release is not pinned down): "
                   "Metadata.version = '1.0.0'; StorageMeta.modules; _StorageInfo has "
                   "transform_descriptors, left out of the pickle when unset"),
}


class WriteItemType(Enum):
    TENSOR = auto()
    SHARD = auto()
    BYTE_IO = auto()


@dataclass(frozen=True)
class TensorWriteData:
    chunk: Any
    properties: Any
    size: torch.Size


@dataclass(frozen=True)
class WriteItem:
    index: Any
    type: WriteItemType
    tensor_data: Optional[TensorWriteData] = None

    def tensor_storage_size(self):
        # The GLOBAL tensor's bytes, not the chunk's: that is what dedup and the thread
        # buckets weigh items by.
        if self.tensor_data is None:
            return None
        n = 1
        for s in self.tensor_data.size:
            n *= s
        return n * torch.empty((), dtype=self.tensor_data.properties.dtype).element_size()


@dataclass(frozen=True)
class SavePlan:
    items: List[WriteItem]
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass(frozen=True)
class WriteResult:
    index: Any
    size_in_bytes: int
    storage_data: Any


@dataclass
class StoragePrefix:
    prefix: str


def roundtrip(obj):
    """What crossing a process boundary through torch.distributed's object collectives does."""
    return pickle.loads(pickle.dumps(obj))


def _write_items(C, fqn, obj):
    if isinstance(obj, FakeDTensor):
        sizes, offsets = torch.Size(obj.sizes), torch.Size(obj.offsets)
        return [WriteItem(
            index=C.MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
            tensor_data=TensorWriteData(
                chunk=C.ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                properties=C.TensorProperties.create_from_tensor(obj.to_local()),
                size=obj.size()))]
    if isinstance(obj, torch.Tensor):
        offsets = torch.Size([0] * obj.dim())
        return [WriteItem(
            index=C.MetadataIndex(fqn, offsets), type=WriteItemType.TENSOR,
            tensor_data=TensorWriteData(
                chunk=C.ChunkStorageMetadata(offsets=offsets, sizes=obj.size()),
                properties=C.TensorProperties.create_from_tensor(obj),
                size=obj.size()))]
    return [WriteItem(index=C.MetadataIndex(fqn), type=WriteItemType.BYTE_IO)]


def local_plan(C, layout, flat, mappings, is_coordinator):
    items = []
    for fqn, obj in flat.items():
        if isinstance(obj, FakeDTensor):
            if obj.coordinate is not None:  # only ranks inside the DTensor's mesh
                items += _write_items(C, fqn, obj)
        elif isinstance(obj, torch.Tensor) or layout.bytes_on_all_ranks or is_coordinator:
            items += _write_items(C, fqn, obj)
    return SavePlan(items, planner_data=mappings)


def dedup_save_plans(plans, save_to_lowest_rank=False):
    """Each MetadataIndex (fqn + offset; the index hint is not compared) stays in one plan: walking
    items in first-seen order, the holder whose plan is smallest so far (ties: lowest rank)."""
    holders = {}
    item_of = {}
    for i, plan in enumerate(plans):
        for wi in plan.items:
            holders.setdefault(wi.index, set()).add(i)
            item_of[wi.index] = wi
    to_remove = [set() for _ in plans]
    planned = [0] * len(plans)
    for idx, ranks in holders.items():
        if save_to_lowest_rank:
            chosen = min(ranks)
        else:
            chosen = min(ranks, key=lambda r: planned[r])
        planned[chosen] += item_of[idx].tensor_storage_size() or 1
        ranks.remove(chosen)
        for r in ranks:
            to_remove[r].add(idx)
    return [dataclasses.replace(p, items=[wi for wi in p.items if wi.index not in to_remove[i]])
            for i, p in enumerate(plans)]


def global_plan(C, plans):
    md = {}
    new_plans = []
    for plan in plans:
        new_items = []
        for item in plan.items:
            if item.type != WriteItemType.SHARD and item.index.fqn in md:
                raise ValueError(f"{item.index.fqn}: planned twice")
            if item.type == WriteItemType.BYTE_IO:
                md[item.index.fqn] = C.BytesStorageMetadata()
                new_items.append(item)
                continue
            tmd = md.setdefault(item.index.fqn, C.TensorStorageMetadata(
                properties=item.tensor_data.properties, size=item.tensor_data.size, chunks=[]))
            new_index = dataclasses.replace(item.index, index=len(tmd.chunks))
            new_items.append(dataclasses.replace(item, index=new_index))
            tmd.chunks.append(item.tensor_data.chunk)
        new_plans.append(dataclasses.replace(plan, items=new_items))
    return new_plans, C.Metadata(md)


def validate_global_plan(C, metadata):
    """DCP refuses to save (ValueError) unless every tensor's chunks are in bounds, pairwise
    disjoint and cover the tensor; 0-dim tensors are skipped."""
    for key, value in metadata.state_dict_metadata.items():
        if isinstance(value, C.BytesStorageMetadata) or len(value.size) == 0:
            continue
        volume = 0
        for i, a in enumerate(value.chunks):
            for d in range(len(value.size)):
                if a.offsets[d] < 0 or a.sizes[d] < 0 or a.offsets[d] + a.sizes[d] > value.size[d]:
                    raise ValueError(f"{key}: chunk {a} out of bounds of {value.size}")
            n = 1
            for s in a.sizes:
                n *= s
            volume += n
            for b in value.chunks[i + 1:]:
                if all(not (a.offsets[d] >= b.offsets[d] + b.sizes[d] or
                            b.offsets[d] >= a.offsets[d] + a.sizes[d])
                       for d in range(len(value.size))):
                    raise ValueError(f"{key}: chunks {a} and {b} overlap")
        total = 1
        for s in value.size:
            total *= s
        if volume != total:
            raise ValueError(f"{key}: chunks cover {volume} of {total} elements")


def split_by_size_and_type(bins, items):
    """FileSystemWriter's thread buckets: bytes items round-robin, tensors largest first (by
    global size) into the lightest bucket."""
    if bins == 1:
        return [items]
    bytes_w = [wi for wi in items if wi.type == WriteItemType.BYTE_IO]
    tensor_w = [wi for wi in items if wi.type != WriteItemType.BYTE_IO]
    buckets = [[] for _ in range(bins)]
    weights = [0] * bins
    tensor_w.sort(key=lambda wi: wi.tensor_storage_size(), reverse=True)
    for i, wi in enumerate(bytes_w):
        buckets[i % bins].append(wi)
    for wi in tensor_w:
        j = min(range(bins), key=lambda b: weights[b])
        buckets[j].append(wi)
        weights[j] += wi.tensor_storage_size()
    return buckets


def _lookup(flat, index):
    obj = flat[index.fqn]
    if isinstance(obj, FakeDTensor):
        return obj.to_local()
    return obj


def _storage_bytes(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    return t.storage().size() * t.element_size()  # torch 1.13


def write_rank(C, plan, flat, out_dir, thread_count, loader):
    """FileSystemWriter.write_data for one rank; returns its WriteResults in file order."""
    prefix = plan.storage_data.prefix
    results = []
    for n, bucket in enumerate(split_by_size_and_type(thread_count, plan.items)):
        file_name = f"{prefix}{n}.distcp"
        tensor_w = [wi for wi in bucket if wi.type != WriteItemType.BYTE_IO]
        if loader == "sorted" and thread_count == 1:
            # _OverlappingCpuLoader (CUDA present, one thread) hands tensors back sorted by
            # global byte size, ascending, stable.
            tensor_w.sort(key=lambda wi: wi.tensor_storage_size())
        bytes_w = [wi for wi in bucket if wi.type == WriteItemType.BYTE_IO]
        with open(os.path.join(out_dir, file_name), "wb") as f:
            for wi in bytes_w:
                buf = io.BytesIO()
                torch.save(_lookup(flat, wi.index), buf)
                offset = f.tell()
                f.write(buf.getbuffer())
                length = f.tell() - offset
                results.append(WriteResult(wi.index, length, C.StorageInfo(file_name, offset, length)))
            for wi in tensor_w:
                t = _lookup(flat, wi.index).detach().cpu()
                if _storage_bytes(t) != t.numel() * t.element_size():
                    t = t.clone()  # a view: save only the chunk's own elements
                offset = f.tell()
                torch.save(t, f)
                length = f.tell() - offset
                results.append(WriteResult(wi.index, length, C.StorageInfo(file_name, offset, length)))
    return results


def save(layout_name, rank_state_dicts, out_dir, checkpoint_id, save_id, thread_count=1,
         loader="serial"):
    """Write a DCP checkpoint of the given per-rank state dicts into out_dir. Returns a summary
    with the flattened state dict of every rank and the plans before/after dedup."""
    layout = LAYOUTS[layout_name]
    C = build_classes(layout_name)
    os.makedirs(out_dir, exist_ok=True)
    with installed(C):
        flats = []
        gathered = []
        for r, sd in enumerate(rank_state_dicts):
            flat, mappings = flat_mod.flatten_state_dict(sd, is_tensor, layout.flatten)
            flats.append(flat)
            gathered.append(roundtrip(local_plan(C, layout, flat, mappings, r == 0)))

        # coordinator
        deduped = dedup_save_plans(gathered, layout.dedup_lowest)
        plans, metadata = global_plan(C, deduped)
        merged = dict(ChainMap(*[p.planner_data for p in plans]))
        metadata = dataclasses.replace(metadata, planner_data=merged)
        validate_global_plan(C, metadata)
        plans = [dataclasses.replace(p, storage_data=StoragePrefix(f"__{i}_"))
                 for i, p in enumerate(plans)]

        all_results = []
        for r, plan in enumerate(plans):
            mine = roundtrip(plan)
            all_results.append(roundtrip(write_rank(C, mine, flats[r], out_dir, thread_count,
                                                    loader)))

        # coordinator: FileSystemWriter.finish
        if layout.version is not None:
            metadata.version = layout.version
        storage = {}
        for results in all_results:
            storage.update({wr.index: wr.storage_data for wr in results})
        metadata.storage_data = storage
        if C.StorageMeta is not None:
            metadata.storage_meta = C.StorageMeta(checkpoint_id=pathlib.Path(checkpoint_id),
                                                  save_id=save_id)
        tmp = os.path.join(out_dir, ".metadata.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(metadata, f)
        os.replace(tmp, os.path.join(out_dir, ".metadata"))

    return {
        "flats": flats,
        "planned_by": [[wi.index.fqn for wi in p.items] for p in gathered],
        "kept_by": [[wi.index.fqn for wi in p.items] for p in plans],
    }
