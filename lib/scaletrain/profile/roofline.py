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

from scaletrain.ops import ceiling

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
    """Peak FLOP/s from n×n matmuls (and n/4, n/2) and bandwidth from a copy, both timed on `device`
    by module 1's ceilings (`scaletrain.ops.ceiling`, the fastest repetition), a GPU spun up first.
    Defaults: n = 1024 and 64 MB on a CPU (seconds), n = 8192 and 1 GB on a GPU (past L2)."""
    cuda = device.startswith("cuda")
    n = matmul_n or (8192 if cuda else 1024)
    mb = copy_mb or (1024 if cuda else 64)
    ceiling.spin_up(device, size=n, dtype=dtype)
    peak = max(ceiling.measure_matmul(device, size=size, dtype=dtype, reps=reps, best=True)
               for size in (n // 4, n // 2, n))
    return Machine(peak_flops=peak * 1e12, bandwidth=ceiling.measure_copy(device, mib=mb, reps=reps, best=True) * 1e9,
                   device=device)
