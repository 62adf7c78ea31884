"""Local-shard geometry of DTensors, as DCP records it.

A DTensor's chunk is what DTensor's compute_local_shape_and_global_offset returns: for every mesh
dim with a Shard(d) placement the current local extent of tensor dim d is cut with torch.chunk
semantics (Shard._local_shard_size_on_dim / local_shard_size_and_offset):

    W | n:  size n/W at r*n/W
    else:   c = ceil(n/W); start = r*c; size = max(0, min(n, start+c) - start); offset = min(start, n)

so n=9, W=4 gives 3,3,3,0 (the empty one at offset 9) and n=5, W=4 gives 2,2,1,0 (offset 5).
Replicate() leaves the extent alone. Ranks are laid on the mesh in row-major order.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    dim: int

    def __str__(self):
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __str__(self):
        return "R"


def describe(placements):
    return "[" + ", ".join(str(p) for p in placements) + "]" if placements else "plain"


def chunk_size_and_offset(n, parts, idx):
    if n % parts == 0:
        c = n // parts
        return c, c * idx
    c = -(-n // parts)
    start = c * idx
    if n < start:
        return 0, n
    return min(n, start + c) - start, start


def mesh_coordinate(rank, mesh_shape):
    coord = []
    for size in reversed(mesh_shape):
        coord.append(rank % size)
        rank //= size
    return tuple(reversed(coord))


def local_box(shape, mesh_shape, coordinate, placements):
    """(sizes, offsets) of the local shard. Raises where torch 2.4's offset bookkeeping for a dim
    sharded twice would differ from the true geometry, so no case depends on a torch version."""
    sizes = list(shape)
    offsets = [0] * len(shape)
    torch24 = [0] * len(shape)
    for mdim, pl in enumerate(placements):
        if isinstance(pl, Replicate):
            continue
        d = pl.dim
        size, off = chunk_size_and_offset(sizes[d], mesh_shape[mdim], coordinate[mdim])
        sizes[d] = size
        offsets[d] += off
        torch24[d] = off if torch24[d] <= off else torch24[d] + off
    if offsets != torch24:
        raise ValueError(f"shape {shape} placements {placements}: nested sharding whose offsets "
                         "differ between torch releases; pick divisible sizes")
    return tuple(sizes), tuple(offsets)


class FakeDTensor:
    """What the stand-in path keeps of a DTensor: its global value and this rank's box."""

    def __init__(self, full, mesh_shape, coordinate, placements):
        self.full = full
        self.mesh_shape = tuple(mesh_shape)
        self.coordinate = coordinate
        self.placements = tuple(placements)
        self.dtype = full.dtype
        self.shape = full.shape
        if coordinate is None:
            self.sizes, self.offsets, self.local = None, None, None
            return
        self.sizes, self.offsets = local_box(tuple(full.shape), self.mesh_shape, coordinate,
                                             placements)
        box = tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))
        # DTensor.to_local(): a tensor of the box's shape (FSDP2's is a view of padded storage,
        # which DCP's writer clones; the saved bytes are the same).
        self.local = full[box].clone() if full.dim() else full.clone()

    def size(self):
        return self.full.size()

    def to_local(self):
        return self.local


def is_tensor(value):
    return isinstance(value, (torch.Tensor, FakeDTensor))
