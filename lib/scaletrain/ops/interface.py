"""What a backend of scaletrain.ops is: four functions, and the dtypes and devices they run on.

Both the registry (backends.py) and the backends built elsewhere (cuda_ext.py compiles one, a
student's kernel files make another) need this description, and only this, so it lives apart:
backends.py loads cuda_ext.py lazily, and neither has to import the other at the top.

A backend is four functions with one signature set (minitorch's "same low-level signature"):
    softmax_fwd(x, mask: MaskView | None, causal_len) -> y
    softmax_bwd(y, dy) -> dx
    layer_norm_fwd(x, weight | None, bias | None, eps) -> (y, mean, rstd)
    layer_norm_bwd(dy, x, weight | None, mean, rstd, need_dweight, need_dbias) -> (dx, dw | None, db | None)
over contiguous (rows, cols) tensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

__all__ = ["Backend", "BACKEND_DTYPES", "KERNELS_DIR", "check_dtype", "check_device", "triton_interpreter_on"]

KERNELS_DIR = Path(__file__).resolve().parents[3] / "kernels"
BACKEND_DTYPES = {  # backend name -> the dtypes it runs (DTYPES elsewhere: short name -> dtype)
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
                     dtypes: tuple[torch.dtype, ...] = BACKEND_DTYPES["triton"]) -> "Backend":
        """A backend from two modules with the standard functions (e.g. a student's kernels)."""
        return cls(name=name, softmax_fwd=softmax_module.softmax_fwd, softmax_bwd=softmax_module.softmax_bwd,
                   layer_norm_fwd=layer_norm_module.layer_norm_fwd,
                   layer_norm_bwd=layer_norm_module.layer_norm_bwd, dtypes=dtypes)

    def check(self, x: torch.Tensor, op: str) -> None:
        """Clear errors for a dtype or device this backend cannot run."""
        check_dtype(self.name, self.dtypes, x, op)
        check_device(self.name, x, op)


def check_dtype(name: str, dtypes: tuple[torch.dtype, ...], x: torch.Tensor, op: str) -> None:
    if x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: backend {name!r} supports dtypes {names}; got {x.dtype}. "
                        f"Cast the input (x.float()) or use backend='torch'.")


def check_device(name: str, x: torch.Tensor, op: str) -> None:
    if name == "cuda" and not x.is_cuda:
        raise ValueError(f"{op}: backend 'cuda' needs CUDA tensors, got a tensor on {x.device}; "
                         "move it with x.cuda() or use backend='torch' (or 'auto').")
    if name == "triton" and not x.is_cuda and not triton_interpreter_on():
        raise RuntimeError(f"{op}: backend 'triton' on {x.device} tensors needs the Triton interpreter: "
                           "set TRITON_INTERPRET=1 in the environment before Python starts "
                           "(or before triton is imported), or use backend='torch'.")


def triton_interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
