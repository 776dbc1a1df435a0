# The file to fill in (handout: README.md here). Staff: generated from kernels/softmax_triton.py by `python -m autograder release`; edit the source.
"""Fused softmax over the last dimension in Triton: the same algorithms as kernels/softmax.cu.

Why fuse: the naive PyTorch softmax (max, subtract, exp, sum, divide: five kernels) reads
5MN + 2M elements and writes 3MN + 2M for an (M, N) input ("Fused Kernels",
techniques-for-large-scale-training.md).  One kernel that keeps a row on chip reads MN and
writes MN, the minimum; softmax is memory-bound, so time follows bytes.

Each program owns a tile of BLOCK_M rows x BLOCK_N columns (several short rows per program, like
the warp-per-row CUDA kernels and LightSeq's `ker_attn_softmax_lt32`). The launcher picks the
tile per row length, as LightSeq's templated launcher does (scaletrain/ops/tiles.py), and the
grader also launches your kernels with other tiles: a kernel must be right for whatever BLOCK_M,
BLOCK_N and SINGLE_TILE it is given. A row longer than one tile is streamed; how many passes over
it you make, and where the running statistics live between tiles, are yours to design: the safe
softmax reads the row three times, the online normalizer of Milakov & Gimelshein 2018 (§3,
Algorithm 3) twice. All arithmetic is fp32 whatever the storage (fp32, fp16, bf16).

Backward: derive dx from the softmax's Jacobian (notebook 01); it needs one reduction per row.

Runs on a GPU, or on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1 set before
triton is imported).  Wrappers take contiguous (rows, cols) tensors; scaletrain.ops flattens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scaletrain.ops.mask import MaskView
from scaletrain.ops.tiles import MAX_TILE_COLS, tile_shape  # noqa: F401 - the a1 grader reads MAX_TILE_COLS here
from scaletrain.ops.tiles import num_warps as _num_warps


@triton.jit
def _load_scores(x_ptr, mask_ptr, rows, cols, row, col, causal_len,
                 m_size1, m_size2, m_stride0, m_stride1, m_stride2, m_col_stride,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """fp32 tile x[row, col] + mask, -inf outside the row or in the causal future.
    row: [BLOCK_M] int64, col: [BLOCK_N]; rows past the end read 0 (finite, never stored).

    HAS_MASK: add the mask's element for (row, col), read in place through the m_* sizes and
      strides: they are `MaskView`'s fields (scaletrain/ops/mask.py states where element (r, c)
      sits). The mask may broadcast over rows and columns (strides 0): never expand it.
    CAUSAL: row r is query r % causal_len; columns after it become -inf (LightSeq's mask_future).
    """
    row_ok = row < rows
    inside = row_ok[:, None] & (col[None, :] < cols)
    x = tl.load(x_ptr + row[:, None] * cols + col[None, :], mask=inside, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        raise NotImplementedError('a1 task 1.1: implement `_load_scores` (see assignments/a1_kernels/README.md)')
    if CAUSAL:
        raise NotImplementedError('a1 task 1.1: implement `_load_scores` (see assignments/a1_kernels/README.md)')
    return tl.where(row_ok[:, None], x, 0.0)


@triton.jit
def softmax_fwd_kernel(x_ptr, y_ptr, mask_ptr, rows, cols, causal_len,
                       m_size1, m_size2, m_stride0, m_stride1, m_stride2, m_col_stride,
                       HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, SINGLE_TILE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = softmax(x + mask) for the BLOCK_M rows of program_id(0); see the module doc.

    Contract: every element of y[row, :cols] of your rows written (the grader fills y with NaN
    first), in y's dtype, from fp32 arithmetic; x and the mask read through `_load_scores`; any
    row length, SINGLE_TILE telling you the row fits one BLOCK_N tile. Graded: max-norm relative
    error on hidden irregular shapes (one element, short rows sharing a program, rows of several
    tiles), masks, causal mode, three dtypes, each a check of its own. Pitfalls: exp overflows
    unless the row's max is subtracted; a row whose first tiles are all -inf (a masked prefix)
    makes exp(-inf - -inf) = NaN in a naive running update; rows past `rows` must not be stored.
    """
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_N)
    raise NotImplementedError('a1 task 1.1: implement `softmax_fwd_kernel` (see assignments/a1_kernels/README.md)')


@triton.jit
def softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, rows, cols, SINGLE_TILE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx for the BLOCK_M rows of program_id(0), given the forward's output y and dy: the
    vector-Jacobian product of the softmax (derive it), in fp32, any row length (streamed in
    BLOCK_N chunks when not SINGLE_TILE). Graded like the forward, fp32 and 16-bit apart."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_N)
    raise NotImplementedError('a1 task 1.2: implement `softmax_bwd_kernel` (see assignments/a1_kernels/README.md)')


def softmax_fwd(x: torch.Tensor, mask: MaskView | None = None, causal_len: int = 0) -> torch.Tensor:
    """Softmax of each row of a contiguous (rows, cols) `x` after adding `mask` (a MaskView over
    the same (rows, cols)); causal_len > 0 hides columns c > r % causal_len."""
    rows, cols = x.shape
    y = torch.empty_like(x)
    block_m, block_n, single = tile_shape(x)
    mask_args = mask.kernel_args() if mask is not None else (1, 1, 0, 0, 0, 0)
    softmax_fwd_kernel[(triton.cdiv(rows, block_m),)](
        x, y, mask.tensor if mask is not None else x, rows, cols, max(causal_len, 1), *mask_args,
        HAS_MASK=mask is not None, CAUSAL=causal_len > 0, SINGLE_TILE=single,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=_num_warps(block_m, block_n))
    return y


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx for contiguous (rows, cols) `y` (the forward output) and `dy`."""
    rows, cols = y.shape
    dx = torch.empty_like(y)
    block_m, block_n, single = tile_shape(y)
    softmax_bwd_kernel[(triton.cdiv(rows, block_m),)](
        y, dy, dx, rows, cols, SINGLE_TILE=single, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=_num_warps(block_m, block_n))
    return dx
