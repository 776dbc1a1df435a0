"""The efficiency fit: GEMM efficiency coefficients from Narayanan et al. 2021, Table 1, rows 1-7.

What is fitted and how (the presets in `clusters.py` hold its result; tests/test_plan_table1.py
re-runs it and compares):

1. Each published row fixes t, p, n and B. Its measured iteration time follows from its figure:
   T_pub = iteration_flops(B, full recompute) / (TFLOP/s · 10¹² · n).
2. The predicted time is linear in the coefficients θ = (a, kappa) of `GemmEfficiency`: compute
   is FLOPs × (a + kappa·O) / peak with O the layer's roofline overhead, the bubble is a fixed
   multiple of compute plus communication, and communication (α–β on the cluster's links) and
   the optimizer step do not depend on θ. So T_i(θ) = K_i + A_i·θ, with K_i and A_i read off
   `predict` itself at three values of θ (no second copy of the time model).
3. θ minimises Σ_i (T_i(θ)/T_pub_i - 1)², relative errors so that small and large runs weigh
   alike: linear least squares (numpy.linalg.lstsq). A negative coefficient is dropped and the
   rest refitted (a GEMM can't get faster as it shrinks).
4. The microbatch b and interleaving v of each row are not published; the fit starts from b = 1,
   v = 1, lets the planner pick each row's fastest (b, v) that fits under the new θ, and refits,
   until the picks stop changing: the coefficients describe the layouts the planner would run.
   (Should the picks cycle, the round with the smallest residual wins.)

Result on the a100-80gb preset: a ≈ 1.62 (no layer beats 62 % of peak), kappa ≈ 216 FLOP/B,
an effective bandwidth 2P/kappa ≈ 2.9 TB/s, near the A100's 2.0 TB/s HBM plus what its caches
add: the slope is a roofline's, not a free knob. All seven rows within 5 %.

Layouts are Megatron's of 2021: full recomputation, no sequence parallelism, no ZeRO, gradient
allreduce after the backward (overlap_dp=False).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from scaletrain.plan.efficiency import GemmEfficiency
from scaletrain.plan.flops import iteration_flops
from scaletrain.plan.layouts import search
from scaletrain.plan.prediction import Prediction, predict
from scaletrain.plan.published import FIT_ROWS, TABLE1, PublishedRun
from scaletrain.plan.specs import ClusterSpec, Layout

__all__ = ["published_seconds", "best_for_row", "compare_table1", "fit_efficiency", "FitResult"]


def published_seconds(run: PublishedRun) -> float:
    """The iteration time the row's TFLOP/s imply (eq. 3 FLOPs over the measured rate)."""
    return iteration_flops(run.model, run.batch, recompute="full") / (run.tflops_per_gpu * 1e12 * run.gpus)


def best_for_row(run: PublishedRun, cluster: ClusterSpec) -> Prediction:
    """The planner's fastest layout with the row's t, p, n and B (its b and v searched), as
    Megatron ran in 2021: gradient allreduce after the backward, full recomputation."""
    for pred in search(run.model, cluster, run.gpus, run.batch, overlap_dp=False):
        if (pred.layout.tp, pred.layout.pp) == (run.tp, run.pp):
            return pred
    raise ValueError(f"no microbatch fits the {run.params_b:g}B row (t={run.tp}, p={run.pp}) on {cluster.name}")


def compare_table1(cluster: ClusterSpec) -> list[dict]:
    """Table 1 beside the planner: per row the published and predicted TFLOP/s per GPU, the
    relative error, the layout picked, the memory per GPU, and whether the row was fitted."""
    rows = []
    for i, run in enumerate(TABLE1):
        pred = best_for_row(run, cluster)
        rows.append({"model": run.model.name, "t": run.tp, "p": run.pp, "GPUs": run.gpus, "batch": run.batch,
                     "published": run.tflops_per_gpu, "predicted": pred.tflops_per_gpu,
                     "error": pred.tflops_per_gpu / run.tflops_per_gpu - 1, "layout": pred.layout.describe(),
                     "GB/GPU": pred.memory_per_gpu_bytes / 1e9, "fitted": i < FIT_ROWS})
    return rows


def _linear_terms(run, cluster: ClusterSpec, layout: Layout) -> tuple[float, np.ndarray]:
    """(K, A) with predicted seconds = K + A·θ (step 2), read off `predict`."""
    def seconds(a, kappa):
        return predict(run.model, replace(cluster, efficiency=GemmEfficiency(a=a, kappa=kappa)), layout).iteration_s
    t1 = seconds(1.0, 0.0)
    k = 2 * t1 - seconds(2.0, 0.0)
    return k, np.array([t1 - k, seconds(0.0, 1.0) - k])


