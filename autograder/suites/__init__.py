"""One package per assignment (`aN_topic/`), split by role: `__init__.py` defines `MANIFEST`,
`names.py` the files and check names, `planted.py` the planted submissions, `inputs.py` the hidden
inputs, `judge*.py` the group functions and their verdicts.

Here too, what every suite's trusted side needs when it reads a collection the worker sent back:
a loop over an empty answer checks nothing. Issue 28: a8's LAMB emptied the caller's parameter
list, the probe returned empty lists, and `zip(got, want)` passed task 8.3 in full. Every loop over
a worker's answer goes through `sized` or `paired`, so an empty, short or long answer is a failed
check that says what was expected and what came back.
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
