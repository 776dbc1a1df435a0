"""linear_cross_entropy(hidden, weight, target): the LM head and its loss, the (N, V) logits never whole.

    loss = linear_cross_entropy(h, lm_head.weight, targets)   # = F.cross_entropy(h @ W.T, targets)

A language model's last layer turns N = batch x sequence hidden states (N, H) into (N, V) logits and
the criterion reads them once.  With V = 128k and N = 16k tokens the fp32 logits alone are 8 GiB,
and autograd keeps them (or the log-probabilities) for the backward: more than the hidden states by
V / H.  Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024, "Liger Kernel: Efficient Triton
Kernels for LLM Training") never holds them whole.  Over chunks of C rows, in the forward:

    z_c  = h_c W^T + b                               (C, V), the only logits alive
    l_c  = lse(z_c) - z_c[y]  (smoothed as torch)     the fused criterion's forward (cross_entropy.py)
    dz_c = (softmax(z_c) - onehot(y_c)) / n_valid     its backward: d(mean loss) / dz, the loss being last
    dh_c = dz_c W ;  dW += dz_c^T h_c ;  db += 1^T dz_c

so the backward only scales dh, dW, db by the incoming gradient (a scalar).  Memory: C V logits
(and the criterion's temporaries of that size) instead of N V, plus dh and dW, which a training step
holds anyway.  C follows Liger's rule, next_pow2(ceil(N / ceil(V / H))): then C V ~ N H, the chunk's
logits are no bigger than the hidden states.  Related: Wijmans et al. 2024 ("Cut Your Losses in
Large-Vocabulary Language Models") compute only the target logit and the log-sum-exp in on-chip
memory, with no chunk of logits in DRAM at all.

Each chunk's criterion is a `cross_entropy` backend: "torch" (composed, CPU), "triton" or "cuda"
(the fused kernels, one pass over the chunk's logits), "auto" (triton for CUDA tensors).
"""

from __future__ import annotations

import math

import torch

from scaletrain.ops.backends import resolve_name
from scaletrain.ops.cross_entropy import CrossEntropyBackend, cross_entropy_backend

__all__ = ["linear_cross_entropy", "liger_chunk_rows"]


def liger_chunk_rows(rows: int, hidden: int, vocab: int) -> int:
    """Liger's chunk: next_pow2(ceil(N / ceil(V / H))) rows, so a chunk's C V logits ~ the N H inputs."""
    return min(rows, 1 << max(0, math.ceil(math.log2(math.ceil(rows / math.ceil(vocab / hidden))))))


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b into the fp32 sum. Half-precision inputs on a GPU: one GEMM on the tensor cores
    that adds into fp32 in place (cuBLAS's mixed-precision GEMM, torch's addmm with out_dtype).
    Elsewhere the product is made in the inputs' dtype and added after: on an H200 that cost a (V, H)
    temporary and its traffic per chunk (bf16, V = 128k, H = 4096: 0.2x the unchunked time, peak 4x
    the logits). CPUs have no mixed-precision addmm."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc += a @ b


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, target, ignore_index, smoothing, chunk, impl: CrossEntropyBackend):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        rows = h.shape[0]
        g = 1.0 / (target != ignore_index).sum().float()        # d(mean) / d(row loss); inf if all ignored, as torch
        loss = torch.zeros((), device=h.device)
        dh = torch.empty_like(h) if need_h else None
        dw = torch.zeros(weight.shape, device=h.device) if need_w else None   # fp32 sums over the chunks
        db = torch.zeros(weight.shape[0], device=h.device) if need_b else None
        for start in range(0, rows, chunk):
            h_c, t_c = h[start:start + chunk], target[start:start + chunk]
            z = h_c @ weight.t() if bias is None else torch.addmm(bias, h_c, weight.t())   # (C, V)
            loss_rows, lse = impl.fwd(z, t_c, smoothing, ignore_index)
            loss += loss_rows.sum()
            dz = impl.bwd(z, t_c, lse, g.expand(t_c.shape[0]).contiguous(), smoothing, ignore_index)
            del z  # the chunk's logits are freed here, before the next chunk's are made
            if need_h:
                dh[start:start + chunk] = dz @ weight
            if need_w:
                _accumulate(dw, dz.t(), h_c)
            if need_b:
                db += dz.sum(0, dtype=torch.float32)
        ctx.save_for_backward(*(t for t in (dh, dw, db) if t is not None))
        ctx.grads = (need_h, need_w, need_b)
        ctx.dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss * g

    @staticmethod
    def backward(ctx, dloss):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * dloss if need else None for need in ctx.grads]   # the chain rule's last factor
        grads = [None if d is None else d.to(dtype) for d, dtype in zip(grads, ctx.dtypes)]
        return (*grads, None, None, None, None, None)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                         chunk_rows: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Mean cross-entropy of hidden (..., H) @ weight (V, H)^T (+ bias (V,)) against target (...), as
    F.cross_entropy(F.linear(hidden, weight, bias).flatten(0, -2), target.flatten(), ignore_index=...,
    label_smoothing=...), computed chunk_rows rows at a time (default: liger_chunk_rows)."""
    _check(hidden, weight, target, bias, chunk_rows, label_smoothing)
    h = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    t = target.reshape(-1).contiguous()
    vocab = weight.shape[0]
    if ((t < 0) | (t >= vocab))[t != ignore_index].any():
        raise ValueError(f"linear_cross_entropy: targets must lie in [0, {vocab}) or equal ignore_index={ignore_index}")
    chunk = chunk_rows or liger_chunk_rows(h.shape[0], h.shape[1], vocab)
    impl = cross_entropy_backend(resolve_name(backend, h, "linear_cross_entropy"))
    loss = _LinearCrossEntropy.apply(h, weight, bias, t, int(ignore_index), float(label_smoothing), chunk, impl)
    return loss.to(hidden.dtype)


def _check(hidden, weight, target, bias, chunk_rows, label_smoothing) -> None:
    if hidden.dim() < 1 or hidden.numel() == 0 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden (..., H), not empty, and weight (V, H) must share H; got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if not hidden.is_floating_point() or weight.dtype != hidden.dtype:
        raise TypeError(f"linear_cross_entropy: hidden and weight must share one floating dtype; got {hidden.dtype} "
                        f"and {weight.dtype} (cast the weight: weight.to(hidden.dtype))")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != hidden.dtype):
        raise ValueError(f"linear_cross_entropy: bias must be ({weight.shape[0]},) of dtype {hidden.dtype}; got "
                         f"{tuple(bias.shape)} {bias.dtype}")
    if target.dtype != torch.int64 or target.shape != hidden.shape[:-1]:
        raise TypeError(f"linear_cross_entropy: target must be int64 of shape {tuple(hidden.shape[:-1])}; got "
                        f"{target.dtype} {tuple(target.shape)} (use target.long())")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must lie in [0, 1], got {label_smoothing}")
