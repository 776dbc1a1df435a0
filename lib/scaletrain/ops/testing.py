"""Scale-aware comparison for kernel outputs, shared by the tests, the notebook and the grader.

An absolute tolerance lets a wrong kernel pass: softmax rows of 1000 entries hold values near
1e-3, so an all-zeros output is within atol=1e-2 of the truth (KernelBench's finding, quoted in
the repository's ANCHORS.md).  The error here is normwise:
    rel_error(a, e) = max |a - e| / max |e|
so all zeros scores exactly 1.0 whatever the row length.  NaNs must sit at the same places
(a fully masked softmax row is NaN in torch too) and are then left out.

`IsolatedWorker` runs test cases in a subprocess whose TRITON_INTERPRET is fixed before
triton is imported (the interpreter tests on CPU, the sm_80 compilation with it off).
"""

from __future__ import annotations

import builtins
import os
import traceback

import torch

__all__ = ["TOLERANCE", "rel_error", "assert_rel_close", "IsolatedWorker"]

# Normwise relative error allowed per storage dtype: a few units of the output's rounding
# (fp16 2^-11, bf16 2^-8) on top of fp32 accumulation.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def rel_error(actual: torch.Tensor, expected: torch.Tensor, *, floor: float = 1e-12) -> float:
    """max |actual - expected| / max(max |expected|, floor), in float64; inf if the shapes or the
    NaN positions differ.  `floor` only guards an all-zero `expected`."""
    if actual.shape != expected.shape:
        return float("inf")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        return float("inf")
    a, e = a[~nan_e], e[~nan_e]
    if a.numel() == 0:
        return 0.0
    if not torch.equal(torch.isinf(a), torch.isinf(e)) or not torch.equal(a[torch.isinf(a)], e[torch.isinf(e)]):
        return float("inf")
    finite = torch.isfinite(e)
    a, e = a[finite], e[finite]
    if a.numel() == 0:
        return 0.0
    return ((a - e).abs().max() / e.abs().max().clamp_min(floor)).item()


def assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, *, tol: float | None = None,
                     what: str = "output", floor: float = 1e-12) -> None:
    """AssertionError naming `what`, the error and the tolerance (default: TOLERANCE of
    expected's dtype) when rel_error(actual, expected) > tol."""
    if tol is None:
        tol = TOLERANCE.get(actual.dtype, TOLERANCE[torch.float32])
    err = rel_error(actual, expected, floor=floor)
    if not err <= tol:
        detail = (f"shape {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
                  if actual.shape != expected.shape else f"relative error {err:.3g} > {tol:.1g}")
        raise AssertionError(f"{what}: {detail} (max-norm relative error vs torch's reference)")


class IsolatedWorker:
    """One Python subprocess whose environment is set BEFORE it imports anything else.

    Triton reads TRITON_INTERPRET when `triton` is first imported (its own tl.max, tl.sum are
    decorated then), so a process that has imported triton cannot switch the interpreter on or
    off.  The tests and the grader run the interpreter's cases in a worker started with
    TRITON_INTERPRET=1, and the sm_80 compilation in one with TRITON_INTERPRET=0, whatever the
    main process did.  `run(fn, *args)` calls a module-level function there and returns its
    result; an exception in the worker is re-raised here as the same type when it is a builtin
    (AssertionError, NotImplementedError, ...) else RuntimeError, with the remote traceback.
    """

    def __init__(self, env: dict[str, str], timeout_s: float = 300.0):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        self.timeout_s = timeout_s
        self._pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                         initializer=_set_env, initargs=(env,))

    def run(self, fn, *args, **kwargs):
        outcome, value = self._pool.submit(_call_reporting, fn, args, kwargs).result(timeout=self.timeout_s)
        if outcome == "ok":
            return value
        exc_type, text = value
        cls = getattr(builtins, exc_type, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        raise cls(f"{text}\n(raised as {exc_type} in the isolated worker)")

    def close(self) -> None:
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()  # a hung case must not keep the test session waiting
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _set_env(env: dict[str, str]) -> None:
    os.environ.update(env)


def _call_reporting(fn, args, kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # report by name: the exception object may not unpickle here
        return "error", (type(exc).__name__, "".join(traceback.format_exception(exc)))
