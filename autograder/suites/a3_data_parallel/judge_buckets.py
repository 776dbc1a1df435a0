"""a3 task 3.1's verdicts: the student's `assign_buckets` (called in the sandboxed worker on
parameter shapes and caps sent as data) judged by the five properties of
`scaletrain.dp.bucket_rules`, each its own check: any design that has them all passes, whatever
its layout (the reference's reverse greedy or another)."""

from __future__ import annotations

import random

from autograder import checks
from scaletrain.dp import bucket_rules as rules

from .inputs import _hidden_cases, _nbytes
from .names import C_CAP, C_DTYPE, C_FULL, C_ORDER, C_PARTITION, PROBE


def _call_assign(remote, specs, cap):
    got = remote.assign_buckets(specs, cap)
    assert isinstance(got, list) and all(isinstance(b, list) for b in got), \
        f"assign_buckets must return a list of lists of indices, got {str(got)[:80]}"
    assert all(type(i) is int for b in got for i in b), \
        f"assign_buckets must return lists of int indices, got {str(got)[:80]}"
    return got


def _what(specs, cap) -> str:
    dtypes = sorted({str(d).split(".")[-1] for _, d in specs})
    return f"assign_buckets({len(specs)} parameters of {'/'.join(dtypes)}, cap_bytes={cap})"


def _property(name: str, specs, cap, got) -> None:
    """One property of `rules` on the student's answer for (specs, cap)."""
    n, nbytes, dtypes, what = len(specs), [_nbytes(s) for s in specs], [d for _, d in specs], _what(specs, cap)
    if name != C_PARTITION and any(not 0 <= i < n for b in got for i in b):
        raise AssertionError(f"{what}: indices outside 0..{n - 1} in {str(got)[:80]} (the partition check says more)")
    {C_PARTITION: lambda: rules.check_partition(got, n, what=what),
     C_CAP: lambda: rules.check_cap(got, nbytes, cap, what=what),
     C_DTYPE: lambda: rules.check_one_dtype(got, dtypes, what=what),
     C_FULL: lambda: rules.check_full(got, nbytes, dtypes, cap, what=what),
     C_ORDER: lambda: rules.check_arrival_order(got, n, what=what)}[name]()


def group_buckets(ctx):
    cases = _hidden_cases(random.Random(checks.trial_seeds(1, salt=31)[0]))
    remote = ctx.remote("dp_bucket", probe=f"{PROBE}:with_params")
    answers: dict[tuple[int, int], list] = {}
    for name in (C_PARTITION, C_CAP, C_DTYPE, C_FULL, C_ORDER):
        with ctx.check(name):
            for k, (specs, caps) in enumerate(cases):
                for cap in caps:
                    if (k, cap) not in answers:  # one call per case: a pure function
                        answers[k, cap] = _call_assign(remote, specs, cap)
                    _property(name, specs, cap, answers[k, cap])
