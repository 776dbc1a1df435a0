"""The trusted side of a4's suite, without processes: the hidden inputs it generates and how it
reads the executor's trace (autograder/suites/a4_pipeline/, autograder/probes/a4_pipeline.py).

The probes record, per rank, every stage forward (its input, how many stage outputs were alive),
every gradient reaching a stage output, every weight-gradient accumulation. Here that trace is
synthesised from an order of actions, to check that the suite accepts the schedule's own order
and rejects another one (an executor that runs everything as GPipe)."""

import random

import pytest

from autograder.suites.a4_pipeline import inputs, inputs_executor, judge_executor, judge_validate
from autograder.suites.a4_pipeline.names import C4_GPIPE, C4_LOSSES, C4_MEMORY
from scaletrain.pipeline import B, F, I, ScheduleError, peak_in_flight, validate


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hidden_channel_swaps_only_break_the_channel_order(seed):
    for schedule, p, m, v, exc in inputs._hidden_channel_swaps(random.Random(seed)):
        with pytest.raises(ScheduleError, match="in the order the sender sends"):
            validate(schedule, p, m, v)
        assert inputs._runs_by_name(schedule, p * v)  # a dry run matching by name accepts it
        assert judge_validate._out_of_order_line(exc).startswith("rank ")


def test_hidden_deadlocks_are_not_the_public_example():
    public = {0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"}
    for schedule, *_ in inputs._hidden_deadlocks(random.Random(3)):
        rows = {r: " ".join(f"{a.kind}{a.microbatch}" for a in acts) for r, acts in schedule.items()}
        assert rows != public


def _trace(case, rank, order):
    """The events the probe records when rank `rank` runs `order`, with outputs freed at the last
    backward of their (stage, microbatch)."""
    events, forward_at, alive = [], {}, set()
    for a in order:
        s, i = a.stage, a.microbatch
        if a.kind == F:
            alive.add((s, i))
            forward_at[(s, i)] = len(events)
            events.append(("F", s, case.inputs[s][i].clone(), len(alive)))
        if a.kind in (B, I):
            events.append(("G", s, forward_at[(s, i)]))
        if a.kind not in (F, I):
            events += [("A", s)] * case.n_params[s]
            alive.discard((s, i))
    return events


def _outputs(case, rank, order):
    p = len(case.schedule)
    return {"grads": {str(s): case.grads[s] for s in range(len(case.specs)) if s % p == rank},
            "losses": list(case.losses), "in_flight_after": 0, "alive_after": 0, "events": _trace(case, rank, order)}


def _gpipe_order(actions):
    return sorted(actions, key=lambda a: (a.kind != F, a.stage if a.kind == F else -a.stage, a.microbatch,
                                          a.kind == "W"))


@pytest.fixture(scope="module")
def cases():
    return inputs_executor._executor_cases(seed=5)


def test_the_schedules_own_order_passes(cases):
    for case in cases:
        for rank, actions in case.schedule.items():
            assert judge_executor._judged(case, rank, _outputs(case, rank, actions)) == {
                case.check: [], C4_LOSSES: [], C4_MEMORY: []}


def test_an_executor_that_runs_gpipe_fails_every_other_schedule(cases):
    for case in cases:
        failed, memory = [], []
        for rank, actions in case.schedule.items():
            problems = judge_executor._judged(case, rank, _outputs(case, rank, _gpipe_order(actions)))
            assert problems[C4_LOSSES] == []
            failed += problems[case.check]
            memory += problems[C4_MEMORY]
        if case.check == C4_GPIPE:
            assert failed == [] and memory == []
        else:
            assert any("in its order" in msg for msg in failed), case.label
            assert any("were alive at once" in msg for msg in memory) or all(
                peak_in_flight(_gpipe_order(a)) <= peak_in_flight(a) for a in case.schedule.values())


def test_activations_kept_past_their_backward_fail(cases):
    """The schedule's order, but no stage output freed before the step ends (1F1B run with
    GPipe's memory): each forward sees every earlier output still alive."""
    case = next(c for c in cases if c.label.startswith("one_f_one_b"))
    out = _outputs(case, 0, case.schedule[0])
    forwards = 0
    for n, event in enumerate(out["events"]):
        if event[0] == "F":
            forwards += 1
            out["events"][n] = (*event[:3], forwards)
    problems = judge_executor._judged(case, 0, out)
    assert any("were alive at once" in msg for msg in problems[C4_MEMORY])
    assert problems[case.check] == []


def test_malformed_outputs_fail_instead_of_crashing(cases):
    case = cases[0]
    for out in (None, {}, {"grads": 3}, {**_outputs(case, 0, case.schedule[0]), "events": [("Z", 0)]}):
        assert judge_executor._judged(case, 0, out)[case.check]
