"""The "cuda" backend: kernels/softmax.cu and kernels/layer_norm.cu behind kernels/torch_binding.cpp,
compiled on first use with torch.utils.cpp_extension.load and cached.

The first call builds (about a minute); torch caches the build under $TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions) keyed by the sources, so later processes only load the .so.
Needs a CUDA device, nvcc and the CUDA build of torch; everything else in scaletrain.ops works
without them.  `make_backend(folder)` builds the same three files from another folder (the a1
grader builds a student's submission this way).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

import torch

from scaletrain.ops.interface import BACKEND_DTYPES, KERNELS_DIR, Backend
from scaletrain.ops.mask import MaskView

__all__ = ["SOURCES", "load", "make_backend"]

SOURCES = ("torch_binding.cpp", "softmax.cu", "layer_norm.cu")


@functools.cache
def load(folder: str = str(KERNELS_DIR), verbose: bool = False):
    """Build (once per source change) and import the extension from `folder`; clear errors
    when that is impossible on this machine."""
    if not torch.cuda.is_available():
        raise RuntimeError("backend 'cuda' needs a CUDA device (torch.cuda.is_available() is False); "
                           "use backend='torch' or 'auto'")
    if torch.version.cuda is None:
        raise RuntimeError("backend 'cuda' needs the CUDA build of torch (this one is CPU-only)")
    if shutil.which("nvcc") is None:
        raise RuntimeError("backend 'cuda' compiles kernels/*.cu on first use and needs nvcc on PATH "
                           "(set CUDA_HOME or install the CUDA toolkit); backend='triton' needs no nvcc")
    missing = [s for s in SOURCES if not (Path(folder) / s).is_file()]
    if missing:
        raise FileNotFoundError(f"cannot build the CUDA kernels: {', '.join(missing)} missing from {folder}")
    from torch.utils.cpp_extension import load as load_extension
    # one extension name per folder: the reference and a submission can be loaded side by side
    tag = hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:8]
    return load_extension(name=f"scaletrain_fused_kernels_{tag}", sources=[str(Path(folder) / s) for s in SOURCES],
                          extra_include_paths=[str(folder)], extra_cuda_cflags=["-O3"], verbose=verbose)


def make_backend(folder: Path | str = KERNELS_DIR) -> Backend:
    """A Backend over the extension built from `folder` (built on the first kernel call)."""
    folder = str(folder)

    def softmax_fwd(x: torch.Tensor, mask: MaskView | None = None, causal_len: int = 0) -> torch.Tensor:
        if mask is None:
            return load(folder).softmax_fwd(x, None, [1, 1], [0, 0, 0, 0], causal_len)
        size1, size2, *strides = mask.kernel_args()
        return load(folder).softmax_fwd(x, mask.tensor, [size1, size2], strides, causal_len)

    def softmax_bwd(y, dy):
        return load(folder).softmax_bwd(y, dy)

    def layer_norm_fwd(x, weight, bias, eps):
        return load(folder).layer_norm_fwd(x, weight, bias, eps)

    def layer_norm_bwd(dy, x, weight, mean, rstd, need_dweight, need_dbias):
        return load(folder).layer_norm_bwd(dy, x, weight, mean, rstd, need_dweight, need_dbias)

    return Backend(name="cuda", softmax_fwd=softmax_fwd, softmax_bwd=softmax_bwd, layer_norm_fwd=layer_norm_fwd,
                   layer_norm_bwd=layer_norm_bwd, dtypes=BACKEND_DTYPES["cuda"])
