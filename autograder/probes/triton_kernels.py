"""Running a student's Triton kernels inside the grader's own wrappers (a1, a1b probes).

The worker switches the interpreter on or off before triton is imported (`triton_mode`), hands
the grader's copy of the wrappers a `torch` whose fresh outputs are NaN (`NanOutputs`: an element
no kernel wrote fails the comparison), and turns the interpreter's or compiler's wrapping of an
untouched stub's NotImplementedError back into one (`unwrap_stub`: "not implemented", not `error`).
`graft` puts the student's kernels into the grader's copy of the file.
"""

from __future__ import annotations

import functools
import os
import re
import sys

import torch

from autograder.checks import Flagged, student_module


def triton_mode(interpret: bool) -> None:
    """Switch the Triton interpreter on or off before triton is first imported (Triton decides
    at decoration time whether a kernel is compiled or interpreted)."""
    want = "1" if interpret else "0"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != want:
        raise RuntimeError(f"grader bug: triton was imported before TRITON_INTERPRET={want} was set")
    os.environ["TRITON_INTERPRET"] = want


@functools.cache
def graft(stem: str, kernels: tuple[str, ...], interpret: bool):
    """The grader's copy of kernels/<stem>.py (the grading build's: given wrappers, stub kernels)
    with the student's `kernels` in place of its stubs."""
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module

    triton_mode(interpret)
    student = student_module(stem)
    grader = load_kernel_module(KERNELS_DIR / f"{stem}.py", name=f"grader_{stem}")
    for name in kernels:
        kernel = getattr(student, name, None)
        if type(kernel).__name__ not in ("JITFunction", "InterpretedFunction"):
            raise AssertionError(f"{stem}.py: `{name}` must stay a @triton.jit kernel (the grader launches it "
                                 f"with the given wrapper), found {type(kernel).__name__}")
        setattr(grader, name, kernel)
    return grader


class NanOutputs:
    """`torch` as the grader's wrappers see it while checking: fresh outputs start as NaN."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty_like(t, **kwargs):
        return torch.empty_like(t, **kwargs).fill_(float("nan"))

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **kwargs).fill_(float("nan"))


def unwrap_stub(fn):
    """The interpreter reports an exception raised in a kernel as InterpreterError("Type('msg')"),
    the compiler a `raise` in a kernel as CompilationError: turn the NotImplementedError of an
    untouched stub back into one, so that it grades as `failed` (not implemented), not `error`."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (NotImplementedError, Flagged):
            raise
        except Exception as exc:
            wrapped = type(exc).__name__ in ("InterpreterError", "CompilationError")
            stub = re.search(r"NotImplementedError\((['\"])(.*?)\1\)", str(exc))
            if wrapped and stub:
                raise NotImplementedError(stub.group(2)) from exc
            raise
    return call
