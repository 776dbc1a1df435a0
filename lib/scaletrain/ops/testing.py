"""The names ops/conformance.py compares with; the comparison itself is `scaletrain.testing`'s.
And the derived absolute error bound of a fused attention backward where its terms cancel."""

from __future__ import annotations

import torch

from scaletrain.testing import TOLERANCE, assert_close

__all__ = ["TOLERANCE", "assert_rel_close", "attention_grad_atol"]


def assert_rel_close(actual, expected, *, tol: float | None = None, what: str = "output",
                     floor: float = 1e-12) -> None:
    """`scaletrain.testing.assert_close` with rtol=tol: rel_error(actual, expected) <= tol."""
    assert_close(actual, expected, rtol=tol, floor=floor, what=what)


def attention_grad_atol(q, k, v, do, *, storage: torch.dtype, scale: float | None = None) -> dict[str, float]:
    """{"dQ", "dK", "dV"}: the absolute error a fused attention backward may carry beside its
    relative error, derived, for assert_close's atol (a picked floor failed on an H200).

    dS_ij = P_ij (dP_ij - D_i) with dP_ij = dO_i . V_j and D_i = dO_i . O_i: two d-term fp32 dot
    products whose difference cancels (exactly, where a row sees one key: sequence 1, the first
    causal row), so their rounding survives whatever the scale of the result: per entry at most
    P_ij (2 g_d + u_s) |dO_i| max_j |V_j| (2-norms; g_d = d u / (1 - d u), u = 2^-24, fp32
    accumulation; u_s: the unit roundoff of the storage D reads O from).  It reaches
    dQ_i = scale sum_j dS_ij K_j with sum_j P_ij = 1, and dK_j = scale sum_i dS_ij Q_i with
    sum_i P_ij <= seq_q; dV = P^T dO has no such difference."""
    d, seq_q = q.shape[-1], q.shape[-2]
    u, u_s = 2.0 ** -24, torch.finfo(storage).eps / 2
    per_entry = (2 * d * u / (1 - d * u) + u_s) * _rows(do).max() * _rows(v).max()
    scale = d ** -0.5 if scale is None else scale
    return {"dQ": float(scale * per_entry * k.double().abs().max()),
            "dK": float(scale * per_entry * q.double().abs().max() * seq_q), "dV": 0.0}


def _rows(t) -> torch.Tensor:
    return t.detach().double().norm(dim=-1)
