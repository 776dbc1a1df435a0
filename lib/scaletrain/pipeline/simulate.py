"""Time a schedule without running it: makespan, bubble fraction, peak in-flight microbatches.

Each rank runs its actions in list order; an action starts when its rank is free and the message
it receives (see `messages.receives`) has arrived, `t_comm` after its sender finished. Durations
are per action, i.e. per stage (one model chunk) and microbatch: with v chunks per rank, pass
t_f / v to compare against a v = 1 schedule of the same model.

    bubble fraction = 1 - (busy time summed over ranks) / (p * makespan)

Closed forms it reproduces (seminar notes "Large-scale DL optimizations", section 1.2.3,
equations 1-3; Narayanan et al. 2021 for interleaving; Qi et al. 2024 for ZB-H1) are in
`closed_form_bubble`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.pipeline.messages import receives, sends
from scaletrain.pipeline.schedules import B, F, I, W, Action, Schedule, stage_rank
from scaletrain.pipeline.validate import schedule_sizes, validate

__all__ = ["Span", "SimResult", "simulate", "closed_form_bubble", "bubble_of", "peak_in_flight"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One action on one rank, from `start` to `end` (simulated units, or seconds when measured)."""
    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True, kw_only=True)
class SimResult:
    p: int
    m: int
    v: int
    makespan: float
    bubble_fraction: float
    peak_in_flight: tuple[int, ...]   # per rank: most (stage, microbatch) pairs between F and last backward
    spans: tuple[Span, ...]           # every action, rank by rank, in execution order


def simulate(schedule: Schedule, t_f=1.0, t_b=2.0, t_i=None, t_w=None, t_comm=0.0) -> SimResult:
    """Simulate `schedule` (validated first). `t_i`/`t_w` default to half of `t_b` each.

    Each duration is a number or a function Action -> number (uneven stages, a recomputation
    that only some backwards pay); `t_comm` a number or a function Message -> number (fit.py
    draws both from measured timelines).
    """
    p, m, v = schedule_sizes(schedule)
    validate(schedule, p, m, v)
    as_fn = lambda t: t if callable(t) else (lambda a: t)  # noqa: E731
    t_i = (lambda a: as_fn(t_b)(a) / 2) if t_i is None else t_i
    t_w = (lambda a: as_fn(t_b)(a) - as_fn(t_i)(a)) if t_w is None else t_w
    kinds = {F: as_fn(t_f), B: as_fn(t_b), I: as_fn(t_i), W: as_fn(t_w)}
    duration = {a: kinds[a.kind](a) for acts in schedule.values() for a in acts}
    comm = as_fn(t_comm)
    if min(duration.values()) < 0 or (not callable(t_comm) and t_comm < 0):
        raise ValueError("simulate: durations must be >= 0")
    num_stages = p * v
    arrival: dict = {}                 # Message -> time it is available at its receiver
    free = {r: 0.0 for r in schedule}  # when each rank finishes its last action so far
    cursor = {r: 0 for r in schedule}
    spans: dict[int, list[Span]] = {r: [] for r in schedule}
    remaining = sum(len(a) for a in schedule.values())
    while remaining:  # validate guarantees every sweep makes progress
        for r, actions in schedule.items():
            while cursor[r] < len(actions):
                a = actions[cursor[r]]
                need = receives(a, num_stages)
                if need is not None and need not in arrival:
                    break
                start = max(free[r], arrival.pop(need) if need is not None else 0.0)
                free[r] = start + duration[a]
                spans[r].append(Span(rank=r, action=a, start=start, end=free[r]))
                out = sends(a, num_stages)
                if out is not None:
                    local = stage_rank(out.dst_stage, p) == r
                    arrival[out] = free[r] + (0.0 if local else comm(out))
                cursor[r] += 1
                remaining -= 1
    flat = tuple(s for r in sorted(spans) for s in spans[r])
    return SimResult(p=p, m=m, v=v, makespan=max(free.values()), bubble_fraction=bubble_of(flat), spans=flat,
                     peak_in_flight=tuple(peak_in_flight(schedule[r]) for r in sorted(schedule)))


def bubble_of(spans) -> float:
    """Idle fraction of a timeline: 1 - busy / (ranks x (last end - first start))."""
    spans = list(spans)
    ranks = {s.rank for s in spans}
    t0, t1 = min(s.start for s in spans), max(s.end for s in spans)
    busy = sum(s.end - s.start for s in spans)
    return 1.0 - busy / (len(ranks) * (t1 - t0)) if t1 > t0 else 0.0


def peak_in_flight(actions: list[Action]) -> int:
    """Most (stage, microbatch) pairs whose F ran and whose last backward (B or W) has not."""
    live = peak = 0
    for a in actions:
        live += {F: 1, B: -1, W: -1}.get(a.kind, 0)
        peak = max(peak, live)
    return peak


def closed_form_bubble(name: str, p: int, m: int, v: int = 1) -> float:
    """Bubble fraction of a named schedule from its formula (t_b = 2 t_f; for zb_h1 t_F = t_I = t_W)."""
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name == "zb_h1":
        return (p - 1) / (3 * m + p - 1)
    raise ValueError(f"closed_form_bubble: unknown schedule {name!r}; choose gpipe, 1f1b, interleaved, zb_h1")
