"""The "cuda" backend of attention and cross_entropy: kernels/attention.cu, attention_mma.cu,
attention_mma_bwd.cu and cross_entropy.cu behind kernels/attention_binding.cpp, compiled on first
use (torch.utils.cpp_extension.load, cached under $TORCH_EXTENSIONS_DIR like cuda_ext.py's softmax /
LayerNorm extension).

Written in CUDA: the attention forward and backward, the cross-entropy forward and backward.  The
extension's attention_fwd and attention_bwd run the tensor-core kernels (attention_mma*.cu:
mma.sync) for fp16 / bf16 at head dim 64 or 128 on sm_80+ and attention.cu's scalar kernels
otherwise (attention_fwd_uses_mma says which); attention_{fwd,bwd}_{scalar,mma} force one.
Needs a CUDA device, nvcc and the CUDA build of torch.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import torch

from scaletrain.ops.interface import KERNELS_DIR

__all__ = ["SOURCES", "load"]

SOURCES = ("attention_binding.cpp", "attention.cu", "attention_mma.cu", "attention_mma_bwd.cu", "cross_entropy.cu")


@functools.cache
def load(verbose: bool = False):
    """Build (once per source change) and import the extension; a clear error when impossible."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        raise RuntimeError("backend 'cuda' needs a CUDA device and the CUDA build of torch; "
                           "use backend='torch' (CPU) or 'triton'")
    if shutil.which("nvcc") is None:
        raise RuntimeError("backend 'cuda' compiles kernels/*.cu on first use and needs nvcc on PATH "
                           "(set CUDA_HOME or install the CUDA toolkit); backend='triton' needs no nvcc")
    from torch.utils.cpp_extension import load as load_extension
    return load_extension(name="scaletrain_fused_1b", sources=[str(Path(KERNELS_DIR) / s) for s in SOURCES],
                          extra_include_paths=[str(KERNELS_DIR)], extra_cuda_cflags=["-O3"], verbose=verbose)
