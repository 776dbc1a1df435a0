"""Running a student's Triton kernels inside the grader's own wrappers (a1, a1b probes).

The worker switches the interpreter on or off before triton is imported (`triton_mode`), hands
the grader's copy of the wrappers a `torch` whose fresh outputs are NaN (`NanOutputs`: an element
no kernel wrote fails the comparison), and turns the interpreter's or compiler's wrapping of an
untouched stub's NotImplementedError back into one (`unwrap_stub`: "not implemented", not `error`).

`graft` puts the student's kernels into the grader's copy of the file without running the
student's module: `kernels_of` takes only the top-level `@triton.jit` functions from the file's
source (its AST) and executes them in a fresh module holding `triton` and `tl`, after checking that
each body names nothing but its arguments, its locals, `tl`, `triton`, the file's other kernels
and a few builtins, and touches no `_private` attribute and assigns none. Module-level code (an
import that patches the launch path, say) never runs where the grader's wrappers launch, and a
launch that changed the launch path anyway is `flagged` (`unwrap_stub` compares before and after).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
import tempfile
import types
from pathlib import Path

import torch

from autograder.checks import Flagged, submission_dir
from autograder.pyparse import parse_python


def triton_mode(interpret: bool) -> None:
    """Switch the Triton interpreter on or off before triton is first imported (Triton decides
    at decoration time whether a kernel is compiled or interpreted)."""
    want = "1" if interpret else "0"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != want:
        raise RuntimeError(f"grader bug: triton was imported before TRITON_INTERPRET={want} was set")
    os.environ["TRITON_INTERPRET"] = want


KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "float", "int", "bool", "abs", "print"})


@functools.cache
def graft(stem: str, kernels: tuple[str, ...], interpret: bool):
    """The grader's copy of kernels/<stem>.py (the grading build's: given wrappers, stub kernels)
    with the student's `kernels` in place of its stubs; the student's module itself never runs."""
    from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module

    triton_mode(interpret)
    student = kernels_of(stem)
    grader = load_kernel_module(KERNELS_DIR / f"{stem}.py", name=f"grader_{stem}")
    for name in kernels:
        kernel = getattr(student, name, None)
        if kernel is None:
            raise AssertionError(f"{stem}.py: no top-level @triton.jit function `{name}` (the grader launches it "
                                 f"with the given wrapper)")
        setattr(grader, name, kernel)
    return grader


@functools.cache
def kernels_of(stem: str) -> types.ModuleType:
    """A module holding `triton`, `tl` and the submitted <stem>.py's top-level @triton.jit functions,
    nothing else of that file. The functions keep their line numbers (Triton reads their source
    from the module's file, and its errors name the student's line)."""
    path = submission_dir() / f"{stem}.py"
    text = path.read_text()
    tree = parse_python(text, path.name)
    jitted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and any(map(_is_jit, n.decorator_list))]
    names = {n.name for n in jitted}
    lines = [""] * len(text.splitlines())
    for node in jitted:
        _check_kernel(node, names, path.name)
        first = min(d.lineno for d in node.decorator_list)
        lines[first - 1:node.end_lineno] = text.splitlines()[first - 1:node.end_lineno]
    lines[0] = "import triton; import triton.language as tl"  # line 1 is the file's header, never a kernel
    out = Path(tempfile.mkdtemp(prefix=f"kernels-{stem}-")) / f"{stem}.py"
    out.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(f"student_kernels_{stem}", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_jit(decorator: ast.expr) -> bool:
    """`@triton.jit` or `@triton.jit(<constant keywords>)`: the one decorator a graded kernel may carry."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    plain = isinstance(target, ast.Attribute) and target.attr == "jit" and \
        isinstance(target.value, ast.Name) and target.value.id == "triton"
    return plain and (call is None or (not call.args and all(isinstance(k.value, ast.Constant) for k in call.keywords)))


def _check_kernel(node: ast.FunctionDef, kernels: set[str], filename: str) -> None:
    """AssertionError naming the line if the kernel reaches beyond its arguments, its locals, `tl`,
    `triton`, the file's other kernels and KERNEL_BUILTINS (module-level names of the file don't
    exist where the grader launches it), or touches or assigns an attribute it has no business with."""
    if len(node.decorator_list) != 1:
        _refuse(filename, node, f"`{node.name}` may carry @triton.jit only")
    args = node.args
    local = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    allowed = local | kernels | KERNEL_BUILTINS | {"tl", "triton"}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Lambda, ast.ClassDef)) or \
                (isinstance(sub, ast.FunctionDef) and sub is not node):
            _refuse(filename, sub, f"`{node.name}`: no {type(sub).__name__.lower()} inside a kernel")
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in allowed:
            _refuse(filename, sub, f"`{node.name}` uses `{sub.id}`, which is not defined where the grader launches "
                                   "it: a kernel may use its arguments, its locals, tl, triton and the file's "
                                   "other @triton.jit functions (pass constants as tl.constexpr arguments)")
        elif isinstance(sub, ast.Attribute) and (sub.attr.startswith("_") or not isinstance(sub.ctx, ast.Load)):
            _refuse(filename, sub, f"`{node.name}`: `.{sub.attr}` is not for a kernel to touch")


def _refuse(filename: str, node: ast.AST, why: str):
    raise AssertionError(f"{filename}:{node.lineno}: {why}")


def _launch_path() -> dict:
    """Identity of everything a launch goes through: Triton's launcher classes' attributes."""
    import triton
    from triton.runtime import jit

    classes = [jit.JITFunction, jit.KernelInterface, triton.runtime.Autotuner]
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is not None:
        classes += [c for c in vars(interp).values() if isinstance(c, type) and c.__module__ == interp.__name__]
    return {(c.__qualname__, k): id(v) for c in classes for k, v in vars(c).items()}


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
    untouched stub back into one, so that it grades as `failed` (not implemented), not `error`.
    A call after which Triton's launch path is not what it was is `flagged`."""
    def call(*args, **kwargs):
        before = _launch_path()
        try:
            out = fn(*args, **kwargs)
        except (NotImplementedError, Flagged):
            raise
        except Exception as exc:
            wrapped = type(exc).__name__ in ("InterpreterError", "CompilationError")
            stub = re.search(r"NotImplementedError\((['\"])(.*?)\1\)", str(exc))
            if wrapped and stub:
                raise NotImplementedError(stub.group(2)) from exc
            raise
        if _launch_path() != before:
            raise Flagged("Triton's launch path changed while your kernels ran")
        return out
    return call
