"""The claims notebooks 02-04 make about their live measurements hold twice in a row (issue 18, item 3).

Each test spawns the ranks once and runs the notebook's measuring function twice inside them, on
the notebook's model and at its sizes or a subset of them, then checks every qualitative claim
the notebook's text makes about what it measured, in both runs. The claims are stated on robust
statistics (medians of paired ratios, medians of per-step shares, the median step), so they must
survive the other processes of a loaded 2-core machine; a claim that fails here is a claim the
notebook must not make.
"""

from __future__ import annotations

from statistics import median

import pytest

from scaletrain.comm import cost_model
from scaletrain.comm.benchmark import _measure_rank, head_to_head
from scaletrain.dp.demo import notebook_demo
from scaletrain.launch import spawn
from scaletrain.pipeline import SCHEDULES, costs_from_timeline, simulate
from scaletrain.pipeline.benchmark import measure_timelines

pytestmark = pytest.mark.slow

RUNS = 2
KIB4, MIB16 = 4 << 10, 16 << 20  # notebook 02's smallest and largest messages


def _twice(rank: int, world_size: int, fn, *args):
    return [fn(rank, world_size, *args) for _ in range(RUNS)]


def test_notebook_02_alpha_beta_and_busbw_claims():
    runs = spawn(_twice, 4, _measure_rank, (KIB4, MIB16), 5, timeout_s=240)[0]
    for run, rows in enumerate(runs):
        small, large = rows
        where = f"run {run + 1}"
        # section 4: latency-bound, the naive algorithm's 2 rounds beat the textbook ring's 2(p-1)
        # blocking steps; at 16 MiB the pipelined ring beats the textbook one (naive vs our ring: not claimed)
        assert head_to_head(small, "naive", "simple").ratio < 1, where
        assert head_to_head(large, "simple", "ring").ratio > 1, where
        # section 3: a model fitted on the ring overcharges the naive allreduce of large messages
        model = cost_model.fit(cost_model.Sample(algorithm="ring", world_size=4, nbytes=r["nbytes"],
                                                 seconds=r["ring"].candidate.median) for r in rows)
        assert model.alpha_s > 0 and model.beta_s_per_byte > 0, (where, model)
        assert cost_model.predict(model, "naive", 4, MIB16) > 1.5 * large["naive"].candidate.median, (where, model)


def test_notebook_03_overlap_and_exposure_claims():
    runs = spawn(_twice, 2, _small_demo, timeout_s=240)[0]
    for run, result in enumerate(runs):
        where = f"run {run + 1}"
        for name, trace in result["timelines"].items():
            launches = len(trace.of("launch"))
            # section 2: with overlap every bucket but the last launches before backward ends; without, none
            assert trace.launches_before_last_grad() == (launches - 1 if "overlap" in name else 0), (where, name)
            assert trace.first("finish_end") >= trace.first("backward_end"), (where, name)
        # section 3: the exposed share of the step grows as the tokens per rank shrink
        share = {t: median([e / (b + e) for b, e in zip(*result["exposed"][t])]) for t in result["exposed"]}
        few, many = min(share), max(share)
        assert share[few] > 2 * share[many], (where, share)
        assert result["accumulation"]["max_rel_err"] < 1e-4, where


def _small_demo(rank: int, world_size: int):
    # the notebook's model and bucket cap; its largest and smallest tokens per rank, half its batch
    return notebook_demo(rank, world_size, 0.5, batch=4, shapes=((16, 64), (1, 2)))


def test_notebook_04_measured_vs_simulated_claims():
    """The exact claims hold in every run; the simulated makespan is within 25 % of the measured
    one in every run of one round, up to three rounds: a stall of a few ms from another job on the
    two cores moves a 30 ms step by more than that, and the notebook shows one quiet run."""
    misses = []
    for _ in range(3):
        runs = spawn(_twice, 2, measure_timelines, ("gpipe", "1f1b"), 4, timeout_s=240)
        missed = [miss for run in range(RUNS) for miss in _notebook_04_run(run, [r[run] for r in runs])]
        if not missed:
            return
        misses.append(missed)
    pytest.fail(f"simulated / measured outside 0.75..1.25 in three rounds: {misses}")


def _notebook_04_run(run: int, per_rank: list) -> list:
    """The timing misses of one run (its exact claims asserted here)."""
    where, missed = f"run {run + 1}", []
    for name in ("gpipe", "1f1b"):
        spans = [s for rank in per_rank for s in rank[name]["spans"]]
        measured = max(s.end for s in spans) - min(s.start for s in spans)
        # the drawn step is the median of the timed steps, the same step on both ranks
        assert measured == pytest.approx(median(per_rank[0][name]["makespans"]), rel=1e-6), (where, name)
        # section 7: per-stage means fitted to the step reproduce its makespan
        simulated = simulate(SCHEDULES[name](2, 4), **costs_from_timeline(spans, by="stage")).makespan
        if not 0.75 < simulated / measured < 1.25:
            missed.append((where, name, round(simulated / measured, 3)))
    # section 7 / 5: GPipe's rank 0 holds all m = 4 microbatches, 1F1B's p - r = 2
    gpipe0, one_f0 = per_rank[0]["gpipe"]["peak_bytes"], per_rank[0]["1f1b"]["peak_bytes"]
    assert gpipe0 == 2 * one_f0, (where, gpipe0, one_f0)
    return missed
