"""`python -m scaletrain.bench attention [--quick] [--dtype fp16|bf16|fp32] [--causal]`

Everywhere: the bytes moved by the composed attention (attention_naive.py) vs FlashAttention
(kernels/attention_triton.py) vs the minimum, per head at head dim 64, over sequence lengths
(traffic.attention_*; the naive count is checked against the aten byte counter at the small
lengths, "counted" column), and what autograd keeps for the backward (naive: O(n^2), the fused
Function: Q, K, V, O and L, O(n d)).  Plot: MB vs n, log-log: slope 2 vs slope 1.

On a GPU, also: forward and forward + backward time of the Triton kernels (and the CUDA ones)
beside torch's scaled_dot_product_attention restricted to its math path (the composed one) and
to its flash path, timed round-robin (bench.compare_many: CUDA events, L2 flushed), at batch 4 x
16 heads; TFLOP/s (forward 4 n^2 d per head, halved when causal; backward 2.5x the forward, the
FlashAttention-2 paper's convention); speedups as medians of per-pair ratios; peak memory of
one forward + backward.  The targets a1b's speed checks grade: >= 2x the math path at
n >= 1024, >= 0.7x the flash path forward, memory O(n).  Without a GPU the kernels cannot be timed (the interpreter
measures Python), and the command says so.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from scaletrain import bench
from scaletrain.ops import attention_naive, traffic

__all__ = ["main", "speed_rows", "bytes_rows"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HEAD_DIM = 64


def _saved(fn) -> int:
    """Elements autograd keeps for the backward while fn() runs."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        fn()
    return sum(saved)


def bytes_rows(ns, *, causal: bool, itemsize: int, count_up_to: int = 1024) -> list[dict]:
    """Per head, forward: naive / fused / minimum MB, the aten count of the naive version and the
    elements saved for the backward by the composed ops and by the fused Function."""
    from scaletrain.ops import attention
    rows = []
    for n in ns:
        nv = traffic.attention_naive("fwd", 1, n, HEAD_DIM, causal=causal)
        fu = traffic.attention_fused("fwd", 1, n, HEAD_DIM, causal=causal)
        lo = traffic.attention_minimum("fwd", 1, n, HEAD_DIM)
        row = {"n": n, "naive MB": nv.nbytes(itemsize) / 1e6, "counted MB": None,
               "fused MB (no cache)": fu.nbytes(itemsize) / 1e6, "minimum MB": lo.nbytes(itemsize) / 1e6,
               "naive/fused": nv.total / fu.total, "saved naive MB": None, "saved fused MB": None}
        if n <= count_up_to:
            q, k, v = (torch.randn(1, n, HEAD_DIM, requires_grad=True) for _ in range(3))
            counted, _ = traffic.count_traffic(attention_naive.attention_fwd, *(t.detach() for t in (q, k, v)), causal)
            row["counted MB"] = counted.nbytes(itemsize) / 1e6
            scores = lambda: torch.softmax((q @ k.transpose(1, 2)) / HEAD_DIM ** 0.5, -1) @ v  # noqa: E731
            row["saved naive MB"] = _saved(scores) * itemsize / 1e6
            fused = _saved(lambda: attention(q, k, v, causal=causal, backend="torch"))
            row["saved fused MB"] = fused * itemsize / 1e6
        rows.append(row)
    return rows


def _flops(n: int, bh: int, causal: bool, direction: str) -> float:
    fwd = 4 * bh * n * n * HEAD_DIM / (2 if causal else 1)
    return fwd if direction == "fwd" else 3.5 * fwd  # forward + backward (2.5x)


