"""Causal self-attention with its heads split over the tensor-parallel ranks.

Shoeybi et al. 2019, "Megatron-LM", §3 and Figure 3b; seminar §1.2.4 ("partitioning K, Q and V
matrices in column-parallel fashion"). Heads are independent until the output projection, so
rank r takes a/t of them:
  * the fused QKV projection (h -> 3h) is column-parallel with `parts=3`: rank r holds the rows of
    its heads in each of W_q, W_k, W_v (`shard`, layers.py), and computes Q, K, V for its heads only;
  * attention runs on those a/t heads, on the whole sequence, with no communication;
  * the output projection (h -> h) is row-parallel: its input is this rank's a/t heads' outputs,
    i.e. columns [r·h/t, (r+1)·h/t) of the concatenated heads, which is exactly its input slice.
One allreduce forward (the row layer's g) and one backward (the column layer's f), as in the MLP.

Dropout on the attention probabilities (the model's `dropout` > 0, training): the probabilities of
this rank's heads are a split region, so their mask is the heads' slice of the whole (b, a, s, s)
tensor's counter-based mask (dropout.py; `dropout_seed`, `dropout_site` name its stream). Attention
then runs unfused, softmax(QKᵀ/√d) materialized, to apply that mask; without dropout it stays torch's
fused kernel.

`ParallelSelfAttention.from_attention` converts `scaletrain.models.CausalSelfAttention` (same
attribute names, `qkv` and `proj`, so parameter names stay the same); a/t must be an integer.
"""

from __future__ import annotations

from typing import Any

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.tp.collectives import DEFAULT_BACKEND, divide, tp_world_size
from scaletrain.tp.dropout import TensorParallelDropout
from scaletrain.tp.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelSelfAttention"]


class ParallelSelfAttention(nn.Module):
    """Input (b, s, h), or (b, s/t, h) under sequence parallelism; output of the same shape."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, n_head: int, dropout: float = 0.0, *,
                 dropout_seed: int = 0, dropout_site: int = 0):
        super().__init__()
        t = qkv.tp_world_size
        self.n_head_local = divide("ParallelSelfAttention: n_head", n_head, t)
        self.qkv, self.proj, self.dropout = qkv, proj, dropout
        # (b, a/t, s, s): this rank's heads are slice tp_rank of the a heads (dim 1)
        self.attn_drop = TensorParallelDropout(dropout, seed=dropout_seed, site=dropout_site, split_dim=1,
                                               tp_rank=qkv.tp_rank, tp_world_size=t)

    @classmethod
    def from_attention(cls, attn: nn.Module, *, tp_group: Any = None, sequence_parallel: bool = False,
                       backend: str = DEFAULT_BACKEND, dropout_seed: int = 0,
                       dropout_site: int = 0) -> "ParallelSelfAttention":
        divide("ParallelSelfAttention: n_head", attn.n_head, tp_world_size(tp_group))  # before slicing
        kw = dict(tp_group=tp_group, sequence_parallel=sequence_parallel, backend=backend)
        qkv = ColumnParallelLinear.from_linear(attn.qkv, parts=3, **kw)
        proj = RowParallelLinear.from_linear(attn.proj, input_is_parallel=True, **kw)
        return cls(qkv, proj, attn.n_head, attn.dropout, dropout_seed=dropout_seed, dropout_site=dropout_site)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)                      # (b, s, 3h/t): Q, K, V of this rank's heads (whole sequence)
        b, s, three_h_local = qkv.shape
        h_local = three_h_local // 3
        q, k, v = qkv.split(h_local, dim=2)
        q, k, v = (z.view(b, s, self.n_head_local, h_local // self.n_head_local).transpose(1, 2) for z in (q, k, v))
        if self.training and self.dropout > 0:
            y = self._attention_with_dropout(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h_local))  # (b, s, h/t) -> row layer

    def _attention_with_dropout(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(QKᵀ/√d)·V with `attn_drop` on the probabilities, (b, a/t, s, d) tensors."""
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))          # (b, a/t, s, s)
        future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        return self.attn_drop(scores.masked_fill(future, float("-inf")).softmax(dim=-1)) @ v
