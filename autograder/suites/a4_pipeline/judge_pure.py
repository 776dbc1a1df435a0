"""a4 tasks 4.1 and 4.2's verdicts: the student's generators (called in the sandboxed worker, one
call per (function, sizes), each under its own time limit) judged by the properties of
`scaletrain.pipeline.schedule_rules`, one check each, on hidden sizes; then task 4.3's group
(judge_validate) in the same worker."""

from __future__ import annotations

import random

from autograder import checks
from scaletrain.pipeline import schedule_rules as rules

from .inputs import _hidden_interleaved, _hidden_sizes
from .judge_validate import group_validate
from .names import (C1_BUBBLE, C1_COOLDOWN, C1_PEAK, C1_REJECT, C1_STEADY, C1_VALID, C1_WARMUP, C2_BUBBLE, C2_PEAK,
                    C2_REJECT, C2_VALID, CALL_LIMIT_S, LOAD_LIMIT_S, PROBE)


class _Student:
    """The student's pure functions in the worker: one call each, under CALL_LIMIT_S. The
    worker is started (and the file imported) by a first untimed call, so the limit measures
    the student's function, not the start of a process."""

    def __init__(self, ctx):
        self.ctx, self.loaded, self.cache = ctx, set(), {}
        self.load_failure: Exception | None = None

    def call(self, probe: str, stem: str, *args):
        from autograder.untrusted import StudentCrash

        worker = self.ctx.untrusted()
        if stem not in self.loaded:
            if self.load_failure is not None:  # an import that hangs costs one limit, not one per check
                raise self.load_failure
            try:
                worker.call(PROBE + "load", stem, timeout_s=LOAD_LIMIT_S)
            except TimeoutError as exc:
                self.load_failure = exc
                raise
            self.loaded.add(stem)
        try:
            return worker.call(PROBE + probe, stem, *args, timeout_s=CALL_LIMIT_S)
        except (TimeoutError, StudentCrash):
            self.loaded.clear()  # the worker may be gone: the next call starts (and imports) again
            raise

    def generated(self, function: str, *args):
        """The probe's answer for `function(*args)`: {"schedule": data} or {"value_error": msg}.
        A generator is a pure function: each (function, args) is asked once per group."""
        key = (function, args)
        if key not in self.cache:
            self.cache[key] = self.call("generate", "pp_schedules", function, *args)
        return self.cache[key]


def _call_text(function: str, args: tuple) -> str:
    return f"{function}({', '.join(map(repr, args))})"


def _as_library(data, name: str) -> dict:
    """The probe's schedule data rebuilt with the library's Action (never the student's class)."""
    from scaletrain.pipeline import Action
    if isinstance(data, dict) and "not_a_dict" in data:
        raise AssertionError(f"{name} returned {data['not_a_dict']}, expected dict[rank, list[Action]]")
    schedule = {}
    try:
        for rank, rows in data:
            if type(rank) is not int:
                raise AssertionError(f"{name}: rank key {rank!r} is not an int")
            actions = []
            for row in rows:
                if isinstance(row, dict):
                    raise AssertionError(f"{name}: {row.get('not_action')} is not an Action(stage, kind, microbatch)")
                try:
                    actions.append(Action(*row))
                except (TypeError, ValueError) as exc:
                    raise AssertionError(f"{name}: rank {rank} holds an invalid action {row!r}: {exc}") from None
            schedule[rank] = actions
    except (TypeError, ValueError) as exc:  # not what the probe sends
        raise AssertionError(f"{name}: malformed answer from the worker ({exc})") from None
    return schedule


def _generated(student: _Student, function: str, *args) -> dict:
    """The student's schedule for `function(*args)` (valid sizes), as library Actions."""
    out = student.generated(function, *args)
    name = _call_text(function, args)
    if "value_error" in out:
        raise AssertionError(f"{name} raised {out['value_error']} for valid sizes")
    return _as_library(out["schedule"], name)


def _expect_value_error(student: _Student, function: str, *args):
    if "value_error" not in student.generated(function, *args):
        raise AssertionError(f"{_call_text(function, args)}: expected a ValueError with a clear message, "
                             "nothing was raised")


def _ranks(schedule: dict, p: int, what: str) -> None:
    """The phases are read rank by rank: every rank 0..p-1 must have a list of actions."""
    assert sorted(schedule) == list(range(p)) and all(schedule.values()), (
        f"{what}: ranks {sorted(schedule)} with {[len(a) for a in schedule.values()]} actions; expected a "
        f"non-empty list for each of the ranks 0..{p - 1}")


def _one_f_one_b(name: str, schedule: dict, p: int, m: int, what: str) -> None:
    """One property of 1F1B (`name`) on the student's schedule for (p, m)."""
    {C1_VALID: lambda: rules.check_valid(schedule, p, m, what=what),
     C1_BUBBLE: lambda: rules.check_bubble(schedule, (p - 1) / (m + p - 1), what=what),
     C1_PEAK: lambda: rules.check_peak(schedule, rules.one_f_one_b_bound(p, m), what=what),
     C1_WARMUP: lambda: (_ranks(schedule, p, what), rules.check_warmup(schedule, p, m, what=what)),
     C1_STEADY: lambda: (_ranks(schedule, p, what), rules.check_steady(schedule, what=what)),
     C1_COOLDOWN: lambda: (_ranks(schedule, p, what), rules.check_cooldown(schedule, what=what))}[name]()


def _interleaved(name: str, schedule: dict, p: int, m: int, v: int, what: str) -> None:
    {C2_VALID: lambda: rules.check_valid(schedule, p, m, v, what=what),
     C2_BUBBLE: lambda: rules.check_bubble(schedule, (p - 1) / (v * m + p - 1), what=what),
     C2_PEAK: lambda: rules.check_peak(schedule, rules.interleaved_bound(p, m, v), what=what)}[name]()


def group_pure(ctx):
    rng = random.Random(checks.trial_seeds(1, salt=4)[0])
    student = _Student(ctx)
    sizes, inter = _hidden_sizes(rng), _hidden_interleaved(rng)
    for name in (C1_VALID, C1_BUBBLE, C1_PEAK, C1_WARMUP, C1_STEADY, C1_COOLDOWN):
        with ctx.check(name):
            for p, m in sizes:
                _one_f_one_b(name, _generated(student, "one_f_one_b", p, m), p, m, _call_text("one_f_one_b", (p, m)))
    with ctx.check(C1_REJECT):
        for p, m in ((5, 3), (4, 3)):  # m = p - 1: the public test's boundary
            _expect_value_error(student, "one_f_one_b", p, m)
    for name in (C2_VALID, C2_BUBBLE, C2_PEAK):
        with ctx.check(name):
            for case in inter:
                _interleaved(name, _generated(student, "interleaved_1f1b", *case), *case,
                             _call_text("interleaved_1f1b", case))
    with ctx.check(C2_REJECT):
        _expect_value_error(student, "interleaved_1f1b", 3, 4, 2)
    group_validate(ctx, student, rng)
