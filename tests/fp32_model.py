"""An fp32 arithmetic model of what a GPU compiler may do to a Triton function's expressions.

The Triton interpreter evaluates `a * b + c` as numpy does: the product rounded to fp32, then the
sum rounded.  On a GPU, Triton (enable_fp_fusion, the default) and nvcc (-fmad=true, the default)
fuse it into one FMA that rounds once, and Triton's fp32 `/` is `div.full.f32`, an approximation
within 2 ulp.  LayerNorm's backward at N = 1 (dx exactly 0 in torch) came out 1e-5..6e-5 on an
H200 for both reasons (issue 29) while the interpreter said 0.

`run(fn, *args, fuse=..., div_ulps=...)` calls the plain Python body of a `@triton.jit` helper
(`fn.fn`) on `Fp32` values: a product stays exact (float64 holds the product of two fp32 numbers
exactly) until an addition fuses it (`fuse` = "left" or "right": which operand's product, when
both are) or something else rounds it; `/` lands `div_ulps` ulp away from the rounded quotient;
`tl.math.div_rn` rounds correctly.
"""

from __future__ import annotations

import types

import numpy as np

__all__ = ["Fp32", "run"]


def _f32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64).astype(np.float32).astype(np.float64)


class Fp32:
    """An fp32 array; `exact` marks an unrounded product (float64) that an add may fuse."""

    fuse: str | None = None  # set by run(): None, "left" or "right"
    div_ulps: int = 0

    def __init__(self, v, exact: bool = False):
        self.v, self.exact = np.asarray(v, dtype=np.float64), exact

    def rounded(self) -> np.ndarray:
        return _f32(self.v) if self.exact else self.v

    def __getitem__(self, idx):
        return Fp32(self.v[idx], self.exact)

    def __neg__(self):
        return Fp32(-self.v, self.exact)

    def __mul__(self, other):
        return Fp32(self.rounded() * _val(other), exact=True)

    __rmul__ = __mul__

    def __add__(self, other):
        return _add(self, other if isinstance(other, Fp32) else Fp32(_f32(other)))

    def __radd__(self, other):
        return _add(Fp32(_f32(other)), self)

    def __sub__(self, other):
        return self + (-other if isinstance(other, Fp32) else -_f32(other))

    def __rsub__(self, other):
        return Fp32(_f32(other)) + (-self)

    def __truediv__(self, other):
        return Fp32(_nudge(_f32(self.rounded() / _val(other)), Fp32.div_ulps))

    def __rtruediv__(self, other):
        return Fp32(_nudge(_f32(_f32(other) / self.rounded()), Fp32.div_ulps))


def _val(x) -> np.ndarray:
    return x.rounded() if isinstance(x, Fp32) else _f32(x)


def _add(a: Fp32, b: Fp32) -> Fp32:
    """a + b rounded once; a pending product of one operand (the `fuse` side first) is fused
    (an FMA), every other pending product is rounded first."""
    if Fp32.fuse is None or not (a.exact or b.exact):
        return Fp32(_f32(a.rounded() + b.rounded()))
    keep_a = a.exact and (Fp32.fuse == "left" or not b.exact)
    return Fp32(_f32((a.v if keep_a else a.rounded()) + (b.rounded() if keep_a else b.v)))


def _nudge(q: np.ndarray, ulps: int) -> np.ndarray:
    """q moved `ulps` fp32 ulp away from zero (towards it when negative): div.full.f32's error."""
    if ulps == 0:
        return q
    out = q.astype(np.float32)
    away = np.where(out < 0, -np.inf, np.inf).astype(np.float32) * np.float32(np.sign(ulps))
    for _ in range(abs(ulps)):
        out = np.nextafter(out, away)
    return out.astype(np.float64)


def _div_rn(a, b) -> Fp32:
    return Fp32(_f32(_val(a) / _val(b)))


_TL = types.SimpleNamespace(math=types.SimpleNamespace(div_rn=_div_rn),
                            div_rn=_div_rn, sqrt=lambda x: Fp32(_f32(np.sqrt(_val(x)))))


def run(jit_fn, *args, fuse: str | None, div_ulps: int = 0) -> np.ndarray:
    """jit_fn's Python body on the model (Fp32 for arrays, plain ints stay ints); the result rounded."""
    fn = getattr(jit_fn, "fn", jit_fn)
    body = types.FunctionType(fn.__code__, {**fn.__globals__, "tl": _TL}, fn.__name__, fn.__defaults__)
    Fp32.fuse, Fp32.div_ulps = fuse, div_ulps
    try:
        out = body(*[Fp32(_f32(a)) if isinstance(a, np.ndarray) else a for a in args])
    finally:
        Fp32.fuse, Fp32.div_ulps = None, 0
    return out.rounded()
