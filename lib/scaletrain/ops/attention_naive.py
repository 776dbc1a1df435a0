"""The "torch" backend of scaletrain.ops.attention: Softmax(Q K^T * scale) V composed from PyTorch ops.

The naive version FlashAttention is measured against, and the CPU fallback.  Every line is one
kernel that reads its inputs from memory and writes its output back; the comments count the
elements moved for one head with n queries, n keys and head dim d.  The (n, n) score and
probability matrices are written and read back several times: O(n^2) traffic and memory,
"Softmax(QK^T)V is O(n^2) in time and memory" ("Effective Attention Mechanisms",
training-speedup-lecture.md).  traffic.attention_naive adds these up; the tests check the sum
against scaletrain.ops.traffic.count_traffic, which watches every aten op.

It uses no torch.softmax / scaled_dot_product_attention, so it is also an independent
reference.  Same signatures as kernels/attention_triton.py: contiguous (BH, seq, d) tensors;
the forward returns (O, L) with L = logsumexp of each score row (fp32), which the backward
uses to recompute P = exp(S - L) as FlashAttention's does.
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention_fwd", "attention_bwd", "causal_mask"]


def causal_mask(seq_q: int, seq_k: int, device) -> torch.Tensor:
    """True where query i must not see key j (j > i: torch's is_causal, top-left aligned)."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(1)


def _probabilities(q, k, causal, scale):
    """(P, L) in fp32: the textbook softmax over the materialized scores."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2))  # read 2nd ; write n^2
    s = s * scale                                             # read n^2 ; write n^2
    if causal:
        s = s.masked_fill(causal_mask(s.shape[-2], s.shape[-1], s.device), float("-inf"))  # read 2n^2 ; write n^2
    s_max = s.amax(dim=-1, keepdim=True)                      # read n^2 ; write n
    p = torch.exp(s - s_max)                                  # read n^2 + n ; write n^2 (twice)
    denominator = p.sum(dim=-1, keepdim=True)                 # read n^2 ; write n
    lse = (s_max + torch.log(denominator)).squeeze(-1)        # read 2n ; write n (twice)
    return p / denominator, lse                               # read n^2 + n ; write n^2


def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) for q (BH, seq_q, d), k and v (BH, seq_k, d); arithmetic in fp32."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p, lse = _probabilities(q, k, causal, scale)
    o = torch.matmul(p, v.float())                            # read n^2 + nd ; write nd
    return o.to(q.dtype), lse


def attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, causal: bool = False, scale: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) by the textbook chain rule over the materialized P (recomputed here)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p, _ = _probabilities(q, k, causal, scale)
    dof = do.float()
    dv = torch.matmul(p.transpose(-1, -2), dof)               # read n^2 + nd ; write nd
    dp = torch.matmul(dof, v.float().transpose(-1, -2))       # read 2nd ; write n^2
    delta = (dof * o.float()).sum(dim=-1, keepdim=True)       # rowsum(dO * O) = rowsum(P * dP)
    ds = p * (dp - delta) * scale                             # read 2n^2 + n ; write n^2 (three times)
    dq = torch.matmul(ds, k.float())                          # read n^2 + nd ; write nd
    dk = torch.matmul(ds.transpose(-1, -2), q.float())        # read n^2 + nd ; write nd
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
