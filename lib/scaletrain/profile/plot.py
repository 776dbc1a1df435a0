"""The pictures of a profiled step (matplotlib, Agg when no display).

  * stacked bars: one bar per phase (forward, backward, optimizer), stacked by category, ms per
    step: the seeds' "GPT-2 Profiling: Time" chart, on this machine;
  * the roofline (Williams et al. 2009): attainable FLOP/s against intensity on log axes, the two
    measured roofs, and each priced op as a point at (its FLOPs/byte, the FLOP/s it reached), the
    marker's area its share of the step's time.  A point above the memory roof is an op whose
    tensors stayed in cache (the roof is DRAM's, measured by a copy larger than the caches);
  * the memory timeline: bytes of each tensor kind (memory_timeline.py) stacked, mark by mark;
  * time-to-loss curves: validation loss against training seconds, one line per run (time_to_loss.py).
"""

from __future__ import annotations

from scaletrain.profile.categories import CATEGORIES
from scaletrain.profile.memory_timeline import KINDS, Mark
from scaletrain.profile.roofline import Machine
from scaletrain.profile.tables import category_seconds
from scaletrain.profile.time_to_loss import METHODS, Run
from scaletrain.profile.trace import PHASES, StepProfile

__all__ = ["category_bars", "roofline_plot", "memory_timeline_plot", "time_to_loss_plot"]

_COLORS = dict(zip(CATEGORIES, ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "0.6")))


def category_bars(ax, prof: StepProfile, *, title: str = "time by category") -> None:
    secs = category_seconds(prof)
    bottom = [0.0] * len(PHASES)
    for cat in CATEGORIES:
        heights = [secs.get((p, cat), 0.0) * 1e3 for p in PHASES]
        if sum(heights) > 0:
            ax.bar(PHASES, heights, bottom=bottom, color=_COLORS[cat], label=cat)
            bottom = [b + h for b, h in zip(bottom, heights)]
    walls = [prof.phase_seconds[p] / prof.steps * 1e3 for p in PHASES]
    ax.scatter(PHASES, walls, marker="_", s=600, color="k", label="phase wall time", zorder=3)
    ax.set(ylabel="ms per step", title=title)
    ax.legend(fontsize=8)


def roofline_plot(ax, rows: list[dict], machine: Machine, *, title: str = "roofline") -> None:
    """`rows`: tables.op_table's rows on `machine`."""
    intensities = [r["FLOP/B"] for r in rows] + [machine.ridge]
    lo, hi = min(intensities) / 3, max(intensities) * 3
    xs = [lo, machine.ridge, hi]
    ax.plot(xs, [min(machine.peak_flops, x * machine.bandwidth) / 1e9 for x in xs], "k-", lw=1.5,
            label=f"roofline: {machine.peak_flops / 1e9:.0f} GFLOP/s, {machine.bandwidth / 1e9:.0f} GB/s")
    total_ms = sum(r["ms"] for r in rows) or 1.0
    seen = set()
    for r in rows:
        cat = r["category"]
        ax.scatter(r["FLOP/B"], r["GFLOP/s"], s=20 + 400 * r["ms"] / total_ms, color=_COLORS[cat], alpha=0.6,
                   edgecolors="k" if r["phase"] == "backward" else "none",
                   label=cat if cat not in seen else None)
        seen.add(cat)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="GFLOP/s reached",
           title=title + " (edge: backward; area: share of time)")
    ax.legend(fontsize=8)


def memory_timeline_plot(ax, marks: list[Mark], *, title: str = "memory by tensor kind over the step") -> None:
    """Stacked areas of memory_timeline's kinds (MB) at each mark; each mark's label on the x axis."""
    xs = range(len(marks))
    ax.stackplot(xs, *[[m.bytes[k] / 1e6 for m in marks] for k in KINDS], labels=KINDS, alpha=0.8)
    ax.set_xticks(list(xs), [f"{m.step}: {m.phase} {m.label}" for m in marks], rotation=90, fontsize=7)
    ax.set(ylabel="MB", title=title)
    ax.legend(fontsize=8, loc="upper left")


def time_to_loss_plot(ax, runs: list[Run], *, title: str = "time to a validation loss") -> None:
    """Validation loss against training seconds, a colour per method, a line per seed; the target dashed."""
    colors = {m: f"C{i}" for i, m in enumerate(METHODS)}
    for r in runs:
        ax.plot(r.walls, r.losses, color=colors[r.method], lw=1, alpha=0.8,
                label=r.method if r.seed == min(q.seed for q in runs if q.method == r.method) else None)
    ax.axhline(runs[0].target, color="k", ls="--", lw=0.8, label=f"target {runs[0].target}")
    target = runs[0].target  # the first losses (ln V) would flatten the approach to the target: cut them
    ax.set(xlabel="training seconds (evaluations not counted)", ylabel="validation loss (nats/byte)", title=title,
           ylim=(target - 0.2, target + 0.8))
    ax.legend(fontsize=8)
