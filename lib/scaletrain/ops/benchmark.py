"""`python -m scaletrain.bench kernels [--quick] [--full] [--dtype fp32,bf16] [--rows M,..] [--sizes N,..] [--variants]`

For softmax and LayerNorm, forward and backward, at M rows of length N: every backend that runs
here timed round-robin with the naive composed PyTorch version (naive.py) and torch's native op
(bench.compare_many: one call of each per rep, CUDA events and L2 flushed on a GPU), so a row's
ratios share one measurement of the backend.  In the same run the two ceilings (ceiling.py): a
device-to-device copy (bytes read + written), the practical bandwidth ceiling, and a large matmul
(bf16 on a GPU, fp32 on a CPU), the compute ceiling.  Reported per row: median / p20 / p80 time,
GB/s counted on the minimum traffic (2 numel for the forwards, 3 numel for the backwards: the
Triton tutorials' convention), % of the measured copy, % of the datasheet's DRAM peak (NaN with no
datasheet), and the speedups over naive and native (medians of per-pair ratios; native reads 1.00),
all from the kernels' time (bench's `hide_host`: the call's Python and launches run while the GPU
is still busy); then "call ms" and "x native, call", a call from an idle GPU with its host part,
which is what a short kernel costs eager code (the first H200 run timed only that: 0.145 ms a
Triton softmax call from N = 512 to 4096, the host's share, not the kernel's).
`--variants` (a GPU): Triton's kernels also launched with other warps and rows per program
(launch_variants.py), timed in the same round-robin: which launch the rule in tiles.py should take.
Plot: GB/s against N per op, every backend, the ceilings drawn (bench_out/kernels_bandwidth_*.png).

Shapes: on a GPU the LLM-training grid, M in {4096, 32768} x N in 512..16384, fp32 and bf16 (the
Triton and CUDA kernels, naive, native); `--quick` M = 4096, N in {1024, 4096}.  On a CPU the fused
kernels cannot be timed (the Triton interpreter times Python, not a kernel), so the rows are naive
and native, scaled down to run in seconds (M = 256, N in {512, 2048}); `--full` runs the GPU grid
anywhere.  The CPU run also prints the analytic bytes moved (naive vs fused vs minimum, traffic.py).
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F

from scaletrain import bench
from scaletrain.bench_cli import positive_float, positive_ints
from scaletrain.ops import ceiling, naive, traffic
from scaletrain.ops.backends import Backend, get_backend

__all__ = ["main", "speed_rows", "gpu_rows", "GPU_COLUMNS", "peak_gbps", "make_inputs", "OP_CALLS", "grid"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (rows M, row lengths N, dtypes) per device and mode; the GPU grid is LLM training's: M = batch x
# sequence tokens, N = the hidden size (LayerNorm) or the attention row / vocabulary (softmax)
GRIDS = {"full": ((4096, 32768), (512, 1024, 2048, 4096, 8192, 16384), ("fp32", "bf16")),
         "gpu quick": ((4096,), (1024, 4096), ("fp32",)),
         "cpu": ((256,), (512, 2048), ("fp32", "bf16")),
         "cpu quick": ((128,), (512,), ("fp32",))}


def grid(*, cuda: bool, quick: bool = False, full: bool = False) -> tuple[tuple[int, ...], tuple[int, ...],
                                                                        tuple[str, ...]]:
    """(M values, N values, dtypes) a run covers: the full grid on a GPU or with --full."""
    if full or (cuda and not quick):
        return GRIDS["full"]
    return GRIDS[("gpu" if cuda else "cpu") + (" quick" if quick else "")]


def peak_gbps(device: int = 0) -> float | None:
    """Peak DRAM bandwidth of a CUDA device in GB/s: from the memory clock and bus width when
    torch reports them (2 transfers per clock), else the datasheet's (ceiling.DATASHEET), else None."""
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    sheet = ceiling.datasheet(props.name)
    return sheet.gbps if sheet else None


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


