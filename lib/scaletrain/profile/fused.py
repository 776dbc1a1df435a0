"""The GPT on the course's hand-fused kernels: LayerNorm, attention (its softmax fused in), cross-entropy.

training-speedup-lecture.md, "Profiling Time of Elementary Operations": normalization, softmax and
the other elementwise ops are bound by memory, so fusing them saves time; additional-techniques.md
§1 (kernel fusion).  Modules 1 and 1b wrote those kernels (`scaletrain.ops`): LayerNorm forward and
backward in one pass each, FlashAttention (Dao et al. 2022: the softmax fused between the two
products, only O(s·d) kept for the backward, never the s×s probabilities), and the fused
cross-entropy (one pass over the logits each way; it keeps the logits and a per-row log-sum-exp where
torch keeps the log-probabilities: the same bytes, fewer passes).  On a GPU torch's own SDPA is
already a fused attention (FlashAttention or the memory-efficient kernel), so the row measures the
course's kernels against torch's, not fusion against none.  This file swaps them into a copy of
`scaletrain.models.GPT` (same weights), so that `variants.py` can set the hand-fused step beside
eager and torch.compile.

Backends (`scaletrain.ops.backends`): on a GPU "triton" (the kernels the course wrote).  On a CPU the
fused kernels exist only through the Triton interpreter (TRITON_INTERPRET=1), which runs each kernel
program in Python: right numbers, a time that says nothing about fusion; and "auto" on a CPU picks
"torch", the composed ops, which is eager again.  So the fused row is not measured on a CPU
(`fused_unavailable`); the "torch" backend serves to test that the model computes the same step.
"""

from __future__ import annotations

import copy
import importlib.util

import torch
import torch.nn as nn

from scaletrain.models import GPT
from scaletrain.ops import attention, cross_entropy, layer_norm

__all__ = ["FUSED_BACKEND", "FusedGPT", "fused_unavailable"]

FUSED_BACKEND = "triton"  # the GPU backend of the fused row ("cuda" would build with nvcc first: minutes)


def fused_unavailable(device: str) -> str | None:
    """Why the fused row is not measured on `device`, or None when it is."""
    if not device.startswith("cuda"):
        return ("not measured on CPU: the fused kernels run there only through the Triton interpreter "
                "(Python per kernel program), and backend 'auto' would run the composed torch ops, eager again")
    return None if importlib.util.find_spec("triton") else "the fused kernels on a GPU need Triton, not installed"


class _LayerNorm(nn.Module):
    def __init__(self, ln: nn.LayerNorm, backend: str):
        super().__init__()
        self.ln, self.backend = ln, backend

    def forward(self, x):
        return layer_norm(x, self.ln.normalized_shape, self.ln.weight, self.ln.bias, self.ln.eps, backend=self.backend)


class _Attention(nn.Module):
    """CausalSelfAttention's projections around `scaletrain.ops.attention` instead of torch's SDPA."""

    def __init__(self, attn: nn.Module, backend: str):
        super().__init__()
        self.attn, self.backend = attn, backend

    def forward(self, x):
        b, s, h = x.shape
        a = self.attn.n_head
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in self.attn.qkv(x).split(h, dim=2))
        y = attention(q, k, v, causal=True, backend=self.backend)
        return self.attn.proj(y.transpose(1, 2).reshape(b, s, h))


class FusedGPT(nn.Module):
    """A copy of `model` (same weights, the tied embedding still tied) whose LayerNorms, attention and
    loss run `scaletrain.ops` with `backend`; `(idx, targets) -> (logits, loss)` as GPT's forward."""

    def __init__(self, model: GPT, backend: str = FUSED_BACKEND):
        super().__init__()
        if model.cfg.dropout:
            raise ValueError(f"FusedGPT: the fused attention has no dropout; build the GPT with dropout=0 "
                             f"(got {model.cfg.dropout})")
        self.model, self.backend = copy.deepcopy(model), backend
        for block in self.model.blocks:
            block.ln1, block.ln2 = _LayerNorm(block.ln1, backend), _LayerNorm(block.ln2, backend)
            block.attn = _Attention(block.attn, backend)
        self.model.ln_f = _LayerNorm(self.model.ln_f, backend)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.model(idx)[0]
        return logits, None if targets is None else cross_entropy(logits, targets, backend=self.backend)
