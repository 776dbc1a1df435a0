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
    than one tile are read twice (`looped=True`).  LayerNorm backward in Triton: the dx kernel
    (read x, dy; write dx) also writes one fp32 row of dw and db partial sums per program, which
    a small sum reads back (CUDA: one row per row lane); with `dwdb_pass` (rows longer than a
    tile, Triton's FUSE_DWDB off, CUDA's 16-bit rows of more than 4096 columns) a second kernel
    reads x and dy again instead, as torch's own kernel does.
  * MINIMUM: every input read once, every output written once.  The benchmark's GB/s uses it
    (the convention of the Triton tutorials' benchmarks: 2 numel for softmax and LayerNorm forward,
    3 numel for the backwards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Traffic", "OPS", "PROGRAMS", "naive", "fused", "minimum", "count_traffic", "traffic_rows", "attention_naive",
           "attention_fused", "attention_minimum", "attention_rows"]

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


PROGRAMS = 264  # the Triton LayerNorm dx kernel's persistent programs on an H100: 2 per SM (dx_programs)


def fused(op: str, direction: str, m: int, n: int, *, looped: bool = False, dwdb_pass: bool = False,
          programs: int = PROGRAMS) -> Traffic:
    """The kernels' traffic; `looped`: rows longer than a tile, streamed twice; `dwdb_pass` (and
    `looped`): LayerNorm's dw and db from a second pass over x and dy, not from `programs`
    partial rows written by the dx kernel."""
    base = minimum(op, direction, m, n)
    extra_reads = {"fwd": 1, "bwd": 2}[direction] * m * n if looped else 0  # the row inputs again
    extra_writes = 0
    if (op, direction) == ("layer_norm", "bwd"):
        if dwdb_pass or looped:
            extra_reads += 2 * m * n + 2 * m  # the dw/db reduction re-reads x, dy and the statistics
        else:  # fp32 rows of dw and db partial sums, one per program: written, then read by the sum
            extra_writes = 2 * min(programs, m) * n
            extra_reads += extra_writes
    return Traffic(base.read + extra_reads, base.write + extra_writes)


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


# ---- module 1b: attention (elements for bh heads of n queries and n keys, head dim d) ------------
# NAIVE: attention_naive.py, counted op by op as `count_traffic` sees them (bmm's output goes through
# an _unsafe_view copy; the causal mask is built once, ones + triu, and read by masked_fill):
#   forward  read 8n^2 + 5n + 4nd, write 6n^2 + 4n + 2nd per head: O(n^2);
#   backward recomputes P (7n^2 + 5n + 2nd read, 6n^2 + 4n written), then dV, dP, dS, dQ, dK.
# MINIMUM: every input and output once: forward Q, K, V -> O, L; backward Q, K, V, O, dO, L -> dQ, dK, dV.
#   O(n d): what FlashAttention moves when the K, V tiles a query tile re-reads hit in L2.
# FUSED (kernels/attention_triton.py, no cache at all): each query tile re-reads the K, V tiles
#   it visits (all of them, or those up to its diagonal when causal); the backward's dK/dV
#   kernel re-reads Q, dO, L, D per key tile, its dQ kernel K, V per query tile.  O(n^2 d / BLOCK):
#   Dao et al. 2022's Theta(n^2 d^2 / M) HBM accesses with on-chip memory M ~ BLOCK * d.
def _causal_extra(bh: int, n: int, causal: bool) -> Traffic:
    return Traffic(bh * n * n + 2 * n * n, bh * n * n + 2 * n * n) if causal else Traffic(0, 0)


def attention_naive(direction: str, bh: int, n: int, d: int, *, causal: bool = False) -> Traffic:
    """Elements the composed attention (attention_naive.py) moves: equal to count_traffic's."""
    fwd = Traffic(bh * (8 * n * n + 5 * n + 4 * n * d), bh * (6 * n * n + 4 * n + 2 * n * d))
    if direction == "bwd":
        fwd = Traffic(bh * (15 * n * n + 6 * n + 13 * n * d), bh * (11 * n * n + 5 * n + 7 * n * d))
    extra = _causal_extra(bh, n, causal)
    return Traffic(fwd.read + extra.read, fwd.write + extra.write)


def attention_minimum(direction: str, bh: int, n: int, d: int) -> Traffic:
    if direction == "fwd":
        return Traffic(bh * 3 * n * d, bh * (n * d + n))
    return Traffic(bh * (5 * n * d + n), bh * 3 * n * d)


def _visited(n: int, block: int, causal: bool) -> int:
    """Sum over the query tiles of the keys each visits (the K, V rows it loads)."""
    tiles = -(-n // block)
    return sum(min(n, (i + 1) * block) for i in range(tiles)) if causal else tiles * n


def attention_fused(direction: str, bh: int, n: int, d: int, *, causal: bool = False, block: int = 64) -> Traffic:
    """Elements the FlashAttention kernels load and store with no cache (square BLOCK tiles)."""
    kv_reads = _visited(n, block, causal)  # key rows loaded over all query tiles (= query rows over key tiles)
    if direction == "fwd":
        return Traffic(bh * (n * d + 2 * kv_reads * d), bh * (n * d + n))
    delta = Traffic(2 * n * d, n)                                     # D = rowsum(dO * O)
    dkdv = Traffic(2 * n * d + kv_reads * (2 * d + 2), 2 * n * d)     # K, V once; Q, dO, L, D per key tile
    dq = Traffic(2 * n * d + 2 * n + kv_reads * 2 * d, n * d)         # Q, dO, L, D once; K, V per query tile
    return Traffic(bh * (delta.read + dkdv.read + dq.read), bh * (delta.write + dkdv.write + dq.write))


def attention_rows(ns, *, bh: int = 1, d: int = 64, causal: bool = False, itemsize: int = 2, block: int = 64) -> list[dict]:
    """One row per (sequence length, direction): MB moved by naive, fused (no cache) and the minimum."""
    rows = []
    for n in ns:
        for direction in ("fwd", "bwd"):
            nv = attention_naive(direction, bh, n, d, causal=causal)
            fu = attention_fused(direction, bh, n, d, causal=causal, block=block)
            lo = attention_minimum(direction, bh, n, d)
            rows.append({"op": f"attention {direction}", "n": n, "d": d, "naive MB": nv.nbytes(itemsize) / 1e6,
                         "fused MB": fu.nbytes(itemsize) / 1e6, "minimum MB": lo.nbytes(itemsize) / 1e6,
                         "naive/fused": nv.total / fu.total, "naive/minimum": nv.total / lo.total})
    return rows