def speed_rows(ns=(512, 1024, 2048, 4096), *, dtype=torch.float16, causal: bool = False, reps: int = 10,
               batch: int = 4, heads: int = 16) -> list[dict]:
    """GPU only: one row per (n, direction) with times, TFLOP/s, speedups vs math and flash, memory."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    from scaletrain.ops import attention

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    impls = {"triton": lambda q, k, v: attention(q, k, v, causal=causal, backend="triton"),
             "math": sdpa(SDPBackend.MATH), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    with contextlib.suppress(Exception):  # the CUDA C++ kernels, when they build here
        attention(*(torch.randn(1, 1, 8, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(3)), backend="cuda")
        impls["cuda"] = lambda q, k, v: attention(q, k, v, causal=causal, backend="cuda")
    rows = []
    for n in ns:
        def setup(grad=False):
            q, k, v = (torch.randn(batch, heads, n, HEAD_DIM, device="cuda", dtype=dtype, requires_grad=grad)
                       for _ in range(3))
            return (q, k, v) if not grad else (q, k, v, torch.randn_like(q))
        for direction in ("fwd", "fwd+bwd"):
            if direction == "fwd":
                cands, make = dict(impls), setup
            else:
                cands = {name: (lambda f: lambda q, k, v, do: f(q, k, v).backward(do))(f) for name, f in impls.items()}
                make = lambda: setup(grad=True)  # noqa: E731
            with torch.no_grad() if direction == "fwd" else contextlib.nullcontext():
                comps = bench.compare_many(cands, "flash", setup=make, reps=reps, device="cuda")
            for name, comp in comps.items():
                if name in ("math", "flash"):
                    continue
                vs_math = bench.Comparison(comp.candidate, comps["math"].candidate)
                rows.append({"n": n, "direction": direction, "impl": name, "ms": comp.candidate.median * 1e3,
                             "p20 ms": comp.candidate.p20 * 1e3, "p80 ms": comp.candidate.p80 * 1e3,
                             "TFLOP/s": _flops(n, batch * heads, causal, direction) / comp.candidate.median / 1e12,
                             "math ms": comps["math"].candidate.median * 1e3,
                             "flash ms": comps["flash"].candidate.median * 1e3,
                             "vs math": 1 / vs_math.ratio, "vs flash": 1 / comp.ratio,
                             "peak MB": _peak_mb(cands[name], make) if direction == "fwd+bwd" else None,
                             "math peak MB": _peak_mb(cands["math"], make) if direction == "fwd+bwd" else None})
    return rows


def _peak_mb(fn, make) -> float:
    args = make()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(*args)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1e6


def _plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ns = [r["n"] for r in rows]
    for key, label in (("naive MB", "composed (naive)"), ("fused MB (no cache)", "FlashAttention, no cache"),
                       ("minimum MB", "minimum (K, V tiles in cache)")):
        ax.loglog(ns, [r[key] for r in rows], "o-", base=2, label=label)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("MB moved per head (forward)")
    ax.set_title(f"Attention forward, head dim {HEAD_DIM}: O(n^2) vs O(n d) bytes (analytic)")
    ax.legend()
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, 'attention_bytes.png')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench attention", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    ns = (256, 1024, 4096) if args.quick else (256, 512, 1024, 2048, 4096, 8192, 16384)
    rows = bytes_rows(ns, causal=args.causal, itemsize=torch.finfo(dtype).bits // 8,
                      count_up_to=256 if args.quick else 1024)
    print(f"Bytes moved per head, forward, head dim {HEAD_DIM}, {args.dtype}, causal={args.causal}: composed "
          "attention (analytic; 'counted' = aten byte counter) vs FlashAttention (each query tile re-reading "
          "its K, V tiles from DRAM) vs the minimum; and what autograd keeps for the backward")
    print(bench.format_table(rows))
    _plot(rows)
    if not torch.cuda.is_available():
        print("\nNo CUDA device: the kernels are not timed here (under the Triton interpreter a run measures "
              "Python, not the kernel). Run on a GPU for time, TFLOP/s and memory vs torch's SDPA math and flash "
              "paths.")
        return 0
    speed = speed_rows(ns=(1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192), dtype=dtype,
                       causal=args.causal, reps=5 if args.quick else 15)
    print(f"\nGPU {torch.cuda.get_device_name()}, batch 4 x 16 heads, head dim {HEAD_DIM}, {args.dtype}: "
          "targets >= 2x math at n >= 1024, >= 0.7x flash forward")
    print(bench.format_table(speed))
    return 0
