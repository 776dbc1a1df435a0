"""One package per assignment (`aN_topic/`), split by role: `__init__.py` defines `MANIFEST`,
`names.py` the files and check names, `planted.py` the planted submissions, `inputs.py` the hidden
inputs, `judge*.py` the group functions and their verdicts.

Here too, what every suite's trusted side needs when it reads a collection the worker sent back:
a loop over an empty answer checks nothing. Issue 28: a8's LAMB emptied the caller's parameter
list, the probe returned empty lists, and `zip(got, want)` passed task 8.3 in full. Every loop over
a worker's answer goes through `sized` or `paired`, so an empty, short or long answer is a failed
check that says what was expected and what came back.

And the pattern of a suite that asks the worker once per probe function and judges several checks on
the answers (`judge_calls`): a failure (the student's exception, a timeout) is kept and raised inside
each check that needed those answers, so a hang or a crash in one function costs its checks only.
"""

from __future__ import annotations


def sized(got, n: int, what: str) -> list:
    """`got` (the worker's answer), checked to be a list or tuple of exactly `n` items."""
    if not isinstance(got, (list, tuple)):
        raise AssertionError(f"{what}: expected a list of {n}, got {type(got).__name__} {str(got)[:80]}")
    if len(got) != n:
        raise AssertionError(f"{what}: expected {n}, got {len(got)}")
    return list(got)


def paired(got, want, what: str) -> list[tuple]:
    """zip(got, want, strict=True) once `got` (the worker's) is as long as `want` (the suite's)."""
    want = list(want)
    return list(zip(sized(got, len(want), what), want, strict=True))


def ask(worker, probe: str, jobs, timeout_s: float) -> tuple:
    """(answers, None) or (None, the exception the student's code raised) of `worker.call(probe, jobs)`."""
    try:
        return worker.call(probe, jobs, timeout_s=timeout_s), None
    except Exception as exc:  # noqa: BLE001 - re-raised inside each check that needed the answers
        return None, exc


def answers(asked: tuple, jobs, what: str) -> list[tuple]:
    """(answer, job) pairs of an `ask`, or its failure raised (inside the check calling this)."""
    got, failure = asked
    if failure is not None:
        raise failure
    return paired(got, jobs, what)


def part(asked: tuple, start: int, stop: int | None) -> tuple:
    """The `ask` of jobs [start, stop) of a call that served several checks' jobs."""
    got, failure = asked
    return (None, failure) if failure is not None else (got[start:stop] if isinstance(got, list) else got, None)


def judge_calls(ctx, probe: str, asks: dict, verdicts: dict, timeout_s: float) -> None:
    """Ask the worker `probe + name` for each (name -> jobs) of `asks` after `probe + "load"`, then run
    each check's verdict on the answers; a failure to load the student's files is every check's outcome."""
    worker = ctx.untrusted()
    loaded = ask(worker, probe + "load", None, timeout_s)
    asked = {fn: loaded if loaded[1] is not None else ask(worker, probe + fn, jobs, timeout_s)
             for fn, jobs in asks.items()}
    for name, verdict in verdicts.items():
        with ctx.check(name):
            verdict(asked)
