"""The "torch" backend: softmax and LayerNorm composed from separate PyTorch ops.

This is the naive version the fused kernels are measured against (and the CPU fallback of
`scaletrain.ops`).  Every line is one kernel launch that reads its inputs from DRAM and writes
its output back; the comments count elements moved for an (M, N) input, as in "Fused Kernels"
of techniques-for-large-scale-training.md (softmax: read 5MN + 2M, write 3MN + 2M).  It uses no
torch.softmax / F.layer_norm, so it is also an independent reference for the tests.

Same signatures as kernels/softmax_triton.py, kernels/layer_norm_triton.py and the CUDA
binding: contiguous (rows, cols) tensors in, fp32 mean / rstd.
"""

from __future__ import annotations

import torch

from scaletrain.ops.mask import MaskView

__all__ = ["softmax_fwd", "softmax_bwd", "layer_norm_fwd", "layer_norm_bwd"]


def softmax_fwd(x: torch.Tensor, mask: MaskView | None = None, causal_len: int = 0) -> torch.Tensor:
    rows, cols = x.shape
    if mask is not None:
        x = x + mask.dense(rows, cols)                        # read MN + mask ; write MN
    if causal_len > 0:
        q = torch.arange(rows, device=x.device) % causal_len
        future = torch.arange(cols, device=x.device)[None, :] > q[:, None]
        x = x.masked_fill(future, float("-inf"))              # read MN ; write MN
    x_max = x.amax(dim=1)                                     # read MN ; write M (no argmax)
    z = x - x_max[:, None]                                    # read MN + M ; write MN
    numerator = torch.exp(z)                                  # read MN ; write MN
    denominator = numerator.sum(dim=1)                        # read MN ; write M
    return numerator / denominator[:, None]                   # read MN + M ; write MN


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dot = (dy * y).sum(dim=1, keepdim=True)                   # read 2MN ; write MN, then M
    return y * (dy - dot)                                     # read 3MN + M ; write 2MN


def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Statistics in fp32, as any careful PyTorch user (and torch's own kernel) computes them.
    xf = x.float()                                            # read MN ; write MN (if half)
    mean = xf.mean(dim=1)                                     # read MN ; write M
    xc = xf - mean[:, None]                                   # read MN + M ; write MN
    var = (xc * xc).mean(dim=1)                               # read 2MN ; write MN + M
    rstd = torch.rsqrt(var + eps)                             # M
    y = xc * rstd[:, None]                                    # read MN + M ; write MN
    if weight is not None:
        y = y * weight.float()                                # read MN + N ; write MN
    if bias is not None:
        y = y + bias.float()                                  # read MN + N ; write MN
    return y.to(x.dtype), mean, rstd


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor,
                   rstd: torch.Tensor, need_dweight: bool, need_dbias: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    # The textbook ("Before" on the LightSeq slide) form: xhat and g materialized, two reductions.
    cols = x.shape[1]
    dyf = dy.float()
    xhat = (x.float() - mean[:, None]) * rstd[:, None]        # read MN + 2M ; write MN (x2)
    g = dyf * weight.float() if weight is not None else dyf   # read MN + N ; write MN
    sum_g = g.sum(dim=1, keepdim=True)                        # read MN ; write M
    sum_gxhat = (g * xhat).sum(dim=1, keepdim=True)           # read 2MN ; write MN + M
    dx = (g - (sum_g + xhat * sum_gxhat) / cols) * rstd[:, None]  # ~5 passes over MN
    dweight = (dyf * xhat).sum(dim=0).to(x.dtype) if need_dweight else None  # read 2MN
    dbias = dyf.sum(dim=0).to(x.dtype) if need_dbias else None               # read MN
    return dx.to(x.dtype), dweight, dbias
