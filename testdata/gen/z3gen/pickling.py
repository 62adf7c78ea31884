"""A pickle module for torch.save that writes tensors carrying Python attributes the way torch >= 2.0 does.

DeepSpeed sets `ds_id` (a str "first_last") on every ZeRO-3 `fp32_flat_groups` tensor
(stage3.py `_create_fp32_partitions`). torch >= 2.0's Tensor.__reduce_ex__ sees the non-empty
instance state and pickles such a tensor as
    torch._tensor._rebuild_from_type_v2(torch._utils._rebuild_tensor_v2, torch.Tensor, args, {'ds_id': ...})
whereas torch 1.13 (installed here, and the version that wrote testdata/fixtures/deepspeed-real)
takes its fast path for plain Tensors and drops the attribute. This Pickler reproduces the torch 2
form through `reducer_override`; torch.save still supplies the storage persistent ids (they are
handled before reducer_override is consulted), so everything else is byte-for-byte torch 1.13.
"""
import pickle
import types

import torch


class _Torch2Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) is torch.Tensor and obj.__dict__:
            func, args = obj._reduce_ex_internal(2)
            return (torch._tensor._rebuild_from_type_v2, (func, torch.Tensor, args, dict(obj.__dict__)))
        return NotImplemented


torch2_pickle_module = types.ModuleType("z3gen_torch2_pickle")
torch2_pickle_module.Pickler = _Torch2Pickler
torch2_pickle_module.Unpickler = pickle.Unpickler


def save(obj, path, torch2_attrs=False):
    """torch.save with protocol 2 (DeepSpeed's TorchCheckpointEngine uses torch.save defaults)."""
    if torch2_attrs:
        torch.save(obj, path, pickle_module=torch2_pickle_module)
    else:
        torch.save(obj, path)
