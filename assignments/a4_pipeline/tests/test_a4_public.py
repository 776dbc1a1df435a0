"""Public tests of a4: the schedules' properties, the closed-form bubbles, one deadlock, one real run.

The grader runs more: hidden (p, m, v), hidden broken schedules, hidden models on 3 ranks. Run one
task with `pytest assignments/a4_pipeline -m task4_1`. The library's `validate` and `simulate`
(`scaletrain.pipeline`) check your generators, so tasks 4.1 and 4.2 do not depend on task 4.3.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as Fn

from autograder.checks import student_module
from scaletrain.launch import spawn
from scaletrain.pipeline import Action, gpipe, one_f_one_b
from scaletrain.pipeline import schedule_rules as rules
from scaletrain.testing import assert_close, expect_equal

sched = student_module("pp_schedules", default=__file__)
val = student_module("pp_validate", default=__file__)


def table(rows, action=Action):
    """{rank: "F0 F1 B0"} -> schedule; "F2@3" names stage 3 (default: the rank's own stage)."""
    out = {}
    for r, text in rows.items():
        out[r] = []
        for tok in text.split():
            body, _, stage = tok.partition("@")
            out[r].append(action(int(stage) if stage else r, body[0], int(body[1:])))
    return out


def as_library(schedule):
    return {r: [Action(a.stage, a.kind, a.microbatch) for a in acts] for r, acts in schedule.items()}


# tasks 4.1 and 4.2 are design decisions: any order with the properties of
# scaletrain.pipeline.schedule_rules is right; each property is one test here and one check in the grader
ONE_F_ONE_B_SIZES = [(3, 4), (2, 2), (3, 7), (4, 8), (5, 5)]
INTERLEAVED_SIZES = [(2, 4, 2), (3, 6, 3), (4, 4, 2)]


def one_f_one_b_cases():
    """(your one_f_one_b(p, m) as library Actions, p, m, the call) for the public sizes."""
    return [(as_library(sched.one_f_one_b(p, m)), p, m, f"one_f_one_b({p}, {m})") for p, m in ONE_F_ONE_B_SIZES]


# one public test per property, as the grader has one check per property
ONE_F_ONE_B_PROPERTIES = {
    "valid": lambda s, p, m, what: rules.check_valid(s, p, m, what=what),
    "bubble_is_gpipes": lambda s, p, m, what: rules.check_bubble(s, (p - 1) / (m + p - 1), what=what),
    "at_most_p_minus_r_in_flight": lambda s, p, m, what: rules.check_peak(s, rules.one_f_one_b_bound(p, m), what=what),
    "warmup": lambda s, p, m, what: rules.check_warmup(s, p, m, what=what),
    "steady_state": lambda s, p, m, what: rules.check_steady(s, what=what),
    "cooldown": lambda s, p, m, what: rules.check_cooldown(s, what=what),
}


@pytest.mark.task4_1
@pytest.mark.parametrize("prop", list(ONE_F_ONE_B_PROPERTIES))
def test_task4_1_one_f_one_b(prop):
    for schedule, p, m, call in one_f_one_b_cases():
        ONE_F_ONE_B_PROPERTIES[prop](schedule, p, m, call)


@pytest.mark.task4_1
def test_task4_1_rejects_m_below_p():
    with pytest.raises(ValueError, match="m >= p"):
        sched.one_f_one_b(4, 3)


def interleaved_cases():
    return [(as_library(sched.interleaved_1f1b(p, m, v)), p, m, v, f"interleaved_1f1b({p}, {m}, {v})")
            for p, m, v in INTERLEAVED_SIZES]


INTERLEAVED_PROPERTIES = {
    "valid": lambda s, p, m, v, what: rules.check_valid(s, p, m, v, what=what),
    "bubble": lambda s, p, m, v, what: rules.check_bubble(s, (p - 1) / (v * m + p - 1), what=what),
    "within_megatrons_bound": lambda s, p, m, v, what: rules.check_peak(s, rules.interleaved_bound(p, m, v),
                                                                        what=what),
}


@pytest.mark.task4_2
@pytest.mark.parametrize("prop", list(INTERLEAVED_PROPERTIES))
def test_task4_2_interleaved(prop):
    for schedule, p, m, v, call in interleaved_cases():
        INTERLEAVED_PROPERTIES[prop](schedule, p, m, v, call)


@pytest.mark.task4_2
def test_task4_2_rejects_m_not_multiple_of_p():
    with pytest.raises(ValueError, match="multiple of p"):
        sched.interleaved_1f1b(3, 4, 2)


@pytest.mark.task4_3
def test_task4_3_accepts_valid_schedules():
    for schedule, p, m in [(gpipe(3, 4), 3, 4), (one_f_one_b(4, 6), 4, 6)]:
        val.validate(table({r: " ".join(f"{a.kind}{a.microbatch}" for a in acts) for r, acts in schedule.items()},
                           val.Action), p, m)


def _public_deadlock():
    # rank 0 waits for B0's gradient before sending F1; rank 1 waits for F1 before running B0
    return table({0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
                 val.Action)


@pytest.mark.task4_3
def test_task4_3_rejects_a_deadlock():
    with pytest.raises(ValueError):
        val.validate(_public_deadlock(), 3, 4)


@pytest.mark.task4_3
def test_task4_3_names_the_lowest_stalled_rank_and_its_action():
    with pytest.raises(ValueError) as err:
        val.validate(_public_deadlock(), 3, 4)
    expect_equal((getattr(err.value, "rank", None), str(getattr(err.value, "action", None))), (0, "B0@s0"),
                 what="validate(1F1B(3, 4) with rank 0's B0 moved before F1): the ScheduleError's (rank, action)")
    for line in ("rank 0 stalls at B0@s0", "rank 1 stalls at F1@s1"):
        assert line in str(err.value), f"the ScheduleError's message lacks {line!r}: {err.value}"


@pytest.mark.task4_3
def test_task4_3_enforces_channel_order():
    # rank 1 asks for microbatch 1 first, but rank 0 sends microbatch 0 first
    broken = table({0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"}, val.Action)
    with pytest.raises(ValueError, match="rank 1 stalls at F1@s1"):
        val.validate(broken, 2, 3)


def _stages(n):
    torch.manual_seed(0)
    widths = [6 + (5 * s) % 4 for s in range(n + 1)]
    return [nn.Sequential(nn.Linear(widths[s], widths[s + 1]), nn.Tanh()) for s in range(n)], widths


def _rank_run(rank, world_size):
    """Per schedule on this rank: the gradient problems and what step() returned."""
    ex_mod = student_module("pp_executor", default=__file__)
    out = {}
    for name, schedule in [("gpipe", gpipe(world_size, 3)), ("1f1b", one_f_one_b(world_size, 3))]:
        stages, widths = _stages(world_size)
        torch.manual_seed(1)
        x, y = torch.randn(6, widths[0]), torch.randn(6, widths[-1])
        reference = nn.Sequential(*copy.deepcopy(stages))
        Fn.mse_loss(reference(x), y).backward()
        with torch.no_grad():
            losses = [Fn.mse_loss(reference(a), b).item() for a, b in zip(x.split(2), y.split(2))]
        try:
            ex = ex_mod.PipelineExecutor({rank: stages[rank]}, schedule=schedule, loss_fn=Fn.mse_loss)
            got = ex.step(x if rank == 0 else None, y if rank == world_size - 1 else None)
        except Exception as exc:  # noqa: BLE001 - each test reports its own failure
            out[name] = {"grads": [f"{name}: rank {rank}: {type(exc).__name__}: {exc}"], "losses": None, "want": losses}
            continue
        problems = [f"{name}: rank {rank}: the gradient of stage {rank}'s parameter {k} differs from the "
                    f"single-process run on the whole batch (or is None)"
                    for k, (q, q_ref) in enumerate(zip(stages[rank].parameters(), reference[rank].parameters()))
                    if q.grad is None or not torch.allclose(q.grad, q_ref.grad, rtol=1e-5, atol=4e-5)]
        out[name] = {"grads": problems, "losses": got, "want": losses}
    return out


@pytest.fixture(scope="module")
def runs():
    """Both runs on 2 ranks, once for the two tests; a rank that dies fails both, with its reason."""
    student_module("pp_executor", default=__file__)
    try:
        return spawn(_rank_run, 2, timeout_s=60)
    except Exception as exc:  # noqa: BLE001 - e.g. a rank's NotImplementedError leaves its peer waiting
        return f"gpipe(2, 3) and one_f_one_b(2, 3) on 2 ranks: {type(exc).__name__}: {exc}"


@pytest.mark.task4_4
def test_task4_4_forward_returns_the_microbatch_losses(runs):
    assert not isinstance(runs, str), runs
    for name in ("gpipe", "1f1b"):
        last = runs[-1][name]
        assert last["losses"] is not None, last["grads"][0] if last["grads"] else f"{name}: step() returned None"
        assert_close(torch.tensor([float(v) for v in last["losses"]]), torch.tensor(last["want"]), rtol=1e-5,
                     what=f"{name}(2, 3): step()'s losses on the last stage, against one process per microbatch")


@pytest.mark.task4_4
def test_task4_4_gradients_match_single_process(runs):
    assert not isinstance(runs, str), runs
    problems = [p for rank in runs for name in ("gpipe", "1f1b") for p in rank[name]["grads"]]
    assert not problems, "\n".join(problems)