def _least_squares(k: np.ndarray, a: np.ndarray, t_pub: np.ndarray) -> np.ndarray:
    """Step 3: min Σ((K + A·θ)/T_pub - 1)² over θ >= 0 (a negative coefficient is dropped)."""
    design, rhs = a / t_pub[:, None], 1.0 - k / t_pub
    active = list(range(design.shape[1]))
    while True:
        theta = np.zeros(design.shape[1])
        theta[active] = np.linalg.lstsq(design[:, active], rhs, rcond=None)[0]
        if (theta[active] >= 0).all():
            return theta
        active.remove(active[int(np.argmin(theta[active]))])


@dataclass(frozen=True)
class FitResult:
    """The fitted efficiency, the (b, v) layout picked per row, the rms relative error of the
    rows' times, and how many refits it took."""
    efficiency: GemmEfficiency
    layouts: tuple[Layout, ...]
    rms: float
    rounds: int


def fit_efficiency(cluster: ClusterSpec, runs=TABLE1[:FIT_ROWS], max_rounds: int = 20) -> FitResult:
    """Steps 1-4 on `runs` (Table 1's first seven rows by default; never the held-out ones)."""
    runs = tuple(runs)
    if not runs or any(run not in TABLE1[:FIT_ROWS] for run in runs):
        raise ValueError(f"fit_efficiency: fit on (some of) the first {FIT_ROWS} rows of Table 1 only; "
                         f"the others are held out")
    t_pub = np.array([published_seconds(run) for run in runs])
    layouts = tuple(Layout(tp=r.tp, pp=r.pp, dp=r.dp, microbatch=1, global_batch=r.batch, recompute="full",
                           overlap_dp=False) for r in runs)
    history: list[FitResult] = []
    for rounds in range(1, max_rounds + 1):
        terms = [_linear_terms(run, cluster, lay) for run, lay in zip(runs, layouts)]
        k, a = np.array([t[0] for t in terms]), np.array([t[1] for t in terms])
        theta = _least_squares(k, a, t_pub)
        rms = float(np.sqrt(np.mean(((k + a @ theta) / t_pub - 1) ** 2)))
        result = FitResult(GemmEfficiency(a=float(theta[0]), kappa=float(theta[1])), layouts, rms, rounds)
        fitted = replace(cluster, efficiency=result.efficiency)
        picked = tuple(best_for_row(run, fitted).layout for run in runs)
        if picked == layouts:
            return result
        if any(picked == h.layouts for h in history):  # a cycle: keep its best round
            return min([*history, result], key=lambda r: r.rms)
        history.append(result)
        layouts = picked
    raise RuntimeError(f"fit_efficiency: the microbatch picks did not settle in {max_rounds} rounds")


def fit_a(cluster: ClusterSpec, runs, max_rounds: int = 10) -> GemmEfficiency:
    """`a` alone, kappa kept from the cluster's preset, on published runs of `published_runs.py`
    (the H100's: Llama 3 405B on 8,192 GPUs). Least squares of the relative time errors; each run's
    layout is the planner's pick for it (`validate.best_for_run`), refitted until the picks settle."""
    from scaletrain.plan.validate import best_for_run

    runs = tuple(runs)
    if not runs or not all(run.fitted for run in runs):
        raise ValueError("fit_a: fit only on runs marked fitted in published_runs.py; the others are held out")
    eff, picked = cluster.efficiency, None
    for _ in range(max_rounds):
        layouts = tuple(best_for_run(run, replace(cluster, efficiency=eff)).layout for run in runs)
        if layouts == picked:
            return eff
        picked, num, den = layouts, 0.0, 0.0
        for run, layout in zip(runs, layouts):
            def seconds(a):
                return predict(run.model, replace(cluster, efficiency=replace(eff, a=a)), layout).iteration_s
            slope = seconds(2.0) - seconds(1.0)
            k, t_pub = seconds(1.0) - slope, run.published_seconds(layout.recompute)
            num, den = num + slope / t_pub * (1 - k / t_pub), den + (slope / t_pub) ** 2
        eff = replace(eff, a=num / den)
    raise RuntimeError(f"fit_a: the layout picks did not settle in {max_rounds} rounds")