def speed_rows(op: str, direction: str, backends: dict[str, Backend], *, m: int, n: int, dtype: str,
               ceilings: ceiling.Ceilings, peak: float | None = None, device: str = "cuda", reps: int = 20,
               warmup: int = 5, pool: int = 3) -> list[dict]:
    """One row per backend, then naive and native, all timed in one round-robin on fresh inputs (a
    pool of `pool` input sets, cycled, so no call reuses the previous call's tensors). `peak`: the
    datasheet GB/s "% datasheet" divides by (default: the ceilings' datasheet)."""
    sets = [make_inputs(op, m, n, DTYPES[dtype], device) for _ in range(pool)]
    counter = iter(range(10**9))
    setup = lambda: (sets[next(counter) % pool],)  # noqa: E731
    call_backend, call_native = OP_CALLS[(op, direction)]
    fns: dict[str, Callable] = {name: (lambda t, be=be: call_backend(be, t)) for name, be in backends.items()}
    naive_backend = Backend.from_modules("torch", naive, naive)
    fns["naive"] = lambda t: call_backend(naive_backend, t)
    fns["native"] = call_native
    # the kernels' time (the call's host part hidden: what the bandwidth is about), then the
    # time of a call from an idle GPU, host part included (what eager code pays per call)
    kernel = bench.compare_many(fns, "native", setup=setup, warmup=warmup, reps=reps, device=device, hide_host=True)
    call = kernel if not device.startswith("cuda") else \
        bench.compare_many(fns, "native", setup=setup, warmup=0, reps=reps, device=device)
    nbytes = (2 if direction == "fwd" else 3) * m * n * DTYPES[dtype].itemsize
    peak = peak or (ceilings.sheet.gbps if ceilings.sheet else None)
    return [_row(f"{op} {direction}", dtype, m, n, name, cmp, bench.Comparison(cmp.candidate, kernel["naive"].candidate),
                 call[name], bench.gbps(nbytes, cmp.candidate.median), ceilings.copy_gbps, peak)
            for name, cmp in kernel.items()]


def _row(op: str, dtype: str, m: int, n: int, backend: str, vs_native: bench.Comparison,
         vs_naive: bench.Comparison, call: bench.Comparison, gbps: float, copy_gbps: float, peak: float | None) -> dict:
    t = vs_native.candidate
    return {"op": op, "dtype": dtype, "M": m, "N": n, "backend": backend, "median ms": t.median * 1e3,
            "p20 ms": t.p20 * 1e3, "p80 ms": t.p80 * 1e3, "GB/s": gbps, "% copy": ceiling.percent(gbps, copy_gbps),
            "% datasheet": ceiling.percent(gbps, peak), "x naive": 1 / vs_naive.ratio,
            "x native": 1 / vs_native.ratio,
            "x native p20-p80": f"{1 / vs_native.ratio_p80:.2f}-{1 / vs_native.ratio_p20:.2f}",
            "call ms": call.candidate.median * 1e3, "x native, call": 1 / call.ratio}


# "median ms" .. "x native": the kernels' time; "call ms", "x native, call": a call from an idle GPU
GPU_COLUMNS = ["op", "dtype", "M", "N", "backend", "median ms", "p20 ms", "p80 ms", "GB/s", "% copy", "% datasheet",
               "x naive", "x native", "x native p20-p80", "call ms", "x native, call"]


def fused_backends() -> dict[str, Backend]:
    """The fused backends that build here (cuda, triton); why one does not is printed."""
    found = {}
    for name in ("cuda", "triton"):
        try:
            found[name] = get_backend(name)
        except Exception as exc:  # e.g. no nvcc: time the others, say why
            print(f"backend {name!r} unavailable: {exc}")
    return found


def two_pass_backend() -> Backend:
    """Triton's backend with the LayerNorm backward's dw and db from a second pass over x and dy
    (FUSE_DWDB off): the design task 1.4's one-pass kernel replaced, timed beside it."""
    import dataclasses

    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module, with_switch

    ln = load_kernel_module(KERNELS_DIR / "layer_norm_triton.py")
    return dataclasses.replace(get_backend("triton"), name="triton 2-pass",
                               layer_norm_bwd=with_switch(ln, "FUSE_DWDB", False, ln.layer_norm_bwd))


def _backends_for(op: str, direction: str, backends: dict[str, Backend]) -> dict[str, Backend]:
    """`backends`, and for the LayerNorm backward Triton's two-pass design beside its one-pass one."""
    if (op, direction) == ("layer_norm", "bwd") and "triton" in backends:
        return {**backends, "triton 2-pass": two_pass_backend()}
    return backends


def gpu_rows(*, quick: bool = False, dtype: str = "fp32", peak: float | None = None, rows: tuple[int, ...] = (4096,),
             sizes: tuple[int, ...] | None = None, ceilings: ceiling.Ceilings | None = None,
             backends: dict[str, Backend] | None = None, device: str = "cuda") -> list[dict]:
    """speed_rows of every op at each M in `rows` and N in `sizes` (default 512, 1024, 4096, 16384;
    quick: 1024, 4096), the ceilings measured first unless given."""
    ceilings = ceilings or ceiling.measure(device, quick=quick)
    backends = fused_backends() if backends is None else backends
    sizes = sizes or ((1024, 4096) if quick else (512, 1024, 4096, 16384))
    reps = 10 if quick else 20
    return [r for op, direction in traffic.OPS for m in rows for n in sizes
            for r in speed_rows(op, direction, _backends_for(op, direction, backends), m=m, n=n, dtype=dtype,
                                ceilings=ceilings, peak=peak,
                                device=device, reps=reps, warmup=2 if device == "cpu" else 5)]


