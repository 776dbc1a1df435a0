"""The rank function behind notebook 03: traced steps of every variant, in one spawn.

`notebook_demo(rank, p)` runs, on every rank, and returns rank 0's findings:
  * one step of each variant (naive, buckets after backward, buckets + overlap with gloo's
    allreduce and with our ring), each timed with a `Trace` after a warm-up step;
  * the exposed communication (finish time after backward ended) as the tokens per rank shrink,
    i.e. as compute per byte of gradient falls;
  * gradient accumulation: micro-steps inside no_sync() against one process on the whole batch,
    and the number of allreduces per optimizer step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from scaletrain.dp.data_parallel import DataParallel
from scaletrain.dp.naive import NaiveDataParallel
from scaletrain.dp.trace import Trace
from scaletrain.models import GPT, GPTConfig, make_batch
from scaletrain.testing import rel_error

__all__ = ["notebook_demo", "VARIANTS", "DEMO_CFG"]

DEMO_CFG = dict(n_layer=4, n_embd=128, n_head=4, block_size=64)  # 0.83 M parameters, 3.2 MiB

VARIANTS: dict[str, Callable[..., Any]] = {
    "naive: one allreduce per parameter, after backward":
        lambda model, cap, trace: NaiveDataParallel(model, allreduce="torch", trace=trace),
    "buckets, launched after backward":
        lambda model, cap, trace: DataParallel(model, bucket_cap_mb=cap, allreduce="torch", overlap=False,
                                               trace=trace),
    "buckets + overlap (gloo allreduce)":
        lambda model, cap, trace: DataParallel(model, bucket_cap_mb=cap, allreduce="torch", trace=trace),
    "buckets + overlap (our ring, comm thread)":
        lambda model, cap, trace: DataParallel(model, bucket_cap_mb=cap, allreduce="ring", trace=trace),
}


def _traced_step(model, x, y, trace: Trace) -> Trace:
    """One step: backward, then finish; returns a copy of the trace with the step's events."""
    trace.clear()
    trace.record("backward_start")
    model(x, y)[1].backward()
    trace.record("backward_end")
    model.finish_gradient_synchronization()
    trace.record("finish_end")
    for p in model.parameters():
        p.grad = None
    return trace.copy()


def _local(cfg: GPTConfig, rank: int, p: int, rows: int, seed: int = 0, seq_len: int | None = None):
    batch = make_batch(cfg, p * rows, seed=seed, seq_len=seq_len)
    return tuple(t[rank * rows:(rank + 1) * rows] for t in batch)


def _timelines(rank, p, cfg, cap_mb, batch) -> dict[str, Trace]:
    out = {}
    x, y = _local(cfg, rank, p, batch)
    for name, make in VARIANTS.items():
        trace = Trace()
        model = make(GPT(cfg), cap_mb, trace)
        _traced_step(model, x, y, trace)  # warm-up: allocator, gloo buffers, the comm thread
        out[name] = min((_traced_step(model, x, y, trace) for _ in range(3)),
                        key=lambda t: t.first("finish_end") - t.first("backward_start"))
        model.close()
    return out


def _exposed(rank, p, cfg, cap_mb, shapes, steps: int = 5) -> dict[int, tuple[list[float], list[float]]]:
    """tokens per rank -> (backward ms, exposed communication ms), one of each per step, `steps`
    steps after a warm-up (the notebook plots their median and p20-p80). Both are taken over all
    ranks: backward is the slowest rank's, and communication is exposed from the moment the *last*
    rank's backward ended until the last rank's step ended. Measured on rank 0 alone, the wait for
    a slower rank's backward would count as communication. (perf_counter is CLOCK_MONOTONIC, one
    clock for every process of the machine.) `shapes`: (sequences, sequence length) per rank; the
    gradient bytes stay the same."""
    out = {}
    trace = Trace()
    model = DataParallel(GPT(cfg), bucket_cap_mb=cap_mb, allreduce="torch", trace=trace)
    for rows, seq_len in shapes:
        x, y = _local(cfg, rank, p, rows, seq_len=seq_len)
        _traced_step(model, x, y, trace)
        runs = [_traced_step(model, x, y, trace) for _ in range(steps)]
        marks = torch.tensor([[t.first("backward_end") - t.first("backward_start"), t.first("backward_end"),
                               t.first("finish_end")] for t in runs], dtype=torch.float64)
        dist.all_reduce(marks, op=dist.ReduceOp.MAX)  # slowest backward, last backward end, last step end
        out[rows * seq_len] = ((marks[:, 0] * 1e3).tolist(), ((marks[:, 2] - marks[:, 1]) * 1e3).tolist())
    model.close()
    return out


def _accumulation(rank, p, cfg, cap_mb, micro, batch) -> dict[str, float]:
    ref = GPT(cfg)
    ref(*make_batch(cfg, p * micro * batch, seed=1))[1].backward()
    trace = Trace()
    model = DataParallel(GPT(cfg), bucket_cap_mb=cap_mb, allreduce="ring", trace=trace)
    x, y = _local(cfg, rank, p, micro * batch, seed=1)
    for j in range(micro):
        sl = slice(j * batch, (j + 1) * batch)
        if j < micro - 1:
            with model.no_sync():
                (model(x[sl], y[sl])[1] / micro).backward()  # mean over micro-steps, not their sum
        else:
            (model(x[sl], y[sl])[1] / micro).backward()
    model.finish_gradient_synchronization()
    err = max(rel_error(a.grad, b.grad) for a, b in zip(model.parameters(), ref.parameters()))
    out = {"effective_batch": p * micro * batch, "max_rel_err": err,
           "allreduces_per_step": len(trace.of("launch")), "buckets": len(model.buckets)}
    model.close()
    return out


def notebook_demo(rank: int, p: int, cap_mb: float = 0.5, *, cfg_kwargs: dict | None = None,
                  batch: int = 8, shapes: tuple = ((16, 64), (8, 64), (4, 32), (2, 16), (1, 8), (1, 2)),
                  micro: int = 4) -> dict:
    """Run every experiment of notebook 03 on this rank; the notebook shows rank 0's result."""
    torch.manual_seed(0)
    cfg = GPTConfig(**(cfg_kwargs or DEMO_CFG))
    result = {"timelines": _timelines(rank, p, cfg, cap_mb, batch),
              "exposed": _exposed(rank, p, cfg, cap_mb, shapes),
              "accumulation": _accumulation(rank, p, cfg, cap_mb, micro, batch=2),
              "n_params": sum(q.numel() for q in GPT(cfg).parameters())}
    return result
