"""a4 task 4.3's verdicts: the student's dry run (its `validate`, called in the sandboxed worker on
schedules sent as data) against the library's verdict on valid schedules, hidden deadlocks and
hidden receives out of channel order. Rejecting a deadlock and naming where it stalls are
separate checks; both count only when valid schedules are accepted (`Check.needs`)."""

from __future__ import annotations

import random

from .inputs import (PUBLIC_DEADLOCK, PUBLIC_OUT_OF_ORDER, _as_data, _hidden_channel_swaps, _hidden_deadlocks,
                     _hidden_valid, _table)
from .names import C3_ACCEPT, C3_CHANNEL, C3_DETECT, C3_REPORT


def _dry_run(student, schedule: dict, p: int, m: int, v: int) -> dict:
    return student.call("validate", "pp_validate", _as_data(schedule), p, m, v)


def _assert_reported(out: dict, p: int, m: int, v: int, rank: int, action, line: str | None = None) -> None:
    """The student's dry run rejected the schedule with the reference's stalled rank and action
    (`exc.rank`, `exc.action`) and, in its message, `line` (default: that rank stalling there)."""
    if "accepted" in out:
        raise AssertionError(f"a schedule that deadlocks (p={p}, m={m}, v={v}) was accepted")
    got = (out.get("rank"), out.get("action"))
    assert got[0] == rank and got[1] == str(action), (
        f"a deadlock (p={p}, m={m}, v={v}) reported rank={got[0]}, action={got[1]}; the lowest stalled "
        f"rank is {rank}, at {action}")
    line = line or f"rank {rank} stalls at {action}"
    assert line in str(out.get("message")), f"the message must say that {line}: {out.get('message')}"


def _out_of_order_line(exc) -> str:
    """'rank R stalls at A' for the rank of the reference's error that waits for a message while
    another one is first on its channel."""
    line = next(x for x in str(exc).splitlines() if "in the order the sender sends" in x)
    return line.strip().split(" (action #")[0]


def _public_deadlock(student) -> None:
    """The public test's deadlock (p = 3, m = 4): the lowest stalled rank and action, and the
    lines of ranks 0 and 1 (the two waiting on each other), as the reference words them."""
    from scaletrain.pipeline import ScheduleError, validate
    schedule = _table(PUBLIC_DEADLOCK)
    try:
        validate(schedule, 3, 4, 1)
    except ScheduleError as exc:
        ref = exc
    else:
        raise RuntimeError("suite bug: the public test's deadlock validates")
    lines = [x.strip().split(" (action #")[0] for x in str(ref).splitlines() if " stalls at " in x]
    out = student.call("validate", "pp_validate", _as_data(schedule), 3, 4, 1)
    for line in lines[:2]:
        _assert_reported(out, 3, 4, 1, ref.rank, ref.action, line)


def _valid_schedules(rng: random.Random) -> list:
    from scaletrain.pipeline import gpipe, interleaved_1f1b, one_f_one_b, zb_h1
    return [(gpipe(3, 5), 3, 5, 1), (gpipe(3, 4), 3, 4, 1), (one_f_one_b(4, 6), 4, 6, 1), (zb_h1(5, 7), 5, 7, 1),
            (interleaved_1f1b(2, 6, 3), 2, 6, 3), (interleaved_1f1b(4, 4, 2), 4, 4, 2),
            ({r: acts[:3] + acts[3:][::-1] for r, acts in gpipe(2, 3).items()}, 2, 3, 1),
            (_hidden_valid(rng, one_f_one_b(3, 5)), 3, 5, 1), (_hidden_valid(rng, zb_h1(3, 4)), 3, 4, 1)]


def _channel_swaps(rng: random.Random) -> list:
    """Rank 1 runs microbatch 1 first while rank 0 sends microbatch 0 first (cf. torch's printable
    1F1B), then hidden ones: two adjacent receives from one rank swapped."""
    from scaletrain.pipeline import ScheduleError, validate
    swaps, public = _hidden_channel_swaps(rng), _table(PUBLIC_OUT_OF_ORDER)
    try:
        validate(public, 2, 3, 1)
    except ScheduleError as exc:
        swaps.insert(0, (public, 2, 3, 1, exc))
    return swaps


def group_validate(ctx, student, rng: random.Random):
    deadlocks, swaps, valid = _hidden_deadlocks(rng), _channel_swaps(rng), _valid_schedules(rng)
    with ctx.check(C3_ACCEPT):
        for schedule, p, m, v in valid:
            out = _dry_run(student, schedule, p, m, v)
            if "accepted" not in out:
                raise AssertionError(f"a valid schedule (p={p}, m={m}, v={v}) was rejected: {out.get('message')}")
    answers: dict[int, dict] = {}  # the dry run is a pure function: one call per hidden deadlock

    def verdicts():
        for k, (schedule, p, m, v, rank, action) in enumerate(deadlocks):
            if k not in answers:
                answers[k] = _dry_run(student, schedule, p, m, v)
            yield answers[k], (p, m, v, rank, action)

    with ctx.check(C3_DETECT):
        for out, (p, m, v, _, _) in verdicts():
            if "accepted" in out:
                raise AssertionError(f"a schedule that deadlocks (p={p}, m={m}, v={v}) was accepted")
    with ctx.check(C3_REPORT):
        for out, sizes in verdicts():
            _assert_reported(out, *sizes)
        _public_deadlock(student)
    with ctx.check(C3_CHANNEL):
        for schedule, p, m, v, exc in swaps:
            line = _out_of_order_line(exc)
            out = _dry_run(student, schedule, p, m, v)
            if "accepted" in out:
                raise AssertionError(f"{line}, waiting for a message while another one is first on its channel "
                                     f"(p={p}, m={m}, v={v}): the schedule must be rejected")
            _assert_reported(out, p, m, v, exc.rank, exc.action, line)
