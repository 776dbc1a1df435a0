"""Gantt chart of a pipeline timeline: one row per rank, one bar per action.

Works for a simulated timeline (`simulate(...).spans`, or the `SimResult` itself) and for a
measured one (`PipelineExecutor.timeline` gathered from every rank): both are lists of `Span`.
Colours: F blue, B green, I orange, W purple; with v > 1 chunks, later chunks are lighter.
White gaps are the bubble.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from scaletrain.pipeline.simulate import SimResult, Span, bubble_of

__all__ = ["plot_schedule", "COLORS"]

COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#dd8452", "W": "#8172b3"}


def plot_schedule(timeline, *, ax=None, title: str | None = None, labels: bool = True):
    """Draw `timeline` (a SimResult or Spans) on `ax` (a new figure when None); return the axes.

    Times are shifted so the first action starts at 0. The title defaults to the bubble fraction.
    A bar carries its microbatch number only when it is wide enough to hold it (1.5% of the span),
    so short measured actions are not buried under their neighbours' labels.
    """
    spans: list[Span] = list(timeline.spans if isinstance(timeline, SimResult) else timeline)
    if not spans:
        raise ValueError("plot_schedule: empty timeline")
    ranks = sorted({s.rank for s in spans})
    p = len(ranks)
    t0 = min(s.start for s in spans)
    min_labelled = 0.015 * (max(s.end for s in spans) - t0)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * p + 1.2))
    for s in spans:
        row = ranks.index(s.rank)
        chunk = s.action.stage // p
        color = _lighten(COLORS[s.action.kind], 0.35 * chunk)
        ax.barh(row, s.end - s.start, left=s.start - t0, height=0.8, color=color, edgecolor="white", linewidth=0.5)
        if labels and s.end - s.start >= min_labelled:
            ax.text((s.start + s.end) / 2 - t0, row, str(s.action.microbatch), ha="center", va="center",
                    fontsize=11, color="white", clip_on=True)
    ax.set_yticks(range(p), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()  # rank 0 (first stage) on top, as in the papers' figures
    ax.set_xlabel("time")
    ax.set_title(title if title is not None else f"bubble fraction {bubble_of(spans):.3f}")
    kinds = [k for k in COLORS if any(s.action.kind == k for s in spans)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    ax.legend(handles, kinds, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=11, frameon=False)
    return ax


def _lighten(color: str, amount: float) -> tuple[float, float, float]:
    r, g, b = to_rgb(color)
    amount = min(amount, 0.7)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)
