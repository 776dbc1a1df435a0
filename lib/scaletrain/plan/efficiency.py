"""How close to peak a transformer layer runs, from the shapes of its matrix multiplies (roofline).

A GEMM (x × k)·(k × y) does 2·x·k·y FLOPs and moves at least 2·(x·k + k·y + x·y) bytes of 16-bit
operands, so at peak P and memory bandwidth W its time per FLOP is at least

    (1/P) · (1 + (2P/W) · (1/x + 1/k + 1/y))

The smaller a side, the further from peak. A Megatron layer on one tensor-parallel rank runs six
of them per microbatch of b sequences (`scaletrain.plan.flops.layer_gemms`): sides b·s (the
tokens), h and h/t (the rank's slice of each weight, Shoeybi et al. 2019, §3), and, inside
attention, s and the head dimension h/a. Weighting each GEMM's 1/x + 1/k + 1/y by its share of
the FLOPs gives the layer's roofline overhead O(b·s, h, h/t, s, h/a), and

    peak / achieved = a + kappa · O

Two coefficients: `a`, what even infinitely large GEMMs lose (the layer's non-GEMM work,
LayerNorm, GeLU, softmax, dropout, rides along with them), and `kappa` = 2P/W, the roofline's
slope in FLOP/B, i.e. an effective bandwidth W = 2P/kappa. `scaletrain.plan.calibrate` fits both
by least squares on the first seven rows of Narayanan et al. 2021, Table 1. The seminar notes'
§1.2.5.3 trade-off (a larger microbatch uses the GPU better) is the 1/(b·s) part of O; the
paper's observation that small t·h/t GEMMs hurt (§3.3) is the 1/(h/t) part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["Gemm", "GemmEfficiency", "roofline_overhead"]

Gemm = tuple[float, float, float, float]  # (FLOPs, x, k, y) of (x × k)·(k × y)


def roofline_overhead(gemms: Iterable[Gemm]) -> float:
    """O = Σ flops·(1/x + 1/k + 1/y) / Σ flops, in 1/elements."""
    gemms = list(gemms)
    if not gemms or any(min(g) <= 0 for g in gemms):
        raise ValueError(f"roofline_overhead: need GEMMs with positive FLOPs and sides, got {gemms!r}")
    total = sum(f for f, *_ in gemms)
    return sum(f * (1 / x + 1 / k + 1 / y) for f, x, k, y in gemms) / total


@dataclass(frozen=True, kw_only=True)
class GemmEfficiency:
    """peak / achieved = a + kappa · roofline_overhead(gemms); a > 0, kappa >= 0 (FLOP/B)."""
    a: float
    kappa: float = 0.0

    def __post_init__(self):
        for f in ("a", "kappa"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"GemmEfficiency: {f} must be a number >= 0, got {v!r}")
        if self.a + self.kappa == 0:
            raise ValueError("GemmEfficiency: a and kappa are both 0 (infinitely fast GEMMs)")

    def slowdown(self, gemms: Iterable[Gemm]) -> float:
        """peak / achieved for a layer made of `gemms`."""
        return self.a + self.kappa * roofline_overhead(gemms)

    def __call__(self, gemms: Iterable[Gemm]) -> float:
        """achieved / peak."""
        return 1.0 / self.slowdown(gemms)

    def bandwidth(self, peak_flops: float) -> float:
        """The effective memory bandwidth W = 2P/kappa (B/s) the fit implies."""
        return float("inf") if self.kappa == 0 else 2 * peak_flops / self.kappa
