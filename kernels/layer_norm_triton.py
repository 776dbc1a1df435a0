"""Fused LayerNorm over the last dimension in Triton: the same algorithms as kernels/layer_norm.cu.

Forward, per row of N elements ("Rewrite Reduction: LayerNorm Forward",
accelerating-transformer-training-lecture.md): the mean and the variance come from ONE pass that
reduces a pair of sums over the row, shifted by the row's first element (variance is
shift-invariant; the shift keeps the subtraction from cancelling when |mean| >> std). y is
normalized, then scaled by w and shifted by b; mean and rstd (fp32) are saved for the backward.

Backward for x ("Rewrite Reduction: LayerNorm Backward", same lecture; notebooks/01_kernel_fusion.ipynb
checks the slide's form, which prints sigma where sigma^2 belongs): the two row reductions the
rewrite needs are independent, so they happen in one pass. Derive dx yourself and evaluate it so
that it is exactly 0 at N = 1 on a GPU too (fused multiply-adds; the a1 handout says why).
Backward for w and b: a reduction ACROSS rows, of the same x and dy the dx kernel reads. Where a
row fits one tile, the dx kernel's programs are persistent (each owns every num_programs-th row
block) and each also sums its rows' share of dw and db into an fp32 partial row, which the
wrapper adds over programs: x and dy are read from memory once for all three gradients (the
anchors' design: Triton's fused LayerNorm tutorial, Liger-Kernel). Two kernels (dx, then a
second pass over x and dy for dw and db) move 5 row-lengths where 3 suffice, which caps them at
3/5 of the copy bandwidth. Longer rows, whose column sums do not fit a program's registers, take
that second kernel: programs own (row group, column block) tiles and write fp32 partial sums.

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
    """(mean, rstd) of a row of `cols` elements from the sums of d and of d² that you reduced, with
    d = x - shift; rstd is 1 / sqrt(var + eps). Graded through the forward, including rows whose
    |mean| is 1000x their std; rounding can make a variance computed this way slightly negative."""
    # BEGIN SOLUTION
    mean_d = s1 / cols
    var = tl.maximum(s2 / cols - mean_d * mean_d, 0.0)  # rounding can make it slightly negative
    return shift + mean_d, 1.0 / tl.sqrt(var + eps)
    # END SOLUTION


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
    # BEGIN SOLUTION
    shift = tl.load(x_ptr + row * cols, mask=row_ok, other=0.0).to(tl.float32)
    if SINGLE_TILE:  # the tile stays in registers: x is read once
        cmask = col < cols
        inside = row_ok[:, None] & cmask[None, :]
        offs = row[:, None] * cols + col[None, :]
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        d = tl.where(inside, x - shift[:, None], 0.0)
        mean, rstd = _moments(tl.sum(d, axis=1), tl.sum(d * d, axis=1), shift, cols, eps)
        y = _affine((x - mean[:, None]) * rstd[:, None], w_ptr, b_ptr, col, cmask, HAS_W, HAS_B)
        tl.store(y_ptr + offs, y, mask=inside)
    else:  # stream the row twice: sums, then normalize
        s1 = tl.zeros((BLOCK_M,), tl.float32)
        s2 = tl.zeros((BLOCK_M,), tl.float32)
        for start in range(0, cols, BLOCK_N):
            inside = row_ok[:, None] & (start + col[None, :] < cols)
            x = tl.load(x_ptr + row[:, None] * cols + start + col[None, :], mask=inside, other=0.0).to(tl.float32)
            d = tl.where(inside, x - shift[:, None], 0.0)
            s1 += tl.sum(d, axis=1)
            s2 += tl.sum(d * d, axis=1)
        mean, rstd = _moments(s1, s2, shift, cols, eps)
        for start in range(0, cols, BLOCK_N):
            cmask = start + col < cols
            inside = row_ok[:, None] & cmask[None, :]
            offs = row[:, None] * cols + start + col[None, :]
            x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
            y = _affine((x - mean[:, None]) * rstd[:, None], w_ptr, b_ptr, start + col, cmask, HAS_W, HAS_B)
            tl.store(y_ptr + offs, y, mask=inside)
    tl.store(mean_ptr + row, mean, mask=row_ok)
    tl.store(rstd_ptr + row, rstd, mask=row_ok)
    # END SOLUTION


@triton.jit
def _load_x_dy_g(dy_ptr, x_ptr, w_ptr, offs, col, inside, cmask, HAS_W: tl.constexpr):
    """fp32 tiles x, dy and g = w * dy (0 outside). g is rounded once, by an explicit fma with 0: a
    plain product lets the compiler fuse it unrounded into a later `g - mean_g` while `mean_g` holds
    the rounded one (on an H200 this left fp32 dx at 4e-5 for N = 1 instead of 0)."""
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    g = dy
    if HAS_W:
        g = tl.fma(dy, tl.load(w_ptr + col, mask=cmask, other=0.0).to(tl.float32)[None, :], 0.0)
    return x, dy, g


@triton.jit
def _dx(x, g, mean, rstd, sum_g, sum_gx, cols):
    """The dx tile from the two row reductions (the LightSeq rewrite, module doc).
    x, g: [BLOCK_M, BLOCK_N] tiles; mean, rstd, sum_g, sum_gx: [BLOCK_M], one per row.
    Pitfall: at N = 1 dx is exactly 0, but rstd ~ 1/sqrt(eps) multiplies whatever rounding is
    left: group the terms so that those which cancel meet before rstd multiplies them (a fused
    multiply-add keeps one product unrounded), and divide by N with IEEE rounding
    (`tl.math.div_rn`; `/` is div.full.f32 on NVIDIA, within 2 ulp)."""
    # BEGIN SOLUTION
    n = cols * 1.0  # fp32 (cols may arrive as the constexpr 1)
    mean_g = tl.math.div_rn(sum_g, n)
    c = rstd * (sum_gx - mean * sum_g) / n
    xhat = (x - mean[:, None]) * rstd[:, None]
    return rstd[:, None] * (g - mean_g[:, None] - xhat * c[:, None])
    # END SOLUTION


@triton.jit
def layer_norm_bwd_dx_kernel(dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_w_ptr, part_b_ptr, rows, cols,
                             HAS_W: tl.constexpr, PARTIALS: tl.constexpr, SINGLE_TILE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dx for the row blocks program_id(0), program_id(0) + num_programs(0), ... of BLOCK_M rows (a
    persistent program), by the rewrite: one pass for the row reductions (x, dy and g = w * dy come
    from _load_x_dy_g), then _dx; mean and rstd come from the forward. Any row length: when
    SINGLE_TILE the tiles can stay in registers between the two steps.
    PARTIALS (given only with SINGLE_TILE): the program also stores, in fp32, the sums over the
    rows it owned of dy * x̂ at part_w[program_id(0), :cols] and of dy at part_b[program_id(0),
    :cols] (x̂ = (x - mean) * rstd); the wrapper adds them over programs into dweight and dbias."""
    col = tl.arange(0, BLOCK_N)
    # BEGIN SOLUTION
    tl.static_assert(SINGLE_TILE or not PARTIALS, "column partials need the row in one tile")
    cmask = col < cols
    acc_w = tl.zeros((BLOCK_N,), tl.float32)
    acc_b = tl.zeros((BLOCK_N,), tl.float32)
    for block in range(tl.program_id(0), tl.cdiv(rows, BLOCK_M), tl.num_programs(0)):
        row = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # int64: row * cols may pass 2**31
        row_ok = row < rows
        mean = tl.load(mean_ptr + row, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row_ok, other=0.0)
        if SINGLE_TILE:  # x and g stay in registers between the reduction and the write
            inside = row_ok[:, None] & cmask[None, :]
            offs = row[:, None] * cols + col[None, :]
            x, dy, g = _load_x_dy_g(dy_ptr, x_ptr, w_ptr, offs, col, inside, cmask, HAS_W)
            dx = _dx(x, g, mean, rstd, tl.sum(g, axis=1), tl.sum(g * x, axis=1), cols)
            tl.store(dx_ptr + offs, dx, mask=inside)
            if PARTIALS:  # masked rows and columns hold dy = 0: they add nothing
                acc_w += tl.sum(dy * ((x - mean[:, None]) * rstd[:, None]), axis=0)
                acc_b += tl.sum(dy, axis=0)
        else:
            sum_g = tl.zeros((BLOCK_M,), tl.float32)
            sum_gx = tl.zeros((BLOCK_M,), tl.float32)
            for start in range(0, cols, BLOCK_N):
                cmask_s = start + col < cols
                inside = row_ok[:, None] & cmask_s[None, :]
                offs = row[:, None] * cols + start + col[None, :]
                x, dy, g = _load_x_dy_g(dy_ptr, x_ptr, w_ptr, offs, start + col, inside, cmask_s, HAS_W)
                sum_g += tl.sum(g, axis=1)
                sum_gx += tl.sum(g * x, axis=1)
            for start in range(0, cols, BLOCK_N):
                cmask_s = start + col < cols
                inside = row_ok[:, None] & cmask_s[None, :]
                offs = row[:, None] * cols + start + col[None, :]
                x, dy, g = _load_x_dy_g(dy_ptr, x_ptr, w_ptr, offs, start + col, inside, cmask_s, HAS_W)
                tl.store(dx_ptr + offs, _dx(x, g, mean, rstd, sum_g, sum_gx, cols), mask=inside)
    if PARTIALS:
        pid = tl.program_id(0).to(tl.int64)
        tl.store(part_w_ptr + pid * cols + col, acc_w, mask=cmask)
        tl.store(part_b_ptr + pid * cols + col, acc_b, mask=cmask)
    # END SOLUTION


