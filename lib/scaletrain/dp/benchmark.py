"""`python -m scaletrain.bench ddp`: step time of data-parallel variants beside torch DDP.

One training step (forward + backward + gradient synchronization, no optimizer) of the tiny GPT
at p = 2 and 4 (gloo, one thread per rank), for:

  naive        one allreduce per parameter after backward          (naive.py)
  buckets      buckets of --cap-mb, all launched after backward    (DataParallel overlap=False)
  overlap      buckets launched by hooks during backward            (DataParallel, gloo allreduce)
  overlap-ring the same with our ring on a communication thread     (DataParallel allreduce="ring")
  torch DDP    DistributedDataParallel with the same bucket cap     (the baseline)

All variants and torch DDP are timed round-robin in the same run, one step of each per rep
(bench.compare_many, slowest rank), and the ratio quoted is the median of per-step ratios to
DDP's step of the same rep: every row divides by the same DDP samples, and DDP's own row reads
1.00. The bucket-cap sweep is a second round-robin, with DDP in it again (one baseline per
table). Beside them: the limits of the α–β picture, T_compute (forward + backward alone) +
T_allreduce (the whole gradient in one allreduce) without overlap, max(T_compute, T_allreduce)
with perfect overlap. Then a sweep of the bucket cap, plotted to bench_out/ddp_bucket_sweep.png:
small buckets pay the per-message latency α many times (seminar notes, "Data parallel", gradient
bucketing; Li et al., 2020, Fig. 2), large ones leave nothing to overlap.

On a CPU machine the "overlapped" allreduce runs on the same cores as backward (gloo threads,
our comm thread): overlap hides waiting for the slowest rank and the network stack, not CPU work,
and p = 4 on fewer than 4 cores is oversubscribed. Quote ratios from one run, not absolute times.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist

from scaletrain import bench
from scaletrain.bench_cli import nonnegative_int, positive_float, positive_int
from scaletrain.dp.data_parallel import DataParallel
from scaletrain.dp.naive import NaiveDataParallel
from scaletrain.launch import spawn
from scaletrain.models import GPT, GPTConfig, make_batch

DISTRIBUTED = True  # spawns ranks: `python -m scaletrain.bench all` runs it under torchrun
CFG = GPTConfig(n_layer=4, n_embd=128, n_head=4, block_size=64)  # 0.83 M parameters, 3.2 MiB
BATCH_PER_RANK = 8
DDP_ROW = "torch DDP"  # the baseline, a row of the table
SWEEP_CAPS_MB = (1e-4, 0.1, 0.3, 1.0, 4.0)  # 52 (one per tensor), 26, 13, 4, 1 buckets


def _step_fn(model):
    x, y = make_batch(CFG, BATCH_PER_RANK, seed=dist.get_rank())

    def step():
        model(x, y)[1].backward()
        if hasattr(model, "finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
        for p in model.parameters():
            p.grad = None
    return step


def _variants(cap_mb: float) -> dict[str, Any]:
    return {
        "naive": lambda: NaiveDataParallel(GPT(CFG), allreduce="torch"),
        "buckets": lambda: DataParallel(GPT(CFG), bucket_cap_mb=cap_mb, allreduce="torch", overlap=False),
        "overlap": lambda: DataParallel(GPT(CFG), bucket_cap_mb=cap_mb, allreduce="torch"),
        "overlap-ring": lambda: DataParallel(GPT(CFG), bucket_cap_mb=cap_mb, allreduce="ring"),
    }


def _limits(reps: int) -> dict[str, float]:
    """T_compute: forward + backward with no communication; T_allreduce: the whole gradient once."""
    model = GPT(CFG)
    t_compute = bench.time_fn(_step_fn(model), reps=reps, group=dist.group.WORLD).median
    flat = torch.randn(sum(p.numel() for p in model.parameters()))
    t_allreduce = bench.time_fn(lambda: dist.all_reduce(flat), reps=reps, group=dist.group.WORLD).median
    return {"compute": t_compute, "allreduce": t_allreduce}


def _rank(rank: int, p: int, cap_mb: float, reps: int, sweep: tuple[float, ...]) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP  # imports torch._dynamo: seconds

    ddp = DDP(GPT(CFG), bucket_cap_mb=cap_mb)
    ddp_step = _step_fn(ddp)
    rows, models = [], []
    variants = {name: make() for name, make in _variants(cap_mb).items()}
    models += variants.values()
    # one round-robin over every variant and DDP: all rows share DDP's samples, DDP's own row is 1.00
    cmps = bench.compare_many({**{n: _step_fn(m) for n, m in variants.items()}, DDP_ROW: ddp_step}, DDP_ROW,
                              reps=reps, group=dist.group.WORLD)
    for name, cmp in cmps.items():
        model = variants.get(name, ddp)
        rows.append({"p": p, "variant": name, "median_ms": cmp.candidate.median * 1e3,
                     "p20_ms": cmp.candidate.p20 * 1e3, "p80_ms": cmp.candidate.p80 * 1e3,
                     "vs_ddp": cmp.ratio, "vs_ddp_p20": cmp.ratio_p20, "vs_ddp_p80": cmp.ratio_p80,
                     "messages": ("-" if name == DDP_ROW else
                                  len(getattr(model, "buckets", None) or list(model.parameters())))})
    sweep_rows = []
    swept = {(cap, kind): DataParallel(GPT(CFG), bucket_cap_mb=cap, allreduce=kind)
             for cap in sweep for kind in ("torch", "ring")}
    models += swept.values()
    if swept:  # the sweep's own round-robin, with DDP in it: one baseline for the whole sweep table
        cmps = bench.compare_many({**{key: _step_fn(m) for key, m in swept.items()}, DDP_ROW: ddp_step}, DDP_ROW,
                                  reps=reps, group=dist.group.WORLD)
        for (cap, kind), model in swept.items():
            cmp = cmps[(cap, kind)]
            sweep_rows.append({"p": p, "cap_mb": cap, "allreduce": kind, "buckets": len(model.buckets),
                               "median_ms": cmp.candidate.median * 1e3, "p20_ms": cmp.candidate.p20 * 1e3,
                               "p80_ms": cmp.candidate.p80 * 1e3, "vs_ddp": cmp.ratio})
    limits = _limits(reps)
    for model in models:
        model.close()
    return {"rows": rows, "sweep": sweep_rows, "limits": limits}


def _plot(results: dict[int, dict], name: str):
    """Step time / torch DDP's (timed round-robin with it, so the machine's drift cancels) vs bucket cap."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for p, res in results.items():
        for kind, style in (("torch", "-o"), ("ring", "--s")):
            pts = [r for r in res["sweep"] if r["allreduce"] == kind]
            ax.plot([r["cap_mb"] for r in pts], [r["vs_ddp"] for r in pts], style,
                    label=f"p={p}, {'gloo' if kind == 'torch' else 'our ring'} allreduce")
            if kind == "torch":
                for r in pts:
                    ax.annotate(f"{r['buckets']}", (r["cap_mb"], r["vs_ddp"]), textcoords="offset points",
                                xytext=(0, 6), fontsize=7, ha="center")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.15, color="0.5", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("bucket cap (MiB); numbers: buckets")
    ax.set_ylabel("step time / torch DDP step time")
    ax.set_title("DataParallel (overlap on) vs bucket cap, tiny GPT, gloo on CPU\n"
                 "small buckets pay the latency α per message; one bucket cannot overlap", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return bench.save_figure(fig, name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench ddp", description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default=None, help="comma-separated, default 2,4 (quick 2); "
                                                             "under torchrun: its WORLD_SIZE")
    parser.add_argument("--cap-mb", type=positive_float, default=1.0, help="bucket cap for the main table (MiB)")
    parser.add_argument("--reps", type=positive_int, default=15)
    parser.add_argument("--sweep-world-size", type=nonnegative_int, default=2,
                        help="p of the bucket-cap sweep (0: none)")
    parser.add_argument("--quick", action="store_true", help="p = 2 only, 5 reps, 3 bucket caps")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps = 5
    try:
        world_sizes = bench.world_sizes(args.world_sizes, "2" if args.quick else "2,4")
    except ValueError as exc:
        parser.error(str(exc))
    caps = SWEEP_CAPS_MB[::2] if args.quick else SWEEP_CAPS_MB
    n_params = sum(p.numel() for p in GPT(CFG).parameters())
    print(f"tiny GPT L={CFG.n_layer} h={CFG.n_embd} s={CFG.block_size}: {n_params / 1e6:.2f} M parameters "
          f"({n_params * 4 / 2**20:.1f} MiB of fp32 gradients), {BATCH_PER_RANK} sequences per rank, "
          f"bucket cap {args.cap_mb} MiB, {args.reps} reps, gloo, 1 thread per rank")
    results = {p: spawn(_rank, p, args.cap_mb, args.reps, caps if p == args.sweep_world_size else (),
                        timeout_s=600)[0] for p in world_sizes}
    rows = [r for res in results.values() for r in res["rows"]]
    print(bench.format_table(rows, ["p", "variant", "messages", "median_ms", "p20_ms", "p80_ms",
                                    "vs_ddp", "vs_ddp_p20", "vs_ddp_p80"]))
    print("\nlimits (alpha-beta picture): no overlap = T_compute + T_allreduce, perfect overlap = max of them")
    print(bench.format_table([{"p": p, "T_compute_ms": r["limits"]["compute"] * 1e3,
                               "T_allreduce_ms": r["limits"]["allreduce"] * 1e3,
                               "no_overlap_ms": sum(r["limits"].values()) * 1e3,
                               "perfect_overlap_ms": max(r["limits"].values()) * 1e3}
                              for p, r in results.items()]))
    swept = {p: r for p, r in results.items() if r["sweep"]}
    if swept:
        print("\nbucket-cap sweep (overlap on), all caps and torch DDP timed round-robin (one DDP baseline)")
        print(bench.format_table([r for res in swept.values() for r in res["sweep"]]))
        print(f"\nplot: {_plot(swept, 'ddp_bucket_sweep.png')}")
    return 0
