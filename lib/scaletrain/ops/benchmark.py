"""`python -m scaletrain.bench kernels [--quick] [--dtype fp32|fp16|bf16] [--peak-gbps X]`

On a GPU: for softmax and LayerNorm, forward and backward, at M = 4096 rows and several row
lengths N, time every fused backend (cuda, triton) beside the naive composed PyTorch version
(naive.py) and torch's native op, the three timed round-robin (bench.compare_many: one call of
each per rep, CUDA events, L2 flushed), so a row's two speedups share one measurement of the
backend. Reported per row: median / p20 / p80 time, GB/s counted on the minimum traffic (2 numel
for forwards, 3 numel for backwards: the convention of the Triton tutorials' fused-softmax and
layer-norm benchmarks), % of the
device's peak DRAM bandwidth, and the speedups over naive and native (medians of per-pair
ratios). Plot: GB/s vs N.

Without a GPU the kernels cannot be timed (the interpreter measures Python, not the kernel), and
the command says so; it prints the analytic bytes moved instead (naive vs fused vs minimum,
traffic.py) and times naive vs native on the CPU.  Plot: the bytes-moved bars.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

import torch
import torch.nn.functional as F

from scaletrain import bench
from scaletrain.ops import naive, traffic
from scaletrain.ops.backends import Backend, get_backend

__all__ = ["main", "speed_case", "gpu_rows", "GPU_COLUMNS", "peak_gbps", "make_inputs", "OP_CALLS"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Peak DRAM bandwidth (GB/s) by device-name fragment, from the vendors' datasheets.
PEAK_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H100": 3350.0, "A100-SXM4-80GB": 2039.0,
             "A100 80GB": 1935.0, "A100": 1555.0, "L40S": 864.0, "A10": 600.0, "V100": 900.0, "T4": 320.0,
             "RTX 4090": 1008.0, "RTX 3090": 936.0}


def peak_gbps(device: int = 0) -> float | None:
    """Peak DRAM bandwidth of a CUDA device in GB/s: from the memory clock and bus width when
    torch reports them (2 transfers per clock), else from the datasheet table, else None."""
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    return next((v for k, v in PEAK_GBPS.items() if k in props.name), None)


def make_inputs(op: str, m: int, n: int, dtype: torch.dtype, device: str) -> dict:
    """One trial's tensors (m, n): x, dy, w, b, y = softmax(x), and LayerNorm's mean and rstd."""
    x = torch.randn(m, n, device=device, dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.randn(n, device=device, dtype=dtype)
    b = torch.randn(n, device=device, dtype=dtype)
    y = torch.softmax(x.float(), -1).to(dtype)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)  # (m, 1) fp32 statistics
    return dict(x=x, dy=dy, w=w, b=b, y=y, mean=mean, rstd=rstd)


# (op, direction) -> how to call a Backend on the inputs, and torch's native op on them
OP_CALLS: dict[tuple[str, str], tuple[Callable, Callable]] = {
    ("softmax", "fwd"): (lambda be, t: be.softmax_fwd(t["x"], None, 0),
                         lambda t: torch.softmax(t["x"], -1)),
    ("softmax", "bwd"): (lambda be, t: be.softmax_bwd(t["y"], t["dy"]),
                         lambda t: torch.ops.aten._softmax_backward_data(t["dy"], t["y"], -1, t["x"].dtype)),
    ("layer_norm", "fwd"): (lambda be, t: be.layer_norm_fwd(t["x"], t["w"], t["b"], 1e-5),
                            lambda t: F.layer_norm(t["x"], t["x"].shape[-1:], t["w"], t["b"], 1e-5)),
    ("layer_norm", "bwd"): (lambda be, t: be.layer_norm_bwd(t["dy"], t["x"], t["w"], t["mean"].view(-1),
                                                             t["rstd"].view(-1), True, True),
                            lambda t: torch.ops.aten.native_layer_norm_backward(
                                t["dy"], t["x"], t["x"].shape[-1:], t["mean"], t["rstd"], t["w"], t["b"],
                                [True, True, True])),
}


def speed_case(op: str, direction: str, candidate: Backend, *, m: int, n: int, dtype: torch.dtype,
               device: str = "cuda", reps: int = 20, warmup: int = 5, pool: int = 3) -> dict:
    """Time `candidate` against naive and native on fresh inputs (a pool of `pool` input sets,
    cycled, so no call reuses the previous call's tensors; L2 is flushed between calls anyway)."""
    sets = [make_inputs(op, m, n, dtype, device) for _ in range(pool)]
    counter = iter(range(10**9))
    setup = lambda: (sets[next(counter) % pool],)  # noqa: E731
    call_backend, call_native = OP_CALLS[(op, direction)]
    naive_backend = Backend.from_modules("torch", naive, naive)
    run = lambda t: call_backend(candidate, t)  # noqa: E731
    # one round-robin of the three: the row's "x naive" and "x native" come from the same candidate samples
    cmps = bench.compare_many({"candidate": run, "native": call_native,
                               "naive": lambda t: call_backend(naive_backend, t)}, "native",
                              setup=setup, warmup=warmup, reps=reps, device=device)
    vs_native = cmps["candidate"]
    vs_naive = bench.Comparison(cmps["candidate"].candidate, cmps["naive"].candidate)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = (2 if direction == "fwd" else 3) * m * n * itemsize
    t = vs_native.candidate
    return {"op": f"{op} {direction}", "N": n, "backend": candidate.name, "median ms": t.median * 1e3,
            "p20 ms": t.p20 * 1e3, "p80 ms": t.p80 * 1e3, "GB/s": bench.gbps(nbytes, t.median),
            "x naive": 1 / vs_naive.ratio, "x native": 1 / vs_native.ratio,
            "x native p20-p80": f"{1 / vs_native.ratio_p80:.2f}-{1 / vs_native.ratio_p20:.2f}"}


def gpu_rows(*, quick: bool = False, dtype: str = "fp32", peak: float | None = None) -> list[dict]:
    """speed_case rows of every fused backend that builds here, each op, each row length N
    (M = 4096), with "% peak" (NaN when the peak is unknown)."""
    m, sizes = 4096, [1024, 4096] if quick else [256, 1024, 4096, 12288]
    backends = []
    for name in ("cuda", "triton"):
        try:
            backends.append(get_backend(name))
        except Exception as exc:  # e.g. no nvcc: time the others, say why
            print(f"backend {name!r} unavailable: {exc}")
    rows = []
    for op, direction in traffic.OPS:
        for n in sizes:
            for backend in backends:
                row = speed_case(op, direction, backend, m=m, n=n, dtype=DTYPES[dtype], reps=10 if quick else 30)
                row["% peak"] = 100 * row["GB/s"] / peak if peak else float("nan")
                rows.append(row)
    return rows


GPU_COLUMNS = ["op", "N", "backend", "median ms", "p20 ms", "p80 ms", "GB/s", "% peak", "x naive", "x native",
               "x native p20-p80"]


def _gpu(args) -> int:
    peak = args.peak_gbps or peak_gbps()
    print(f"{torch.cuda.get_device_name()}: M = 4096, {args.dtype}, peak DRAM "
          f"{'%.0f GB/s' % peak if peak else 'unknown (pass --peak-gbps)'}")
    rows = gpu_rows(quick=args.quick, dtype=args.dtype, peak=peak)
    print(bench.format_table(rows, GPU_COLUMNS))
    _plot_bandwidth(rows, peak, args.dtype)
    return 0


def _cpu(args) -> int:
    print("No CUDA device: the fused kernels cannot be timed here (the Triton interpreter times "
          "Python, not a kernel).\nAnalytic DRAM traffic instead (traffic.py; fp32, M = 4096):")
    rows = [r for n in ([1024, 4096] if args.quick else [256, 1024, 4096, 12288])
            for r in traffic.traffic_rows(4096, n, itemsize=4)]
    print(bench.format_table(rows))
    m, n = (512, 512) if args.quick else (1024, 1024)
    print(f"\nMeasured on this CPU (naive composed vs torch native, {m} x {n} fp32, "
          "paired protocol; ratio > 1: naive slower):")
    measured = []
    for op, direction in traffic.OPS:
        call_backend, call_native = OP_CALLS[(op, direction)]
        t = make_inputs(op, m, n, torch.float32, "cpu")
        naive_backend = Backend.from_modules("torch", naive, naive)
        c = bench.compare(lambda: call_backend(naive_backend, t), lambda: call_native(t), warmup=2,
                          reps=5 if args.quick else 15)
        nv, lo = traffic.naive(op, direction, m, n), traffic.minimum(op, direction, m, n)
        measured.append({"op": f"{op} {direction}", "naive ms": c.candidate.median * 1e3,
                         "native ms": c.baseline.median * 1e3, "naive/native": c.ratio,
                         "p20": c.ratio_p20, "p80": c.ratio_p80, "naive/min bytes": nv.total / lo.total})
    print(bench.format_table(measured))
    _plot_traffic(rows)
    return 0


def _plot_traffic(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n_max = max(r["N"] for r in rows)
    sel = [r for r in rows if r["N"] == n_max]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(sel))
    for k, (key, label) in enumerate([("naive MB", "naive PyTorch"), ("fused MB", "fused kernel"),
                                      ("minimum MB", "minimum")]):
        ax.bar([x + 0.27 * (k - 1) for x in xs], [r[key] for r in sel], width=0.27, label=label)
    ax.set_xticks(list(xs), [r["op"] for r in sel])
    ax.set_ylabel("MB moved to/from DRAM")
    ax.set_title(f"Bytes moved, M = 4096, N = {n_max}, fp32 (analytic)")
    ax.legend()
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, 'kernels_traffic.png')}")


def _plot_bandwidth(rows: list[dict], peak: float | None, dtype: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for ax, (op, direction) in zip(axes.flat, traffic.OPS):
        for backend in sorted({r["backend"] for r in rows}):
            sel = [r for r in rows if r["op"] == f"{op} {direction}" and r["backend"] == backend]
            ax.plot([r["N"] for r in sel], [r["GB/s"] for r in sel], "o-", label=backend)
        if peak:
            ax.axhline(peak, color="k", ls="--", lw=0.8, label="peak DRAM")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {direction}")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("N (row length), M = 4096")
    fig.suptitle(f"Fused kernels, {dtype}: GB/s on the minimum traffic")
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, 'kernels_bandwidth.png')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, fewer repetitions")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--peak-gbps", type=float, default=None, help="override the device's peak DRAM GB/s")
    args = parser.parse_args(argv)
    if args.peak_gbps is not None and not (args.peak_gbps > 0 and math.isfinite(args.peak_gbps)):
        parser.error("--peak-gbps must be a positive number")
    return _gpu(args) if torch.cuda.is_available() else _cpu(args)
