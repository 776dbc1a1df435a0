"""softmax and layer_norm as autograd Functions over the backends (backends.py).

The public functions validate the arguments, flatten to the (rows, cols) view every kernel takes
(rows = all leading dims, cols = the reduced dim), call the backend's forward, and save what the
backward needs: y for softmax (dx = y * (dy - sum dy y) needs nothing else), x, weight, mean and
rstd for LayerNorm.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from scaletrain.ops.backends import Backend, resolve
from scaletrain.ops.labels import labelled
from scaletrain.ops.mask import MaskView

__all__ = ["softmax", "layer_norm"]


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, mask, causal_len, backend):
        view = MaskView.broadcast(mask) if mask is not None else None
        y = backend.softmax_fwd(x2d, view, causal_len)
        ctx.save_for_backward(y)
        ctx.backend, ctx.mask_shape = backend, None if mask is None else mask.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = ctx.backend.softmax_bwd(y, dy.contiguous())
        # y = softmax(x + mask): the additive mask gets the same gradient as x (autograd then
        # sums it over the dims where the mask was broadcast)
        dmask = dx.reshape(ctx.mask_shape) if ctx.needs_input_grad[1] else None
        return dx, dmask, None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, eps, backend):
        y, mean, rstd = backend.layer_norm_fwd(x2d, weight, bias, eps)
        ctx.save_for_backward(x2d, weight, mean, rstd)
        ctx.backend = backend
        ctx.mark_non_differentiable(mean, rstd)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, dy, _dmean, _drstd):
        x2d, weight, mean, rstd = ctx.saved_tensors
        need_dw, need_db = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        dx, dw, db = ctx.backend.layer_norm_bwd(dy.contiguous(), x2d, weight, mean, rstd, need_dw, need_db)
        return dx, dw, db, None, None


def softmax(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, causal: bool = False,
            backend: "str | Backend" = "auto") -> torch.Tensor:
    """softmax(x + mask) along `dim`, numerically stable (max subtracted), differentiable.

    mask: additive float mask broadcastable to x (0 keeps, -inf hides), e.g. (batch, 1, 1, s)
    for (batch, heads, s, s) attention scores; it is read through strides, never expanded.
    causal: hide the future as attention does (LightSeq's mask_future): x must end in (s, s)
    and `dim` must be its last dim; query i sees keys j <= i.  A row with every entry hidden
    gives NaN, as torch.softmax does.
    backend: "auto" | "torch" | "triton" | "cuda" (see scaletrain/ops/backends.py) or a Backend.
    """
    _check_tensor(x, "softmax")
    dim = _check_dim(x, dim, "softmax")
    chosen = resolve(backend, x, "softmax")
    causal_len = _causal_len(x, dim, causal)
    mask = _expand_mask(mask, x, "softmax")
    if x.numel() == 0:
        return torch.empty_like(x)
    moved = x.movedim(dim, -1)
    mask_moved = None if mask is None else mask.movedim(dim, -1)
    with labelled("softmax"):
        y2d = _Softmax.apply(moved.reshape(-1, moved.shape[-1]).contiguous(), mask_moved, causal_len, chosen)
    return y2d.reshape(moved.shape).movedim(-1, dim)


def layer_norm(x: torch.Tensor, normalized_shape: int | Sequence[int], weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5,
               backend: "str | Backend" = "auto") -> torch.Tensor:
    """LayerNorm over the trailing `normalized_shape` dims (as torch.nn.functional.layer_norm):
    y = (x - mean) / sqrt(var + eps) * weight + bias, biased variance, differentiable in x,
    weight and bias.  weight and bias have shape normalized_shape and x's dtype and device."""
    _check_tensor(x, "layer_norm")
    shape = _check_normalized_shape(x, normalized_shape)
    for name, p in (("weight", weight), ("bias", bias)):
        _check_affine(name, p, x, shape)
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"layer_norm: eps must be a non-negative number, got {eps!r}")
    chosen = resolve(backend, x, "layer_norm")
    if x.numel() == 0:
        return torch.empty_like(x)
    cols = math.prod(shape)
    x2d = x.reshape(-1, cols).contiguous()
    w = None if weight is None else weight.reshape(cols).contiguous()  # kernels assume unit stride
    b = None if bias is None else bias.reshape(cols).contiguous()
    with labelled("layer_norm"):
        y2d, _mean, _rstd = _LayerNorm.apply(x2d, w, b, float(eps), chosen)
    return y2d.reshape(x.shape)


# ---- argument checks: each error names the problem and the fix ------------------------------------
def _check_tensor(x, op: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{op}: x must be a floating-point tensor, got {x.dtype}; convert with x.float()")
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension; use x.reshape(1)")


def _check_dim(x: torch.Tensor, dim: int, op: str) -> int:
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise IndexError(f"{op}: dim {dim!r} is out of range for a {x.dim()}-d tensor "
                         f"(use -{x.dim()}..{x.dim() - 1})")
    return dim % x.dim()


def _causal_len(x: torch.Tensor, dim: int, causal: bool) -> int:
    if not causal:
        return 0
    if x.dim() < 2 or dim != x.dim() - 1 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"softmax: causal=True needs scores of shape (..., s, s) with dim=-1, "
                         f"got shape {tuple(x.shape)} and dim={dim}; pass an explicit mask otherwise")
    return x.shape[-1]


def _expand_mask(mask, x: torch.Tensor, op: str):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{op}: mask must be a tensor or None, got {type(mask).__name__}")
    if not mask.is_floating_point():
        raise TypeError(f"{op}: mask must be an additive float mask (0 keeps, -inf hides), got {mask.dtype}; "
                        "convert a boolean keep-mask with torch.where(keep, 0.0, float('-inf'))")
    if mask.device != x.device:
        raise ValueError(f"{op}: mask is on {mask.device} but x is on {x.device}; move it with mask.to(x.device)")
    try:
        shape = torch.broadcast_shapes(mask.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"{op}: mask of shape {tuple(mask.shape)} does not broadcast to x's shape {tuple(x.shape)}")
    return mask.to(x.dtype).expand(x.shape)  # a view: broadcast dims get stride 0


def _check_normalized_shape(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(n, int) for n in shape) or tuple(x.shape[-len(shape):]) != shape \
            or len(shape) > x.dim():
        raise ValueError(f"layer_norm: normalized_shape {normalized_shape!r} must be x's trailing dims; "
                         f"x has shape {tuple(x.shape)}")
    return shape


def _check_affine(name: str, p, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape:
        got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
        raise ValueError(f"layer_norm: {name} must have shape {shape} (normalized_shape), got {got}")
    if p.dtype != x.dtype:
        raise TypeError(f"layer_norm: {name} has dtype {p.dtype} but x has {x.dtype}; cast with {name}.to(x.dtype)")
    if p.device != x.device:
        raise ValueError(f"layer_norm: {name} is on {p.device} but x is on {x.device}")
