"""`python -m scaletrain.bench allreduce [--quick] [--world-sizes 2,3,4] [--reps N] [--latency]`

Our ring allreduce vs `dist.all_reduce` (gloo on CPU, NCCL on GPU) vs the textbook ring (naive.py:
one blocking exchange per step, fresh buffers) vs the naive reduce+broadcast,
for float32 messages from 4 KiB to 64 MiB on p ranks; and our ring reduce-scatter vs the backend's
`reduce_scatter_single` (gloo emulates it with a full allreduce: measured with torch 2.13, a plain
Python ring reduce-scatter beat it 4.2x at p = 2 and 2.5x at p = 4, 8M floats). The three allreduces
and the backend's are timed round-robin on fresh inputs, slowest rank per rep (bench.compare_many),
so a row's three ratios divide by one backend measurement; the reduce-scatter is a second pair
timed alternately against its own baseline (bench.compare). ratio = median of per-rep ratios
(> 1: slower than the backend). busbw = algbw · 2(p-1)/p (nccl-tests). "sent/bound" is the
bytes the busiest rank sent (comm_counter) over 2(p-1)·⌈n/p⌉·4, the ring's exact volume. The fitted α–β
model (cost_model.py) gives the "model" column. Plot: bench_out/allreduce_busbw.png.

`--sweep [--impl student|DIR]` is a2 task 2.4's design decision: it times a ring (the reference, or the
student's ring.py) against `dist.all_reduce` for every SEGMENT_BYTES × SENDS_IN_FLIGHT pair
(ring.py's two tuning constants, set in each rank before its calls) at 4 and 16 MiB on 2 ranks (the
grader's CPU speed check: 2 ranks, 16 MiB) and prints the median ratio with its p20–p80 range.

`--latency` times one ring step alone (an exchange of 128 KiB with the neighbours, 400 times per
rank) and prints its median, p90, mean and how many exchanges took over 5x the median: where the
fitted α comes from. On the 2-vCPU development VM most exchanges take 0.13-0.25 ms and 7-13 % of
them stall for about 3 ms (consistent with a vCPU woken from idle), so α is 2-3 times the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.bench_cli import positive_int, positive_ints
from scaletrain.comm import cost_model
from scaletrain.comm.counter import comm_counter
from scaletrain.comm.naive import naive_allreduce, simple_ring_allreduce, tree_allreduce
from scaletrain.comm.ring import ring_allreduce, ring_reduce_scatter, segment_bounds, shard_numel
from scaletrain.comm.tensor_collectives import reduce_scatter_single
from scaletrain.launch import RankError, pick_backend, spawn
from scaletrain.student_code import for_ranks

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
SIZES = tuple(4 << (10 + 2 * k) for k in range(8))  # 4 KiB, 16 KiB, ..., 64 MiB
QUICK_SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
COLUMNS = ["p", "size", "ring ms", "p20", "p80", "backend ms", "ring/backend", "ratio p20-p80",
           "simple/backend", "naive/backend", "rs/backend rs", "ring busbw", "backend busbw", "model ms", "sent/bound"]


# a2 task 2.4's sweep: gloo's own choice (1 MiB, 2 in flight) sits inside the grid
SWEEP_SEGMENTS = (256 << 10, 1 << 20, 4 << 20)
SWEEP_IN_FLIGHT = (1, 2, 4)
SWEEP_SIZES = (4 << 20, 16 << 20)
SWEEP_COLUMNS = ["size", "segment", "segments/chunk", "in flight", "ring ms", "gloo ms", "ring/gloo", "ratio p20-p80"]
SWEEP_REPS = 9


def _device() -> str:
    return f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"


def _measure_rank(rank: int, world_size: int, sizes: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    group, device, rows = dist.group.WORLD, _device(), []
    for nbytes in sizes:
        n = nbytes // 4
        setup = lambda: (torch.ones(n, device=device),)  # noqa: E731 - fresh input every rep
        kw = dict(setup=setup, warmup=2, reps=reps, device=device, group=group)
        # one round-robin: ring/backend, simple/backend and naive/backend of a row share one backend measurement
        cmps = bench.compare_many({"ring": ring_allreduce, "naive": naive_allreduce, "simple": simple_ring_allreduce,
                                   "backend": dist.all_reduce}, "backend", **kw)
        ring, naive, simple = cmps["ring"], cmps["naive"], cmps["simple"]
        out = torch.empty(shard_numel(n, world_size), device=device)
        padded = world_size * out.numel()  # gloo's reduce-scatter takes only p equal shards
        rs = bench.compare(ring_reduce_scatter, lambda x: reduce_scatter_single(out, x),
                           **{**kw, "setup": lambda: (torch.ones(padded, device=device),)})
        sent = {}
        for name, allreduce in (("ring", ring_allreduce), ("tree", tree_allreduce), ("naive", naive_allreduce)):
            with comm_counter() as stats:
                allreduce(torch.ones(n, device=device))
            sent[name] = stats.bytes_sent
        rows.append(dict(p=world_size, nbytes=nbytes, ring=ring, naive=naive, simple=simple, rs=rs, sent=sent))
    return rows


def measure(world_sizes: tuple[int, ...], sizes: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    """One row per (p, size): the Comparisons (slowest rank's times, identical on every rank) and
    `sent`, the bytes the busiest rank sent per algorithm (comm_counter, max over ranks)."""
    rows = []
    for p in world_sizes:
        # the rendezvous of every rank plus 6 timed functions × (reps + warm-up) calls per size
        per_rank = spawn(_measure_rank, p, sizes, reps, timeout_s=120 + 4 * reps * len(sizes))
        for i, row in enumerate(per_rank[0]):
            row["sent"] = {name: max(rank_rows[i]["sent"][name] for rank_rows in per_rank) for name in row["sent"]}
            rows.append(row)
    return rows


def _sweep_rank(rank: int, world_size: int, sizes: tuple[int, ...], segments: tuple[int, ...],
                in_flight: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    # the module ring_allreduce reads SEGMENT_BYTES and SENDS_IN_FLIGHT from at call time: the
    # student's ring.py when $SCALETRAIN_STUDENT_FILES names it (--impl), else the reference
    ring_module = sys.modules[ring_allreduce.__module__]
    chosen = ring_module.SEGMENT_BYTES, ring_module.SENDS_IN_FLIGHT
    device, rows = _device(), []
    try:
        for nbytes in sizes:
            setup = lambda: (torch.ones(nbytes // 4, device=device),)  # noqa: E731 - fresh input every rep
            for segment in segments:
                for k in in_flight:
                    ring_module.SEGMENT_BYTES, ring_module.SENDS_IN_FLIGHT = segment, k
                    cmp = bench.compare(ring_allreduce, dist.all_reduce, setup=setup, warmup=2, reps=reps,
                                        device=device, group=dist.group.WORLD)
                    rows.append(dict(nbytes=nbytes, segment=segment, in_flight=k, cmp=cmp, file=ring_module.__file__))
    finally:
        ring_module.SEGMENT_BYTES, ring_module.SENDS_IN_FLIGHT = chosen
    return rows


def sweep(world_size: int = 2, sizes: tuple[int, ...] = SWEEP_SIZES, segments: tuple[int, ...] = SWEEP_SEGMENTS,
          in_flight: tuple[int, ...] = SWEEP_IN_FLIGHT, reps: int = SWEEP_REPS) -> list[dict[str, Any]]:
    """One row per (size, segment, in flight): `cmp`, the ring vs `dist.all_reduce` Comparison
    (timed alternately on fresh inputs, slowest rank; ratio = median of per-rep ratios), and `file`,
    the ring.py the ranks ran."""
    cells = len(sizes) * len(segments) * len(in_flight)
    rows = spawn(_sweep_rank, world_size, tuple(sizes), tuple(segments), tuple(in_flight), reps,
                 timeout_s=120 + cells * (reps + 2))[0]
    for row in rows:  # with one segment per chunk there is never more than one send in flight
        row["segments_per_chunk"] = len(segment_bounds(shard_numel(row["nbytes"] // 4, world_size), 4, row["segment"]))
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"size": _size(r["nbytes"]), "segment": _size(r["segment"]), "segments/chunk": r["segments_per_chunk"],
             "in flight": r["in_flight"],
             "ring ms": r["cmp"].candidate.median * 1e3, "gloo ms": r["cmp"].baseline.median * 1e3,
             "ring/gloo": r["cmp"].ratio, "ratio p20-p80": f"{r['cmp'].ratio_p20:.2f}-{r['cmp'].ratio_p80:.2f}"}
            for r in rows]


def head_to_head(row: dict[str, Any], a: str, b: str) -> bench.Comparison:
    """Algorithm `a`'s time over `b`'s in one row of `measure` ("ring", "naive", "simple" or
    "backend"), pair by pair: both ran in the same round-robin rep, so a burst of load that slows
    one rep slows both, and the median of these ratios is what holds from run to run on a shared
    machine (notebook 02's claims are stated on it)."""
    timing = lambda name: row["ring"].baseline if name == "backend" else row[name].candidate  # noqa: E731
    return bench.Comparison(timing(a), timing(b))


def table_rows(rows: list[dict[str, Any]], model: cost_model.AlphaBeta) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        p, nbytes, ring = r["p"], r["nbytes"], r["ring"]
        algbw = lambda t: bench.gbps(nbytes, t)  # noqa: E731
        out.append({
            "p": p, "size": _size(nbytes),
            "ring ms": ring.candidate.median * 1e3, "p20": ring.candidate.p20 * 1e3,
            "p80": ring.candidate.p80 * 1e3, "backend ms": ring.baseline.median * 1e3,
            "ring/backend": ring.ratio, "ratio p20-p80": f"{ring.ratio_p20:.2f}-{ring.ratio_p80:.2f}",
            "simple/backend": r["simple"].ratio, "naive/backend": r["naive"].ratio,
            "rs/backend rs": r["rs"].ratio,
            "ring busbw": bench.busbw(algbw(ring.candidate.median), p),
            "backend busbw": bench.busbw(algbw(ring.baseline.median), p),
            "model ms": cost_model.predict(model, "ring", p, nbytes) * 1e3,
            "sent/bound": r["sent"]["ring"] / (2 * (p - 1) * shard_numel(nbytes // 4, p) * 4)})
    return out


def fit_model(rows: list[dict[str, Any]]) -> cost_model.AlphaBeta:
    return cost_model.fit(cost_model.Sample(algorithm="ring", world_size=r["p"], nbytes=r["nbytes"],
                                            seconds=r["ring"].candidate.median) for r in rows)


def plot(rows: list[dict[str, Any]], name: str):
    """busbw vs message size, ours beside the backend's; the path written (None off rank 0)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"font.size": 12, "legend.fontsize": 11}):  # projector-ready
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for i, p in enumerate(sorted({r["p"] for r in rows})):
            mine = [r for r in rows if r["p"] == p]
            x = [r["nbytes"] for r in mine]
            for key, label, style in (("ring", "our ring", "-o"), ("backend", "dist.all_reduce", "--s")):
                t = [r["ring"].candidate if key == "ring" else r["ring"].baseline for r in mine]
                bw = lambda q: [bench.busbw(bench.gbps(n, s), p) for n, s in zip(x, q)]  # noqa: E731
                ax.plot(x, bw([s.median for s in t]), style, color=f"C{i}", label=f"{label}, p={p}")
                ax.fill_between(x, bw([s.p80 for s in t]), bw([s.p20 for s in t]), color=f"C{i}", alpha=0.12)
        ax.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)",
               title="allreduce bus bandwidth (higher is better; bands p20-p80)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.tight_layout()
        return bench.save_figure(fig, name)


def _main_sweep(args, segments: tuple[int, ...], in_flight: tuple[int, ...]) -> int:
    try:  # the ranks import scaletrain.comm.ring from this file (student_code's finder)
        for_ranks("ring", args.impl)
    except (FileNotFoundError, ImportError) as exc:
        raise SystemExit(f"--impl {args.impl}: {exc}")
    try:
        rows = sweep(segments=segments, in_flight=in_flight, reps=args.reps or SWEEP_REPS)
    except RankError as exc:
        print(exc.remote_traceback, file=sys.stderr)
        raise
    reps = args.reps or SWEEP_REPS
    print(f"ring: {rows[0]['file']}; 2 gloo ranks, float32; ring/gloo = median of {reps} paired ratios "
          f"(> 1: slower than gloo); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(bench.format_table(sweep_table(rows), SWEEP_COLUMNS))
    return 0


LATENCY_BYTES, LATENCY_REPS, STALL_FACTOR = 128 << 10, 400, 5


def _latency_rank(rank: int, world_size: int, nbytes: int, reps: int) -> list[float]:
    """Seconds per exchange with the ring neighbours (irecv from the previous rank, isend to the
    next, both waited on), `reps` back to back after a warm-up: one step of our ring, alone."""
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    out, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    times = []
    for rep in range(reps + 10):
        t0 = time.perf_counter()
        recv = dist.irecv(into, src=prev)
        dist.isend(out, dst=nxt).wait()
        recv.wait()
        if rep >= 10:
            times.append(time.perf_counter() - t0)
    return times


def latency_rows(world_sizes: tuple[int, ...], nbytes: int = LATENCY_BYTES, reps: int = LATENCY_REPS) -> list[dict]:
    """Per p: the distribution of one ring step's time (every rank's exchanges pooled). Its median
    is what a message costs; the α that `fit_model` finds is a mean, and on a machine whose idle
    CPUs wake slowly (a VM's vCPUs) a few stalled exchanges set it."""
    return [latency_summary(p, nbytes, [t for rank in spawn(_latency_rank, p, nbytes, reps, timeout_s=120) for t in rank])
            for p in world_sizes]


def latency_summary(p: int, nbytes: int, times: list[float]) -> dict[str, Any]:
    """One row of `latency_rows` from the exchanges' seconds: an exchange over STALL_FACTOR times the
    median counts as stalled."""
    median = statistics.median(times)
    stalled = [t for t in times if t > STALL_FACTOR * median]
    return {"p": p, "size": _size(nbytes), "exchanges": len(times), "median ms": median * 1e3,
            "p90 ms": bench.quantile(times, 0.9) * 1e3, "mean ms": statistics.fmean(times) * 1e3,
            "stalled": f"{len(stalled) / len(times):.0%}", "stalled mean ms": statistics.fmean(stalled or [0.0]) * 1e3}


# the speed target the ring is held to: no slower than the backend's allreduce over this size range
TARGET_SIZES, TARGET_RATIO = (256 << 10, 64 << 20), 1.0


def target_summary(rows: list[dict[str, Any]]) -> str:
    """One line: in how many (p, size) cells inside TARGET_SIZES the ring's median paired ratio to
    the backend is <= TARGET_RATIO, and which cells miss it."""
    cells = [r for r in rows if TARGET_SIZES[0] <= r["nbytes"] <= TARGET_SIZES[1]]
    if not cells:
        return f"target: no size from {_size(TARGET_SIZES[0])} to {_size(TARGET_SIZES[1])} was measured"
    missed = [f"p={r['p']} {_size(r['nbytes'])} {r['ring'].ratio:.2f}" for r in cells if r["ring"].ratio > TARGET_RATIO]
    return (f"target (ring/backend <= {TARGET_RATIO:.2f} from {_size(TARGET_SIZES[0])} to {_size(TARGET_SIZES[1])}): "
            f"met in {len(cells) - len(missed)} of {len(cells)} cells" + (f"; missed: {', '.join(missed)}" if missed else ""))


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench allreduce", description=__doc__.split("\n")[2])
    parser.add_argument("--quick", action="store_true", help="4 sizes, p in {2, 4}, 5 reps")
    parser.add_argument("--world-sizes", default=None, help="comma-separated, default 2,3,4 (quick 2,4); "
                                                             "under torchrun: its WORLD_SIZE")
    parser.add_argument("--reps", type=positive_int, default=None,
                        help="timed reps per pair (default 10, quick 5, sweep 9)")
    parser.add_argument("--sweep", action="store_true", help="a2 task 2.4: ring/gloo for every SEGMENT_BYTES x "
                                                            "SENDS_IN_FLIGHT at 4 and 16 MiB on 2 ranks")
    parser.add_argument("--latency", action="store_true", help=f"the time of one ring step alone ({LATENCY_REPS} "
                        f"exchanges of {LATENCY_BYTES >> 10} KiB with the neighbours): median, tail and stalls")
    parser.add_argument("--impl", default="reference", help="with --sweep: whose ring.py, 'reference', 'student' "
                                                            "(assignments/a2_collectives/) or a submission folder")
    parser.add_argument("--segments-kib", type=positive_ints, default=",".join(str(s >> 10) for s in SWEEP_SEGMENTS),
                        help="with --sweep: SEGMENT_BYTES to try, in KiB, comma-separated")
    parser.add_argument("--in-flight", type=positive_ints, default=",".join(map(str, SWEEP_IN_FLIGHT)),
                        help="with --sweep: SENDS_IN_FLIGHT to try, comma-separated")
    args = parser.parse_args(argv)
    if args.impl != "reference" and not args.sweep:
        parser.error("--impl goes with --sweep")
    if args.sweep:
        return _main_sweep(args, tuple(kib << 10 for kib in args.segments_kib), args.in_flight)
    try:
        world_sizes = bench.world_sizes(args.world_sizes, "2,4" if args.quick else "2,3,4")
    except ValueError as exc:
        parser.error(str(exc))
    if args.latency:
        print(f"one ring step (irecv from the previous rank, isend to the next, both waited) on "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}:")
        print(bench.format_table(latency_rows(world_sizes)))
        return 0
    sizes, reps = (QUICK_SIZES, 5) if args.quick else (SIZES, 10)
    try:
        rows = measure(world_sizes, sizes, args.reps or reps)
    except RankError as exc:  # show where the rank failed, not only that it did
        print(exc.remote_traceback, file=sys.stderr)
        raise
    model = fit_model(rows)
    print(f"backend: {pick_backend('auto', max(world_sizes))}; float32; times are the slowest rank's; "
          f"ratios > 1 mean slower than the backend; a row's allreduce ratios share one backend measurement, "
          f"rs/backend rs has its own (the backend's reduce_scatter_single)")
    print(bench.format_table(table_rows(rows, model), COLUMNS))
    print(target_summary(rows))
    print(f"fitted ring model: alpha = {model.alpha_s * 1e6:.1f} us/message, "
          f"beta = 1/({model.bandwidth_gbps:.2f} GB/s)")
    print(f"plot: {plot(rows, 'allreduce_busbw.png')}")
    return 0
