"""The two ceilings a kernel's speed is read against, measured in the same run, and the datasheet's.

A memory-bound kernel (softmax, LayerNorm, cross-entropy) cannot move bytes faster than the device
copies them: a device-to-device copy of a large buffer, counted as bytes read + bytes written, is
its *practical* bandwidth ceiling, usually 85-95 % of the datasheet figure on HBM (the "speed of
light" that quack's memory-bound kernels are measured against).  A compute-bound kernel (matmul,
attention) cannot beat a large matmul from the vendor library: 2 M N K flops over its time is the
*practical* compute ceiling.  Both are measured with `bench.time_fn` (CUDA events, L2 flushed), so
a row's "% copy" compares like with like; "% datasheet" compares against the vendor's number.

    c = measure("cuda")                    # or "cpu"
    percent(row_gbps, c.copy_gbps)         # NaN when a ceiling is unknown, never a guess
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass

import torch

from scaletrain import bench

__all__ = ["Datasheet", "DATASHEET", "datasheet", "Ceilings", "copy_bytes", "matmul_flops", "measure_copy",
           "measure_matmul", "spin_up", "measure", "percent", "ceiling_rows"]


@dataclass(frozen=True)
class Datasheet:
    """The vendor's peak figures: DRAM GB/s, dense bf16 tensor-core and plain fp32 TFLOP/s."""
    gbps: float
    bf16_tflops: float | None
    fp32_tflops: float | None
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h100/ (tensor-core figures halved: " \
        "the sheet quotes them with 2:4 sparsity)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200/ (tensor-core figures halved: " \
        "the sheet quotes them with 2:4 sparsity)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/a100/ (dense figures)"
_MEMORY_ONLY = "the vendor's datasheet (memory bandwidth only)"
# device-name fragment -> figures; the first fragment the name contains wins, so variants come first
DATASHEET: dict[str, Datasheet] = {
    "H200 NVL": Datasheet(4800.0, 835.5, 60.0, _H200),
    "H200": Datasheet(4800.0, 989.5, 67.0, _H200),                 # SXM
    "H100 NVL": Datasheet(3900.0, 835.5, 60.0, _H100),
    "H100 PCIe": Datasheet(2000.0, 756.5, 51.0, _H100),
    "H100": Datasheet(3350.0, 989.5, 67.0, _H100),                 # SXM ("NVIDIA H100 80GB HBM3")
    "A100-SXM4-80GB": Datasheet(2039.0, 312.0, 19.5, _A100),
    "A100 80GB": Datasheet(1935.0, 312.0, 19.5, _A100),            # PCIe
    "A100": Datasheet(1555.0, 312.0, 19.5, _A100),                 # 40 GB
    "L40S": Datasheet(864.0, None, None, _MEMORY_ONLY), "A10": Datasheet(600.0, None, None, _MEMORY_ONLY),
    "V100": Datasheet(900.0, None, None, _MEMORY_ONLY), "T4": Datasheet(320.0, None, None, _MEMORY_ONLY),
    "RTX 4090": Datasheet(1008.0, None, None, _MEMORY_ONLY), "RTX 3090": Datasheet(936.0, None, None, _MEMORY_ONLY),
}


def datasheet(device_name: str) -> Datasheet | None:
    """The datasheet entry of a device by its name (torch.cuda.get_device_name), or None: a CPU, or
    a GPU not in the table, has no datasheet figure here, and every "% datasheet" is then NaN."""
    return next((sheet for fragment, sheet in DATASHEET.items() if fragment in device_name), None)


@dataclass(frozen=True)
class Ceilings:
    """What one run measured (GB/s, TFLOP/s) and the datasheet it is read against."""
    device: str
    copy_gbps: float
    copy_mib: int
    matmul_tflops: float
    matmul_dtype: str
    matmul_size: int
    sheet: Datasheet | None

    @property
    def sheet_tflops(self) -> float | None:
        if self.sheet is None:
            return None
        return self.sheet.bf16_tflops if self.matmul_dtype == "bf16" else self.sheet.fp32_tflops


def copy_bytes(numel: int, itemsize: int) -> int:
    """A copy reads every byte once and writes it once."""
    return 2 * numel * itemsize


def matmul_flops(m: int, n: int, k: int) -> int:
    """An (m, k) @ (k, n) product: m n multiply-adds per k, 2 flops each."""
    return 2 * m * n * k


