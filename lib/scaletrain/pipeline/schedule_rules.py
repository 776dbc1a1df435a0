"""What makes a 1F1B or interleaved schedule correct (tasks 4.1 and 4.2 of a4), one property per function.

The order of a rank's actions is the student's design; any order with these properties is right.
The public tests and the grader call these same functions, each property graded as its own check,
and each raises AssertionError naming the call, the rank, what it found and what it expected.

1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1 and Figure 4, top; seminar notes §1.2.3.2)
splits each rank's list into three phases around its in-flight bound p - r: a warm-up of
forwards only that fills the pipeline up to the bound, a steady state of one forward, one
backward, and a cool-down of backwards only that drains what the warm-up put in.
"""

from __future__ import annotations

from scaletrain.pipeline.schedules import B, F, Schedule
from scaletrain.pipeline.simulate import peak_in_flight, simulate
from scaletrain.pipeline.validate import validate

__all__ = ["check_valid", "check_bubble", "check_peak", "check_warmup", "check_steady", "check_cooldown",
           "one_f_one_b_bound", "interleaved_bound"]


def one_f_one_b_bound(p: int, m: int) -> list[int]:
    """Most microbatches in flight on each rank of a 1F1B schedule: p - r (never above m)."""
    return [min(p - r, m) for r in range(p)]


def interleaved_bound(p: int, m: int, v: int) -> list[int]:
    """Most chunk outputs in flight on each rank of Megatron's interleaved order (§2.2.2): its
    warm-up of 2(p - r - 1) + (v - 1)p forwards, one more in the steady state, at most m·v."""
    return [min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) for r in range(p)]


def check_valid(schedule: Schedule, p: int, m: int, v: int = 1, *, what: str) -> None:
    """`validate` accepts it: every (stage, microbatch) has one forward and one backward, each
    forward before its backward on its rank, and a dry run of the messages that cannot deadlock."""
    try:
        validate(schedule, p, m, v)
    except ValueError as exc:
        raise AssertionError(f"{what} is not a valid schedule: {exc}") from None


def check_bubble(schedule: Schedule, expected: float, *, what: str) -> None:
    """The simulated bubble fraction (t_b = 2 t_f) equals the closed form `expected`."""
    try:
        got = simulate(schedule, t_f=1.0, t_b=2.0).bubble_fraction
    except ValueError as exc:  # simulate validates first
        raise AssertionError(f"{what} cannot be simulated, it is not a valid schedule: {exc}") from None
    assert abs(got - expected) < 1e-9, (f"{what}: simulated bubble fraction {got:.4f} (t_b = 2 t_f), expected "
                                        f"{expected:.4f}: some rank waits where it could have worked")


def check_peak(schedule: Schedule, bound: list[int], *, what: str) -> None:
    """Rank r never holds more than bound[r] (stage, microbatch) pairs between F and backward."""
    for r, actions in sorted(schedule.items()):
        got = peak_in_flight(actions)
        assert got <= bound[r], (f"{what}, rank {r}: {got} microbatches in flight at once, the bound is {bound[r]}: "
                                 "run a backward before the next forward once the rank holds its bound")


def _kinds(actions) -> str:
    return "".join("F" if a.kind == F else "B" if a.kind == B else a.kind for a in actions)


def check_warmup(schedule: Schedule, p: int, m: int, *, what: str) -> None:
    """Warm-up: rank r runs forwards only until it holds its bound, min(p - r, m) microbatches."""
    for r, actions in sorted(schedule.items()):
        kinds = _kinds(actions)
        got = len(kinds) - len(kinds.lstrip("F"))
        want = min(p - r, m)
        assert got == want, (f"{what}, rank {r}: {got} forwards before its first backward ({kinds[:12]}...); "
                             f"its warm-up fills the pipeline up to {want} microbatches in flight")


def check_steady(schedule: Schedule, *, what: str) -> None:
    """Steady state: from its first backward to its last forward, rank r alternates B and F."""
    for r, actions in sorted(schedule.items()):
        kinds = _kinds(actions)
        first_b, last_f = kinds.find("B"), kinds.rfind("F")
        middle = kinds[first_b:last_f + 1] if 0 <= first_b < last_f else ""
        bad = next((k for k in range(len(middle) - 1) if middle[k] == middle[k + 1]), None)
        assert bad is None, (f"{what}, rank {r}: two {middle[bad]}s in a row in the steady state (actions "
                             f"#{first_b + bad} and #{first_b + bad + 1}: {middle}); one forward, one backward")


def check_cooldown(schedule: Schedule, *, what: str) -> None:
    """Cool-down: after its last forward, rank r runs backwards only, as many as its warm-up ran
    forwards (it drains what the warm-up put in flight)."""
    for r, actions in sorted(schedule.items()):
        kinds = _kinds(actions)
        tail = kinds[kinds.rfind("F") + 1:]
        warmup = len(kinds) - len(kinds.lstrip("F"))
        assert set(tail) <= {"B"} and len(tail) == warmup, (
            f"{what}, rank {r}: after its last forward it runs {tail or 'nothing'}; the cool-down runs the "
            f"{warmup} backwards its warm-up of {warmup} forwards still owes, and nothing else")