@triton.jit
def layer_norm_bwd_dwdb_kernel(dy_ptr, x_ptr, mean_ptr, rstd_ptr, part_w_ptr, part_b_ptr, rows, cols,
                               ROWS_PER_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (group, column block): the partial dweight and dbias of its columns, summed over
    rows [group * ROWS_PER_GROUP, +ROWS_PER_GROUP) in chunks of BLOCK_M rows, stored in fp32 at
    part_w[group, col] and part_b[group, col]; the wrapper adds the groups' partials. Any rows
    count (the last group is partial)."""
    group = tl.program_id(0)
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = col < cols
    # BEGIN SOLUTION
    acc_w = tl.zeros((BLOCK_N,), tl.float32)
    acc_b = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, ROWS_PER_GROUP, BLOCK_M):
        row = group.to(tl.int64) * ROWS_PER_GROUP + start + tl.arange(0, BLOCK_M)
        row_ok = row < rows
        inside = row_ok[:, None] & cmask[None, :]
        offs = row[:, None] * cols + col[None, :]
        dy = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row_ok, other=0.0)
        acc_w += tl.sum(dy * (x - mean[:, None]) * rstd[:, None], axis=0)
        acc_b += tl.sum(dy, axis=0)
    tl.store(part_w_ptr + group * cols + col, acc_w, mask=cmask)
    tl.store(part_b_ptr + group * cols + col, acc_b, mask=cmask)
    # END SOLUTION


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


def dx_programs(x: torch.Tensor, row_blocks: int) -> int:
    """Programs of the dx kernel when it also sums dw and db: two per SM on a GPU, as many as fit
    at once at up to 128 registers a thread (two 8-warp programs per SM); each owns row_blocks /
    programs blocks, and its partial rows (8 bytes per column, written and read again) are a small
    share of the 3 row-lengths every row moves. sm_90's build takes 128-147 registers (Triton 3.6),
    so mostly one fits and the second runs as a second wave: the same rows per SM, and twice the
    partial rows one program an SM would write (8.6 % of the traffic at 4096 x 4096 fp32 on 132 SMs,
    against 4.3 %). A few in the interpreter (~1 ms of Python per program)."""
    if x.is_cuda:
        return min(row_blocks, 2 * torch.cuda.get_device_properties(x.device).multi_processor_count)
    return min(row_blocks, 4)


FUSE_DWDB = True  # False: dw and db always come from the second kernel (two passes over x and dy)


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                   rstd: torch.Tensor, need_dweight: bool, need_dbias: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None) for contiguous (rows, cols) `dy` and `x`. Rows that fit
    one tile get all three from the dx kernel (partial sums per program, added here); longer rows,
    or FUSE_DWDB off, get dw and db from layer_norm_bwd_dwdb_kernel."""
    rows, cols = x.shape
    dx = torch.empty_like(x)
    block_m, block_n, single = tile_shape(x)
    blocks = triton.cdiv(rows, block_m)
    fused = single and FUSE_DWDB and (need_dweight or need_dbias)
    programs = dx_programs(x, blocks) if fused else blocks
    partial = torch.empty(2, programs if fused else 1, cols, dtype=torch.float32, device=x.device)  # (dw, db)
    layer_norm_bwd_dx_kernel[(programs,)](
        dy, x, weight if weight is not None else x, mean, rstd, dx, partial[0], partial[1], rows, cols,
        HAS_W=weight is not None, PARTIALS=fused, SINGLE_TILE=single, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=_num_warps(block_m, block_n))
    if not (need_dweight or need_dbias):
        return dx, None, None
    if not fused:
        rows_per_group, block_m, block_n = dwdb_tiles(x)
        groups = triton.cdiv(rows, rows_per_group)
        partial = torch.empty(2, groups, cols, dtype=torch.float32, device=x.device)
        layer_norm_bwd_dwdb_kernel[(groups, triton.cdiv(cols, block_n))](
            dy, x, mean, rstd, partial[0], partial[1], rows, cols,
            ROWS_PER_GROUP=rows_per_group, BLOCK_M=block_m, BLOCK_N=block_n)
    dw, db = partial.sum(dim=1).to(x.dtype)  # programs (or groups) x cols fp32 -> cols: a small second stage
    return dx, dw if need_dweight else None, db if need_dbias else None
