"""Selective recomputation: recompute only the attention core, keep everything else.

Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models", §5:
of a layer's s·b·h·(34 + 5·a·s/h) activation bytes (fp16; seed "Techniques for large-scale
training", activation memory), the 5·a·s/h part is the attention core's a·s² matrices: the
softmax output (2 B), the dropout mask (1 B) and the dropout output (2 B) per element. They are
the largest for long sequences and the cheapest to recompute (no weight matmul: a few % of the
layer's FLOPs). Checkpointing just softmax(QKᵀ/√d)·V, with Q, K, V as its saved inputs, removes
the s² term and keeps the memory linear in s.

A fused kernel (FlashAttention, torch's scaled_dot_product_attention) never stores the s²
matrices in the first place; `scaletrain.models.GPT` uses one. To see what Megatron's unfused
attention stores and selective recomputation removes, `explicit_attention(model)` swaps each
block's attention for the same weights computed with `attention_core`. In fp32 on CPU it stores
12 bytes per s² element with dropout (softmax output, dropout's mask, which CPU keeps as a
float, and dropout output: 4 + 4 + 4) and 4 without; `tests/test_checkpointing.py` measures both.

    with explicit_attention(model, recompute=True):     # selective recomputation
        loss = model(idx, targets)[1]
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.checkpointing.function import checkpoint

__all__ = ["attention_core", "CoreAttention", "explicit_attention"]


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0,
                   training: bool = False) -> torch.Tensor:
    """Causal softmax(QKᵀ/√d)·V on (b, a, s, d) tensors, every a·s² intermediate materialized."""
    s, d = q.shape[-2], q.shape[-1]
    # −inf above the diagonal, added rather than masked_fill'ed: an add saves nothing for backward
    bias = torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)) + bias, dim=-1)   # (b, a, s, s)
    if dropout_p > 0 and training:
        att = F.dropout(att, dropout_p, training=True)
    return att @ v


class CoreAttention(nn.Module):
    """`scaletrain.models.CausalSelfAttention`'s weights with `attention_core` in place of the fused
    kernel; `recompute=True` checkpoints the core (its saved inputs: Q, K, V, one QKV storage)."""

    def __init__(self, attn: nn.Module, *, recompute: bool, checkpoint_fn: Callable = checkpoint):
        super().__init__()
        self.attn, self.recompute, self.checkpoint_fn = attn, recompute, checkpoint_fn
        self.train(attn.training)    # a new module starts in training mode; follow the model's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        a = self.attn.n_head
        q, k, v = self.attn.qkv(x).split(h, dim=2)
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in (q, k, v))

        def core(q, k, v):
            return attention_core(q, k, v, dropout_p=self.attn.dropout, training=self.training)

        y = self.checkpoint_fn(core, q, k, v) if self.recompute else core(q, k, v)
        return self.attn.proj(y.transpose(1, 2).reshape(b, s, h))


@contextlib.contextmanager
def explicit_attention(model: nn.Module, *, recompute: bool = False, checkpoint_fn: Callable = checkpoint):
    """Within the block, every `block.attn` of `model.blocks` runs as a `CoreAttention` (same
    parameters, so gradients land in `model`); restored on exit. `checkpoint_fn(core, q, k, v)`
    does the recomputation (ours by default)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "attn") for b in blocks):
        raise TypeError(f"explicit_attention: expected a scaletrain.models.GPT (blocks with .attn), "
                        f"got {type(model).__name__}")
    originals = [b.attn for b in blocks]
    try:
        for b in blocks:
            b.attn = CoreAttention(b.attn, recompute=recompute, checkpoint_fn=checkpoint_fn)
        yield model
    finally:
        for b, attn in zip(blocks, originals):
            b.attn = attn
