"""`python -m scaletrain.bench profile [--quick] [--reps N] [--no-compile] [--device auto|cpu|cuda]`

One training step (forward, backward, AdamW) of the GPT that `python -m scaletrain.profile` profiles,
three ways (variants.py): eager (the baseline), the MLP checkpointed, and torch.compile (inductor; on
a CPU it compiles C++, which takes minutes on a loaded 2-core box: `--no-compile` leaves it out, and
a missing compiler leaves it out with the reason printed).  Timed round-robin in the same run; the
figure to quote is the median of the per-round ratios to eager with p20-p80.  Beside the times: the
bytes autograd keeps after the forward and their peak (on a GPU also the allocator's peak), and the
first step's loss (the variants compute the same step).

On a GPU the shape is GPT-2 small (h = 768, 12 layers, s = 512, b = 8): that path has NOT been run
in this repository's sessions.  Plot: bench_out/profile_variants.png.
"""

from __future__ import annotations

import argparse

import torch

from scaletrain import bench
from scaletrain.models import GPT, make_batch
from scaletrain.profile.shapes import SHAPES, pick_shape, resolve_device
from scaletrain.profile.variants import compare_variants


def plot(rows: list[dict], name: str = "profile_variants.png"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [r["variant"] for r in rows]
    ax_t.bar(names, [r["time / eager"] for r in rows], color="C0",
             yerr=[[r["time / eager"] - float(r["p20-p80"].split("-")[0]) for r in rows],
                   [float(r["p20-p80"].split("-")[1]) - r["time / eager"] for r in rows]], capsize=4)
    ax_t.axhline(1.0, color="k", lw=0.8)
    ax_t.set(ylabel="step time / eager (median of paired ratios, p20-p80)", title="time")
    ax_m.bar(names, [r["saved MB"] for r in rows], color="C1")
    ax_m.set(ylabel="MB kept for the backward after the forward", title="activation memory")
    for ax in (ax_t, ax_m):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return bench.save_figure(fig, name)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaletrain.bench profile", description=__doc__.splitlines()[2])
    parser.add_argument("--quick", action="store_true", help="the tiny GPT, 3 rounds")
    parser.add_argument("--reps", type=int, default=None, help="timed rounds (default 10, quick 3)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out (minutes on a CPU)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    shape = pick_shape(device, quick=args.quick)
    cfg, batch = SHAPES[shape]
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # a second thread on a shared 2-core box only adds noise
    try:
        model = GPT(cfg, seed=0).to(device)
        data = tuple(t.to(device) for t in make_batch(cfg, batch, seed=0))
        rows, skipped = compare_variants(model, data, device=device, rounds=args.reps or (3 if args.quick else 10),
                                         compile=not args.no_compile)
    finally:
        torch.set_num_threads(threads)
    print(f"{device}{' (GPU path: untested in this repository)' if device == 'cuda' else ''}; GPT h={cfg.n_embd} "
          f"L={cfg.n_layer} s={cfg.block_size} b={batch}; one step = forward + backward + AdamW")
    print(bench.format_table(rows))
    if skipped:
        print(f"torch.compile left out: {skipped}")
    print(f"plot: {plot(rows)}")
    return 0
