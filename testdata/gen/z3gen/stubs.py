"""Stand-ins for the DeepSpeed classes pickled into ZeRO-3 checkpoint files.

DeepSpeed is not installed here. pickle names a class by (module, qualified name) and, when
writing, checks that sys.modules[module].<name> is the very object being pickled, so each
stand-in lives under DeepSpeed's exact module path and is registered in sys.modules:

* ZeroStageEnum (deepspeed/runtime/zero/config.py): an int Enum. Python 3.11 reduces enum
  members to getattr(cls, 'weights'), so files carry GLOBAL __builtin__.getattr, as the real
  DeepSpeed-written files in /work/shared/fixtures/deepspeed-real do.
* LossScaler / DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py): plain classes whose
  __dict__ is filled in the order of DeepSpeed's constructors; pickled as NEWOBJ + BUILD.

If a real deepspeed package is importable its classes are used instead.
"""
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
    cls.__module__ = module_name
    cls.__qualname__ = cls.__name__
    setattr(_module(module_name), cls.__name__, cls)
    return cls


def register():
    """Make the DeepSpeed classes importable; return them as a dict by short name."""
    if _REGISTERED:
        return _REGISTERED
    if importlib.util.find_spec("deepspeed") is not None and "deepspeed" not in sys.modules:
        from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: real package
        from deepspeed.runtime.fp16.loss_scaler import LossScaler, DynamicLossScaler
        _REGISTERED.update(ZeroStageEnum=ZeroStageEnum, LossScaler=LossScaler,
                           DynamicLossScaler=DynamicLossScaler)
        return _REGISTERED

    class ZeroStageEnum(int, enum.Enum):
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
        max_stage = 3

    _place(ZeroStageEnum, "deepspeed.runtime.zero.config")

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

    for cls in (LossScalerBase, LossScaler, DynamicLossScaler):
        _place(cls, "deepspeed.runtime.fp16.loss_scaler")

    _REGISTERED.update(ZeroStageEnum=ZeroStageEnum, LossScaler=LossScaler,
                       DynamicLossScaler=DynamicLossScaler)
    return _REGISTERED
