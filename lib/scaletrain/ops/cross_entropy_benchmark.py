"""`python -m scaletrain.bench cross_entropy [--quick] [--dtype fp32,bf16] [--variants]`

Cross-entropy at real vocabularies, forward + backward, every variant timed round-robin with torch's
own (bench.compare_many: CUDA events and L2 flushed on a GPU), with the peak memory of one call
(allocations.peak_allocated: the allocator's figure on a GPU, every op's new storages on a CPU):

  1. the criterion on given (N, V) logits: F.cross_entropy (the baseline), the fused criterion
     (cross_entropy.py: "triton" and "cuda", one pass over the logits each way, only the per-row
     log-sum-exp saved) and the composed one ("torch"); GB/s on the minimum traffic (the logits
     read forward and backward, their gradient written: 3 N V elements) and % of the copy ceiling
     measured in the same run (ceiling.py);
  2. the LM head and its loss from (N, H) hidden states and a (V, H) weight: F.linear then
     F.cross_entropy (the (N, V) logits materialized, the baseline) against the chunked fused
     linear + cross-entropy (linear_cross_entropy.py, Liger-Kernel's approach: one chunk of logits
     at a time); TFLOP/s on its three matmuls (6 N H V) and % of the matmul ceiling.

`--variants` (a GPU): the Triton criterion also with 4k and 8k logits a loop step in place of its
16k (launch_variants.chunk_variants), in the same round-robin: which chunk the launcher should take.

Shapes: on a GPU N = 8192 tokens, V in {32000, 50257, 128256} (Llama 2, GPT-2, Llama 3), H = 4096,
fp32 and bf16 logits; on a CPU the same code at small V (N = 256 and 1024, V in {2048, 4096}, H = 64)
so that every path runs in seconds; the Triton and CUDA criteria only on a GPU (the interpreter
times Python, not a kernel).  Plot: peak memory per variant against V (bench_out/cross_entropy_memory.png).
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F

from scaletrain import bench
from scaletrain.ops import ceiling
from scaletrain.ops.allocations import peak_allocated
from scaletrain.ops.cross_entropy import cross_entropy, cross_entropy_backend
from scaletrain.ops.linear_cross_entropy import linear_cross_entropy, liger_chunk_rows

__all__ = ["main", "criterion_rows", "linear_rows", "SHAPES"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# per device and mode: tokens N for the criterion, vocabularies V, and (N, H) for the linear head
SHAPES = {"cuda": {"n": 8192, "vocabs": (32000, 50257, 128256), "linear": (8192, 4096)},
          "cuda quick": {"n": 4096, "vocabs": (32000, 128256), "linear": (4096, 4096)},
          "cpu": {"n": 256, "vocabs": (2048, 4096), "linear": (1024, 64)},
          "cpu quick": {"n": 128, "vocabs": (2048,), "linear": (512, 64)}}


def _fused_criteria(device: str) -> list[str]:
    """The fused criteria that load here: triton and cuda on a GPU (why one does not is printed)."""
    if device == "cpu":
        return []
    found = []
    for name in ("triton", "cuda"):
        try:
            cross_entropy_backend(name)
            found.append(name)
        except Exception as exc:  # e.g. no nvcc: time the others, say why
            print(f"cross_entropy backend {name!r} unavailable: {exc}")
    return found


def _time_and_peak(fns: dict[str, Callable[[], None]], baseline: str, device: str, reps: int) -> dict[str, dict]:
    """Per variant: median / p20 / p80 seconds, the speedup over `baseline` (median of per-pair
    ratios, all timed in one round-robin) and the peak bytes of one call, measured apart."""
    cmps = bench.compare_many(fns, baseline, warmup=2, reps=reps, device=device)
    out = {}
    for name, cmp in cmps.items():
        t = cmp.candidate
        _, peak = peak_allocated(fns[name], device)
        out[name] = {"median ms": t.median * 1e3, "p20 ms": t.p20 * 1e3, "p80 ms": t.p80 * 1e3,
                     f"x {baseline}": 1 / cmp.ratio, "peak MiB": peak / 2**20, "_seconds": t.median, "_peak": peak}
    return out


def _backward(loss_of: Callable[[], torch.Tensor], *leaves: torch.Tensor) -> Callable[[], None]:
    def run():
        for t in leaves:
            t.grad = None  # a fresh gradient each call, as in a training step
        loss_of().backward()
    return run


def criterion_rows(n: int, vocab: int, dtype: str, *, device: str, ceilings: ceiling.Ceilings, reps: int,
                   variants: bool = False) -> list[dict]:
    """F.cross_entropy, the fused criteria and the composed one on (n, vocab) logits, forward + backward;
    `variants`: the Triton criterion also with smaller vocabulary chunks (launch_variants.chunk_variants)."""
    x = torch.randn(n, vocab, device=device).mul_(3).to(DTYPES[dtype]).requires_grad_()
    y = torch.randint(0, vocab, (n,), device=device)
    fns = {"F.cross_entropy": _backward(lambda: F.cross_entropy(x, y), x)}
    for name in (*_fused_criteria(device), "torch"):
        fns[f"fused {name}" if name != "torch" else "composed"] = _backward(
            lambda name=name: cross_entropy(x, y, backend=name), x)
    if variants and "fused triton" in fns:
        from scaletrain.ops.launch_variants import chunk_variants
        fns.update({f"fused triton, {label}": run for label, run in chunk_variants(fns["fused triton"]).items()})
    logits = n * vocab * x.element_size()
    rows = []
    for name, r in _time_and_peak(fns, "F.cross_entropy", device, reps).items():
        gbps, peak = bench.gbps(3 * logits, r.pop("_seconds")), r.pop("_peak")
        rows.append({"V": vocab, "dtype": dtype, "variant": name, **r, "GB/s": gbps,
                     "% copy": ceiling.percent(gbps, ceilings.copy_gbps), "peak / logits": peak / logits})
    return rows


def linear_rows(n: int, hidden: int, vocab: int, dtype: str, *, device: str, ceilings: ceiling.Ceilings,
                reps: int) -> list[dict]:
    """F.linear + F.cross_entropy (the logits whole) against the chunked linear + cross-entropy."""
    h = torch.randn(n, hidden, device=device).to(DTYPES[dtype]).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device) / hidden ** 0.5).to(DTYPES[dtype]).requires_grad_()
    y = torch.randint(0, vocab, (n,), device=device)
    chunk = liger_chunk_rows(n, hidden, vocab)
    fns = {"linear + F.cross_entropy": _backward(lambda: F.cross_entropy(h @ w.t(), y), h, w)}
    for name in (*_fused_criteria(device), "torch"):
        fns[f"chunked, {name} criterion"] = _backward(lambda name=name: linear_cross_entropy(h, w, y, backend=name),
                                                      h, w)
    logits = n * vocab * h.element_size()
    rows = []
    for name, r in _time_and_peak(fns, "linear + F.cross_entropy", device, reps).items():
        tflops = 6 * n * hidden * vocab / r.pop("_seconds") / 1e12  # h W^T, dz W, dz^T h
        peak = r.pop("_peak")
        rows.append({"V": vocab, "dtype": dtype, "variant": name, "chunk rows": chunk if "chunked" in name else n,
                     **r, "TFLOP/s": tflops, "% matmul": ceiling.percent(tflops, ceilings.matmul_tflops),
                     "peak / logits": peak / logits})
    return rows


def _plot(rows: list[dict], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for dtype, style in (("fp32", "o-"), ("bf16", "s--")):
            sel = [r for r in rows if r["variant"] == variant and r["dtype"] == dtype]
            if sel:
                ax.plot([r["V"] for r in sel], [r["peak MiB"] for r in sel], style, label=f"{variant}, {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary V")
    ax.set_ylabel("peak MiB, one forward + backward")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, 'cross_entropy_memory.png')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench cross_entropy", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer vocabularies and repetitions")
    parser.add_argument("--dtype", default="fp32,bf16", help="logits' dtypes, comma-separated (fp32, bf16)")
    parser.add_argument("--variants", action="store_true",
                        help="also time the Triton criterion with 4k and 8k vocabulary chunks a loop step "
                             "(launch_variants.py) in the same round-robin; a GPU only")
    args = parser.parse_args(argv)
    dtypes = args.dtype.split(",")
    if set(dtypes) - set(DTYPES):
        parser.error(f"--dtype: comma-separated among {', '.join(DTYPES)}, e.g. fp32,bf16; got {args.dtype!r}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.variants and device == "cpu":
        parser.error("--variants times the Triton criterion's launches, which run on a CPU only through the "
                     "interpreter (Python, not a kernel): run it on a GPU")
    shape = SHAPES[device + (" quick" if args.quick else "")]
    reps = (3 if args.quick else 5) if device == "cpu" else (10 if args.quick else 20)
    ceilings = ceiling.measure(device, quick=args.quick)
    print(f"{ceilings.device}: ceilings measured in this run")
    print(bench.format_table(ceiling.ceiling_rows(ceilings)))
    if device == "cpu":
        print("No CUDA device: the fused Triton and CUDA criteria are timed on a GPU only; here the composed "
              "paths and the chunked one with the composed criterion, at small V.")
    crit = [r for v in shape["vocabs"] for d in dtypes
            for r in criterion_rows(shape["n"], v, d, device=device, ceilings=ceilings, reps=reps,
                                    variants=args.variants)]
    print(f"\n1. the criterion on (N = {shape['n']}, V) logits, forward + backward:\n{bench.format_table(crit)}")
    n, hidden = shape["linear"]
    lin = [r for v in shape["vocabs"] for d in dtypes
           for r in linear_rows(n, hidden, v, d, device=device, ceilings=ceilings, reps=reps)]
    print(f"\n2. linear + cross-entropy from (N = {n}, H = {hidden}) hidden states, forward + backward:\n"
          f"{bench.format_table(lin)}")
    _plot(crit + lin, f"{ceilings.device}: cross-entropy, peak memory")
    return 0
