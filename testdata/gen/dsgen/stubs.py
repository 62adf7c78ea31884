"""Stand-ins for the DeepSpeed classes that DeepSpeed pickles into its checkpoint files.

DeepSpeed is not installed here. pickle records a class as (module, qualified name) and, when
writing, checks that sys.modules[module].<name> is the very class being pickled, so each
stand-in is defined under the exact module path DeepSpeed uses and registered in sys.modules.
The instances then pickle exactly as DeepSpeed's own do:

* fragment_address: a @dataclass (fields numel, start) -> NEWOBJ + BUILD with {'numel', 'start'}.
* ZeroStageEnum: an int Enum; Python 3.11 reduces members to getattr(cls, name), so the files
  carry GLOBAL __builtin__.getattr like the real ones.
* LossScaler / DynamicLossScaler: plain classes whose __dict__ is filled in the order of
  DeepSpeed's constructors (deepspeed/runtime/fp16/loss_scaler.py).

Registering is idempotent, and if a real deepspeed package is importable its classes are used.
"""
import dataclasses
import enum
import importlib.util
import sys
import types

import torch

_REGISTERED = {}


def _module(name):
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__dict__["__stand_in__"] = True
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, mod)
    return mod


def _place(cls, module_name):
    """Publish cls as module_name.<name>, unless that module already defines it (a real class
    imported earlier wins, so pickling its instances keeps working)."""
    mod = _module(module_name)
    existing = getattr(mod, cls.__name__, None)
    if isinstance(existing, type):
        return existing
    cls.__module__ = module_name
    cls.__qualname__ = cls.__name__
    setattr(mod, cls.__name__, cls)
    return cls


def register():
    """Make the DeepSpeed classes importable and return them as a dict by short name."""
    if _REGISTERED:
        return _REGISTERED
    if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is not None:
        from deepspeed.utils.tensor_fragment import fragment_address  # noqa: real package
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.runtime.fp16.loss_scaler import LossScaler, DynamicLossScaler
        _REGISTERED.update(fragment_address=fragment_address, ZeroStageEnum=ZeroStageEnum,
                           LossScaler=LossScaler, DynamicLossScaler=DynamicLossScaler)
        return _REGISTERED

    @dataclasses.dataclass
    class fragment_address:  # noqa: N801 - DeepSpeed's name
        numel: int
        start: int

    fragment_address = _place(fragment_address, "deepspeed.utils.tensor_fragment")
    # Mid-2022 checkpoints name it under bf16_optimizer; DeepSpeed keeps that alias.
    setattr(_module("deepspeed.runtime.bf16_optimizer"), "fragment_address", fragment_address)

    class ZeroStageEnum(int, enum.Enum):
        __module__ = "deepspeed.runtime.zero.config"
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
        max_stage = 3

    ZeroStageEnum = _place(ZeroStageEnum, "deepspeed.runtime.zero.config")

    class LossScalerBase:
        def __init__(self, cur_scale):
            self.cur_scale = cur_scale
            self.dynamic = False

    class LossScaler(LossScalerBase):
        def __init__(self, scale=1):
            super().__init__(scale)

    class DynamicLossScaler(LossScalerBase):
        def __init__(self, init_scale=2**32, scale_factor=2., scale_window=1000, min_scale=1,
                     delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=True,
                     dtype=torch.half):
            super().__init__(init_scale)
            self.cur_iter = 0
            self.last_overflow_iter = -1
            self.scale_factor = scale_factor
            self.scale_window = scale_window
            self.min_scale = min_scale
            self.delayed_shift = delayed_shift
            self.cur_hysteresis = delayed_shift
            self.consecutive_hysteresis = consecutive_hysteresis
            self.raise_error_at_min_scale = raise_error_at_min_scale
            self.dynamic = True
            self.dtype = dtype

    LossScalerBase, LossScaler, DynamicLossScaler = (
        _place(cls, "deepspeed.runtime.fp16.loss_scaler") for cls in (LossScalerBase, LossScaler, DynamicLossScaler))

    @dataclasses.dataclass
    class SubparamShape:
        patterns: list
        shape: tuple
        partition_dim: int

    SubparamShape = _place(SubparamShape, "deepspeed.checkpoint.universal_checkpoint")

    _REGISTERED.update(fragment_address=fragment_address, ZeroStageEnum=ZeroStageEnum,
                       LossScaler=LossScaler, DynamicLossScaler=DynamicLossScaler,
                       SubparamShape=SubparamShape)
    return _REGISTERED
