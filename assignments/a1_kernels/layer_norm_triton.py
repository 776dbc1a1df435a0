# The file to fill in (handout: README.md here). Staff: generated from kernels/layer_norm_triton.py by `python -m autograder release`; edit the source.
"""Fused LayerNorm over the last dimension in Triton: the same algorithms as kernels/layer_norm.cu.

Forward, per row of N elements ("Rewrite Reduction: LayerNorm Forward",
accelerating-transformer-training-lecture.md): the mean and the variance come from ONE pass
that reduces the pair (sum d, sum d^2) with d = x - x[0], using sigma^2 = mu(d^2) - mu(d)^2
(variance is shift-invariant; the shift by the row's first element keeps the subtraction from
cancelling when |mu| >> sigma).  y = (x - mu) * rstd * w + b; mean and rstd (fp32) are saved.

Backward for x ("Rewrite Reduction: LayerNorm Backward", same lecture): with g = w * dy,
    dx_i = rstd g_i + alpha_i sum_j g_j + beta_i sum_j g_j x_j,
    alpha_i = ((x_i - mu) mu rstd^2 - 1) rstd / N,     beta_i = (mu - x_i) rstd^3 / N,
so both reductions (sum g, sum g x) are independent and happen in one pass (the slide prints
sigma where sigma^2 belongs in alpha's numerator; notebooks/01_kernel_fusion.ipynb checks this form).
_dx evaluates it regrouped, rstd (g_i - sum g / N - xhat_i rstd (sum g x - mu sum g) / N), so
that it is exactly 0 at N = 1 on a GPU too (fused multiply-adds; the a1 handout says why).
Backward for w and b: dw_j = sum_r dy_rj xhat_rj, db_j = sum_r dy_rj, a reduction ACROSS rows:
programs own (row group, column block) tiles and write fp32 partial sums, summed at the end.

Tiles (scaletrain/ops/tiles.py), fp32 arithmetic and the interpreter as in softmax_triton.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scaletrain.ops.tiles import MAX_TILE_COLS, TILE_ELEMENTS, tile_shape  # noqa: F401 - as in softmax_triton
from scaletrain.ops.tiles import num_warps as _num_warps


@triton.jit
def _moments(s1, s2, shift, cols, eps):
    """(mean, rstd) from the shifted sums s1 = sum d, s2 = sum d^2 over a row of `cols` elements,
    d = x - shift: mean = shift + mu(d), var = mu(d^2) - mu(d)^2, rstd = 1 / sqrt(var + eps)."""
    raise NotImplementedError('a1 task 1.3: implement `_moments` (see assignments/a1_kernels/README.md)')


@triton.jit
def _affine(y, w_ptr, b_ptr, col, cmask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        y = y * tl.load(w_ptr + col, mask=cmask, other=1.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + col, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, eps,
                          HAS_W: tl.constexpr, HAS_B: tl.constexpr, SINGLE_TILE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = (x - mean) * rstd * w + b for the BLOCK_M rows of program_id(0); stores mean and rstd
    (fp32, one per row).  One pass for the shifted sums (shift = the row's first element),
    _moments, then normalize: from registers when SINGLE_TILE, else a second pass over the row.
    _affine applies w and b when present."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_N)
    row_ok = row < rows
    raise NotImplementedError('a1 task 1.3: implement `layer_norm_fwd_kernel` (see assignments/a1_kernels/README.md)')


@triton.jit
def _load_x_g(dy_ptr, x_ptr, w_ptr, offs, col, inside, cmask, HAS_W: tl.constexpr):
    """fp32 tiles x and g = w * dy (0 outside)."""
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    if HAS_W:
        g = g * tl.load(w_ptr + col, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return x, g


@triton.jit
def _dx(x, g, mean, rstd, sum_g, sum_gx, cols):
    """dx_i = rstd g_i + alpha_i sum g + beta_i sum g x (the LightSeq rewrite, module doc),
    evaluated as rstd (g_i - sum g / N - xhat_i c) with c = rstd (sum g x - mean sum g) / N:
    the terms that cancel (exactly, at N = 1) meet before rstd ~ 1/sqrt(eps) multiplies them, so a
    fused multiply-add cannot leave one product's rounding error behind, and sum g / N divides
    with IEEE rounding (`/` is div.full.f32 on NVIDIA, within 2 ulp).
    x, g: [BLOCK_M, BLOCK_N] tiles; mean, rstd, sum_g, sum_gx: [BLOCK_M], one per row."""
    raise NotImplementedError('a1 task 1.4: implement `_dx` (see assignments/a1_kernels/README.md)')


@triton.jit
def layer_norm_bwd_dx_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, rows, cols,
                             HAS_W: tl.constexpr, SINGLE_TILE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx for the BLOCK_M rows of program_id(0) by the alpha/beta rewrite: one pass reduces
    (sum g, sum g x) with g = w * dy (_load_x_g), then _dx; mean and rstd come from the forward.
    When SINGLE_TILE the tiles stay in registers between the two steps."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.arange(0, BLOCK_N)
    row_ok = row < rows
    raise NotImplementedError('a1 task 1.4: implement `layer_norm_bwd_dx_kernel` (see assignments/a1_kernels/README.md)')


@triton.jit
def layer_norm_bwd_dwdb_kernel(dy_ptr, x_ptr, mean_ptr, rstd_ptr, part_w_ptr, part_b_ptr, rows, cols,
                               ROWS_PER_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (group, column block): over rows [group * ROWS_PER_GROUP, +ROWS_PER_GROUP), in
    chunks of BLOCK_M rows, accumulate dw_j += sum_r dy_rj * (x_rj - mean_r) * rstd_r and
    db_j += sum_r dy_rj (tl.sum over axis=0), then store both partials at part[group, col].
    The wrapper adds the groups' partials."""
    group = tl.program_id(0)
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = col < cols
    raise NotImplementedError('a1 task 1.5: implement `layer_norm_bwd_dwdb_kernel` (see assignments/a1_kernels/README.md)')


