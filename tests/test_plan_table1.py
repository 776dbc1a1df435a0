"""The planner against a table nobody here wrote: Narayanan et al. 2021, Table 1 (A100 80GB).

For each row the planner searches the microbatch and interleaving for the row's t, p, GPUs and
batch (`calibrate.best_for_row`), predicts TFLOP/s per GPU by eq. (3), and must land within ±7 %
of the published figure on the seven rows its efficiency was fitted on. The three larger rows
and the 175B run of §5.1 were never fitted: they check the planner beyond its data.
"""

import functools

import pytest

from scaletrain.plan import CLUSTERS, TABLE1, Layout, predict
from scaletrain.plan.calibrate import best_for_row, compare_table1, fit_efficiency
from scaletrain.plan.clusters import A100_EFFICIENCY
from scaletrain.plan.published import FIT_ROWS, GPT3_175B, GPT3_175B_1024
from scaletrain.plan.layouts import search

A100 = CLUSTERS["a100-80gb"]
FITTED, HELD_OUT = TABLE1[:FIT_ROWS], TABLE1[FIT_ROWS:]


@functools.cache
def _best(run):
    return best_for_row(run, A100)


@pytest.mark.parametrize("run", FITTED, ids=lambda r: f"{r.params_b:g}B")
def test_table1_reproduced_within_7_percent(run):
    pred = _best(run)
    assert pred.tflops_per_gpu == pytest.approx(run.tflops_per_gpu, rel=0.07), pred.layout.describe()


@pytest.mark.parametrize("run", TABLE1, ids=lambda r: f"{r.params_b:g}B")
def test_every_published_configuration_fits_in_80gb(run):
    assert _best(run).memory_per_gpu_bytes < 80e9
    # and so does the leanest way to run it (b = 1, no interleaving): the paper did run them
    lean = Layout(tp=run.tp, pp=run.pp, dp=run.dp, microbatch=1, global_batch=run.batch, overlap_dp=False)
    assert predict(run.model, A100, lean).memory_per_gpu_bytes < 80e9


def test_held_out_rows_beat_a_constant_guess():
    """The fitted rows' mean is the best constant; the planner must explain the trend past it."""
    constant = sum(r.tflops_per_gpu for r in FITTED) / len(FITTED)
    for run in HELD_OUT:
        err = abs(_best(run).tflops_per_gpu / run.tflops_per_gpu - 1)
        assert err < 0.12, f"{run.params_b}B: {err:.1%}"
        assert err < abs(constant / run.tflops_per_gpu - 1)


def test_gpt3_175b_on_1024_gpus_as_in_section_5_1():
    """§5.1 gives no layout; the planner's free pick (t = 4) beats the paper's figure by 14 %
    (`plan validate` lists it): within 15 %, and above, as a free search over a model should be."""
    best = search(GPT3_175B, A100, GPT3_175B_1024["gpus"], GPT3_175B_1024["batch"], overlap_dp=False)[0]
    assert 1.0 < best.tflops_per_gpu / GPT3_175B_1024["tflops_per_gpu"] < 1.15


def test_comparison_table_rows():
    rows = compare_table1(A100)
    assert [r["published"] for r in rows] == [run.tflops_per_gpu for run in TABLE1]
    assert sum(r["fitted"] for r in rows) == FIT_ROWS


def test_the_fit_reproduces_the_preset_and_sees_only_rows_1_to_7():
    fit = fit_efficiency(A100)
    assert fit.efficiency.a == pytest.approx(A100_EFFICIENCY.a, rel=1e-3)
    assert fit.efficiency.kappa == pytest.approx(A100_EFFICIENCY.kappa, rel=1e-3)
    assert fit.rms < 0.04
    # with the element-wise traffic counted at the HBM's bandwidth, no GEMM-shape slope is left to fit
    assert fit.efficiency.kappa == 0 and 1.2 < fit.efficiency.a < 2.0
    with pytest.raises(ValueError, match="held out"):
        fit_efficiency(A100, runs=TABLE1)
