"""Why the planner charges MT-NLG's DeepSpeed pipeline (Smith et al. 2022) the 1F1B bubble.

DeepSpeed's `TrainSchedule` (deepspeed/runtime/pipe/schedule.py) runs 2·(m + p - 1) steps; at
every step a stage does one forward or one backward, by the parity of step and stage, and starts
with blocking sends and receives paired with a neighbour at the same step. Simulated with those
barriers, its makespan is the 1F1B closed form (m + p - 1)·(t_f + t_b) (Narayanan et al. 2021
§2.2.1): the schedule adds no bubble, so it cannot explain the fixed seconds per iteration that
MT-NLG's published times have beyond the planner's (`scaletrain.plan.validate`)."""

import pytest


def _micro_batch(step: int, stage: int, stages: int) -> tuple[int, bool]:
    """(micro-batch, is forward) of `TrainSchedule._step_to_micro_batch`."""
    forward = step % 2 == stage % 2
    if forward:
        return step // 2 - stage // 2, True
    if step % 2 == 0:
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def _makespan(stages: int, m: int, t_f: float, t_b: float) -> float:
    """Each stage's step k starts when its step k - 1 and the step k - 1 of every neighbour it
    exchanges with at step k (forward: the previous stage; backward: the next) have ended."""
    steps = 2 * (m + stages - 1)
    end = [[0.0] * steps for _ in range(stages)]
    for k in range(steps):
        for s in range(stages):
            mb, forward = _micro_batch(k, s, stages)
            prev_mb = _micro_batch(k - 1, s, stages)[0] if k else -1
            talks = 0 <= mb < m or 0 <= prev_mb < m
            neighbour = s - 1 if forward else s + 1
            ready = [end[s][k - 1] if k else 0.0]
            if talks and 0 <= neighbour < stages and k:
                ready.append(end[neighbour][k - 1])
            end[s][k] = max(ready) + ((t_f if forward else t_b) if 0 <= mb < m else 0.0)
    return max(row[-1] for row in end)


@pytest.mark.parametrize("stages,m", [(4, 8), (35, 160), (35, 240), (8, 3)])
def test_deepspeed_train_schedule_has_the_1f1b_makespan(stages, m):
    t_f, t_b = 1.0, 3.0  # full recomputation: the backward is three forwards
    assert _makespan(stages, m, t_f, t_b) == pytest.approx((m + stages - 1) * (t_f + t_b))


def test_every_micro_batch_runs_once_forward_and_once_backward_per_stage():
    stages, m = 5, 7
    for s in range(stages):
        seen = [_micro_batch(k, s, stages) for k in range(2 * (m + stages - 1))]
        assert sorted(mb for mb, fwd in seen if fwd and 0 <= mb < m) == list(range(m))
        assert sorted(mb for mb, fwd in seen if not fwd and 0 <= mb < m) == list(range(m))
