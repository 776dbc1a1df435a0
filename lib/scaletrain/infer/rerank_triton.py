"""Retrieve and re-rank in Triton: the launcher of kernels/retrieve_rerank_triton.py (one program per row).

The same contract as `scaletrain.infer.rerank.retrieve_rerank`, plus the number of candidates each
row re-ranked. It runs on CUDA, or on CPU through the Triton interpreter (TRITON_INTERPRET=1 before
triton is imported). Kept out of rerank.py, which is a student file of assignment a12 whose re-rank
may not call a finished one.
"""

from __future__ import annotations

import torch

from scaletrain.infer.rerank import check_shapes
from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module

__all__ = ["retrieve_rerank_triton"]


def retrieve_rerank_triton(x: torch.Tensor, k: int, *, groups: int | None = None):
    """The kernel's (values, indices, candidates per row)."""
    groups = groups or k
    check_shapes(x, k, groups)
    return load_kernel_module(KERNELS_DIR / "retrieve_rerank_triton.py").retrieve_rerank(x, k, groups)
