"""Backends of scaletrain.ops: "torch" (naive composed ops), "triton", "cuda"; "auto" picks one.

A backend is four functions with one signature set (minitorch's "same low-level signature"):
    softmax_fwd(x, mask: MaskView | None, causal_len) -> y
    softmax_bwd(y, dy) -> dx
    layer_norm_fwd(x, weight | None, bias | None, eps) -> (y, mean, rstd)
    layer_norm_bwd(dy, x, weight | None, mean, rstd, need_dweight, need_dbias) -> (dx, dw | None, db | None)
over contiguous (rows, cols) tensors.  The Triton kernels live in kernels/*.py and are loaded
from there by path (so the reference files are the very ones the assignment's stubs are made
from); the CUDA kernels are compiled on first use (cuda_ext.py).

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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

__all__ = ["Backend", "BACKENDS", "KERNELS_DIR", "get_backend", "resolve", "triton_interpreter_on",
           "load_kernel_module"]

BACKENDS = ("auto", "torch", "triton", "cuda")
KERNELS_DIR = Path(__file__).resolve().parents[3] / "kernels"
DTYPES = {
    "torch": (torch.float32, torch.float16, torch.bfloat16, torch.float64),
    "triton": (torch.float32, torch.float16, torch.bfloat16),
    "cuda": (torch.float32, torch.float16, torch.bfloat16),
}


@dataclass(frozen=True, kw_only=True)
class Backend:
    name: str
    softmax_fwd: Callable
    softmax_bwd: Callable
    layer_norm_fwd: Callable
    layer_norm_bwd: Callable
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def from_modules(cls, name: str, softmax_module: ModuleType, layer_norm_module: ModuleType,
                     dtypes: tuple[torch.dtype, ...] = DTYPES["triton"]) -> "Backend":
        """A backend from two modules with the standard functions (e.g. a student's kernels)."""
        return cls(name=name, softmax_fwd=softmax_module.softmax_fwd, softmax_bwd=softmax_module.softmax_bwd,
                   layer_norm_fwd=layer_norm_module.layer_norm_fwd,
                   layer_norm_bwd=layer_norm_module.layer_norm_bwd, dtypes=dtypes)

    def check(self, x: torch.Tensor, op: str) -> None:
        """Clear errors for a dtype or device this backend cannot run."""
        _check_dtype(self.name, self.dtypes, x, op)
        _check_device(self.name, x, op)


def _check_dtype(name: str, dtypes: tuple[torch.dtype, ...], x: torch.Tensor, op: str) -> None:
    if x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: backend {name!r} supports dtypes {names}; got {x.dtype}. "
                        f"Cast the input (x.float()) or use backend='torch'.")


def _check_device(name: str, x: torch.Tensor, op: str) -> None:
    if name == "cuda" and not x.is_cuda:
        raise ValueError(f"{op}: backend 'cuda' needs CUDA tensors, got a tensor on {x.device}; "
                         "move it with x.cuda() or use backend='torch' (or 'auto').")
    if name == "triton" and not x.is_cuda and not triton_interpreter_on():
        raise RuntimeError(f"{op}: backend 'triton' on {x.device} tensors needs the Triton interpreter: "
                           "set TRITON_INTERPRET=1 in the environment before Python starts "
                           "(or before triton is imported), or use backend='torch'.")


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def load_kernel_module(path: Path | str, *, name: str | None = None) -> ModuleType:
    """Import a kernel file by path, once per (path, interpreter on/off).

    Triton decides at decoration time whether a @triton.jit function is compiled or interpreted,
    so a module imported before TRITON_INTERPRET=1 was set is loaded again under a new name.
    """
    return _load_kernel_module(str(Path(path).resolve()), name, triton_interpreter_on())


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
    stem = name or Path(path).stem
    mod_name = f"scaletrain_kernels_{stem}{'_interpreted' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # Triton's JIT reads the kernels' source through the module
    spec.loader.exec_module(module)
    return module


def _triton_backend() -> Backend:
    return Backend.from_modules("triton", load_kernel_module(KERNELS_DIR / "softmax_triton.py"),
                                load_kernel_module(KERNELS_DIR / "layer_norm_triton.py"))


def _torch_backend() -> Backend:
    from scaletrain.ops import naive
    return Backend.from_modules("torch", naive, naive, dtypes=DTYPES["torch"])


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
        _check_dtype(backend, DTYPES[backend], x, op)  # before building or loading anything
        _check_device(backend, x, op)
        chosen = get_backend(backend)
    else:
        raise ValueError(f"{op}: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    chosen.check(x, op)
    return chosen


_UNAVAILABLE: dict[str, str] = {}  # backend name -> why it failed to load (tried once per process)


def _auto(x: torch.Tensor) -> Backend:
    if not x.is_cuda or x.dtype not in DTYPES["cuda"]:
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
