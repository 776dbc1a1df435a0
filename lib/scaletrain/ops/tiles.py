"""How the Triton kernels cut a (rows, cols) tensor into programs: one rule for softmax and LayerNorm.

Both kernels reduce along a row, so a program owns BLOCK_M whole rows of BLOCK_N columns (the
next power of two >= cols): short rows share a program, as in the warp-per-row CUDA kernels and
LightSeq's templated launcher, which picks the tile per row length. A row longer than
MAX_TILE_COLS is streamed through one tile in chunks (kernels/softmax_triton.py's online
softmax, kernels/layer_norm_triton.py's two-pass moments). The kernel files import these names,
so `module.tile_shape` and `module.MAX_TILE_COLS` are the ones the kernels launch with.
"""

from __future__ import annotations

import torch
import triton

__all__ = ["MAX_TILE_COLS", "TILE_ELEMENTS", "tile_shape", "num_warps"]

MAX_TILE_COLS = 8192  # longest row held in one tile; longer rows take the two-pass loop
# Elements per program for short rows (BLOCK_M = TILE_ELEMENTS // BLOCK_N).  The interpreter
# (CPU tensors) pays ~1 ms of Python per program, so it gets larger tiles; the math is the same.
TILE_ELEMENTS = {"gpu": 4096, "interpreter": 65536}


def tile_shape(x: torch.Tensor, elements: int | None = None) -> tuple[int, int, bool]:
    """(BLOCK_M, BLOCK_N, SINGLE_TILE) for a (rows, cols) tensor: the row-length buckets.
    Short rows share a program (BLOCK_M rows of BLOCK_N = next power of two >= cols, about
    `elements` in all, default TILE_ELEMENTS); rows up to MAX_TILE_COLS get one program each;
    longer rows are streamed in MAX_TILE_COLS chunks."""
    rows, cols = x.shape
    block_n = triton.next_power_of_2(max(cols, 1))
    if block_n > MAX_TILE_COLS:
        return 1, MAX_TILE_COLS, False
    tile = elements or TILE_ELEMENTS["gpu" if x.is_cuda else "interpreter"]
    block_m = max(1, min(tile // block_n, triton.next_power_of_2(max(rows, 1))))
    return block_m, block_n, True


def num_warps(block_m: int, block_n: int) -> int:
    """Warps per program: more for larger tiles, so each thread keeps a few elements in registers."""
    return 4 if block_m * block_n <= 2048 else 8 if block_m * block_n <= 8192 else 16
