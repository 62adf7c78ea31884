"""A CPU stand-in for the CUDA package `grouped_gemm` (github:fanshiqing/grouped_gemm), for the
fixture generators only (testdata/gen/megatron_grouped_fixtures.py). Never used by ucp.

megatron-core's legacy GroupedMLP (megatron/core/transformer/moe/experts.py, core <= 0.16.1) asserts in
__init__ that `grouped_gemm` imports (moe/grouped_gemm_util.py `assert_grouped_gemm_is_available`) and
computes its two expert GEMMs in forward with `grouped_gemm.ops.gmm(x, w, tokens_per_expert,
trans_b=False)`. The package is a CUDA extension (CUTLASS/cuBLAS kernels), so it cannot be installed
on a machine without a GPU. This module provides `ops.gmm` only, written here as a loop of torch
matmuls (differentiable through autograd); it changes nothing about the parameters Megatron creates
or saves, which is what the fixtures record.
"""

from . import ops  # noqa: F401

__all__ = ["ops"]
