"""The roofline of the machine the step ran on, measured there (Williams, Waterman & Patterson 2009).

An op of arithmetic intensity I = FLOPs / bytes can run no faster than
    attainable(I) = min(peak FLOP/s, I · bandwidth)                                (roofline)
The ridge I* = peak / bandwidth separates the memory-bound ops (I < I*: elementwise, LayerNorm,
GeLU, "limited by memory access speed" in training-speedup-lecture.md) from the compute-bound ones
(matmuls of large enough m, n, k).  Both roofs are measured on the same machine as the profile,
not taken from a data sheet: peak = the best FLOP rate of square matmuls of n/4, n/2 and n (2n³ FLOPs;
on a CPU the largest can fall out of cache and run slower than the model's own), bandwidth =
a large copy (reads n and writes n elements).  The fastest of the repetitions, not the median: a roof
is what the machine can do, and a shared machine's noise only ever slows a run down.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scaletrain import bench

__all__ = ["Machine", "attainable", "measure_machine"]


@dataclass(frozen=True)
class Machine:
    peak_flops: float   # FLOP/s of a large matmul in the profiled dtype
    bandwidth: float    # bytes/s of a large copy
    device: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the two roofs meet."""
        return self.peak_flops / self.bandwidth


def attainable(machine: Machine, intensity: float) -> float:
    """The roofline: the best FLOP/s an op of `intensity` FLOPs/byte can reach on `machine`."""
    return min(machine.peak_flops, intensity * machine.bandwidth)


def measure_machine(device: str = "cpu", *, matmul_n: int | None = None, copy_mb: int | None = None,
                    dtype: torch.dtype = torch.float32, reps: int = 5) -> Machine:
    """Peak FLOP/s from n×n matmuls (and n/4, n/2) and bandwidth from a copy, both timed on `device`.
    Defaults: n = 1024 and 64 MB on a CPU (seconds), n = 8192 and 1 GB on a GPU (past L2)."""
    cuda = device.startswith("cuda")
    n = matmul_n or (8192 if cuda else 1024)
    mb = copy_mb or (1024 if cuda else 64)
    if cuda:
        _spin_up(n, device, dtype)
    peak = max(_matmul_rate(size, device, dtype, reps) for size in (n // 4, n // 2, n))
    src = torch.empty(mb * 2**20 // (torch.finfo(dtype).bits // 8), device=device, dtype=dtype).uniform_()
    dst = torch.empty_like(src)
    cp = bench.time_fn(lambda: dst.copy_(src), warmup=2, reps=reps, device=device)
    return Machine(peak_flops=peak, bandwidth=2 * src.nbytes / min(cp.samples), device=device)


def _matmul_rate(n: int, device: str, dtype: torch.dtype, reps: int) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / min(bench.time_fn(lambda: torch.mm(a, b), warmup=2, reps=reps, device=device).samples)


def _spin_up(n: int, device: str, dtype: torch.dtype, seconds: float = 0.5) -> None:
    """Keep the GPU busy for `seconds` before the roof is timed: an idle GPU clocks down (an H200 read
    345 MHz idle, 1980 MHz under load) and takes longer than two warm-up products to clock up. The
    first GPU profile (H200, 2026-11-27) measured its fp32 roof cold, and the model's own matmuls
    then ran at 105 % of it."""
    import time

    a = torch.randn(n, n, device=device, dtype=dtype)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, a)
        torch.cuda.synchronize(device)
