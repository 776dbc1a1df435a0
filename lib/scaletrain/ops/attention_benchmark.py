"""`python -m scaletrain.bench attention [--quick] [--dtype fp16|bf16|fp32] [--causal]`

Everywhere: the bytes moved by the composed attention (attention_naive.py) vs FlashAttention
(kernels/attention_triton.py) vs the minimum, per head at head dim 64, over sequence lengths
(traffic.attention_*; the naive count is checked against the aten byte counter at the small
lengths, "counted" column), and what autograd keeps for the backward (naive: O(n^2), the fused
Function: Q, K, V, O and L, O(n d)).  Plot: MB vs n, log-log: slope 2 vs slope 1.

On a GPU, also: forward and forward + backward time of the Triton kernels (and the CUDA ones:
"cuda", whose fp16 / bf16 forward and backward run on tensor cores, kernels/attention_mma*.cu, and
"cuda scalar", the forward of kernels/attention.cu without them; "triton atomic dq", forward +
backward only: the Triton backward with dQ by atomic adds from the dK/dV kernel, DQ_BY_ATOMICS,
FlashAttention-2's design, beside the default two-kernel one) beside torch's
scaled_dot_product_attention restricted to its math path (the composed one) and to its flash path,
timed round-robin (bench.compare_many: CUDA events, L2 flushed, the kernels' time with the
call's host part hidden: the first H200 run timed calls from an idle GPU, and the autotuned
forward read 0.26 ms slower than the fixed one at both n = 1024 and 4096, a constant: the mark
of host time, the autotuner's Python, not of a slower kernel), at batch 4 x
16 heads; TFLOP/s (forward 4 n^2 d per head, halved when causal; backward 2.5x the forward, the
FlashAttention-2 paper's convention); speedups as medians of per-pair ratios; peak memory of
one forward + backward.  The targets a1b's speed checks grade: >= 2x the math path at
n >= 1024, >= 0.7x the flash path forward at n = 4096 (GRADED), memory O(n).  Without a GPU the kernels cannot be timed (the interpreter
measures Python), and the command says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
import warnings

import torch

from scaletrain import bench
from scaletrain.ops import attention_naive, attention_tuning, ceiling, traffic

__all__ = ["main", "speed_rows", "bytes_rows", "GRADED", "speed_inputs", "sdpa_paths", "forward_backward",
           "batch_seconds", "graded_speed", "local_student", "graded_rows", "atomic_dq_backend"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HEAD_DIM = 64
# a1b's speed checks: the n = 4096 row of the table below (batch 4 x 16 heads, fp16, not causal)
GRADED = {"batch": 4, "heads": 16, "n": 4096, "dtype": "fp16", "causal": False}
# SDPA's paths, and what stands in for one that cannot run the inputs (device, dtype, head dim)
_PATHS = {"math": ("MATH",), "flash": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")}


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


def speed_inputs(spec: dict, *, device: str, seed: int | None = None, grad: bool = False) -> tuple[torch.Tensor, ...]:
    """(q, k, v, do) of spec's dtype, contiguous (batch, heads, n, HEAD_DIM) as in GRADED: 4-D, as
    SDPA's flash path requires (a1b's check handed it (batch x heads, n, d) and got "No available
    kernel" on an H200).  From `seed` when given: the grader and its worker make the same."""
    shape, dtype = (spec["batch"], spec["heads"], spec["n"], HEAD_DIM), spec["dtype"]
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    make = (lambda: torch.randn(shape, device=device)) if gen is None else (lambda: torch.randn(shape, generator=gen))
    return tuple(make().to(device=device, dtype=DTYPES[dtype]).requires_grad_(grad and i < 3) for i in range(4))


def _sdpa(backend, causal: bool):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def sdpa_paths(q, k, v, *, causal: bool, backward: bool = False) -> dict[str, tuple]:
    """{"math": (fn, note), "flash": (fn or None, note)}: SDPA restricted to each path, tried on
    one head of these inputs (their dtype, layout, head dim, device).  A path that cannot run them
    gives way to the next of _PATHS, and `note` says which ran and why ('' when the path itself)."""
    from torch.nn.attention import SDPBackend

    out = {}
    for name, choices in _PATHS.items():
        refused = []
        for choice in choices:
            fn = _sdpa(getattr(SDPBackend, choice), causal)
            why = _refusal(fn, q, k, v, backward)
            if why:
                refused.append(f"{choice}: {why}")
                continue
            out[name] = (fn, f"{name} = {choice} ({'; '.join(refused)})" if refused else "")
            break
        else:
            out[name] = (None, f"no {name} path for these inputs ({'; '.join(refused)})")
    return out


