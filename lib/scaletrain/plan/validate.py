"""`python -m scaletrain.plan validate`: every published run of `published_runs.py` beside the planner.

For each run the planner searches the layouts the paper's degrees allow (its t, c, p and d, its
batch, the options its software generation had, `software.SOFTWARE`; what the paper pinned, e.g.
the microbatch, stays pinned), takes the fastest that fits, and compares its iteration time with
the one the published figure implies. The error is predicted throughput / published - 1: positive
when the planner is too optimistic. Rows the efficiency fits saw are marked "fit".
"""

from __future__ import annotations

import argparse

from scaletrain.plan.clusters import CLUSTERS
from scaletrain.plan.layouts import candidate_layouts
from scaletrain.plan.prediction import Prediction, predict
from scaletrain.plan.published_runs import PUBLISHED, PublishedConfig
from scaletrain.plan.software import SOFTWARE
from scaletrain.plan.specs import ClusterSpec, Layout
from scaletrain.plan.stages import balanced_stages

__all__ = ["run_space", "best_for_run", "validate_rows", "main"]

_PINNED_SPACE = {"recompute": "recompute", "sequence_parallel": "sequence_parallel", "zero": "zero",
                 "microbatch": "microbatches", "interleave": "interleaves"}


def run_space(run: PublishedConfig) -> dict:
    """candidate_layouts' options for the run: its generation's, narrowed by what it pinned."""
    space = SOFTWARE[run.software].space(cps=(run.cp,))
    space["uneven_stages"] = run.stages == "balanced"
    for key, value in run.pinned.items():
        space[_PINNED_SPACE[key]] = (value,)
    return space


def _matches(run: PublishedConfig, layout: Layout) -> bool:
    stages = balanced_stages(run.model.layers, layout.pp) if run.stages == "balanced" else None
    return ((run.tp is None or layout.tp == run.tp) and (run.pp is None or layout.pp == run.pp)
            and layout.cp == run.cp and layout.stages == stages)


def best_for_run(run: PublishedConfig, cluster: ClusterSpec | None = None) -> Prediction:
    """The fastest fitting layout of the run's degrees and options (module docstring)."""
    cluster = cluster or CLUSTERS[run.cluster]
    layouts = [lay for lay in candidate_layouts(run.model, cluster, run.gpus, run.batch, **run_space(run))
               if _matches(run, lay)]
    fitting = [p for p in (predict(run.model, cluster, lay) for lay in layouts) if p.fits]
    if not fitting:
        raise ValueError(f"{run.label}: none of the {len(layouts)} layouts of t={run.tp} c={run.cp} p={run.pp} fits "
                         f"on {cluster.name}")
    return min(fitting, key=lambda p: (p.iteration_s, p.memory_per_gpu_bytes))


def validate_rows(runs=PUBLISHED) -> list[dict]:
    """One row per run: source, model, layout, GPUs, published figure, predicted, error, fitted."""
    rows = []
    for run in runs:
        pred = best_for_run(run)
        published_s = run.published_seconds(pred.layout.recompute)
        predicted = pred.iteration_s if run.kind == "iteration_s" else run.value * published_s / pred.iteration_s
        unit = {"iteration_s": "s/iter", "hw_tflops": "TFLOP/s hw", "model_tflops": "TFLOP/s model"}[run.kind]
        rows.append({"source": run.source, "model": run.model.name, "cluster": run.cluster, "GPUs": run.gpus,
                     "layout": pred.layout.describe(), "published": run.value, "predicted": predicted, "unit": unit,
                     "error": published_s / pred.iteration_s - 1, "fitted": run.fitted,
                     "GB/GPU": pred.memory_per_gpu_bytes / 1e9})
    return rows


def _format(rows: list[dict]) -> str:
    lines = [f"{'source':<16} {'model':<18} {'GPUs':>6} {'layout':<58} {'published':>10} {'predicted':>10} "
             f"{'unit':<14} {'error':>7}  fit"]
    for r in rows:
        lines.append(f"{r['source']:<16} {r['model']:<18} {r['GPUs']:>6} {r['layout']:<58} {r['published']:>10.2f} "
                     f"{r['predicted']:>10.2f} {r['unit']:<14} {r['error']:>+7.1%}  {'fit' if r['fitted'] else ''}")
    held = [abs(r["error"]) for r in rows if not r["fitted"]]
    lines.append(f"\n{len(rows)} runs, {len(rows) - len(held)} fitted; held out: mean |error| "
                 f"{sum(held) / len(held):.1%}, max {max(held):.1%}, {sum(e <= 0.10 for e in held)}/{len(held)} "
                 f"within 10 %")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scaletrain.plan validate", description=__doc__.split("\n")[0])
    ap.add_argument("--source", help="only runs whose source starts with this (e.g. D24, K22)")
    args = ap.parse_args(argv)
    runs = [r for r in PUBLISHED if not args.source or r.source.startswith(args.source)]
    if not runs:
        ap.error(f"no run from {args.source!r}; sources: {sorted({r.source.split()[0] for r in PUBLISHED})}")
    print(_format(validate_rows(runs)))
    return 0
