"""How many elements each version of softmax / LayerNorm moves to and from DRAM.

Softmax and LayerNorm do a handful of flops per element, far below what a GPU can do per byte
it loads (H100 SXM: 67 TFLOP/s fp32 vs 3.35 TB/s, 20 flops per byte), so their time is
bytes / bandwidth and fusion pays exactly the ratio of bytes moved.  Counts are in elements
for an (M, N) input with fp32 storage (M-sized statistics and N-sized parameters included):

  * NAIVE: the composed PyTorch version in naive.py, one kernel per op, each reading its inputs
    and writing its output; softmax forward is the count of "Fused Kernels" in
    techniques-for-large-scale-training.md: read 5MN + 2M, write 3MN + 2M.
    `count_traffic` measures the same numbers by watching every aten op (tests compare).
  * FUSED: the kernels in kernels/ with the row held on chip (one read, one write); rows longer
    than one tile are read twice (`looped=True`).  LayerNorm backward = the dx kernel
    (read x, dy; write dx) + the dw/db reduction (reads x, dy again), as torch's own kernel.
  * MINIMUM: every input read once, every output written once.  The benchmark's GB/s uses it
    (the Triton tutorials' convention, ANCHORS.md: 2 numel for softmax and LayerNorm forward,
    3 numel for the backwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Traffic", "OPS", "naive", "fused", "minimum", "count_traffic", "traffic_rows"]

OPS = (("softmax", "fwd"), ("softmax", "bwd"), ("layer_norm", "fwd"), ("layer_norm", "bwd"))


@dataclass(frozen=True)
class Traffic:
    """Elements read and written."""
    read: int
    write: int

    @property
    def total(self) -> int:
        return self.read + self.write

    def nbytes(self, itemsize: int) -> int:
        return self.total * itemsize


_NAIVE: dict[tuple[str, str], Callable[[int, int], Traffic]] = {
    # max, x - max, exp, sum, divide (naive.softmax_fwd)
    ("softmax", "fwd"): lambda m, n: Traffic(5 * m * n + 2 * m, 3 * m * n + 2 * m),
    # dy * y, sum, dy - dot, y * (...)
    ("softmax", "bwd"): lambda m, n: Traffic(6 * m * n + m, 3 * m * n + m),
    # mean, x - mean, square, mean, + eps, rsqrt, * rstd, * weight, + bias
    ("layer_norm", "fwd"): lambda m, n: Traffic(8 * m * n + 4 * m + 2 * n, 5 * m * n + 4 * m),
    # xhat (2 ops), g, two row sums with a product, five elementwise ops for dx, dw and db
    ("layer_norm", "bwd"): lambda m, n: Traffic(17 * m * n + 5 * m + n, 10 * m * n + 2 * m + 2 * n),
}

_MINIMUM: dict[tuple[str, str], Callable[[int, int], Traffic]] = {
    ("softmax", "fwd"): lambda m, n: Traffic(m * n, m * n),
    ("softmax", "bwd"): lambda m, n: Traffic(2 * m * n, m * n),                      # y, dy -> dx
    ("layer_norm", "fwd"): lambda m, n: Traffic(m * n + 2 * n, m * n + 2 * m),       # + w, b; mean, rstd
    ("layer_norm", "bwd"): lambda m, n: Traffic(2 * m * n + n + 2 * m, m * n + 2 * n),  # x, dy, w, stats
}


def naive(op: str, direction: str, m: int, n: int) -> Traffic:
    return _NAIVE[(op, direction)](m, n)


def minimum(op: str, direction: str, m: int, n: int) -> Traffic:
    return _MINIMUM[(op, direction)](m, n)


def fused(op: str, direction: str, m: int, n: int, *, looped: bool = False) -> Traffic:
    """The kernels' traffic; `looped`: rows longer than a tile, streamed twice."""
    base = minimum(op, direction, m, n)
    extra_reads = {"fwd": 1, "bwd": 2}[direction] * m * n if looped else 0  # the row inputs again
    if (op, direction) == ("layer_norm", "bwd"):
        extra_reads += 2 * m * n + 2 * m  # the dw/db reduction re-reads x, dy and the statistics
    return Traffic(base.read + extra_reads, base.write)


def traffic_rows(m: int, n: int, itemsize: int = 4) -> list[dict]:
    """One row per op: MB moved by naive, fused and the minimum, and naive / fused."""
    rows = []
    for op, direction in OPS:
        nv, fu, lo = naive(op, direction, m, n), fused(op, direction, m, n), minimum(op, direction, m, n)
        rows.append({"op": f"{op} {direction}", "M": m, "N": n,
                     "naive MB": nv.nbytes(itemsize) / 1e6, "fused MB": fu.nbytes(itemsize) / 1e6,
                     "minimum MB": lo.nbytes(itemsize) / 1e6, "naive/fused": nv.total / fu.total})
    return rows


class _Counter(TorchDispatchMode):
    """Adds up the elements every non-view aten op reads (tensor arguments) and writes (outputs)."""

    def __init__(self):
        super().__init__()
        self.read = self.write = 0
        self.ops: list[str] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # else torch wraps __torch_dispatch__ and imports dynamo (~2.5 s)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:  # views (unsqueeze, reshape of contiguous data) move nothing
            self.read += sum(t.numel() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            self.write += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            self.ops.append(str(func))
        return out


def count_traffic(fn: Callable, *args, **kwargs) -> tuple[Traffic, list[str]]:
    """Run fn(*args, **kwargs) and return (elements read and written by its aten ops, their names).
    An op's reads are its tensor arguments' sizes: a kernel reads each input once (caches aside)."""
    with _Counter() as counter:
        fn(*args, **kwargs)
    return Traffic(counter.read, counter.write), counter.ops
