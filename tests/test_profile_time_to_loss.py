"""Time to a validation loss (issue 35 item 3): each speedup reduces to the baseline's very run at its
degenerate setting (θ̄ = 1 keeps every layer unscaled; a curriculum starting at the full length never
cuts), a run stops at the first evaluation at or below the target, and the summary's means, spreads
and paired ratios against hand-computed values."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from scaletrain.models import GPTConfig
from scaletrain.profile.time_to_loss import BASELINE, Run, Setup, summary, train_to_loss

TINY = Setup(cfg=GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=16), batch=4, target=0.0, max_steps=12,
             eval_every=4, val_windows=4, curriculum_steps=8)


def test_each_speedup_at_its_degenerate_setting_is_the_baseline_run():
    base = train_to_loss(BASELINE, TINY, seed=3)
    assert base.steps == (0, 4, 8, 12) and base.reached is None and base.walls == tuple(sorted(base.walls))
    no_drop = train_to_loss("pld", dataclasses.replace(TINY, theta_bar=1.0), seed=3)
    no_cut = train_to_loss("curriculum", dataclasses.replace(TINY, curriculum_start=16), seed=3)
    assert no_drop.losses == base.losses and no_cut.losses == base.losses
    dropping = train_to_loss("pld", dataclasses.replace(TINY, gamma=1.0), seed=3)
    cutting = train_to_loss("curriculum", TINY, seed=3)
    assert dropping.losses[0] == base.losses[0] and dropping.losses[1:] != base.losses[1:]
    assert cutting.losses[0] == base.losses[0] and cutting.losses[1:] != base.losses[1:]


def test_a_run_stops_at_the_first_evaluation_at_or_below_the_target():
    curve = train_to_loss(BASELINE, TINY, seed=0).losses
    target = curve[2]  # reached at the third evaluation, step 8, unless an earlier one is as low
    run = train_to_loss(BASELINE, dataclasses.replace(TINY, target=target), seed=0)
    first = next(i for i, v in enumerate(curve) if v <= target)
    assert run.losses == curve[:first + 1] and run.steps_to_target == 4 * first
    assert run.wall_to_target == run.walls[-1] > 0


def test_summary_means_spreads_and_paired_ratios():
    def run(method, seed, wall, steps):
        return Run(method, seed, 1.0, (0, steps), (0.0, wall), (2.0, 1.0 if wall else 2.0))
    runs = [run(BASELINE, 0, 2.0, 10), run("pld", 0, 1.0, 20), run(BASELINE, 1, 4.0, 30), run("pld", 1, 6.0, 40),
            run("curriculum", 0, 0.0, 50)]  # the curriculum never reached the target
    rows = {r["method"]: r for r in summary(runs)}
    assert rows[BASELINE]["reached"] == "2/2" and rows[BASELINE]["wall / baseline"] == "1.00"
    assert rows[BASELINE]["steps"] == f"20 ± {statistics.stdev([10, 30]):.2g}"
    assert rows["pld"]["wall s"] == f"3.5 ± {statistics.stdev([1.0, 6.0]):.2g}"
    assert rows["pld"]["wall / baseline"] == "1.00" and rows["pld"]["min-max"] == "0.50-1.50"  # 1/2 and 6/4
    assert rows["curriculum"]["reached"] == "0/1" and rows["curriculum"]["steps"] == "-"


def test_an_unknown_method_names_the_choices():
    with pytest.raises(ValueError, match="baseline, pld, curriculum"):
        train_to_loss("dropout", TINY)
