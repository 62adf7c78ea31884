"""Stand-ins for the DeepSpeed classes pickled into ZeRO-3 checkpoint files.

They are the ones the ZeRO-1/2 generator registers (dsgen/stubs.py): ZeroStageEnum,
LossScaler and DynamicLossScaler under DeepSpeed's exact module paths, or the real classes
when a deepspeed package is importable.
"""
from dsgen.stubs import register  # noqa: F401
