"""a4's hidden inputs for tasks 4.1-4.3: the sizes the generators are called with, and broken
schedules (deadlocks, receives out of channel order) made from valid ones by random moves that
the library's `validate` classifies. The public tests' cases are among them (issue 27)."""

from __future__ import annotations

import copy
import random

# the public tests' sizes (assignments/a4_pipeline/tests/): every one runs here too (issue 27)
PUBLIC_1F1B = [(3, 4), (2, 2), (3, 7), (4, 8), (5, 5)]
PUBLIC_INTERLEAVED = [(2, 4, 2), (3, 6, 3), (4, 4, 2)]
PUBLIC_DEADLOCK = {0: "F0 B0 F1 F2 B1 F3 B2 B3", 1: "F0 F1 B0 F2 B1 F3 B2 B3", 2: "F0 B0 F1 B1 F2 B2 F3 B3"}
PUBLIC_OUT_OF_ORDER = {0: "F0 F1 B0 F2 B1 B2", 1: "F1 B1 F0 B0 F2 B2"}


def _table(rows: dict[int, str]) -> dict:
    """{rank: "F0 F1 B0"} -> a schedule of library Actions on each rank's own stage."""
    from scaletrain.pipeline import Action
    return {r: [Action(r, t[0], int(t[1:])) for t in text.split()] for r, text in rows.items()}


def _hidden_sizes(rng: random.Random) -> list[tuple[int, int]]:
    sizes = list(dict.fromkeys([(1, 1), (2, 2), (3, 3), (2, 5), (4, 9), (5, 6), (6, 13)] + PUBLIC_1F1B))
    return sizes + [(p, p + rng.randrange(0, 3 * p)) for p in (rng.randint(3, 8) for _ in range(4))]


def _hidden_interleaved(rng: random.Random) -> list[tuple[int, int, int]]:
    cases = [(1, 2, 2), (2, 2, 2), (2, 6, 3), (3, 3, 2), (4, 8, 2), (3, 9, 4)] + PUBLIC_INTERLEAVED
    return cases + [(p, p * rng.randint(1, 3), rng.randint(2, 4)) for p in (rng.randint(2, 6) for _ in range(3))]


def _moved(schedule: dict, rng: random.Random) -> dict:
    """`schedule` with one action of one rank moved to another position."""
    r = rng.randrange(len(schedule))
    acts = schedule[r]
    acts.insert(rng.randrange(len(acts)), acts.pop(rng.randrange(len(acts))))
    return schedule


def _sizes_of(schedule: dict) -> tuple[int, int, int]:
    p = len(schedule)
    actions = [a for acts in schedule.values() for a in acts]
    m = 1 + max(a.microbatch for a in actions)
    return p, m, -(-(1 + max(a.stage for a in actions)) // p)


def _hidden_deadlocks(rng: random.Random, count: int = 12):
    """Valid schedules with one action moved, kept when the library says they deadlock in the dry run."""
    from scaletrain.pipeline import ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, validate, zb_h1
    makers = [lambda: one_f_one_b(3, 5), lambda: gpipe(4, 4), lambda: zb_h1(3, 4), lambda: interleaved_1f1b(2, 4, 2),
              lambda: one_f_one_b(4, 7)]
    found = []
    for _ in range(100 * count):  # about half of the random moves deadlock; the rest break local order
        if len(found) == count:
            break
        schedule = _moved(rng.choice(makers)(), rng)
        p, m, v = _sizes_of(schedule)
        try:
            validate(schedule, p, m, v)
        except ScheduleError as exc:
            if "deadlocks" in str(exc):
                found.append((schedule, p, m, v, exc.rank, exc.action))
    if len(found) < count:
        raise RuntimeError(f"suite bug: found only {len(found)} hidden deadlocks")
    return found


def _runs_by_name(schedule: dict, num_stages: int) -> bool:
    """Whether a dry run that takes any sent message, whatever its place on the channel, finishes:
    then the only fault of the schedule is the order of its receives."""
    from scaletrain.pipeline import receives, sends
    sent, cursor, progress = set(), {r: 0 for r in schedule}, True
    while progress:
        progress = False
        for r, actions in schedule.items():
            while cursor[r] < len(actions):
                need = receives(actions[cursor[r]], num_stages)
                if need is not None and need not in sent:
                    break
                out = sends(actions[cursor[r]], num_stages)
                if out is not None:
                    sent.add(out)
                cursor[r] += 1
                progress = True
    return all(cursor[r] == len(actions) for r, actions in schedule.items())


def _hidden_channel_swaps(rng: random.Random, count: int = 6):
    """Valid schedules in which one rank swaps two adjacent receives from the same rank: every
    message arrives (a dry run matching by name finishes), but not in the order it is asked for."""
    from scaletrain.pipeline import (ScheduleError, gpipe, interleaved_1f1b, one_f_one_b, receives, stage_rank,
                                     validate, zb_h1)
    makers = [lambda: gpipe(3, 4), lambda: one_f_one_b(3, 5), lambda: one_f_one_b(4, 6), lambda: zb_h1(3, 4),
              lambda: interleaved_1f1b(2, 4, 2), lambda: interleaved_1f1b(3, 6, 2)]
    found = []
    for _ in range(200 * count):
        if len(found) == count:
            break
        schedule = rng.choice(makers)()
        p, m, v = _sizes_of(schedule)
        r = rng.randrange(p)
        acts = schedule[r]
        src = [None if (msg := receives(a, p * v)) is None else stage_rank(msg.src_stage, p) for a in acts]
        pairs = [k for k in range(len(acts) - 1) if src[k] is not None and src[k] == src[k + 1]]
        if not pairs:
            continue
        k = rng.choice(pairs)
        acts[k], acts[k + 1] = acts[k + 1], acts[k]
        try:
            validate(schedule, p, m, v)
        except ScheduleError as exc:
            if "in the order the sender sends" in str(exc) and _runs_by_name(schedule, p * v):
                found.append((schedule, p, m, v, exc))
    if len(found) < count:
        raise RuntimeError(f"suite bug: found only {len(found)} hidden receives out of channel order")
    return found


def _as_data(schedule: dict) -> list:
    return [(r, [(a.stage, a.kind, a.microbatch) for a in acts]) for r, acts in schedule.items()]


def _hidden_valid(rng: random.Random, schedule: dict, moves: int = 4) -> dict:
    """`schedule` changed by random moves that keep it valid: no executor can know its order."""
    from scaletrain.pipeline import ScheduleError, validate
    p, m, v = _sizes_of(schedule)
    done = 0
    for _ in range(200):
        if done == moves:
            break
        candidate = _moved(copy.deepcopy(schedule), rng)
        try:
            validate(candidate, p, m, v)
        except ScheduleError:
            continue
        schedule, done = candidate, done + (candidate != schedule)
    return schedule
