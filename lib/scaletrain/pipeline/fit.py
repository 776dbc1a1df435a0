"""Fit the simulator's costs to measured timelines, and predict a run's bubble from them.

A real pipeline's idle time has three sources, and each fit below adds one:

1. the schedule itself, with equal stages: `closed_form_bubble`, or `simulate` with one mean
   duration per kind (`costs_from_timeline(spans)`);
2. unequal stages: the first stage's backward computes no input gradient, the last stage's
   forward adds the loss, and the slowest stage sets everyone's pace
   (`costs_from_timeline(spans, by="stage")`: a mean per stage and kind);
3. jitter: a pipeline's makespan is a max over paths, and the mean of a max exceeds the max of
   the means (Jensen), so durations that vary from microbatch to microbatch stretch it even when
   every mean is right (`sampled_bubble`: each action's duration, and each message's delay, drawn
   from what the run measured for that stage and kind).

What is left is correlation: on a shared machine a rank is slow for a whole step, not one action
at a time. Replaying each action's own measured duration (`by="action"`) keeps it and tests the
simulator's model of the executor itself; `sampled_bubble([step], by="action")` also draws each
message's delay from that step's, so that the rare message that waits a whole scheduler tick
(about 4 ms on a 2-core box) lands on the critical path as often as it does in reality. On 2 CPU
ranks (8×Linear(512), m = 8, batch 1024, `python -m scaletrain.bench pipeline`) 1F1B's bubble was
predicted as 0.119 (equal stages), 0.155 (per stage), 0.187 (+ jitter) and 0.177 (replay)
against 0.179 measured.

The simulator gives every rank a processor of its own. With more ranks than cores (p = 4 on 2)
a woken receiver also waits for a core, the longer the more of the other ranks are computing: in
one p = 4 run, 13-16% of the idle receivers whose message left while one other rank computed
waited over 1 ms, 26-42% with two or three. Drawn at random, such waits also land in the ramp,
where few ranks compute, and the replay overestimates the bubble by up to about 10%.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

from scaletrain.pipeline.messages import receives
from scaletrain.pipeline.schedules import B, F, I, Action, Schedule
from scaletrain.pipeline.simulate import Span, simulate

__all__ = ["costs_from_timeline", "message_delays", "sampled_bubble"]


def costs_from_timeline(spans: Sequence[Span], by: str = "kind") -> dict:
    """`simulate`'s keyword arguments fitted to one measured timeline: durations (t_f, t_b, t_i,
    t_w) and t_comm, the mean of `message_delays`. The durations, by:

      "kind"    one mean per kind (source 1 above): numbers;
      "stage"   a mean per stage and kind (source 2): functions Action -> seconds;
      "action"  each action's own measured duration: a replay of the run through the simulator,
                which then differs from the measurement only where its model of the executor
                (dependencies, one message delay, nothing else between actions) is wrong.
    """
    if by not in ("kind", "stage", "action"):
        raise ValueError(f"costs_from_timeline: by must be 'kind', 'stage' or 'action', got {by!r}")
    costs = {}
    for kind in ("F", "B", "I", "W"):
        mine = [s for s in spans if s.action.kind == kind]
        mean = _mean_duration(mine)
        if by == "kind" or not mine:
            costs[f"t_{kind.lower()}"] = mean
            continue
        key = (lambda a: a.stage) if by == "stage" else (lambda a: a)
        table = {k: _mean_duration([s for s in mine if key(s.action) == k]) for k in {key(s.action) for s in mine}}
        costs[f"t_{kind.lower()}"] = lambda a, table=table, key=key, mean=mean: table.get(key(a), mean)
    delays = message_delays(spans)  # the mean: a few messages that missed a wake-up cost ms each
    costs["t_comm"] = max(0.0, sum(delays) / len(delays)) if delays else 0.0
    if not any(s.action.kind == B for s in spans):  # an I/W schedule: simulate wants t_b = t_i + t_w
        t_i, t_w = costs["t_i"], costs["t_w"]
        costs["t_b"] = t_i + t_w if by == "kind" else (lambda a: t_i(a) + t_w(a))
    return costs


def message_delays(spans: Sequence[Span]) -> list[float]:
    """Seconds from a sender's end to its receiver's start, for every message the receiver sat
    idle for (its previous action ended before the message was sent): transfer plus wake-up."""
    spans = sorted(spans, key=lambda s: s.start)
    by_action = {s.action: s for s in spans}
    num_stages = max(s.action.stage for s in spans) + 1
    previous_end: dict[int, float] = {}
    delays = []
    for s in spans:
        need = receives(s.action, num_stages)
        if need is not None:
            sender = next(by_action[a] for a in _senders(need) if a in by_action)
            if sender.rank != s.rank and previous_end.get(s.rank, -float("inf")) <= sender.end:
                delays.append(s.start - sender.end)
        previous_end[s.rank] = s.end
    return delays


def sampled_bubble(schedule: Schedule, timelines: Sequence[Sequence[Span]], by: str = "stage",
                   samples: int = 200, seed: int = 0) -> float:
    """Expected bubble fraction of `schedule` when every message takes a random measured delay
    and every action a random measured duration, both pooled over `timelines`: the mean over
    `samples` simulations. by="stage": an action's duration is drawn from its (stage, kind)
    (source 3 above, over several steps of one run); by="action": from its own measurements (with
    one timeline, the replay of that step, its message delays drawn from the ones it had)."""
    if by not in ("stage", "action"):
        raise ValueError(f"sampled_bubble: by must be 'stage' or 'action', got {by!r}")
    key = (lambda a: (a.stage, a.kind)) if by == "stage" else (lambda a: a)
    durations: dict = {}
    for spans in timelines:
        for s in spans:
            durations.setdefault(key(s.action), []).append(s.end - s.start)
    missing = {key(a) for actions in schedule.values() for a in actions} - durations.keys()
    if missing:
        raise ValueError(f"sampled_bubble: the timelines never ran {sorted(map(str, missing))[:4]}: "
                         "pass timelines measured with this schedule")
    delays = [max(0.0, d) for spans in timelines for d in message_delays(spans)] or [0.0]
    rng = random.Random(seed)
    draw = lambda a: rng.choice(durations[key(a)])  # noqa: E731
    bubbles = [simulate(schedule, t_f=draw, t_b=draw, t_i=draw, t_w=draw,
                        t_comm=lambda msg: rng.choice(delays)).bubble_fraction for _ in range(samples)]
    return statistics.fmean(bubbles)


def _mean_duration(spans: Sequence[Span]) -> float:
    return sum(s.end - s.start for s in spans) / len(spans) if spans else 0.0


def _senders(msg) -> list[Action]:
    if msg.kind == "activation":
        return [Action(msg.src_stage, F, msg.microbatch)]
    return [Action(msg.src_stage, B, msg.microbatch), Action(msg.src_stage, I, msg.microbatch)]
