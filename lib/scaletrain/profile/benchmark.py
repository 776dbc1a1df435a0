"""`python -m scaletrain.bench profile [--part all|variants|speedups] [--quick] [--full] [--seeds N] ...`

One training step of the GPT that `python -m scaletrain.profile` profiles four ways, then time to a loss.
Variants (variants.py; forward, backward, AdamW): eager (the baseline), the MLP checkpointed,
torch.compile (inductor; on a CPU it compiles C++, which takes minutes on a loaded 2-core box:
`--no-compile` leaves it out, and a missing compiler leaves it out with the reason printed), and the
course's fused kernels (fused.py; a GPU only: on a CPU they exist only through the Triton interpreter,
so that row is left out with the reason printed).  Timed round-robin in the same run; the figure to
quote is the median of the per-round ratios to eager with p20-p80.  Beside the times: the bytes
autograd keeps after the forward and their peak (on a GPU also the allocator's peak), and the first
step's loss (the variants compute the same step).

Speedups (time_to_loss.py, on the CPU): progressive layer dropping and the sequence-length
curriculum against the baseline, steps and training seconds to a fixed validation loss on the
course's corpus, mean ± sd over seeds, and each seed's wall-time ratio to its own baseline run
(mean, min-max).  The default setup runs in about half a minute; `--full` is the larger one.

On a GPU the variants' shape is GPT-2 small (h = 768, 12 layers, s = 512, b = 8): that path has NOT
been run in this repository's sessions.  Also: [--reps N] [--no-compile] [--device auto|cpu|cuda].
Plots: bench_out/profile_variants.png,
bench_out/profile_time_to_loss.png.
"""

from __future__ import annotations

import argparse

import torch

from scaletrain import bench
from scaletrain.bench_cli import positive_int
from scaletrain.models import GPT, make_batch
from scaletrain.profile.plot import time_to_loss_plot
from scaletrain.profile.shapes import SHAPES, device_arg, device_note, pick_shape, resolve_device
from scaletrain.profile.time_to_loss import FULL, QUICK, measure, summary
from scaletrain.profile.variants import compare_variants


def plot(rows: list[dict], name: str = "profile_variants.png"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [r["variant"] for r in rows]
    # the band is the table's, rounded to 2 decimals: a median within 0.005 of an end can fall just
    # outside it (0.977 in "0.98-0.98", H200), and matplotlib refuses a negative error bar
    band = [[float(end) for end in r["p20-p80"].split("-")] for r in rows]
    ax_t.bar(names, [r["time / eager"] for r in rows], color="C0",
             yerr=[[max(0.0, r["time / eager"] - lo) for r, (lo, _) in zip(rows, band)],
                   [max(0.0, hi - r["time / eager"]) for r, (_, hi) in zip(rows, band)]], capsize=4)
    ax_t.axhline(1.0, color="k", lw=0.8)
    ax_t.set(ylabel="step time / eager (median of paired ratios, p20-p80)", title="time")
    ax_m.bar(names, [r["saved MB"] for r in rows], color="C1")
    ax_m.set(ylabel="MB kept for the backward after the forward", title="activation memory")
    for ax in (ax_t, ax_m):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return bench.save_figure(fig, name)


def _variants(args) -> None:
    device = resolve_device(args.device)
    cfg, batch = SHAPES[pick_shape(device, quick=args.quick)]
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # a second thread on a shared 2-core box only adds noise
    try:
        model = GPT(cfg, seed=0).to(device)
        data = tuple(t.to(device) for t in make_batch(cfg, batch, seed=0))
        rows, left_out = compare_variants(model, data, device=device, rounds=args.reps or (3 if args.quick else 10),
                                          compile=not args.no_compile)
    finally:
        torch.set_num_threads(threads)
    print(f"{device_note(device)}; GPT h={cfg.n_embd} "
          f"L={cfg.n_layer} s={cfg.block_size} b={batch}; one step = forward + backward + AdamW")
    print(bench.format_table(rows))
    for name, why in left_out.items():
        print(f"{name} left out: {why}")
    print(f"plot: {plot(rows)}")


def _speedups(args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setup = FULL if args.full else QUICK
    runs = measure(setup, seeds=args.seeds or (2 if args.quick else 3))
    cfg = setup.cfg
    print(f"\ntime to validation loss {setup.target} (cpu, one thread; GPT h={cfg.n_embd} L={cfg.n_layer} "
          f"s={cfg.block_size} b={setup.batch}, at most {setup.max_steps} steps, evaluated every {setup.eval_every})")
    print(bench.format_table(summary(runs)))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    time_to_loss_plot(ax, runs)
    fig.tight_layout()
    print(f"plot: {bench.save_figure(fig, 'profile_time_to_loss.png')}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench profile", description=__doc__.splitlines()[2])
    parser.add_argument("--part", default="all", choices=("all", "variants", "speedups"))
    parser.add_argument("--quick", action="store_true", help="the tiny GPT, 3 rounds; 2 seeds of time to loss")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed rounds (default 10, quick 3)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (minutes on a CPU)")
    parser.add_argument("--device", type=device_arg, default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--full", action="store_true", help="time to loss on the larger setup (time_to_loss.FULL)")
    parser.add_argument("--seeds", type=positive_int, default=None, help="time-to-loss seeds (default 3, quick 2)")
    args = parser.parse_args(argv)
    if args.part in ("all", "variants"):
        _variants(args)
    if args.part in ("all", "speedups"):
        _speedups(args)
    return 0