def dwdb_tiles(x: torch.Tensor) -> tuple[int, int, int]:
    """(ROWS_PER_GROUP, BLOCK_M, BLOCK_N) of the dw/db reduction.  On a GPU: 64-column strips
    and 256-row groups, so even a (4096, 768) problem has 16 x 12 programs; the interpreter
    wants few programs, so it takes whole rows of up to 1024 columns and up to 4096 rows."""
    rows, cols = x.shape
    if x.is_cuda:
        return 256, 64, 64
    block_n = min(triton.next_power_of_2(max(cols, 1)), 1024)
    block_m = max(1, TILE_ELEMENTS["interpreter"] // block_n)
    return max(block_m, min(triton.next_power_of_2(max(rows, 1)), 4096)), block_m, block_n


def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) for a contiguous (rows, cols) `x`; weight, bias: (cols,) or None."""
    rows, cols = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block_m, block_n, single = tile_shape(x)
    layer_norm_fwd_kernel[(triton.cdiv(rows, block_m),)](
        x, weight if weight is not None else x, bias if bias is not None else x, y, mean, rstd,
        rows, cols, eps, HAS_W=weight is not None, HAS_B=bias is not None, SINGLE_TILE=single,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=_num_warps(block_m, block_n))
    return y, mean, rstd


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                   rstd: torch.Tensor, need_dweight: bool, need_dbias: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None) for contiguous (rows, cols) `dy` and `x`."""
    rows, cols = x.shape
    dx = torch.empty_like(x)
    block_m, block_n, single = tile_shape(x)
    layer_norm_bwd_dx_kernel[(triton.cdiv(rows, block_m),)](
        dy, x, weight if weight is not None else x, mean, rstd, dx, rows, cols,
        HAS_W=weight is not None, SINGLE_TILE=single, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=_num_warps(block_m, block_n))
    if not (need_dweight or need_dbias):
        return dx, None, None
    rows_per_group, block_m, block_n = dwdb_tiles(x)
    groups = triton.cdiv(rows, rows_per_group)
    partial = torch.empty(2, groups, cols, dtype=torch.float32, device=x.device)  # (dw, db) partials
    layer_norm_bwd_dwdb_kernel[(groups, triton.cdiv(cols, block_n))](
        dy, x, mean, rstd, partial[0], partial[1], rows, cols,
        ROWS_PER_GROUP=rows_per_group, BLOCK_M=block_m, BLOCK_N=block_n)
    dw, db = partial.sum(dim=1).to(x.dtype)  # groups x cols fp32 -> cols: a small second stage
    return dx, dw if need_dweight else None, db if need_dbias else None
