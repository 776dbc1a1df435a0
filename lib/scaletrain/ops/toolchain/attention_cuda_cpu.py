"""kernels/attention.cu (forward, backward), kernels/attention_mma.cu and attention_mma_bwd.cu (the
same on tensor cores) and kernels/cross_entropy.cu run unmodified on a CPU, in the CUDA emulator.

scaletrain.ops.toolchain.cuda_cpu compiles .cu files as host C++ against its shim (32-lane warps, block
barriers, warp shuffles) and runs their extern "C" launchers; this module declares module 1b's
launchers (fused_launchers.h) to it and wraps them with the "cuda" backend's signatures over CPU
tensors, so the tests check the CUDA kernels' numbers on a machine without a GPU.  Outputs start
as NaN: an element no thread writes fails the comparison.
"""

from __future__ import annotations

import ctypes as c
import functools
import math

import torch

from scaletrain.ops.toolchain import cuda_cpu
from scaletrain.ops.interface import KERNELS_DIR

__all__ = ["attention_fwd", "attention_fwd_mma", "attention_bwd", "attention_bwd_mma", "cross_entropy_fwd",
           "cross_entropy_bwd", "MMA_HEAD_DIMS", "MMA_SOURCES"]

MMA_HEAD_DIMS = (64, 128)  # the head dims attention_mma.cu is instantiated for
MMA_SOURCES = ("attention_mma.cu", "attention_mma_bwd.cu")

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # StDtype of launchers.h
_P, _I = c.c_void_p, c.c_int64
_SIGNATURES = {
    "st_attention_fwd": [c.c_int, _P, _P, _P, _P, _P, _I, _I, _I, _I, c.c_float, c.c_int, _P],
    "st_attention_bwd": [c.c_int, *[_P] * 10, _I, _I, _I, _I, c.c_float, c.c_int, _P],
    "st_cross_entropy_fwd": [c.c_int, _P, _P, _P, _P, _I, _I, c.c_float, _I, _P],
    "st_cross_entropy_bwd": [c.c_int, _P, _P, _P, _P, _P, _I, _I, c.c_float, _I, _P],
}


@functools.cache
def _library():
    lib = cuda_cpu.load(KERNELS_DIR, sources=("attention.cu", "cross_entropy.cu"))
    for name, args in _SIGNATURES.items():
        fn = getattr(lib.dll, name)
        fn.restype, fn.argtypes = c.c_int, args
    return lib


@functools.cache
def _mma_library(folder: str):
    """attention_mma.cu, attention_mma_bwd.cu and their headers, all from `folder` (kernels/, or a
    planted copy in the tests)."""
    lib = cuda_cpu.load(folder, include=folder, sources=MMA_SOURCES)
    for name, like in (("st_attention_fwd_mma", "st_attention_fwd"), ("st_attention_bwd_mma", "st_attention_bwd")):
        fn = getattr(lib.dll, name)
        fn.restype, fn.argtypes = c.c_int, _SIGNATURES[like]
    return lib


def _nan(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def attention_fwd(q, k, v, causal: bool = False, scale: float | None = None):
    """(O, L) of attention.cu for contiguous CPU q (BH, seq_q, d), k, v (BH, seq_k, d)."""
    bh, seq_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (t.contiguous() for t in (q, k, v))
    o, lse = _nan(q.shape, q.dtype), _nan((bh, seq_q), torch.float32)
    _library().call("attention forward", "st_attention_fwd", _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(),
                    v.data_ptr(), o.data_ptr(), lse.data_ptr(), bh, seq_q, k.shape[1], d, scale, int(causal), None)
    return o, lse


def _check_mma(q) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in MMA_HEAD_DIMS:
        raise ValueError(f"attention_mma.cu runs fp16 / bf16 at head dim {' or '.join(map(str, MMA_HEAD_DIMS))}, "
                         f"got {q.dtype} at head dim {q.shape[-1]}; attention.cu's kernels cover the rest")


def attention_fwd_mma(q, k, v, causal: bool = False, scale: float | None = None, *, folder=KERNELS_DIR):
    """(O, L) of attention_mma.cu (mma.sync fragments, emulated by their PTX layout) for contiguous
    fp16 / bf16 CPU q (BH, seq_q, d), k, v (BH, seq_k, d), d in MMA_HEAD_DIMS; ValueError otherwise."""
    bh, seq_q, d = q.shape
    _check_mma(q)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (t.contiguous() for t in (q, k, v))
    o, lse = _nan(q.shape, q.dtype), _nan((bh, seq_q), torch.float32)
    _mma_library(str(folder)).call("attention forward (tensor cores)", "st_attention_fwd_mma", _DTYPES[q.dtype],
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), bh, seq_q,
                                   k.shape[1], d, scale, int(causal), None)
    return o, lse


def attention_bwd(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None):
    """(dQ, dK, dV) of attention.cu's backward from contiguous CPU tensors and the forward's O, L."""
    bh, seq_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    do, q, k, v, o = (t.contiguous() for t in (do, q, k, v, o))
    dq, dk, dv = _nan(q.shape, q.dtype), _nan(k.shape, k.dtype), _nan(v.shape, v.dtype)
    delta = _nan((bh, seq_q), torch.float32)
    _library().call("attention backward", "st_attention_bwd", _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(),
                    v.data_ptr(), o.data_ptr(), do.data_ptr(), lse.contiguous().data_ptr(), delta.data_ptr(),
                    dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), bh, seq_q, k.shape[1], d, scale, int(causal), None)
    return dq, dk, dv


def attention_bwd_mma(do, q, k, v, o, lse, causal: bool = False, scale: float | None = None, *,
                      folder=KERNELS_DIR):
    """(dQ, dK, dV) of attention_mma_bwd.cu (tensor cores) from contiguous fp16 / bf16 CPU tensors and
    the forward's O, L; the head dims of attention_fwd_mma."""
    bh, seq_q, d = q.shape
    _check_mma(q)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    do, q, k, v, o = (t.contiguous() for t in (do, q, k, v, o))
    dq, dk, dv = _nan(q.shape, q.dtype), _nan(k.shape, k.dtype), _nan(v.shape, v.dtype)
    delta = _nan((bh, seq_q), torch.float32)
    _mma_library(str(folder)).call("attention backward (tensor cores)", "st_attention_bwd_mma", _DTYPES[q.dtype],
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), do.data_ptr(),
                                   lse.contiguous().data_ptr(), delta.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                   dv.data_ptr(), bh, seq_q, k.shape[1], d, scale, int(causal), None)
    return dq, dk, dv


def cross_entropy_fwd(x, target, smoothing: float = 0.0, ignore_index: int = -100):
    rows, vocab = x.shape
    loss, lse = _nan((rows,), torch.float32), _nan((rows,), torch.float32)
    _library().call("cross-entropy forward", "st_cross_entropy_fwd", _DTYPES[x.dtype], x.data_ptr(), target.data_ptr(),
                    loss.data_ptr(), lse.data_ptr(), rows, vocab, smoothing, ignore_index, None)
    return loss, lse


def cross_entropy_bwd(x, target, lse, dloss, smoothing: float = 0.0, ignore_index: int = -100):
    rows, vocab = x.shape
    dx = _nan(x.shape, x.dtype)
    _library().call("cross-entropy backward", "st_cross_entropy_bwd", _DTYPES[x.dtype], x.data_ptr(),
                    target.data_ptr(), lse.data_ptr(), dloss.data_ptr(), dx.data_ptr(), rows, vocab, smoothing,
                    ignore_index, None)
    return dx
