"""a3 task 3.1's verdicts: the student's `assign_buckets` (called in the sandboxed worker on
parameter shapes and caps sent as data) against the properties of the assignment and the
reference `scaletrain.dp.bucket.assign_buckets`."""

from __future__ import annotations

import itertools
import random

from autograder import checks

from .inputs import _as_tensors, _hidden_cases, _nbytes, _reference_assign
from .names import C_CAP, C_DTYPE, C_ORDER, PROBE

def _call_assign(remote, specs, cap):
    got = remote.assign_buckets(specs, cap)
    assert isinstance(got, list) and all(isinstance(b, list) for b in got), \
        f"assign_buckets must return a list of lists of indices, got {str(got)[:80]}"
    assert all(isinstance(i, int) for b in got for i in b), \
        f"assign_buckets must return lists of int indices, got {str(got)[:80]}"
    return got


def _check_order(remote, specs, cap) -> None:
    want = list(reversed(range(len(specs))))
    flat = [i for b in _call_assign(remote, specs, cap) for i in b]
    assert flat == want, (f"{len(specs)} parameters, cap {cap} B: concatenated buckets are {flat[:8]}..., "
                          f"expected {want[:8]}... (last registered first, each once)")


def _check_cap(remote, specs, cap) -> None:
    """Within the cap, greedy (the next bucket's first parameter did not fit), and, when the
    order is right (the other check's business), the reference's buckets."""
    want = _reference_assign()(_as_tensors(specs), cap)  # the reference first
    got = _call_assign(remote, specs, cap)
    size = lambda b: sum(_nbytes(specs[i]) for i in b)  # noqa: E731
    assert sorted(i for b in got for i in b) == list(range(len(specs))), (  # else the loops below check nothing
        f"cap {cap} B: the buckets hold {sum(map(len, got))} indices, expected each of 0..{len(specs) - 1} once")
    for b in got:
        assert b, f"cap {cap} B: an empty bucket"
        assert len(b) == 1 or size(b) <= cap, f"cap {cap} B: bucket {b[:6]} holds {size(b)} B"
    for a, b in itertools.pairwise(got):
        assert size(a) + _nbytes(specs[b[0]]) > cap, (
            f"cap {cap} B: parameter {b[0]} would still fit in bucket {a[:6]} ({size(a) + _nbytes(specs[b[0]])} B"
            f"{', exactly the cap' if size(a) + _nbytes(specs[b[0]]) == cap else ''}): fill each bucket greedily "
            "before opening the next")
    if [i for b in got for i in b] == list(reversed(range(len(specs)))):
        assert got == want, f"cap {cap} B: buckets {str(got)[:80]}, expected {str(want)[:80]}"


def _check_dtypes(remote, mixed) -> None:
    want = _reference_assign()(_as_tensors(mixed), 10**6)
    got = _call_assign(remote, mixed, 10**6)
    assert sorted(sorted(b) for b in got) == sorted(sorted(b) for b in want), (  # order: the other check's
        f"dtypes {[str(d).split('.')[-1] for _, d in mixed]} with a large cap: got {got}, expected {want} "
        "(one flat buffer holds one dtype)")


def group_buckets(ctx):
    import torch
    cases = _hidden_cases(random.Random(checks.trial_seeds(1, salt=31)[0]))
    remote = ctx.remote("dp_bucket", probe=f"{PROBE}:with_params")
    with ctx.check(C_ORDER):
        for specs, caps in cases:
            for cap in caps:
                _check_order(remote, specs, cap)
    with ctx.check(C_CAP):
        for specs, caps in cases:
            for cap in caps:
                _check_cap(remote, specs, cap)
        small = [((10,), torch.float32), ((1000,), torch.float32), ((10,), torch.float32)]
        got = _call_assign(remote, small, 100)
        assert got == [[2], [1], [0]], f"cap 100 B, sizes 40/4000/40 B: got {got}, expected [[2], [1], [0]]"
    with ctx.check(C_DTYPE):
        f32, f64 = torch.float32, torch.float64
        for mixed in ([((3,), f32), ((3,), f64), ((3,), f64), ((3,), f32)],
                      [((2,), f32), ((2,), f64), ((2,), f32)]):  # the second: the public test's
            _check_dtypes(remote, mixed)