def _run(args, device: str) -> int:
    cuda = device == "cuda"
    ms, ns, dtypes = grid(cuda=cuda, quick=args.quick, full=args.full)
    ms, ns, dtypes = args.rows or ms, args.sizes or ns, args.dtype or dtypes
    ceilings = ceiling.measure(device, quick=args.quick)
    peak = args.peak_gbps or (ceilings.sheet.gbps if ceilings.sheet else None)
    print(f"{ceilings.device}: M = {', '.join(map(str, ms))}; ceilings measured in this run "
          f"(datasheet: {ceilings.sheet.source if ceilings.sheet else 'none for this device'}):")
    print(bench.format_table(ceiling.ceiling_rows(ceilings)))
    if not cuda:
        print("(rows this small stay in the CPU's caches, the copy's buffers do not: % copy can pass 100 here)")
    backends = fused_backends() if cuda else {}
    if args.variants:
        from scaletrain.ops.launch_variants import variant_backends
        backends.update(variant_backends())
    for dtype in dtypes:
        rows = gpu_rows(quick=args.quick, dtype=dtype, peak=peak, rows=ms, sizes=ns, ceilings=ceilings,
                        backends=backends, device=device)
        print(f"\n{dtype}:\n{bench.format_table(rows, GPU_COLUMNS)}")
        _plot_bandwidth(rows, ceilings, peak, dtype)
    return 0


def _cpu_traffic(args) -> None:
    print("No CUDA device: the fused kernels cannot be timed here (the Triton interpreter times "
          "Python, not a kernel); the rows below time naive and native only.\n"
          "Analytic DRAM traffic of the fused kernels instead (traffic.py; fp32, M = 4096):")
    rows = [r for n in ([1024, 4096] if args.quick else [256, 1024, 4096, 12288])
            for r in traffic.traffic_rows(4096, n, itemsize=4)]
    print(bench.format_table(rows) + "\n")
    _plot_traffic(rows)
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


def _plot_bandwidth(rows: list[dict], ceilings: ceiling.Ceilings, peak: float | None, dtype: str) -> None:
    """GB/s against N, one panel per op, a line per (backend, M); the measured copy and the datasheet drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    styles = dict(zip(sorted({r["M"] for r in rows}), ("o-", "s--", "^:")))
    for ax, (op, direction) in zip(axes.flat, traffic.OPS):
        for backend in dict.fromkeys(r["backend"] for r in rows):
            for m, style in styles.items():
                sel = [r for r in rows if r["op"] == f"{op} {direction}" and r["backend"] == backend and r["M"] == m]
                ax.plot([r["N"] for r in sel], [r["GB/s"] for r in sel], style, label=f"{backend}, M = {m}")
        ax.axhline(ceilings.copy_gbps, color="k", lw=1.2, label=f"copy (measured) {ceilings.copy_gbps:.0f} GB/s")
        if peak:
            ax.axhline(peak, color="k", ls="--", lw=0.8, label=f"datasheet {peak:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {direction}")
        ax.set_ylabel("GB/s (minimum traffic)")
    for ax in axes[1]:
        ax.set_xlabel("N (row length)")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{ceilings.device}, {dtype}: GB/s against the copy ceiling")
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, f'kernels_bandwidth_{dtype}.png')}")


def _dtypes(text: str) -> tuple[str, ...]:
    values = tuple(text.split(","))
    if set(values) - set(DTYPES):
        raise argparse.ArgumentTypeError(f"comma-separated dtypes among {', '.join(DTYPES)}, e.g. fp32,bf16; "
                                         f"got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, fp32, fewer repetitions")
    parser.add_argument("--full", action="store_true", help="the GPU grid (M 4096, 32768; N 512..16384; fp32, bf16) "
                                                            "on a CPU too (minutes)")
    parser.add_argument("--dtype", type=_dtypes, default=None, help="dtypes, e.g. fp32,bf16")
    parser.add_argument("--rows", type=positive_ints, default=None, help="M values, e.g. 4096,32768")
    parser.add_argument("--sizes", type=positive_ints, default=None, help="N values, e.g. 512,4096,16384")
    parser.add_argument("--peak-gbps", type=positive_float, default=None, help="override the datasheet's DRAM GB/s")
    parser.add_argument("--variants", action="store_true",
                        help="also time Triton's kernels launched other ways (launch_variants.py: 4 or 16 warps, "
                             "2k or 16k elements a program) in the same round-robin; a GPU only")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        return _run(args, "cuda")
    if args.variants:
        parser.error("--variants times Triton's launches, which run on a CPU only through the interpreter "
                     "(Python, not a kernel): run it on a GPU")
    _cpu_traffic(args)
    return _run(args, "cpu")
