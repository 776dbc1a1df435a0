# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/pipeline/validate.py by `python -m autograder release`; edit the source.
"""Check a schedule before anything runs it: coverage, local order, and a dry run of its messages.

A schedule that is wrong does not crash: it hangs (a receive whose send never comes) or, on a
transport that matches messages in order (NCCL), silently computes on the wrong microbatch.
`validate` catches both before a process starts:

1. shape and coverage: every action sits on the rank that holds its stage, and every
   (stage, microbatch) has exactly one F and one backward (B, or I then W);
2. local order: on its rank, a backward comes after its forward and W after its I;
3. dry run: every rank walks its list; an action that needs a message (messages.py: F needs the
   previous stage's activation, B/I the next stage's gradient) waits until that message is the
   next one on its channel (src rank -> dst rank, first in first out). Sends never block (the
   executor posts `isend` and moves on). If the walk stops before every rank is done, the
   schedule would deadlock and the error names each stalled rank, its action and what it waits for.

Torch's printable 1F1B order (`Schedule1F1B._get_pipeline_order`, torch 2.13) is an example:
its last rank starts at F1, so that rank has no F0 (rule 1); with F0 added after F1 it waits
for microbatch 1 while microbatch 0 sits first on its channel (rule 3).
"""

from __future__ import annotations

from collections import deque

from scaletrain.pipeline.messages import Message, receives, sends
from scaletrain.pipeline.schedules import B, F, I, W, Action, Schedule, stage_rank

__all__ = ["ScheduleError", "validate", "schedule_sizes"]


class ScheduleError(ValueError):
    """A schedule that cannot run; `rank` and `action` say where (None when not about one action)."""

    def __init__(self, message: str, *, rank: int | None = None, action: Action | None = None):
        super().__init__(message)
        self.rank, self.action = rank, action


def schedule_sizes(schedule: Schedule) -> tuple[int, int, int]:
    """(p, m, v) implied by a schedule: ranks, microbatches, chunks per rank."""
    p = len(schedule)
    actions = [a for acts in schedule.values() for a in acts]
    if p == 0 or not actions:
        raise ScheduleError("empty schedule: expected dict[pp_rank, list[Action]] with actions")
    num_stages = max(a.stage for a in actions) + 1
    return p, max(a.microbatch for a in actions) + 1, -(-num_stages // p)


def validate(schedule: Schedule, p: int, m: int, v: int = 1) -> None:
    """Raise `ScheduleError` unless `schedule` runs to completion on p ranks, m microbatches, v chunks."""
    schedule = _as_actions(schedule)
    _check_coverage(schedule, p, m, v)
    _check_local_order(schedule)
    _dry_run(schedule, p * v)


def _as_actions(schedule) -> Schedule:
    """`schedule` with every action as this module's `Action`. Actions are compared by their
    fields, not their class: a generator written against another copy of schedules.py (the
    assignment's pp_schedules.py) builds actions of its own class."""
    if not isinstance(schedule, dict):
        raise ScheduleError(f"a schedule is dict[pp_rank, list[Action]], got {type(schedule).__name__}")
    out: Schedule = {}
    for r, actions in schedule.items():
        out[r] = []
        for a in actions:
            try:
                out[r].append(a if isinstance(a, Action) else Action(a.stage, a.kind, a.microbatch))
            except (AttributeError, ValueError) as exc:
                raise ScheduleError(f"rank {r}: {a!r} is not an Action ({exc})", rank=r) from None
    return out


def _check_coverage(schedule: Schedule, p: int, m: int, v: int) -> None:
    if sorted(schedule) != list(range(p)):
        raise ScheduleError(f"schedule ranks are {sorted(schedule)}, expected 0..{p - 1} (one list per pp_rank)")
    seen: dict[tuple[int, int, str], int] = {}
    for r, actions in schedule.items():
        for a in actions:
            where = f"rank {r}, action {a}"
            if a.stage >= p * v or a.microbatch >= m:
                raise ScheduleError(f"{where}: stage must be < p*v = {p * v} and microbatch < m = {m}",
                                    rank=r, action=a)
            if stage_rank(a.stage, p) != r:
                raise ScheduleError(f"{where}: stage {a.stage} lives on rank {stage_rank(a.stage, p)} "
                                    f"(stage s is on rank s % p)", rank=r, action=a)
            key = (a.stage, a.microbatch, a.kind)
            if key in seen:
                raise ScheduleError(f"{where}: appears twice", rank=r, action=a)
            seen[key] = r
    for s in range(p * v):
        for i in range(m):
            kinds = {k for k in (F, B, I, W) if (s, i, k) in seen}
            if kinds not in ({F, B}, {F, I, W}):
                r = stage_rank(s, p)
                raise ScheduleError(
                    f"rank {r}: stage {s}, microbatch {i} has actions {sorted(kinds) or 'none'}; it needs "
                    f"exactly one F and one backward (B, or I and W)", rank=r)


def _check_local_order(schedule: Schedule) -> None:
    for r, actions in schedule.items():
        position = {a: n for n, a in enumerate(actions)}
        for a in actions:
            before = {B: F, I: F, W: I}.get(a.kind)
            if before and position.get(Action(a.stage, before, a.microbatch), -1) > position[a]:
                raise ScheduleError(f"rank {r}, action {a}: runs before {before}{a.microbatch}@s{a.stage}, "
                                    f"which it depends on", rank=r, action=a)


def _dry_run(schedule: Schedule, num_stages: int) -> None:
    """Walk every rank's list as the executor would; raise `ScheduleError` if a rank cannot finish.

    The model of the transport (the executor's, messages.py): each ordered pair of ranks is one
    first-in first-out channel; a send never blocks (the executor posts `isend` and moves on);
    an action whose `receives(a, num_stages)` is a message can run only when that message is
    the next one on its channel: anything else there means the receive would wait forever, or
    take the wrong tensor on a transport that matches in order. Ranks run in any interleaving.
    Raise iff some rank can never finish its list: `ScheduleError(message, rank=r, action=a)`,
    r the lowest stalled rank, a its stalled action, the message "schedule deadlocks:" followed
    by one indented line per stalled rank (`_why_stalled` writes one). Graded on valid schedules
    of every kind, hidden deadlocks and out-of-order receives; a valid schedule returns None.
    """
    raise NotImplementedError('a4 task 4.3: implement `_dry_run` (see assignments/a4_pipeline/README.md)')


def _why_stalled(r: int, schedule: Schedule, cursor: dict, channels: dict, num_stages: int) -> str:
    """One line: where rank r stalls, what it waits for, and why that message does not come."""
    p = len(schedule)
    a = schedule[r][cursor[r]]
    need = receives(a, num_stages)
    src = stage_rank(need.src_stage, p)
    queue = channels.get((src, r))
    head = f"rank {r} stalls at {a} (action #{cursor[r]}): it waits for the {need} from rank {src}"
    if queue:
        return (f"{head}, but the next message from rank {src} is the {queue[0]} "
                f"(receives must be posted in the order the sender sends)")
    if cursor[src] < len(schedule[src]):
        return f"{head}, which is itself stalled at {schedule[src][cursor[src]]}"
    return f"{head}, which finished without sending it"
