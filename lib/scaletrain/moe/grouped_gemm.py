"""All experts' GEMMs in one grouped computation over variable-size token groups, and its two
naive references.

The experts' input is one (N, K) matrix whose rows are grouped by expert, `counts[e]` rows for
expert e (dropless.py), and one weight per expert, stacked (E, K, F). Wanted: the (N, F) matrix
whose group e is X_e · W_e. Three ways, the naive two beside the grouped one (module 3's habit):

  loop     E separate matmuls, then a concatenation. Each GEMM is as small as its group: on a GPU
           one launch per expert and an idle device for the small ones; in autograd E graph nodes
           and, backward, E more plus the split. Work: exactly 2·N·K·F FLOPs.
  padded   every group padded with zero rows to the largest, M = max counts, then one batched
           matmul (E, M, K) × (E, K, F): one call, static shapes (GShard's and Switch's layout),
           but 2·E·M·K·F FLOPs and E·M·(K+F) elements of memory: the more imbalanced the routing,
           the more of it is padding (M = N when one expert takes everything: E times the work).
  grouped  one call over the groups as they are (CUTLASS's grouped GEMM, MegaBlocks' block-sparse
           products, torch's `F.grouped_mm`): the work of the loop, the single launch of the padded
           version, no padding. Its backward is two more grouped products (MegaBlocks §4-5):
               dX_e = dY_e · W_eᵀ        grouped over rows, like the forward
               dW_e = X_eᵀ · dY_e        grouped over the *reduction* dimension: the groups of
                                         rows are summed over, one (K, F) result per expert

`grouped_mm` is an autograd Function that states exactly those three products. Each runs on a
kernel, `kernel=`:
  "mm"     one `torch.mm` per group written into slices of one output buffer: no per-group
           tensors, no concatenation, one autograd node, any dtype (float64 for gradcheck);
  "torch"  torch's grouped GEMM, `F.grouped_mm`, one call (float32, bfloat16 or float16, every
           non-unit stride a multiple of 16 bytes);
  "auto"   "torch" on a CUDA device where it accepts the operands (one launch instead of E: the
           point of grouping on a GPU), "mm" elsewhere. On this course's CPUs torch's kernel is no
           faster than "mm" (`python -m scaletrain.bench moe`, table 2); not yet run on a GPU here.

Why the loop is slow in autograd beyond its E calls: `w[e]` is a select, whose backward writes
the slice's gradient into a zero tensor of w's full (E, K, F) shape, once per expert: E² K F
elements written for E K F of gradient (the bench's E = 32 row).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["grouped_mm", "grouped_mm_loop", "grouped_mm_padded", "GEMMS", "KERNELS", "torch_kernel_accepts"]

KERNELS = ("auto", "torch", "mm")
_TORCH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, w: torch.Tensor, counts: Sequence[int]) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1] or len(counts) != w.shape[0]:
        raise ValueError(f"grouped GEMM: x (N, K), w (E, K, F) and E counts; got x {tuple(x.shape)}, "
                         f"w {tuple(w.shape)}, {len(counts)} counts")
    if sum(counts) != x.shape[0] or min(counts, default=0) < 0:
        raise ValueError(f"grouped GEMM: counts {list(counts)} must be >= 0 and sum to N = {x.shape[0]}")


def grouped_mm_loop(x: torch.Tensor, w: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Naive reference 1: one matmul per expert, concatenated. (N, K), (E, K, F) -> (N, F)."""
    _check(x, w, counts)
    return torch.cat([xe @ w[e] for e, xe in enumerate(x.split(list(counts)))] + [x.new_zeros(0, w.shape[2])])


def grouped_mm_padded(x: torch.Tensor, w: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Naive reference 2: groups padded with zero rows to M = max(counts), one batched matmul
    (E, M, K) × (E, K, F), the padding rows dropped again. (N, K), (E, K, F) -> (N, F)."""
    _check(x, w, counts)
    e, m = len(counts), max(counts, default=0)
    # row i of group g lands in slot g·M + i of the padded buffer
    slot = torch.cat([torch.arange(c) + g * m for g, c in enumerate(counts)] + [torch.zeros(0, dtype=torch.long)])
    padded = x.new_zeros(e * m, x.shape[1]).index_copy(0, slot.to(x.device), x)
    return torch.bmm(padded.view(e, m, x.shape[1]), w).view(e * m, w.shape[2]).index_select(0, slot.to(x.device))


def torch_kernel_accepts(*tensors: torch.Tensor) -> bool:
    """Whether torch's grouped GEMM takes these operands: a dtype it has, every non-unit stride a
    multiple of 16 bytes."""
    return all(t.dtype in _TORCH_DTYPES and all(s == 1 or (s * t.element_size()) % 16 == 0 for s in t.stride())
               for t in tensors)


def _offsets(counts: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)


def _rows(a: torch.Tensor, b: torch.Tensor, counts: Sequence[int], kernel: str) -> torch.Tensor:
    """Grouped over rows: group e of a (N, K) times b[e] (K, F) -> (N, F)."""
    if kernel == "torch" or (kernel == "auto" and a.is_cuda and torch_kernel_accepts(a, b)):
        return F.grouped_mm(a, b, offs=_offsets(counts, a.device))
    out = a.new_empty(a.shape[0], b.shape[2])
    lo = 0
    for e, c in enumerate(counts):
        if c:
            torch.mm(a[lo:lo + c], b[e], out=out[lo:lo + c])
        lo += c
    return out


def _reduction(a: torch.Tensor, b: torch.Tensor, counts: Sequence[int], kernel: str) -> torch.Tensor:
    """Grouped over the reduction dimension: a_eᵀ · b_e for row groups of a (N, K), b (N, F) -> (E, K, F)."""
    at = a.t()
    if kernel == "torch" or (kernel == "auto" and a.is_cuda and torch_kernel_accepts(at, b)):
        return F.grouped_mm(at, b, offs=_offsets(counts, a.device))
    out = a.new_zeros(len(counts), a.shape[1], b.shape[1])  # an empty group's gradient is 0
    lo = 0
    for e, c in enumerate(counts):
        if c:
            torch.mm(at[:, lo:lo + c], b[lo:lo + c], out=out[e])
        lo += c
    return out


class _GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, counts, kernel):
        ctx.save_for_backward(x, w)
        ctx.counts, ctx.kernel = counts, kernel
        return _rows(x, w, counts, kernel)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()  # autograd may hand an expanded gradient (a sum's): strides 0
        dx = _rows(dy, w.transpose(1, 2), ctx.counts, ctx.kernel) if ctx.needs_input_grad[0] else None
        dw = _reduction(x, dy, ctx.counts, ctx.kernel) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: Sequence[int], *, kernel: str = "auto") -> torch.Tensor:
    """Group e of x (counts[e] rows) times w[e], for all experts in one call; forward and backward
    are grouped products (module docstring). (N, K), (E, K, F) -> (N, F). `kernel`: "auto" (torch's
    grouped GEMM on CUDA where it accepts the operands, else one mm per group), "torch" or "mm"."""
    _check(x, w, counts)
    if kernel not in KERNELS:
        raise ValueError(f"grouped_mm: kernel must be one of {KERNELS}, got {kernel!r}")
    if x.shape[0] == 0:  # no rows: torch's kernel wants at least one offset past 0
        return x.new_zeros(0, w.shape[2]) + 0 * w.sum()
    return _GroupedMM.apply(x.contiguous(), w, [int(c) for c in counts], kernel)


GEMMS = {"grouped": grouped_mm, "loop": grouped_mm_loop, "padded": grouped_mm_padded}
