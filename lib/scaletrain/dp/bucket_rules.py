"""What makes a bucket assignment correct (task 3.1 of a3), one property per function.

Any assignment that has all five properties is a correct design; which one you build (where the
cuts fall, how a bucket's slots are laid out) is your decision. The public tests and the grader
call these same functions, each property graded as its own check. Each raises AssertionError
naming the property, the bucket and what to change.

The arrival model (Li et al. 2020, PyTorch DDP §3.2.3, gradient bucketing and its ordering
requirement): backward produces gradients from the last registered parameter to the first, and
DataParallel launches bucket 0, then 1, ..., a bucket only once all its gradients arrived.
"""

from __future__ import annotations

import itertools
from typing import Sequence

__all__ = ["arrival_order", "check_partition", "check_cap", "check_one_dtype", "check_full",
           "check_arrival_order"]


def arrival_order(n: int) -> list[int]:
    """The order in which backward hands over the gradients of n parameters: last registered first."""
    return list(reversed(range(n)))


def _size(bucket: Sequence[int], nbytes: Sequence[int]) -> int:
    return sum(nbytes[i] for i in bucket)


def check_partition(buckets: list[list[int]], n: int, *, what: str) -> None:
    """Every parameter index 0..n-1 in exactly one bucket; no empty bucket."""
    flat = [i for b in buckets for i in b]
    empty = [k for k, b in enumerate(buckets) if not b]
    assert not empty, f"{what}: bucket {empty[0]} is empty; every bucket holds at least one parameter"
    missing = sorted(set(range(n)) - set(flat))
    twice = sorted(i for i in set(flat) if flat.count(i) > 1)
    wrong = sorted(i for i in set(flat) if not 0 <= i < n)
    assert not (missing or twice or wrong), (
        f"{what}: the buckets must hold each of the {n} indices exactly once; missing {missing[:6]}, "
        f"twice {twice[:6]}, out of range {wrong[:6]}")


def check_cap(buckets: list[list[int]], nbytes: Sequence[int], cap: int, *, what: str) -> None:
    """A bucket's bytes stay within `cap`, unless it holds one parameter larger than the cap."""
    for k, b in enumerate(buckets):
        assert len(b) == 1 or _size(b, nbytes) <= cap, (
            f"{what}: bucket {k} {b[:6]} holds {_size(b, nbytes)} B, above the cap of {cap} B; close a bucket "
            "before a parameter would take it past the cap (only a parameter larger than the cap may stand alone)")


def check_one_dtype(buckets: list[list[int]], dtypes: Sequence, *, what: str) -> None:
    """One dtype per bucket: a flat buffer has one dtype."""
    for k, b in enumerate(buckets):
        kinds = sorted({str(dtypes[i]) for i in b})
        assert len(kinds) <= 1, (f"{what}: bucket {k} {b[:6]} mixes {kinds}; one flat buffer holds one dtype, so "
                                 "a dtype change must close the bucket")


def check_full(buckets: list[list[int]], nbytes: Sequence[int], dtypes: Sequence, cap: int, *, what: str) -> None:
    """No two neighbouring buckets would fit together under the cap (one dtype): each bucket more
    is one more allreduce, one more latency α, for nothing."""
    for k, (a, b) in enumerate(itertools.pairwise(buckets)):
        together = _size(a, nbytes) + _size(b, nbytes)
        same = len({str(dtypes[i]) for i in a + b}) == 1
        assert not (same and together <= cap), (
            f"{what}: buckets {k} and {k + 1} hold {_size(a, nbytes)} B + {_size(b, nbytes)} B = {together} B"
            f"{' (exactly the cap)' if together == cap else ''}, within the cap of {cap} B: they would fit in one; "
            "a bucket closes only when the next parameter no longer fits (or its dtype differs)")


def check_arrival_order(buckets: list[list[int]], n: int, *, what: str) -> None:
    """With gradients arriving in `arrival_order(n)` and buckets launched in index order, each
    bucket is a run of consecutive arrivals, and the runs come in arrival order: no full bucket
    waits behind one still filling, and every bucket but the last goes out before backward ends."""
    position = {i: pos for pos, i in enumerate(arrival_order(n))}
    runs = [sorted(position[i] for i in b) for b in buckets]
    for k, run in enumerate(runs):
        assert run == list(range(run[0], run[0] + len(run))), (
            f"{what}: bucket {k} {buckets[k][:6]} is not a run of consecutive arrivals (gradients arrive in the "
            f"order {arrival_order(n)[:6]}...): it would wait for a late gradient while earlier ones sit in it")
    for k, (a, b) in enumerate(itertools.pairwise(runs)):
        assert a[-1] < b[0], (
            f"{what}: bucket {k} {buckets[k][:6]} completes after bucket {k + 1} {buckets[k + 1][:6]} "
            f"(gradients arrive in the order {arrival_order(n)[:6]}...): launched in index order, a full bucket "
            "would wait behind it; order the buckets as the gradients arrive")
