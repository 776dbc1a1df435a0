"""The timing protocol every benchmark and speed check uses, and the `python -m scaletrain.bench` entry
(the benchmarks themselves are discovered by `scaletrain.bench_cli`).

Protocol (DESIGN.md, "Performance evidence"):
  * warm-up runs first (allocator, caches, lazy init, Triton/CUDA compilation);
  * candidate and baseline are timed *alternately*, on fresh inputs from `setup()`, so drift of a
    shared machine (another process, thermal state) hits both equally;
  * the figure quoted is the **median of per-pair ratios** with p20/p80, never a ratio of means;
  * on CUDA: events around the call, `synchronize` at the boundaries, L2 flushed between reps;
    a call from an idle GPU, its host part included, or with `hide_host` the kernels' time alone;
  * across ranks: a barrier before each rep and the slowest rank's time (a collective is as
    slow as its last rank).

Bandwidth helpers follow nccl-tests' conventions: algbw = bytes / time, and busbw = algbw times
2(p-1)/p for allreduce or (p-1)/p for reduce-scatter and all-gather, so busbw is comparable to
the link's peak whatever p is.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from scaletrain.bench_cli import main, positive_int

__all__ = ["Timing", "Comparison", "quantile", "time_fn", "compare", "compare_many", "gbps", "busbw", "BUSBW_FACTOR",
           "format_table", "out_dir", "save_figure", "world_sizes", "main"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `samples`."""
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p20(self) -> float:
        return quantile(self.samples, 0.2)

    @property
    def p80(self) -> float:
        return quantile(self.samples, 0.8)


@dataclass(frozen=True)
class Comparison:
    candidate: Timing
    baseline: Timing

    @property
    def ratios(self) -> tuple[float, ...]:
        """candidate time / baseline time, pair by pair (> 1 means the candidate is slower)."""
        return tuple(c / b for c, b in zip(self.candidate.samples, self.baseline.samples))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def ratio_p20(self) -> float:
        return quantile(self.ratios, 0.2)

    @property
    def ratio_p80(self) -> float:
        return quantile(self.ratios, 0.8)


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of `xs`, linear between order statistics (numpy's default): what p20 and
    p80 mean in every table of the course."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# the GPU spin (torch.cuda._sleep, in SM clock cycles: ~2.5 ms at the ~2 GHz of a busy H100/H200)
# queued before the start event when a call's host part is hidden
QUEUE_AHEAD_CYCLES = 5_000_000


class _Clock:
    """perf_counter on CPU; CUDA events with synchronize at the boundaries on a GPU.

    On a GPU the start event is recorded on an idle device, so a call's time holds its host part
    too: Python, argument checks, the launches.  For a kernel of a few microseconds that host part
    is the figure (the first H200 run: a Triton softmax call took 0.145 ms at every N from 512 to
    4096; at N = 512, M = 4096 its 17 MB take 4 µs at the copy's 3.9 TB/s).  `hide_host` queues a spin of the GPU before the start
    event, so the call's host part runs while the GPU is busy and the events hold the kernels' time
    alone, as triton.testing.do_bench gets by queuing reps back to back; a host part longer than
    the spin (QUEUE_AHEAD_CYCLES) shows again.  Nothing changes on a CPU."""

    def __init__(self, device: str, group: Any = None, hide_host: bool = False):
        self.cuda = device.startswith("cuda")
        self.group = group
        self.hide_host = hide_host and self.cuda
        self._flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if self.cuda else None

    def __call__(self, fn: Callable[..., Any], args: tuple) -> float:
        if self.cuda:
            self._flush.zero_()  # evict L2 (50-60 MB on H100) so every rep reads from DRAM
            torch.cuda.synchronize()
        if self.group is not None:
            torch.distributed.barrier(group=self.group)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if self.hide_host:
                torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t0


def _slowest_rank(samples: list[float], group: Any) -> list[float]:
    if group is None:
        return samples
    t = torch.tensor(samples, dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)
    return t.tolist()


def time_fn(fn: Callable[..., Any], *, setup: Callable[[], tuple] | None = None, warmup: int = 3,
            reps: int = 10, device: str = "cpu", group: Any = None, hide_host: bool = False) -> Timing:
    """Time `fn(*setup())`; `group` (a process group) makes every rank call it in lockstep."""
    return compare(fn, None, setup=setup, warmup=warmup, reps=reps, device=device, group=group,
                   hide_host=hide_host).candidate


def compare(candidate: Callable[..., Any], baseline: Callable[..., Any] | None, *,
            setup: Callable[[], tuple] | None = None, warmup: int = 3, reps: int = 10,
            device: str = "cpu", group: Any = None, hide_host: bool = False) -> Comparison:
    """Time candidate and baseline alternately (who goes first alternates too) on fresh inputs.

    `setup()` returns the argument tuple; it is called before every timed call and is not timed.
    With `group`, all ranks must call `compare` together; times are the slowest rank's.
    `hide_host`: on a GPU, the kernels' time without the call's host part (_Clock).
    """
    clock = _Clock(device, group, hide_host)
    fns = [candidate] if baseline is None else [candidate, baseline]
    make = setup or (lambda: ())
    for _ in range(warmup):
        for f in fns:
            f(*make())
    times: list[list[float]] = [[] for _ in fns]
    for rep in range(reps):
        order = range(len(fns)) if rep % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            times[i].append(clock(fns[i], make()))
    timings = [Timing(tuple(_slowest_rank(t, group))) for t in times]
    return Comparison(timings[0], timings[-1])


def compare_many(candidates: dict[str, Callable[..., Any]], baseline: str, *,
                 setup: Callable[[], tuple] | None = None, warmup: int = 3, reps: int = 10,
                 device: str = "cpu", group: Any = None, hide_host: bool = False) -> dict[str, Comparison]:
    """Time every function of `candidates` round-robin (one call of each per rep, the order
    rotating from rep to rep) and compare each with the one named `baseline`, which is one of them.

    Every row of a table built from the result uses the *same* baseline measurement, and the
    baseline's own row reads exactly 1.00 (its samples divided by themselves). With `group`, all ranks
    call it together; times are the slowest rank's. `hide_host`: as in `compare`.
    """
    if baseline not in candidates:
        raise ValueError(f"baseline {baseline!r} is not among the candidates {list(candidates)}")
    clock = _Clock(device, group, hide_host)
    names = list(candidates)
    make = setup or (lambda: ())
    for _ in range(warmup):
        for name in names:
            candidates[name](*make())
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        order = names[shift:] + names[:shift]
        for name in (order if rep % 2 == 0 else order[::-1]):
            times[name].append(clock(candidates[name], make()))
    timings = {name: Timing(tuple(_slowest_rank(t, group))) for name, t in times.items()}
    return {name: Comparison(timings[name], timings[baseline]) for name in names}


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
}


