"""Backends of scaletrain.ops: "torch" (naive composed ops), "triton", "cuda"; "auto" picks one.

A backend is four functions over contiguous (rows, cols) tensors (interface.py).  The Triton
kernels live in kernels/*.py and are loaded from there by path (so the reference files are the
very ones the assignment's stubs are made from); the CUDA kernels are compiled on first use
(cuda_ext.py, imported only then).

"auto": cuda, then triton for CUDA tensors (a failing CUDA build warns once and falls back);
torch for CPU tensors.  backend="triton" on CPU tensors runs through the Triton interpreter,
which must be switched on (TRITON_INTERPRET=1) before the kernels are first loaded.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from scaletrain.ops.interface import (BACKEND_DTYPES, KERNELS_DIR, Backend, check_device, check_dtype,
                                      triton_interpreter_on)

__all__ = ["Backend", "BACKENDS", "KERNELS_DIR", "get_backend", "resolve", "resolve_name", "triton_interpreter_on",
           "load_kernel_module", "with_switch"]

BACKENDS = ("auto", "torch", "triton", "cuda")


def load_kernel_module(path: Path | str, *, name: str | None = None) -> ModuleType:
    """Import a kernel file by path, once per (path, interpreter on/off).

    Triton decides at decoration time whether a @triton.jit function is compiled or interpreted,
    so a module imported before TRITON_INTERPRET=1 was set is loaded again under a new name. A
    file of kernels/ that a notebook pointed at the student's copy (`student_code.implementation`)
    loads that copy instead, so the notebook's own calls run the student's kernel.
    """
    from scaletrain.student_code import IMPL_ENV
    return _load_kernel_module(_kernel_path(str(path), os.environ.get(IMPL_ENV, "")), name, triton_interpreter_on())


@functools.cache
def _kernel_path(path: str, choices: str) -> str:
    """The real path of the file `path` stands for under the notebook's `choices` (student_code's
    $SCALETRAIN_STUDENT_FILES): two path resolutions, ~30 µs, once per path and choice instead of
    on every call of an op (the ops call load_kernel_module per call; eager code pays it per layer)."""
    from scaletrain.student_code import kernel_file
    return str(kernel_file(path).resolve())


@functools.cache
def _load_kernel_module(path: str, name: str | None, interpret: bool) -> ModuleType:
    if not Path(path).is_file():
        raise FileNotFoundError(f"kernel source {path} not found: scaletrain.ops loads its Triton kernels "
                                "from the repository's kernels/ folder (install with `pip install -e .`)")
    try:
        import triton.language as tl  # fail here with a clear message, not inside the kernel file
    except ImportError as exc:
        raise RuntimeError("backend 'triton' needs the triton package (pip install triton; "
                           "Linux x86-64 wheels only); use backend='torch' instead") from exc
    if interpret != (type(tl.max).__name__ == "InterpretedFunction"):
        # triton's own tl.max, tl.sum were decorated when triton was imported, under the other mode
        raise RuntimeError(f"TRITON_INTERPRET={int(interpret)} now, but triton was imported with it "
                           f"{'unset' if interpret else 'set'}: set TRITON_INTERPRET before the first "
                           "`import triton` (at the top of the script or in the environment)")
    if interpret:
        from scaletrain.ops.toolchain.interpreter_compat import patch_scalar_index
        patch_scalar_index()  # Triton 3.6's interpreter with NumPy >= 2.4: loop bounds from scalars
    stem = name or Path(path).stem
    mod_name = f"scaletrain_kernels_{stem}{'_interpreted' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # Triton's JIT reads the kernels' source through the module
    spec.loader.exec_module(module)
    return module


def with_switch(module: ModuleType, name: str, value, fn):
    """`fn` with the kernel module's switch `name` (e.g. FUSE_DWDB, DQ_BY_ATOMICS) set to `value`
    for each call and restored after: a design the wrapper does not take by default, timed beside
    the default in one benchmark run."""
    def call(*args, **kwargs):
        given = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(module, name, given)
    return call


def _triton_backend() -> Backend:
    return Backend.from_modules("triton", load_kernel_module(KERNELS_DIR / "softmax_triton.py"),
                                load_kernel_module(KERNELS_DIR / "layer_norm_triton.py"))


def _torch_backend() -> Backend:
    from scaletrain.ops import naive
    return Backend.from_modules("torch", naive, naive, dtypes=BACKEND_DTYPES["torch"])


def _cuda_backend() -> Backend:
    from scaletrain.ops import cuda_ext
    cuda_ext.load()  # build now: "auto" must learn here whether CUDA works, not at the first call
    return cuda_ext.make_backend()


_FACTORIES = {"torch": _torch_backend, "triton": _triton_backend, "cuda": _cuda_backend}


def get_backend(name: str) -> Backend:
    """The named backend ("torch", "triton" or "cuda"); the kernels load on first use."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return _FACTORIES[name]()


def resolve(backend: "str | Backend", x: torch.Tensor, op: str) -> Backend:
    """Turn the user's `backend` argument into a Backend that can run on x, or raise clearly."""
    if isinstance(backend, Backend):
        chosen = backend
    elif backend == "auto":
        chosen = _auto(x)
    elif isinstance(backend, str) and backend in _FACTORIES:
        check_dtype(backend, BACKEND_DTYPES[backend], x, op)  # before building or loading anything
        check_device(backend, x, op)
        chosen = get_backend(backend)
    else:
        raise ValueError(f"{op}: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    chosen.check(x, op)
    return chosen


_UNAVAILABLE: dict[str, str] = {}  # backend name -> why it failed to load (tried once per process)


def _auto(x: torch.Tensor) -> Backend:
    if not x.is_cuda or x.dtype not in BACKEND_DTYPES["cuda"]:
        return get_backend("torch")
    for name in ("cuda", "triton"):
        if name in _UNAVAILABLE:
            continue
        try:
            return get_backend(name)
        except Exception as exc:  # a missing compiler or package: say so once, try the next one
            _UNAVAILABLE[name] = str(exc)
            warnings.warn(f"scaletrain.ops: backend {name!r} unavailable ({exc}); falling back",
                          RuntimeWarning, stacklevel=3)
    return get_backend("torch")


def resolve_name(backend: str, x: torch.Tensor, op: str) -> str:
    """The backend name for the ops built outside the four-function Backend record (attention,
    cross_entropy, embedding), checked against x's dtype and device with the same messages.
    "auto": "triton" for CUDA tensors when the triton package is installed (its kernels cover
    forward and backward), "torch" otherwise."""
    if isinstance(backend, Backend):
        raise TypeError(f"{op}: pass a backend name ({', '.join(BACKENDS)}), not a Backend record")
    if backend == "auto":
        fused = x.is_cuda and x.dtype in BACKEND_DTYPES["triton"] and importlib.util.find_spec("triton") is not None
        return "triton" if fused else "torch"
    if not isinstance(backend, str) or backend not in _FACTORIES:
        raise ValueError(f"{op}: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_dtype(backend, BACKEND_DTYPES[backend], x, op)
    check_device(backend, x, op)
    return backend
