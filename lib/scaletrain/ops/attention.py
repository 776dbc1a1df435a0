"""attention(q, k, v, causal=False, backend=...): Softmax(Q K^T / sqrt(d)) V as an autograd Function.

    from scaletrain.ops import attention
    y = attention(q, k, v, causal=True, backend="triton")   # q, k, v: (batch, heads, seq, head_dim)

Backends (the same names as softmax / layer_norm, backends.resolve_name):
  "torch"  attention_naive.py: the composed ops that materialize the (n, n) scores, O(n^2) memory;
  "triton" kernels/attention_triton.py: FlashAttention forward and backward (Dao et al. 2022;
           FlashAttention-2's work split, Dao 2023), O(n d) memory; on CPU tensors through the
           Triton interpreter (TRITON_INTERPRET=1); on a GPU the forward's tile shape is tuned
           (attention_tuning.py; attention_backend("triton", tuned=False): the launcher's tiles);
  "cuda"   kernels/attention.cu: forward and backward, warp-per-row kernels without tensor cores;
           fp16 / bf16 at head dim 64 or 128 on sm_80+ run kernels/attention_mma.cu and
           attention_mma_bwd.cu instead, FlashAttention-2 on tensor cores (mma.sync);
  "auto"   triton for CUDA tensors, torch on CPU.
Every backend's forward returns (O, L) with L = logsumexp of each scaled score row, the only
statistic the backward needs besides Q, K, V and O (FlashAttention-2, Algorithm 2): what is
saved for the backward is O(n d), never the (n, n) probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from scaletrain.ops import attention_naive
from scaletrain.ops.attention_tuning import tuned_attention_fwd
from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module, resolve_name
from scaletrain.ops.labels import labelled

__all__ = ["attention", "attention_backend", "MAX_HEAD_DIM"]

MAX_HEAD_DIM = 128  # the fused kernels' largest head-dim tile (registers / shared memory)


@dataclass(frozen=True)
class AttentionBackend:
    """fwd(q, k, v, causal, scale) -> (o, lse);  bwd(do, q, k, v, o, lse, causal, scale) -> (dq, dk, dv)
    over contiguous (BH, seq, head_dim) tensors."""
    name: str
    fwd: Callable
    bwd: Callable


def attention_backend(name: str, *, tuned: bool = True) -> AttentionBackend:
    """The named attention backend; kernels load (and CUDA builds) on first use. tuned=False:
    triton's forward with its launcher's fixed tiles, as the a1b grader launches a kernel."""
    if name == "torch":
        return AttentionBackend("torch", attention_naive.attention_fwd, attention_naive.attention_bwd)
    if name == "triton":
        kernels = load_kernel_module(KERNELS_DIR / "attention_triton.py")
        return AttentionBackend("triton", tuned_attention_fwd if tuned else kernels.attention_fwd, kernels.attention_bwd)
    if name == "cuda":
        from scaletrain.ops import attention_cuda
        ext = attention_cuda.load()
        return AttentionBackend("cuda", ext.attention_fwd, ext.attention_bwd)
    raise ValueError(f"unknown attention backend {name!r}; choose torch, triton or cuda")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, impl):
        o, lse = impl.fwd(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)  # O(n d): no (n, n) tensor survives the forward
        ctx.causal, ctx.scale, ctx.impl = causal, scale, impl
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ctx.impl.bwd(do.contiguous(), q, k, v, o, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
              backend: str | AttentionBackend = "auto") -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v, differentiable in q, k and v.

    q: (..., seq_q, head_dim); k, v: (..., seq_k, head_dim) with the same leading dims (batch,
    heads), dtype and device.  scale defaults to 1 / sqrt(head_dim).  causal: query i sees keys
    j <= i (torch's is_causal, top-left aligned when seq_q != seq_k).  Matches
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).
    backend: a name, or an AttentionBackend record (e.g. attention_backend("triton", tuned=False)).
    """
    _check(q, k, v)
    impl = backend if isinstance(backend, AttentionBackend) else None
    backend = impl.name if impl else backend
    if backend in ("triton", "cuda") and q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"attention: backend {backend!r} supports head_dim <= {MAX_HEAD_DIM}, got {q.shape[-1]}; "
                         "split the heads further or use backend='torch'")
    name = resolve_name(backend, q, "attention")
    if q.shape[-1] > MAX_HEAD_DIM:
        name = "torch"  # "auto" with heads wider than the kernels' largest tile
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lead, (seq_q, d), seq_k = q.shape[:-2], q.shape[-2:], k.shape[-2]
    if q.numel() == 0:  # no heads: nothing to launch
        return q.new_empty(q.shape)
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], d).contiguous() for t in (q, k, v))
    with labelled("attention"):
        o = _Attention.apply(q3, k3, v3, bool(causal), scale,
                             impl if impl and impl.name == name else attention_backend(name))
    return o.reshape(*lead, seq_q, d)


def _check(q, k, v) -> None:
    """Clear errors: each names the problem and the fix."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"attention: {name} must be a floating-point tensor, got {got}")
        if t.dim() < 2:
            raise ValueError(f"attention: {name} must be (..., seq, head_dim), got shape {tuple(t.shape)}")
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: q (..., seq_q, d) and k, v (..., seq_k, d) must share the leading dims "
                         f"and d; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast with .to()")
    if not q.device == k.device == v.device:
        raise ValueError(f"attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if 0 in (q.shape[-2], k.shape[-2], q.shape[-1]):
        raise ValueError(f"attention: empty sequence or head dim (q {tuple(q.shape)}, k {tuple(k.shape)}); "
                         "every query needs at least one key")
