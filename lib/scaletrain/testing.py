"""What "matches" means everywhere: one scale-aware comparison and one single-process reference.

The tests, the notebooks, the ZeRO checks and the grader all compare through this module, so a
tolerance means the same thing in each of them.

Comparison. An absolute tolerance lets a wrong answer pass: softmax rows of 1000 entries hold
values near 1e-3, so an all-zeros output is within atol=1e-2 of the truth (KernelBench's finding,
Ouyang et al. 2025). The error here is normwise:
    rel_error(a, e) = max |a - e| / max |e|
so all zeros scores exactly 1.0 whatever the size, and `assert_close` passes when
    max |a - e| <= atol + rtol * max |e|.
NaN and inf must sit at the same places as in the reference (a fully masked softmax row is NaN in
torch too) and are then left out. Numbers (ints, floats) compare by the same rule, exactly in
Python: the memory formulas return integers beyond float64's 2^53.

Agreement across ranks. A check that fails on one rank only must fail on all of them (`agree`,
`agreed`): the others would run ahead into the next collective and a wrong answer would end as a
deadlock instead of a message.

Reference. Data parallelism over N ranks computes the mean of N micro-batch gradients;
`mean_gradients` computes it in one process, each rank's gradient first and summed in rank order,
as the allreduce has them.

Torch loads on first use, not at import: the grader's arithmetic-only groups compare numbers.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

__all__ = ["TOLERANCE", "rel_error", "assert_close", "expect_equal", "agree", "agreed", "mean_gradients"]


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _ByDtypeName(dict):
    """A dict keyed by dtype name ("float32") that also answers torch dtypes (torch.float32)."""

    def __missing__(self, dtype):
        return self[_dtype_name(dtype)]


# Normwise relative error allowed per storage dtype: a few units of the output's rounding
# (fp16 2^-11, bf16 2^-8) on top of fp32 accumulation.
TOLERANCE = _ByDtypeName(float64=1e-10, float32=2e-5, float16=4e-3, bfloat16=2e-2)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _error_and_scale(actual, expected) -> tuple[float, float]:
    """(max |a - e|, max |e|) over the entries where `expected` is finite; error inf when the
    NaN or inf entries differ. Tensors of the same shape, compared in float64."""
    import torch

    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    finite = torch.isfinite(e)
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(a[torch.isinf(e)], e[torch.isinf(e)]):
        return math.inf, 0.0
    a, e = a[finite], e[finite]
    if not torch.isfinite(a).all():
        return math.inf, 0.0
    if e.numel() == 0:
        return 0.0, 0.0
    return (a - e).abs().max().item(), e.abs().max().item()


def rel_error(actual, expected, *, floor: float = 1e-12) -> float:
    """max |actual - expected| / max(max |expected|, floor), in float64; inf if the shapes or the
    NaN and inf positions differ. Tensors or numbers; `floor` only guards an all-zero `expected`."""
    if _is_number(expected) and _is_number(actual):
        return abs(actual - expected) / max(abs(expected), floor)
    if actual.shape != expected.shape:
        return math.inf
    err, scale = _error_and_scale(actual, expected)
    return err / max(scale, floor)


def assert_close(actual, expected, *, rtol: float | None = None, atol: float = 0.0, floor: float = 1e-12,
                 what: str = "result", check_dtype: bool = False) -> None:
    """AssertionError naming `what` unless max |a - e| <= atol + rtol * max(max |e|, floor).

    `expected` a tensor: `actual` must be a tensor of its shape (and dtype, with `check_dtype`),
    NaN and inf where it has them; `rtol` defaults to TOLERANCE of actual's dtype (float32's for
    other dtypes). `expected` a number: `actual` must be an int or float (not a bool), `rtol`
    defaults to float64's, and `floor` is not applied (rtol=0 or expected=0 demand equality). An
    all-zeros answer fails whenever `expected` is not ~0."""
    if _is_number(expected):
        if not _is_number(actual):
            raise AssertionError(f"{what} returned {type(actual).__name__} {actual!r}; "
                                 f"expected a number like {expected}")
        if not abs(actual - expected) <= atol + (TOLERANCE["float64"] if rtol is None else rtol) * abs(expected):
            rel = f" (relative error {rel_error(actual, expected):.2g})" if expected else ""
            raise AssertionError(f"{what} = {actual:,}, expected {expected:,}{rel}")
        return
    if not hasattr(actual, "detach"):
        raise AssertionError(f"{what}: expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if check_dtype and actual.dtype != expected.dtype:
        raise AssertionError(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    if rtol is None:
        rtol = TOLERANCE.get(_dtype_name(actual.dtype), TOLERANCE["float32"])
    err, scale = _error_and_scale(actual, expected)
    if math.isinf(err):
        raise AssertionError(f"{what}: NaN or inf where the reference has none, or the reverse")
    bound = atol + rtol * max(scale, floor)
    if not err <= bound:
        raise AssertionError(f"{what}: relative error {err / max(scale, floor):.3g} > {rtol:.1g}"
                             f"{f' + atol {atol:.1g}' if atol else ''} (max |a - e| {err:.3g}, max |e| {scale:.3g})")


def expect_equal(got, want, *, what: str) -> None:
    """AssertionError "{what}: got {got}, expected {want}" unless `got == want`: exact answers
    (counts, bytes, orders, layouts), where a tolerance would hide an off-by-one. `what` names the
    call and its configuration, e.g. "in_flight_microbatches(pp=4, num_microbatches=8)". Two
    sequences (or dicts) also get the first index (key) where they differ."""
    if got != want:
        raise AssertionError(f"{what}: got {_short(got)}, expected {_short(want)}{_first_difference(got, want)}")


def _short(value, limit: int = 240) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 5] + " ...]"


def _first_difference(got, want) -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        keys = [k for k in [*want, *got] if got.get(k, _MISSING) != want.get(k, _MISSING)]
        k = keys[0]
        return f" (first difference at key {k!r}: got {_short(got.get(k, _MISSING))}, expected {_short(want.get(k, _MISSING))})"
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        k = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        sizes = f"lengths {len(got)} and {len(want)}; " if len(got) != len(want) else ""
        mine, theirs = (got[k] if k < len(got) else _MISSING), (want[k] if k < len(want) else _MISSING)
        return f" ({sizes}first difference at index {k}: got {_short(mine)}, expected {_short(theirs)})"
    return ""


class _Missing:
    def __repr__(self) -> str:
        return "<nothing>"


_MISSING = _Missing()


def agree(error: str | None, group: Any = None) -> None:
    """Collective: raise AssertionError(the first error) on every rank of `group` if any rank has
    an `error`; every rank must call it, with None when its own checks passed."""
    import torch.distributed as dist

    errors = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    first = next((e for e in errors if e), None)
    if first:
        raise AssertionError(first)


def agreed(check: Callable) -> Callable:
    """Decorator for `check(obj, ...)`, `obj` holding its process group in `obj.group`: an
    AssertionError on any rank is raised on all of them. Every rank must reach the end of `check`
    (run its collectives before asserting)."""
    @functools.wraps(check)
    def run(obj, *args, **kwargs):
        import torch.distributed as dist

        try:
            check(obj, *args, **kwargs)
            error = None
        except AssertionError as exc:
            error = f"rank {dist.get_rank(obj.group)}: {exc}"
        agree(error, obj.group)
    return run


def mean_gradients(model: nn.Module, micro_batch_loss: Callable[[int], torch.Tensor], dp_world_size: int) -> None:
    """One process, the gradient data parallelism averages: for dp_rank r = 0..N-1 the gradient of
    `micro_batch_loss(r)`, summed in rank order, divided by N, left in each parameter's `.grad`.

    A parameter that some micro-batches leave unused gets the mean with zeros for them; one that
    none uses keeps `.grad = None`, as one process on the whole batch (and torch DDP with
    find_unused_parameters=True) leaves it, so an optimizer skips it."""
    params = [q for q in model.parameters() if q.requires_grad]
    total: list = [None] * len(params)
    for r in range(dp_world_size):
        for q in params:
            q.grad = None
        micro_batch_loss(r).backward()
        for k, q in enumerate(params):
            if q.grad is not None:
                total[k] = q.grad if total[k] is None else total[k].add_(q.grad)
    for q, t in zip(params, total):
        q.grad = None if t is None else t.div_(dp_world_size)