def _seconds(t: bench.Timing, best: bool) -> float:
    """The fastest repetition (a roof: noise only ever slows a run down) or the median (as the rows)."""
    return min(t.samples) if best else t.median


def measure_copy(device: str, *, mib: int, reps: int = 10, best: bool = False) -> float:
    """GB/s of dst.copy_(src) for fp32 buffers of `mib` MiB each: larger than the last-level cache
    (L2 is flushed between reps on a GPU anyway), so the figure is DRAM's, not a cache's. The median
    of `reps`, or with `best` the fastest."""
    numel = mib * 2**20 // 4
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    t = bench.time_fn(lambda: dst.copy_(src), warmup=2, reps=reps, device=device)
    return bench.gbps(copy_bytes(numel, 4), _seconds(t, best))


def measure_matmul(device: str, *, size: int, dtype: torch.dtype, reps: int = 10, best: bool = False) -> float:
    """TFLOP/s of a (size x size) @ (size x size) product in `dtype` (cuBLAS on a GPU, oneDNN or
    MKL on a CPU): what the vendor library reaches, the compute ceiling a kernel is measured against.
    The median of `reps`, or with `best` the fastest."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    t = bench.time_fn(lambda: a @ b, warmup=2, reps=reps, device=device)
    return matmul_flops(size, size, size) / _seconds(t, best) / 1e12


def spin_up(device: str, *, size: int, dtype: torch.dtype, seconds: float = 0.5) -> None:
    """Keep a GPU busy for `seconds` before a ceiling is timed: an idle GPU clocks down (an H200 read
    345 MHz idle, 1980 MHz under load) and takes longer than two warm-up products to clock up. The
    first GPU profile (H200, 2026-11-27) measured its fp32 roof cold, and the model's own matmuls
    then ran at 105 % of it. Nothing to do on a CPU."""
    import time

    if not device.startswith("cuda"):
        return
    a = torch.randn(size, size, device=device).to(dtype)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, a)
        torch.cuda.synchronize(device)


def measure(device: str = "cuda", *, quick: bool = False) -> Ceilings:
    """Both ceilings on `device`: a 1 GiB copy and an 8192^3 bf16 matmul on a GPU; on a CPU, scaled
    down to run in about a second (a 64 MiB copy, a 1024^3 fp32 matmul: CPUs have no bf16 peak to
    quote and their bf16 matmul is often emulated)."""
    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name(device) if cuda else f"CPU {platform.processor() or platform.machine()}, " \
                                                          f"{torch.get_num_threads()} threads"
    mib = (256 if quick else 1024) if cuda else (32 if quick else 64)
    size = (4096 if quick else 8192) if cuda else (512 if quick else 1024)
    dtype = torch.bfloat16 if cuda else torch.float32
    reps = 5 if quick else 10
    spin_up(device, size=size, dtype=dtype)
    return Ceilings(device=name, copy_gbps=measure_copy(device, mib=mib, reps=reps), copy_mib=mib,
                    matmul_tflops=measure_matmul(device, size=size, dtype=dtype, reps=reps),
                    matmul_dtype="bf16" if cuda else "fp32", matmul_size=size, sheet=datasheet(name) if cuda else None)


def percent(value: float, ceiling: float | None) -> float:
    """100 value / ceiling; NaN when the ceiling is unknown (None, 0 or not finite)."""
    if not ceiling or not math.isfinite(ceiling):
        return float("nan")
    return 100.0 * value / ceiling


def ceiling_rows(c: Ceilings) -> list[dict]:
    """The ceilings as a table: measured, datasheet, measured as % of the datasheet."""
    sheet_gbps = c.sheet.gbps if c.sheet else None
    no_sheet = "no datasheet"
    return [{"ceiling": f"copy, {c.copy_mib} MiB fp32 (read + write)", "measured": f"{c.copy_gbps:.1f} GB/s",
             "datasheet": f"{sheet_gbps:.0f} GB/s" if sheet_gbps else no_sheet,
             "% datasheet": percent(c.copy_gbps, sheet_gbps)},
            {"ceiling": f"matmul {c.matmul_size}^3 {c.matmul_dtype}", "measured": f"{c.matmul_tflops:.3g} TFLOP/s",
             "datasheet": f"{c.sheet_tflops:.0f} TFLOP/s" if c.sheet_tflops else no_sheet,
             "% datasheet": percent(c.matmul_tflops, c.sheet_tflops)}]
