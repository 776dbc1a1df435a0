"""cross_entropy(logits, target, label_smoothing=0.0, backend=...): the fused criterion as an autograd Function.

    loss = cross_entropy(logits, targets, label_smoothing=0.1, backend="triton")  # mean over rows

Same value and gradient as torch.nn.functional.cross_entropy(logits, target,
label_smoothing=eps, ignore_index=ignore_index) with the mean reduction.  Backends:
  "torch"  the composed version below (log_softmax materialized, what autograd keeps: (rows, V));
  "triton" kernels/cross_entropy_triton.py: one pass over the logits forward, one backward,
           only the per-row log-sum-exp saved (LightSeq2's fused criterion);
  "cuda"   kernels/cross_entropy.cu, the same algorithm;
  "auto"   triton for CUDA tensors, torch on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module, resolve_name
from scaletrain.ops.labels import labelled

__all__ = ["cross_entropy", "naive_cross_entropy_fwd", "naive_cross_entropy_bwd"]


def naive_cross_entropy_fwd(x: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0,
                            ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss per row, L) composed from separate ops; elements moved for (R, V) logits in comments."""
    xf = x.float()                                              # read RV ; write RV (if half)
    lse = torch.logsumexp(xf, dim=1)                            # read RV ; write R (several kernels)
    logp = xf - lse[:, None]                                    # read RV + R ; write RV
    safe = target.clamp(min=0)                                  # ignored rows gather column 0, zeroed below
    nll = -logp.gather(1, safe[:, None]).squeeze(1)             # read 2R ; write R
    smooth = -logp.mean(dim=1)                                  # read RV ; write R
    loss = (1 - smoothing) * nll + smoothing * smooth
    return torch.where(target == ignore_index, 0.0, loss), lse


def naive_cross_entropy_bwd(x: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                            smoothing: float = 0.0, ignore_index: int = -100) -> torch.Tensor:
    """dlogits = dloss * (softmax(x) - (1 - eps) onehot(t) - eps / V), ignored rows 0."""
    vocab = x.shape[1]
    p = torch.exp(x.float() - lse[:, None])                     # read RV + R ; write RV (twice)
    onehot = torch.zeros_like(p).scatter_(1, target.clamp(min=0)[:, None], 1.0)  # write RV
    g = torch.where(target == ignore_index, 0.0, dloss)
    return (g[:, None] * (p - (1 - smoothing) * onehot - smoothing / vocab)).to(x.dtype)  # ~4 passes


@dataclass(frozen=True)
class CrossEntropyBackend:
    """fwd(x, target, smoothing, ignore_index) -> (loss rows fp32, L fp32);
    bwd(x, target, L, dloss, smoothing, ignore_index) -> dx.  Contiguous (rows, V) logits."""
    name: str
    fwd: Callable
    bwd: Callable


def cross_entropy_backend(name: str) -> CrossEntropyBackend:
    if name == "torch":
        return CrossEntropyBackend("torch", naive_cross_entropy_fwd, naive_cross_entropy_bwd)
    if name == "triton":
        kernels = load_kernel_module(KERNELS_DIR / "cross_entropy_triton.py")
        return CrossEntropyBackend("triton", kernels.cross_entropy_fwd, kernels.cross_entropy_bwd)
    if name == "cuda":
        from scaletrain.ops import attention_cuda
        ext = attention_cuda.load()
        return CrossEntropyBackend("cuda", ext.cross_entropy_fwd, ext.cross_entropy_bwd)
    raise ValueError(f"unknown cross_entropy backend {name!r}; choose torch, triton or cuda")


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, target, smoothing, ignore_index, impl):
        loss_rows, lse = impl.fwd(x, target, smoothing, ignore_index)
        ctx.save_for_backward(x, target, lse)  # the logits (an input) and R floats: no probabilities
        ctx.smoothing, ctx.ignore_index, ctx.impl = smoothing, ignore_index, impl
        return loss_rows

    @staticmethod
    def backward(ctx, dloss_rows):
        x, target, lse = ctx.saved_tensors
        dx = ctx.impl.bwd(x, target, lse, dloss_rows.float().contiguous(), ctx.smoothing, ctx.ignore_index)
        return dx, None, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0, ignore_index: int = -100,
                  backend: str = "auto") -> torch.Tensor:
    """Mean cross-entropy of (..., V) logits against (...) int64 class indices, as
    torch.nn.functional.cross_entropy(logits.flatten(0, -2), target.flatten(), ...): rows whose
    target is ignore_index count neither in the sum nor in the mean (NaN if every row is ignored,
    as torch)."""
    _check(logits, target, label_smoothing)
    name = resolve_name(backend, logits, "cross_entropy")
    x = logits.reshape(-1, logits.shape[-1]).contiguous()
    t = target.reshape(-1).contiguous()
    valid = t != ignore_index
    if ((t < 0) | (t >= x.shape[1]))[valid].any():
        raise ValueError(f"cross_entropy: targets must lie in [0, {x.shape[1]}) or equal ignore_index={ignore_index}")
    with labelled("cross_entropy"):
        loss_rows = _CrossEntropy.apply(x, t, float(label_smoothing), int(ignore_index), cross_entropy_backend(name))
    return (loss_rows.sum() / valid.sum()).to(logits.dtype)


def _check(logits, target, label_smoothing) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise TypeError("cross_entropy: logits must be a floating-point tensor of shape (..., V)")
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        got = target.dtype if isinstance(target, torch.Tensor) else type(target).__name__
        raise TypeError(f"cross_entropy: target must be an int64 tensor of class indices, got {got}; use target.long()")
    if target.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: target shape {tuple(target.shape)} must be logits' shape without the "
                         f"class dim, {tuple(logits.shape[:-1])}")
    if target.device != logits.device:
        raise ValueError(f"cross_entropy: target is on {target.device}, logits on {logits.device}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must lie in [0, 1], got {label_smoothing}")
    if logits.numel() == 0:
        raise ValueError(f"cross_entropy: empty logits {tuple(logits.shape)}")