def busbw(algbw: float, world_size: int, collective: str = "allreduce") -> float:
    """Bus bandwidth: algbw scaled so that a bandwidth-optimal algorithm reads the link speed."""
    if collective not in BUSBW_FACTOR:
        raise ValueError(f"busbw: unknown collective {collective!r}; choose from {sorted(BUSBW_FACTOR)}")
    return algbw * BUSBW_FACTOR[collective](world_size)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text table; floats printed with 3 significant digits."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def out_dir() -> Path:
    """Where benchmarks write plots and CSVs: $SCALETRAIN_BENCH_OUT or ./bench_out."""
    path = Path(os.environ.get("SCALETRAIN_BENCH_OUT", "bench_out"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: Any, name: str, dpi: int = 120) -> Path | None:
    """Write `fig` to out_dir()/name in the primary process only (rank 0 under torchrun) and
    close it; the path, or None where nothing was written."""
    import matplotlib.pyplot as plt
    from scaletrain.launch import is_primary

    path = out_dir() / name if is_primary() else None
    if path is not None:
        fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def distributed_args(argv: list[str], name: str, doc: str, *, quick_help: str, sizes_help: str,
                     sizes: str, quick_sizes: str, reps: int, quick_reps: int, more=None):
    """The arguments every distributed benchmark takes, parsed: `--quick`, `--world-sizes` (checked by
    `world_sizes`, torchrun's WORLD_SIZE included) and `--reps`, each with its quick default; `more(parser)`
    adds a benchmark's own. Returns (args, world sizes, reps); a bad value is argparse's usage error."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m scaletrain.bench {name}", description=doc.splitlines()[2])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--world-sizes", default=None, help=f"{sizes_help}; under torchrun: its WORLD_SIZE")
    parser.add_argument("--reps", type=positive_int, default=None,
                        help=f"timed reps per variant (default {reps}, quick {quick_reps})")
    if more is not None:
        more(parser)
    args = parser.parse_args(argv)
    try:
        chosen = world_sizes(args.world_sizes, quick_sizes if args.quick else sizes)
    except ValueError as exc:
        parser.error(str(exc))
    return args, chosen, args.reps or (quick_reps if args.quick else reps)


def world_sizes(requested: str | None, default: str, *, multiple_of: int = 1) -> tuple[int, ...]:
    """The world sizes a distributed benchmark runs, from `--world-sizes` ("2,4") or `default`;
    under torchrun the one it started (WORLD_SIZE), which `--world-sizes`, if given, must list.
    ValueError naming the fix for p < 2 or p not dividing what the benchmark needs."""
    from scaletrain.launch import under_torchrun

    try:
        sizes = tuple(int(p) for p in (requested or default).split(","))
    except ValueError:
        raise ValueError(f"--world-sizes: comma-separated integers, e.g. 2,4; got {requested!r}") from None
    if under_torchrun():
        started = int(os.environ["WORLD_SIZE"])
        if requested and started not in sizes:
            raise ValueError(f"torchrun started {started} processes but --world-sizes is {requested}: "
                             f"drop --world-sizes or pass --nproc-per-node={sizes[0]}")
        sizes = (started,)
    bad = [p for p in sizes if p < 2 or p % multiple_of]
    if bad:
        need = f" and a multiple of {multiple_of}" if multiple_of > 1 else ""
        raise ValueError(f"world size {bad[0]} does not fit this benchmark: p must be >= 2{need}")
    return sizes


if __name__ == "__main__":
    sys.exit(main())
