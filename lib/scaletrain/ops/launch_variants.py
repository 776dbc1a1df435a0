"""Triton's softmax, LayerNorm and cross-entropy launched other ways than their rules, to time beside them.

tiles.py makes two launch choices from the anchors' reasoning, not from a measurement on the card
at hand: the warps of a program (num_warps: 8 from 4096 elements a program) and how many short
rows share one (TILE_ELEMENTS["gpu"]: 4096 elements, so 8 rows of 512). The compiled kernels say
why each could be wrong on sm_90 (Triton 3.6, cuobjdump of the launcher's builds at M = 4096): the
LayerNorm backward's dx kernel takes 128-147 registers a thread at 8 warps, so one program fits an
SM (8 of its 64 warps) where dx_programs counts on two; the forward takes 165-194 from N = 8192.
Each variant here changes one choice for every call of the backend; `bench kernels --variants`
times them in the round-robin of the default and torch's op, so one GPU run says which launch the
kernels should take (timings from separate runs, on a shared or re-clocked GPU, do not compare).

The cross-entropy kernels stream a row in chunks of up to 16384 logits at 32 warps
(cross_entropy_triton._block_v): sm_90's build fits one such program an SM, so while a row's chunk
is reduced across warps no other row's loads are in flight; 4096 at 8 warps fits five, 8192 at 16
fits two (Triton 3.6, cuobjdump). `bench cross_entropy --variants` times both caps beside it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import triton

from scaletrain.ops.backends import KERNELS_DIR, Backend, get_backend, load_kernel_module, with_switch
from scaletrain.ops.tiles import tile_shape

__all__ = ["CHUNK_CAPS", "VARIANTS", "chunk_variants", "variant_backends"]

# label -> (the kernel modules' global it replaces, its replacement)
VARIANTS = {
    "4 warps": ("_num_warps", lambda block_m, block_n: 4),
    "16 warps": ("_num_warps", lambda block_m, block_n: 16),
    "2k/program": ("tile_shape", functools.partial(tile_shape, elements=2048)),
    "16k/program": ("tile_shape", functools.partial(tile_shape, elements=16384)),
}


def variant_backends() -> dict[str, Backend]:
    """"triton <label>" -> Triton's backend with VARIANTS[label] in force in both kernel modules
    for each call (restored after): the same kernels, launched another way."""
    softmax = load_kernel_module(KERNELS_DIR / "softmax_triton.py")
    layer_norm = load_kernel_module(KERNELS_DIR / "layer_norm_triton.py")
    triton_backend = get_backend("triton")
    found = {}
    for label, (name, value) in VARIANTS.items():
        switched = {fn: with_switch(module, name, value, getattr(module, fn))
                    for module, fns in ((softmax, ("softmax_fwd", "softmax_bwd")),
                                        (layer_norm, ("layer_norm_fwd", "layer_norm_bwd"))) for fn in fns}
        found[f"triton {label}"] = dataclasses.replace(triton_backend, name=f"triton {label}", **switched)
    return found


CHUNK_CAPS = (4096, 8192)  # cross-entropy chunks of logits a loop step, in place of the rule's 16384


def chunk_variants(run: Callable[[], None]) -> dict[str, Callable[[], None]]:
    """"<cap> chunks" -> `run` (a call of the Triton cross-entropy, forward and backward) with the
    kernels' vocabulary chunk capped at cap for its duration; the warps follow (_warps: cap / 512)."""
    kernels = load_kernel_module(KERNELS_DIR / "cross_entropy_triton.py")
    return {f"{cap // 1024}k chunks": with_switch(kernels, "_block_v", functools.partial(_capped, cap=cap), run)
            for cap in CHUNK_CAPS}


def _capped(x, block_v: int | None, *, cap: int) -> int:
    return block_v or min(triton.next_power_of_2(x.shape[1]), cap)
