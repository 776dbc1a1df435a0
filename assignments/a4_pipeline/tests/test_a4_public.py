"""Public tests of a4: small hand-written tables, the closed-form bubbles, one deadlock, one real run.

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
from scaletrain.pipeline import Action, gpipe, one_f_one_b, simulate, validate
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


def expect_order(got, want, call):
    """Rank by rank, the actions as `F0@s1` strings: the message shows where the order departs."""
    expect_equal(sorted(got), sorted(want), what=f"{call}: ranks")
    for r in want:
        expect_equal([str(a) for a in got[r]], [str(a) for a in want[r]], what=f"{call}, rank {r}")


@pytest.mark.task4_1
def test_task4_1_one_f_one_b_table():
    expect_order(as_library(sched.one_f_one_b(3, 4)), table({
        0: "F0 F1 F2 B0 F3 B1 B2 B3",   # warm-up, steady pairs, cool-down
        1: "F0 F1 B0 F2 B1 F3 B2 B3",
        2: "F0 B0 F1 B1 F2 B2 F3 B3",   # the last stage alternates from the start
    }), "one_f_one_b(3, 4)")


@pytest.mark.task4_1
@pytest.mark.parametrize("p,m", [(2, 2), (3, 7), (4, 8), (5, 5)])
def test_task4_1_bubble_and_in_flight(p, m):
    schedule = as_library(sched.one_f_one_b(p, m))
    validate(schedule, p, m)
    sim = simulate(schedule, t_f=1, t_b=2)
    assert_close(sim.bubble_fraction, (p - 1) / (m + p - 1), rtol=1e-9,
                 what=f"one_f_one_b({p}, {m}): simulated bubble fraction (t_b = 2 t_f), GPipe's (p-1)/(m+p-1)")
    expect_equal(list(sim.peak_in_flight), [p - r for r in range(p)],
                 what=f"one_f_one_b({p}, {m}): peak microbatches in flight per rank (p - r on rank r)")


@pytest.mark.task4_1
def test_task4_1_rejects_m_below_p():
    with pytest.raises(ValueError, match="m >= p"):
        sched.one_f_one_b(4, 3)


@pytest.mark.task4_2
def test_task4_2_interleaved_table():
    # p = 2, v = 2: rank 0 holds stages 0 and 2, rank 1 holds 1 and 3
    expect_order(as_library(sched.interleaved_1f1b(2, 4, 2)), table({
        0: "F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0",
        1: "F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1",
    }), "interleaved_1f1b(2, 4, 2)")


@pytest.mark.task4_2
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (3, 6, 3), (4, 4, 2)])
def test_task4_2_bubble(p, m, v):
    schedule = as_library(sched.interleaved_1f1b(p, m, v))
    validate(schedule, p, m, v)
    assert_close(simulate(schedule).bubble_fraction, (p - 1) / (v * m + p - 1), rtol=1e-9,
                 what=f"interleaved_1f1b({p}, {m}, {v}): simulated bubble fraction, (p-1)/(vm+p-1)")


@pytest.mark.task4_2
def test_task4_2_rejects_m_not_multiple_of_p():
    with pytest.raises(ValueError, match="multiple of p"):
        sched.interleaved_1f1b(3, 4, 2)


@pytest.mark.task4_3
def test_task4_3_accepts_valid_schedules():
    for schedule, p, m in [(gpipe(3, 4), 3, 4), (one_f_one_b(4, 6), 4, 6)]:
        val.validate(table({r: " ".join(f"{a.kind}{a.microbatch}" for a in acts) for r, acts in schedule.items()},
                           val.Action), p, m)


@pytest.mark.task4_3
def test_task4_3_reports_a_deadlock_with_rank_and_action():
    # rank 0 waits for B0's gradient before sending F1; rank 1 waits for F1 before running B0
    broken = table({0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"},
                   val.Action)
    with pytest.raises(ValueError) as err:
        val.validate(broken, 3, 4)
    expect_equal((err.value.rank, str(err.value.action)), (0, "B0@s0"),
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
    ex_mod = student_module("pp_executor", default=__file__)
    problems = []
    for name, schedule in [("gpipe", gpipe(world_size, 3)), ("1f1b", one_f_one_b(world_size, 3))]:
        stages, widths = _stages(world_size)
        torch.manual_seed(1)
        x, y = torch.randn(6, widths[0]), torch.randn(6, widths[-1])
        reference = nn.Sequential(*copy.deepcopy(stages))
        Fn.mse_loss(reference(x), y).backward()
        ex = ex_mod.PipelineExecutor({rank: stages[rank]}, schedule=schedule, loss_fn=Fn.mse_loss)
        ex.step(x if rank == 0 else None, y if rank == world_size - 1 else None)
        for q, q_ref in zip(stages[rank].parameters(), reference[rank].parameters()):
            if q.grad is None or not torch.allclose(q.grad, q_ref.grad, rtol=1e-5, atol=4e-5):
                problems.append(f"{name}: rank {rank} gradient differs from the single-process run")
    return problems


@pytest.mark.task4_4
def test_task4_4_executor_matches_single_process():
    problems = sum(spawn(_rank_run, 2, timeout_s=60), [])
    assert not problems, "\n".join(problems)
