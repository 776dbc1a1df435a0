"""`python -m scaletrain.plan validate`: every published run of `published_runs.py` beside the planner.

For each run the planner searches the layouts the paper's degrees allow (its t, c, p and d, its
batch, the options its software generation had, `software.SOFTWARE`; what the paper pinned, e.g.
the microbatch, stays pinned), takes the fastest that fits, and compares its iteration time with
the one the published figure implies. The error is predicted throughput / published - 1: positive
when the planner is too optimistic. Rows the efficiency fits saw are marked "fit".

Where it misses, and what was tested. Each hypothesis is a term with a physical reason; one is
kept only if it improves held-out rows without making the fitted ones worse, and the fits never
see the rows they are judged on (Table 1 rows 1-7 and Llama 3's 8,192-GPU row only).

- MT-NLG 530B (Smith et al. 2022): over-predicted by 17-21 %, more as d grows. Its three times
  lie on T = 12.7 s + 0.197 s·m (m = 1920/d microbatches per pipeline), the planner's on 6.7 s +
  0.187 s·m (`pipeline_line`): per microbatch it is 5 % fast, and it lacks ~6 s per iteration,
  a share of T that grows as m falls: the drift with d. Rejected: a GEMM-size or tensor-parallel
  volume term (2·(t-1)/t·b·s·h per allreduce): MT-NLG's layer (t = 8, b = 1, s = 2048, h = 20480)
  is also Table 1's 530B row (-2.3 %) and Korthikanti's (-10.9 %), so a term that lowered MT-NLG
  by 16 % would lower those as much, and it is the same in all three MT-NLG runs, so it cannot
  drift with d (doubling the NVLink allreduce cost and refitting: rows 1-7 rms 3.5 → 5.0 %,
  MT-NLG +25..+30 %); the data-parallel reduction: already after the backward, 0.3 s (in fp32,
  Megatron's main_grad, 0.6 s; refitted, rows 1-7 rms 3.5 → 6.3 % and MT-NLG +24..+28 %);
  DeepSpeed's own schedule (`TrainSchedule`, blocking neighbour exchanges at each of 2·(m+p-1)
  steps): simulated, it has the 1F1B makespan (tests/test_plan_deepspeed_pipeline.py). The 6 s,
  about twice the 1F1B bubble's (p - 1)·(t_f + t_b), has no mechanism in the published record:
  a documented miss.
- Korthikanti et al. 2022's 530B and 1T: under-predicted by 8-11 %, more with scale. They run at
  d = 1, so no data-parallel term can matter; the planner's bubble is 4-6 % of its time, so even
  none would leave -7 % (530B) and -4 % (1T). A GEMM-size slope fitted on rows 1-7 is zero
  (kappa = 0), and Table 1's own 530B and 1T rows (the same layers in 2021) are within 2.4 %.
  Any tensor-parallel term moves small models most (its share of the time goes as t/h): hiding
  the backward's 2 of 6 allreduces per layer behind the weight-gradient GEMMs (Megatron's
  asynchronous TP allreduce) takes the 22B run -1.3 → +4.0 % and the 530B only -10.9 → -9.1 %,
  widening the drift.
  The published baseline says why: at full recomputation the 530B layout runs at 180 TFLOP/s per
  GPU in 2022 and at 163 in Table 1 (2021), the same t, p and m: a faster code base, which the
  data the fit may use does not show. Kept: the A100's memory is 80 GiB (81,920 MiB), not
  80·10⁹ B (`clusters.py`); with it the 1T model under sequence parallelism and selective
  recomputation fits the interleaved schedule (v = 2), -13.2 → -8.9 %.
"""

from __future__ import annotations

import argparse

import numpy as np

from scaletrain.plan.clusters import CLUSTERS
from scaletrain.plan.layouts import candidate_layouts
from scaletrain.plan.prediction import Prediction, predict
from scaletrain.plan.published_runs import PUBLISHED, PublishedConfig
from scaletrain.plan.software import SOFTWARE
from scaletrain.plan.specs import ClusterSpec, Layout
from scaletrain.plan.stages import balanced_stages

__all__ = ["run_space", "best_for_run", "validate_rows", "pipeline_line", "main"]

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
                     "GB/GPU": pred.memory_per_gpu_bytes / 1e9, "m": pred.layout.num_microbatches,
                     "published_s": published_s, "predicted_s": pred.iteration_s})
    return rows


def pipeline_line(rows: list[dict]) -> tuple[tuple[float, float], tuple[float, float]]:
    """Runs of one model and layout at different d: iteration seconds against the microbatches m
    per pipeline, T = fixed + per_microbatch·m, fitted by least squares to the published and to
    the predicted times: ((fixed, per_microbatch) published, (fixed, per_microbatch) predicted).
    With the 1F1B schedule the fixed part is the bubble, (p - 1) microbatches, plus the data-
    parallel reduction and the optimizer."""
    if len({r["m"] for r in rows}) < 2:
        raise ValueError("pipeline_line: needs runs at two or more microbatch counts m")
    m = np.array([r["m"] for r in rows], dtype=float)
    fits = (np.polyfit(m, np.array([r[key] for r in rows]), 1) for key in ("published_s", "predicted_s"))
    return tuple((float(fixed), float(slope)) for slope, fixed in fits)


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
    mt_nlg = [r for r in rows if r["source"] == "S22"]
    if len(mt_nlg) > 1:
        (pub_fixed, pub_m), (pred_fixed, pred_m) = pipeline_line(mt_nlg)
        lines.append(f"S22 as T = fixed + per microbatch·m: published {pub_fixed:.1f} s + {pub_m:.3f} s·m, predicted "
                     f"{pred_fixed:.1f} s + {pred_m:.3f} s·m (the miss that grows with d is the fixed part; "
                     f"the hypotheses tested are in this module's docstring)")
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