def _refusal(fn, q, k, v, backward: bool) -> str:
    """'' if fn runs (and its backward, when asked) on one head of q, k, v; else why not: torch's
    warnings name the reason ("requires ... 4 dimensional"), its error only "No available kernel"."""
    one = [t[:1, :1].detach().requires_grad_(backward) for t in (q, k, v)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(*one)
            if backward:
                out.sum().backward()
            return ""
        except RuntimeError as exc:
            said = [str(w.message).split(" (Triggered internally")[0] for w in caught]
            said = [m for m in dict.fromkeys(said) if not m.endswith("because:")]
            return " / ".join(said)[:300] or str(exc).splitlines()[0][:120]


def forward_backward(fn):
    """fn(q, k, v) then the backward of its output with do: what "fwd+bwd" times everywhere."""
    return lambda q, k, v, do: fn(q, k, v).backward(do)


def batch_seconds(fn, args: tuple, reps: int) -> float:
    """Seconds per call of `reps` calls of fn(*args) (reps = 0: the sync alone), on the wall clock
    with the device synchronized at both ends: the clock a1b's grader has around its worker."""
    sync = torch.cuda.synchronize if args[0].is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    sync()
    return (time.perf_counter() - start) / max(reps, 1)


def graded_speed(student, direction: str, *, seed: int, spec: dict | None = None, pairs: int = 5, reps: int = 10,
                 device: str = "cuda") -> dict:
    """a1b's speed protocol, shared by its checks and `bench attention`: `student(reps)` returns
    seconds per call of `direction` ("fwd" or "fwd+bwd") on speed_inputs(spec, seed=seed) (made
    again wherever it runs; spec: GRADED by default); one warm-up batch of each, then `pairs`
    rounds alternating the student's batch with a batch of each SDPA path on the same inputs
    (batch_seconds).  Returns the median seconds, the medians of the per-round ratios ("x math",
    "x flash": None without a flash path) and sdpa_paths' notes (what stood in for a path, why)."""
    spec = {**GRADED, **(spec or {})}
    args = speed_inputs(spec, device=device, seed=seed, grad=direction != "fwd")
    paths = sdpa_paths(*args[:3], causal=spec["causal"], backward=direction != "fwd")
    base = {name: (fn if direction == "fwd" else forward_backward(fn)) for name, (fn, _) in paths.items() if fn}
    args = args[:3] if direction == "fwd" else args
    timers = {"student": student, **{name: functools.partial(batch_seconds, fn, args) for name, fn in base.items()}}
    rounds = []
    with torch.no_grad() if direction == "fwd" else contextlib.nullcontext():
        for timer in timers.values():  # warm-up: compilation, allocation
            timer(1)
        for i in range(pairs):
            order = list(timers) if i % 2 == 0 else list(timers)[::-1]
            rounds.append({who: timers[who](reps) for who in order})
    mine = [r["student"] for r in rounds]
    x = {name: statistics.median(r[name] / r["student"] for r in rounds) for name in base}
    return {"seconds": statistics.median(mine), "x math": x.get("math"), "x flash": x.get("flash"),
            "notes": [note for _, note in paths.values() if note]}


def atomic_dq_backend():
    """Triton's attention backend with the backward's dQ by atomic adds from the dK/dV kernel
    (DQ_BY_ATOMICS on for the call, FlashAttention-2's design): timed beside the default, whose
    separate dq kernel recomputes P (7 matmuls against 5, no atomics, deterministic)."""
    import dataclasses

    from scaletrain.ops.attention import attention_backend
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module, with_switch

    kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
    bwd = with_switch(kernels, "DQ_BY_ATOMICS", True, kernels.attention_bwd)
    return dataclasses.replace(attention_backend("triton"), bwd=bwd)  # named "triton": scaletrain.ops.attention runs it


def speed_rows(ns=(512, 1024, 2048, 4096), *, dtype=torch.float16, causal: bool = False, reps: int = 10,
               batch: int = 4, heads: int = 16) -> list[dict]:
    """GPU only: one row per (n, direction) with times, TFLOP/s and its % of a large bf16 matmul measured
    first (ceiling.py; fp16 and bf16 share the tensor cores' peak), speedups vs math and flash, memory."""
    from scaletrain.ops import attention
    from scaletrain.ops.attention import attention_backend

    matmul_tflops = ceiling.measure("cuda", quick=True).matmul_tflops

    dname = next(k for k, v in DTYPES.items() if v == dtype)
    probe = speed_inputs({"batch": 1, "heads": 1, "n": 128, "dtype": dname}, device="cuda")[:3]
    paths = sdpa_paths(*probe, causal=causal)
    impls = {"triton": lambda q, k, v: attention(q, k, v, causal=causal, backend="triton"),
             "math": paths["math"][0], "flash": paths["flash"][0] or paths["math"][0]}
    fixed = attention_backend("triton", tuned=False)
    fwd_only = {"triton fixed": lambda q, k, v: attention(q, k, v, causal=causal, backend=fixed)}  # forward-only rows
    atomic = atomic_dq_backend()
    fwd_bwd_only = {"triton atomic dq": lambda q, k, v: attention(q, k, v, causal=causal, backend=atomic)}
    try:  # the CUDA C++ kernels, when they build here
        attention(*(torch.randn(1, 1, 8, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(3)), backend="cuda")
        impls["cuda"] = lambda q, k, v: attention(q, k, v, causal=causal, backend="cuda")
        fwd_only["cuda scalar"] = _cuda_scalar_forward(causal)
    except Exception as exc:  # noqa: BLE001 -- the table goes on without them, and says why
        print(f"backend 'cuda' left out: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    rows = []
    for n in ns:
        spec = {"batch": batch, "heads": heads, "n": n, "dtype": dname}
        for direction in ("fwd", "fwd+bwd"):
            if direction == "fwd":
                cands = {**impls, **fwd_only}
                make = lambda: speed_inputs(spec, device="cuda")[:3]  # noqa: E731
            else:
                cands = {key: forward_backward(f) for key, f in {**impls, **fwd_bwd_only}.items()}
                make = lambda: speed_inputs(spec, device="cuda", grad=True)  # noqa: E731
            with torch.no_grad() if direction == "fwd" else contextlib.nullcontext():
                comps = bench.compare_many(cands, "flash", setup=make, reps=reps, device="cuda", hide_host=True)
            for name, comp in comps.items():
                if name in ("math", "flash"):
                    continue
                vs_math = bench.Comparison(comp.candidate, comps["math"].candidate)
                tflops = _flops(n, batch * heads, causal, direction) / comp.candidate.median / 1e12
                rows.append({"n": n, "direction": direction, "impl": name, "ms": comp.candidate.median * 1e3,
                             "p20 ms": comp.candidate.p20 * 1e3, "p80 ms": comp.candidate.p80 * 1e3,
                             "TFLOP/s": tflops, "% matmul": ceiling.percent(tflops, matmul_tflops),
                             "math ms": comps["math"].candidate.median * 1e3,
                             "flash ms": comps["flash"].candidate.median * 1e3,
                             "vs math": 1 / vs_math.ratio, "vs flash": 1 / comp.ratio,
                             "peak MB": _peak_mb(cands[name], make) if direction == "fwd+bwd" else None,
                             "math peak MB": _peak_mb(cands["math"], make) if direction == "fwd+bwd" else None})
    return rows


def _cuda_scalar_forward(causal: bool):
    """attention.cu's scalar forward alone, on 4-d inputs: the row the "cuda" backend's forward is
    measured against, since for fp16 / bf16 at head dim 64 that one runs attention_mma.cu on tensor
    cores (the scalar kernels keep fp32 and the other head dims)."""
    from scaletrain.ops import attention_cuda
    ext = attention_cuda.load()

    def run(q, k, v):
        n, d = q.shape[-2:]
        return ext.attention_fwd_scalar(*(t.reshape(-1, t.shape[-2], d) for t in (q, k, v)), causal, d ** -0.5)[0]
    return run


def local_student(direction: str, *, seed: int, spec: dict | None = None, backend: str = "triton",
                  device: str = "cuda"):
    """reps -> seconds per call of scaletrain.ops.attention(backend) in this process on the inputs
    graded_speed makes: the student's side of a1b's checks, without the grader's worker."""
    from scaletrain.ops import attention
    from scaletrain.ops.attention import attention_backend

    spec = {**GRADED, **(spec or {})}
    args = speed_inputs(spec, device=device, seed=seed, grad=direction != "fwd")
    fn = functools.partial(attention, causal=spec["causal"], backend=attention_backend(backend, tuned=False))
    if direction == "fwd":
        return functools.partial(batch_seconds, fn, args[:3])
    return functools.partial(batch_seconds, forward_backward(fn), args)


def graded_rows(*, seed: int = 0, spec: dict | None = None, backend: str = "triton", device: str = "cuda",
                pairs: int = 5, reps: int = 10) -> list[dict]:
    """a1b's two speed checks as its grader runs them (graded_speed), the kernels in this process."""
    rows = []
    for direction in ("fwd", "fwd+bwd"):
        student = local_student(direction, seed=seed, spec=spec, backend=backend, device=device)
        row = graded_speed(student, direction, seed=seed, spec=spec, pairs=pairs, reps=reps, device=device)
        rows.append({"direction": direction, "impl": backend, "ms": row["seconds"] * 1e3, "x math": row["x math"],
                     "x flash": row["x flash"], "notes": "; ".join(row["notes"])})
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
          "targets >= 2x math at n >= 1024, >= 0.7x flash forward at n = 4096; 'cuda' = attention_mma.cu's "
          "tensor-core kernels for fp16 / bf16 (attention_mma*.cu), target >= 0.5x flash forward; "
          "'cuda scalar' = attention.cu's forward; 'triton' = its forward's tiles tuned on this GPU "
          "(attention_tuning.py), 'triton fixed' = the launcher's 64 x 64, as a1b grades; 'triton atomic dq' = "
          "the backward's dQ by atomic adds from the dK/dV kernel (FlashAttention-2), not the dq kernel")
    print(bench.format_table(speed))
    print("tiles the tuner chose:\n" + bench.format_table(attention_tuning.chosen()))
    print(f"\na1b's speed checks as graded ({GRADED}; attention_benchmark.graded_speed, the kernels in this "
          "process): >= 2x math, forward >= 0.7x flash")
    print(bench.format_table(graded_rows(reps=5 if args.quick else 10)))
    return 0
