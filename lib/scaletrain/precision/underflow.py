"""Why loss scaling exists, measured: how much of a real gradient fp16 loses, with and without S.

fp16 (1 sign, 5 exponent, 10 mantissa bits) represents normal numbers down to 2^-14 ≈ 6.1e-5,
subnormals down to 2^-24 ≈ 6e-8 with ever fewer bits, and rounds anything smaller to 0; its
largest value is 65504. bf16 (8 exponent bits, 7 mantissa bits) has fp32's range: it underflows
only below ~1e-38 but keeps 3 significant digits. Micikevicius et al. (2018, Fig. 3) show that
much of an SSD's activation-gradient histogram lies below 2^-24; "Large-scale DL optimizations"
§1.2.7 gives the rule of thumb: scale until the largest gradient is close to 65504.

Two measurements on a real model (the course's tiny GPT in the notebook and tests):
  * `cast_report`: the fp32 gradient cast to a 16-bit format after multiplying by S: which
    fraction of its non-zero elements becomes 0 (lost), subnormal (precision lost) or inf;
  * `half_backward_report`: a real backward in fp16/bf16 on S·loss, divided by S in fp32, against
    the fp32 gradient: the fraction of non-zero elements lost, and the relative error.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = ["CastReport", "cast_report", "gradients", "half_backward_report", "SMALLEST_NORMAL", "SMALLEST_SUBNORMAL"]

SMALLEST_NORMAL = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126}
SMALLEST_SUBNORMAL = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133}


@dataclass(frozen=True)
class CastReport:
    """Fractions of the non-zero elements of a gradient after the cast (they sum to ≤ 1)."""
    dtype: torch.dtype
    scale: float
    lost: float          # became exactly 0
    subnormal: float     # non-zero but below the smallest normal: fewer mantissa bits
    overflow: float      # became ±inf
    count: int           # non-zero elements looked at


def _check_scale(fn: str, scale: float) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{fn}: scale must be a finite number > 0, got {scale!r}")


def cast_report(values: torch.Tensor, dtype: torch.dtype = torch.float16, *, scale: float = 1.0) -> CastReport:
    """What casting S·values (fp32) to `dtype` does to its non-zero elements."""
    if dtype not in SMALLEST_NORMAL:
        raise ValueError(f"cast_report: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    _check_scale("cast_report", scale)
    nz = values.detach().float().flatten()
    nz = nz[nz != 0]
    if nz.numel() == 0:
        raise ValueError("cast_report: every element is 0; nothing can underflow")
    cast = (nz * scale).to(dtype)
    zero = cast == 0
    inf = torch.isinf(cast)
    sub = ~zero & ~inf & (cast.float().abs() < SMALLEST_NORMAL[dtype])
    n = nz.numel()
    return CastReport(dtype, float(scale), zero.sum().item() / n, sub.sum().item() / n, inf.sum().item() / n, n)


def gradients(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """One fp32 backward of `model(idx, targets) -> (logits, loss)`: the parameter gradients and
    the activation gradients (each block's output), flattened. Leaves `model`'s grads set."""
    acts: list[torch.Tensor] = []

    def keep(_module, _inputs, out):
        out.register_hook(lambda g: acts.append(g.detach().flatten().clone()))

    blocks = getattr(model, "blocks", [])
    handles = [b.register_forward_hook(keep) for b in blocks]
    try:
        model.zero_grad(set_to_none=True)
        model(idx, targets)[1].backward()
    finally:
        for h in handles:
            h.remove()
    params = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {"parameters": params, "activations": torch.cat(acts) if acts else params.new_empty(0)}


@dataclass(frozen=True)
class BackwardReport:
    dtype: torch.dtype
    scale: float
    lost: float          # non-zero in fp32, exactly 0 after the 16-bit backward
    rel_error: float     # ‖g16/S − g32‖ / ‖g32‖ (inf when the 16-bit gradient overflowed)
    nonfinite: int       # elements that came out inf or NaN


def half_backward_report(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor,
                         dtype: torch.dtype = torch.float16, *, scale: float = 1.0) -> BackwardReport:
    """Backward of a 16-bit copy of `model` (fp32, left untouched) on S·loss, against fp32."""
    if dtype not in SMALLEST_NORMAL:
        raise ValueError(f"half_backward_report: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    _check_scale("half_backward_report", scale)
    ref = copy.deepcopy(model)
    g32 = gradients(ref, idx, targets)["parameters"]
    half = copy.deepcopy(model).to(dtype)
    (half(idx, targets)[1].float() * scale).backward()   # the scaled loss, as DynamicLossScaler does
    g16 = torch.cat([p.grad.float().flatten() for p in half.parameters() if p.grad is not None]) / scale
    nz = g32 != 0
    finite = torch.isfinite(g16)
    rel = ((g16 - g32).norm() / g32.norm()).item() if finite.all() else math.inf
    return BackwardReport(dtype, float(scale), ((g16 == 0) & nz).sum().item() / nz.sum().item(), rel,
                          int((~finite).sum()))
