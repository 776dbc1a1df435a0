"""Reusable pieces of every suite: loading the student's module, seeded trials, irregular shapes,
the grader's use of the scale-aware comparison (`scaletrain.testing`), the inputs-unmodified
check and the run-time forbidden-op guards.

Correctness protocol (DESIGN.md): several seeded trials; irregular shapes (non-powers of two,
sizes below and just above the world size); relative error, not only an absolute tolerance
(KernelBench found that an all-zeros softmax passes `atol=1e-2`); inputs checked unmodified;
the reference computed before the student's call.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from scaletrain import testing

if TYPE_CHECKING:  # torch is imported lazily: arithmetic-only groups should not pay 2-6 s for it
    import torch

SUBMISSION_ENV = "AUTOGRADER_SUBMISSION"
SEED_ENV = "AUTOGRADER_SEED"   # set by the Gradescope package; never passed to the untrusted worker
DEFAULT_SEED = 20261122         # the public one: what a student's own `grade` uses


def grading_seed() -> int:
    """The hidden inputs' seed, read when used rather than at import: a runner forked from a zygote
    that imported this module earlier must still see the seed of its own request."""
    return int(os.environ.get(SEED_ENV, DEFAULT_SEED))


class Flagged(Exception):
    """Raised when a submission is caught using what the assignment forbids."""


class StudentCrash(Exception):
    """The process running the student's code died or answered something that is not a message
    (raised by `autograder.untrusted`, and by `rank_failure` for an error no outcome names)."""


# ---------------------------------------------------------------- the student's module

def submission_dir(default: str | os.PathLike | None = None) -> Path:
    """$AUTOGRADER_SUBMISSION when set; else the assignment folder of `default` (a public test's
    `__file__`, or a folder)."""
    if os.environ.get(SUBMISSION_ENV):
        return Path(os.environ[SUBMISSION_ENV]).resolve()
    if default is None:
        raise RuntimeError(f"no submission folder: set {SUBMISSION_ENV} or pass default=__file__")
    path = Path(default).resolve()
    path = path.parent if path.is_file() else path
    return path.parent if path.name == "tests" else path


def student_module(stem: str, default: str | os.PathLike | None = None):
    """Import `<submission>/<stem>.py` as the top-level module `stem`.

    The folder goes first on sys.path and into $AUTOGRADER_SUBMISSION, so ranks started by
    `scaletrain.launch.spawn` import the same file when they unpickle a function from it.
    """
    folder = submission_dir(default)
    path = folder / f"{stem}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the submission must contain {stem}.py "
                                f"(start from the stub in assignments/)")
    os.environ[SUBMISSION_ENV] = str(folder)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    loaded = sys.modules.get(stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
        del sys.modules[stem]  # same stem from another folder (e.g. solution, then stub)
    return importlib.import_module(stem)


# ---------------------------------------------------------------- inputs

def trial_seeds(n: int, salt: int = 0) -> list[int]:
    """`n` seeds derived from the grading seed (recorded in results.json)."""
    seed = grading_seed()
    return [seed + 1000 * salt + i for i in range(n)]


def irregular_sizes(world_size: int) -> list[int]:
    """Sizes that break chunking code: empty, below, at and just above p, and odd large ones."""
    p = world_size
    return sorted({0, 1, max(p - 1, 1), p, p + 1, 2 * p + 3, 1021, 4099})


IRREGULAR_ROWS = ((1, 1), (3, 1), (7, 33), (16, 100), (31, 257), (5, 1000))


# ---------------------------------------------------------------- comparison

def assert_close(actual, expected, *, rtol: float = 1e-5, atol: float = 0.0, what: str = "result"):
    """`scaletrain.testing.assert_close` (max|a - e| <= atol + rtol * max|e|, so an all-zeros answer
    fails whenever e is not ~0), with the dtype checked too: a submission returns what it is given."""
    testing.assert_close(actual, expected, rtol=rtol, atol=atol, what=what, check_dtype=True)


def assert_equal(actual, expected, *, what: str = "result"):
    """Exact equality (integer-valued inputs make a sum exact in any order)."""
    assert_close(actual, expected, rtol=0.0, atol=0.0, what=what)


@contextlib.contextmanager
def inputs_unmodified(*tensors: torch.Tensor, what: str = "input") -> Iterator[None]:
    """Fail if the code inside changes any of `tensors` (students must not scribble on inputs)."""
    import torch

    before = [t.detach().clone() for t in tensors]
    yield
    for i, (t, b) in enumerate(zip(tensors, before)):
        if not torch.equal(t.detach(), b):
            raise AssertionError(f"{what} {i} was modified in place; work on a copy")


def assert_tensor_close(actual, expected: torch.Tensor, *, rtol: float, atol: float = 0.0, what: str,
                        compare_in=None) -> None:
    """The rank suites' tensor comparison: `actual` must be a tensor (a freed one arrives as None),
    then `scaletrain.testing.assert_close`. `compare_in`: None, the dtypes must match; "actual",
    `expected` is cast to a floating `actual`'s dtype (the student's precision at its own
    tolerance); a dtype or its name, both are cast to it ("float64": any float a compressor returns)."""
    import torch

    if not isinstance(actual, torch.Tensor):
        got = "freed (no storage)" if actual is None else f"got {type(actual).__name__} {actual!r}"[:200]
        raise AssertionError(f"{what}: {got}, expected a tensor of shape {tuple(expected.shape)}")
    if compare_in == "actual":
        expected = expected.to(actual.dtype) if actual.dtype.is_floating_point else expected
    elif compare_in is not None:
        dtype = getattr(torch, compare_in) if isinstance(compare_in, str) else compare_in
        actual, expected = actual.to(dtype), expected.to(dtype)
    testing.assert_close(actual, expected, rtol=rtol, atol=atol, what=what, check_dtype=True)


# ---------------------------------------------------------------- failures on ranks

_RANK_ERRORS = {"AssertionError": AssertionError, "NotImplementedError": NotImplementedError,
                "Flagged": Flagged, "TimeoutError": TimeoutError}
_TRANSPORT = ("gloo/transport", "Connection closed")  # a peer gone, not the rank's own mistake


def rank_failure(jobs: list[dict], per_rank: list, *, size_key: str | None = None) -> Exception | None:
    """The first failure among `jobs` on any rank (`autograder.probes.common.run_jobs`' answers),
    rebuilt for `classify`: a rank's own error before a timeout its peer saw waiting for it, and
    before a transport error. `size_key`: the job field naming how many ranks ran it (the rest idled)."""
    for job in jobs:
        ranks = per_rank[:job[size_key]] if size_key else per_rank
        errors = [out[job["name"]]["error"] for out in ranks if "error" in out.get(job["name"], {})]
        if not errors:
            continue
        own = [e for e in errors if e[0] != "TimeoutError" and not any(t in e[1] for t in _TRANSPORT)]
        kind, message = (own or [e for e in errors if e[0] == "TimeoutError"] or errors)[0]
        return _RANK_ERRORS[kind](message) if kind in _RANK_ERRORS else StudentCrash(f"{kind}: {message}")
    return None


# ---------------------------------------------------------------- run-time guards

@contextlib.contextmanager
def forbid_calls(*qualnames: str, modules: tuple = ()) -> Iterator[None]:
    """Make each dotted callable (e.g. "torch.distributed.all_reduce") raise `Flagged` while the
    block runs, also where a student module imported it by name. A name this torch does not have
    is skipped: nothing can call it (torch 2.11, on the lent GPU machines, has no
    `all_gather_single`, which 2.13 added; trapping it there crashed every check that forbids it)."""
    saved = []
    try:
        for qualname in qualnames:
            owner_name, attr = qualname.rsplit(".", 1)
            owner = importlib.import_module(owner_name)
            original = getattr(owner, attr, None)
            if original is None:
                continue

            def trap(*args, __name=qualname, **kwargs):
                raise Flagged(f"called forbidden `{__name}`")

            saved.append((owner, attr, original))
            setattr(owner, attr, trap)
            for mod in modules:
                for key, value in list(vars(mod).items()):
                    if value is original:
                        saved.append((mod, key, original))
                        setattr(mod, key, trap)
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


TORCH_COLLECTIVES = tuple(f"torch.distributed.{name}" for name in (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "all_gather_single", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "broadcast", "broadcast_object_list", "all_to_all", "all_to_all_single", "gather",
    "scatter"))


@contextlib.contextmanager
def forbid_collectives(*modules) -> Iterator[None]:
    """torch.distributed's collectives raise `Flagged` while the block runs: under torch.distributed,
    under distributed_c10d (where they are defined) and wherever `modules` bound them by name. They
    move data that a byte counter at `isend` does not see, so a compressor or a ring must not reach them."""
    import torch.distributed.distributed_c10d as c10d

    with forbid_calls(*TORCH_COLLECTIVES, modules=(c10d, *modules)):
        yield


@contextlib.contextmanager
def forbid_aten(*op_names: str) -> Iterator[None]:
    """Fail with `Flagged` if any of these aten ops (e.g. "_softmax", "native_layer_norm") runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AtenGuard(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # else the first dispatch imports torch._dynamo (~2.5 s)
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in op_names:
                raise Flagged(f"ran forbidden aten op `{name}`")
            return func(*args, **(kwargs or {}))

    with AtenGuard():
        yield
