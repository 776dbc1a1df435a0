"""embedding(ids, token_weight, position_weight, p=0.0, backend=...): token + position embedding + dropout.

    x = embedding(idx, model.wte.weight, model.wpe.weight, p=0.1, backend="triton")  # (batch, seq, dim)

The GPT input layer, x = dropout(wte[idx] + wpe[arange(seq)]), as one autograd Function.
Backends: "torch" (the composed version below), "triton" (kernels/embedding_triton.py, LightSeq2's
fused embedding: one pass forward, one scatter-add pass backward), "auto" (triton on CUDA tensors).
There is no CUDA C++ embedding kernel.  Gradients: both tables get dense fp32-accumulated
gradients in their own dtype.  Dropout draws a fresh mask per call from `seed` (default: from
torch's generator); p = 0 is exact.
"""

from __future__ import annotations

import torch

from scaletrain.ops.backends import KERNELS_DIR, load_kernel_module, resolve_name
from scaletrain.ops.labels import labelled

__all__ = ["embedding", "naive_embedding_fwd", "naive_embedding_bwd"]


def naive_embedding_fwd(ids, tok, pos, p=0.0, seed=0):
    """(y (tokens, dim), keep mask or None) composed; elements moved for T tokens of dim d."""
    seq = ids.shape[1]
    x = tok[ids.reshape(-1)]                                    # read T + Td ; write Td
    x = x + pos[:seq].repeat(ids.shape[0], 1)                   # read 2Td (+ the repeat: Td, Td) ; write Td
    if p == 0:
        return x, None
    gen = torch.Generator(device=tok.device).manual_seed(seed)
    keep = torch.rand(x.shape, generator=gen, device=x.device) >= p  # write Td (+ Td bytes)
    return x * keep / (1 - p), keep.to(torch.int8)              # read 2Td ; write 2Td


def naive_embedding_bwd(ids, dy, keep, p, vocab, max_pos):
    """(dtok, dpos) in fp32: index_add_ of the kept, rescaled gradient rows."""
    seq, dim = ids.shape[1], dy.shape[1]
    g = dy.float() if keep is None else dy.float() * keep / (1 - p)
    dtok = torch.zeros(vocab, dim, device=dy.device).index_add_(0, ids.reshape(-1), g)
    dpos = torch.zeros(max_pos, dim, device=dy.device)
    dpos[:seq] = g.reshape(ids.shape[0], seq, dim).sum(0)
    return dtok, dpos


def _impl(name: str):
    if name == "torch":
        return naive_embedding_fwd, naive_embedding_bwd
    if name == "triton":
        kernels = load_kernel_module(KERNELS_DIR / "embedding_triton.py")
        return kernels.embedding_fwd, kernels.embedding_bwd
    raise ValueError("embedding: there is no CUDA C++ embedding kernel; use backend='triton' or 'torch'")


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, tok, pos, p, seed, impl):
        y, keep = impl[0](ids, tok, pos, p, seed)
        ctx.save_for_backward(ids, keep)  # ids and a 1-byte mask: never the float activations
        ctx.p, ctx.impl, ctx.shapes = p, impl, (tok.shape[0], pos.shape[0], tok.dtype, pos.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        ids, keep = ctx.saved_tensors
        vocab, max_pos, tok_dtype, pos_dtype = ctx.shapes
        dtok, dpos = ctx.impl[1](ids, dy.contiguous(), keep, ctx.p, vocab, max_pos)
        return None, dtok.to(tok_dtype), dpos.to(pos_dtype), None, None, None


def embedding(ids: torch.Tensor, token_weight: torch.Tensor, position_weight: torch.Tensor, p: float = 0.0,
              seed: int | None = None, backend: str = "auto") -> torch.Tensor:
    """dropout(token_weight[ids] + position_weight[:seq], p) for (batch, seq) int64 ids -> (batch, seq, dim)."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
        raise TypeError("embedding: ids must be a (batch, seq) int64 tensor")
    for name, w in (("token_weight", token_weight), ("position_weight", position_weight)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
            raise TypeError(f"embedding: {name} must be a floating-point (rows, dim) table")
        if w.device != ids.device:
            raise ValueError(f"embedding: {name} is on {w.device}, ids on {ids.device}")
    if token_weight.shape[1] != position_weight.shape[1] or token_weight.dtype != position_weight.dtype:
        raise ValueError("embedding: token_weight and position_weight must share dim and dtype")
    if ids.shape[1] > position_weight.shape[0]:
        raise ValueError(f"embedding: sequence length {ids.shape[1]} exceeds the {position_weight.shape[0]} positions")
    if ids.numel() and (ids.min() < 0 or ids.max() >= token_weight.shape[0]):
        raise ValueError(f"embedding: ids must lie in [0, {token_weight.shape[0]})")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"embedding: dropout p must lie in [0, 1), got {p}")
    name = resolve_name(backend, token_weight, "embedding")
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else int(seed)
    with labelled("embedding"):
        y = _Embedding.apply(ids.contiguous(), token_weight.contiguous(), position_weight.contiguous(), float(p),
                             seed, _impl(name))
    return y.reshape(*ids.shape, token_weight.shape[1])
