"""`python -m scaletrain.bench allreduce [--quick] [--world-sizes 2,3,4] [--reps N]`

Our ring allreduce vs `dist.all_reduce` (gloo on CPU, NCCL on GPU) vs the textbook ring (naive.py:
one blocking exchange per step, fresh buffers) vs the naive reduce+broadcast,
for float32 messages from 4 KiB to 64 MiB on p ranks; and our ring reduce-scatter vs the backend's
`reduce_scatter_single` (gloo emulates it with a full allreduce, ANCHORS.md). The three allreduces
and the backend's are timed round-robin on fresh inputs, slowest rank per rep (bench.compare_many),
so a row's three ratios divide by one backend measurement; the reduce-scatter is a second pair
timed alternately against its own baseline (bench.compare). ratio = median of per-rep ratios
(> 1: slower than the backend). busbw = algbw · 2(p-1)/p (nccl-tests). "sent/bound" is the
bytes the busiest rank sent (comm_counter) over 2(p-1)·⌈n/p⌉·4, the ring's exact volume. The fitted α–β
model (cost_model.py) gives the "model" column. Plot: bench_out/allreduce_busbw.png.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.comm import cost_model
from scaletrain.comm.counter import comm_counter
from scaletrain.comm.naive import naive_allreduce, simple_ring_allreduce, tree_allreduce
from scaletrain.comm.ring import ring_allreduce, ring_reduce_scatter, shard_numel
from scaletrain.launch import RankError, pick_backend, spawn

SIZES = tuple(4 << (10 + 2 * k) for k in range(8))  # 4 KiB, 16 KiB, ..., 64 MiB
QUICK_SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
COLUMNS = ["p", "size", "ring ms", "p20", "p80", "backend ms", "ring/backend", "ratio p20-p80",
           "simple/backend", "naive/backend", "rs/backend rs", "ring busbw", "backend busbw", "model ms", "sent/bound"]


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
        rs = bench.compare(ring_reduce_scatter, lambda x: dist.reduce_scatter_single(out, x),
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

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, p in enumerate(sorted({r["p"] for r in rows})):
        mine = [r for r in rows if r["p"] == p]
        x = [r["nbytes"] for r in mine]
        for key, label, style in (("ring", "our ring", "-o"), ("backend", "dist.all_reduce", "--s")):
            t = [(r["ring"].candidate if key == "ring" else r["ring"].baseline).median for r in mine]
            ax.plot(x, [bench.busbw(bench.gbps(n, s), p) for n, s in zip(x, t)], style, color=f"C{i}",
                    label=f"{label}, p={p}")
    ax.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)",
           title="allreduce bus bandwidth (higher is better)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return bench.save_figure(fig, name)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench allreduce", description=__doc__.split("\n")[2])
    parser.add_argument("--quick", action="store_true", help="4 sizes, p in {2, 4}, 5 reps")
    parser.add_argument("--world-sizes", default=None, help="comma-separated, default 2,3,4 (quick 2,4); "
                                                             "under torchrun: its WORLD_SIZE")
    parser.add_argument("--reps", type=int, default=None, help="timed reps per pair (default 10, quick 5)")
    args = parser.parse_args(argv)
    try:
        world_sizes = bench.world_sizes(args.world_sizes, "2,4" if args.quick else "2,3,4")
    except ValueError as exc:
        parser.error(str(exc))
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
    print(f"fitted ring model: alpha = {model.alpha_s * 1e6:.1f} us/message, "
          f"beta = 1/({model.bandwidth_gbps:.2f} GB/s)")
    print(f"plot: {plot(rows, 'allreduce_busbw.png')}")
    return 0
