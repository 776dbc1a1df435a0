"""a1b's hidden inputs, made here from the grading seed and sent to the worker as data: attention's
Q, K, V (and dO) and the cross-entropy's logits, targets (one row ignored) and upstream gradient."""

from __future__ import annotations


def dtype_of(name: str):
    import torch
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def attention_inputs(bh: int, seq_q: int, seq_k: int, d: int, dtype: str, seed: int, scale: float = 1.0):
    """Q (bh, seq_q, d), K and V (bh, seq_k, d) in `dtype`; Q times `scale` (scores near 1e4 at 400)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(bh, s, d, generator=gen).to(dtype_of(dtype)) for s in (seq_q, seq_k, seq_k))
    return (q * scale).to(q.dtype), k, v


def cross_entropy_inputs(rows: int, vocab: int, dtype: str, seed: int, scale: float):
    """(logits, targets with row rows // 2 ignored (-100), the upstream gradient per row)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype_of(dtype))
    target = torch.randint(0, vocab, (rows,), generator=gen)
    target[rows // 2] = -100
    return x, target, torch.rand(rows, generator=gen)
