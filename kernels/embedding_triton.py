"""Fused embedding in Triton: token + position embedding + dropout forward, scatter-add backward
(LightSeq2's fused embedding kernels, "accelerating-transformer-training-lecture.md").

Composed, the forward is three kernels and two (tokens, dim) intermediates: gather the token
rows, gather the position rows, add, draw the dropout mask, multiply by mask / (1 - p).  Fused,
each program gathers BLOCK_T token rows and their position rows, adds, applies dropout and
writes once: reads 2 T d (the gathered rows), writes T d and the 1-byte keep mask
(LightSeq's uint8 mask), instead of ~7 T d.
Backward: dy * keep / (1 - p) is scatter-added into the fp32 gradient rows of the tokens and of
the positions (tl.atomic_add: two tokens with the same id, or the same position in two
sequences, add into one row), again in one pass over dy.

Tokens are the flattened (batch, seq) ids; token t sits at position t % seq.  The dropout mask
comes from tl.rand(seed, element index) (Philox), so a seed reproduces it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["embedding_fwd", "embedding_bwd"]


@triton.jit
def embedding_fwd_kernel(ids_ptr, tok_ptr, pos_ptr, y_ptr, keep_ptr, tokens, seq, dim, p, seed,
                         DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """y[t] = (tok[ids[t]] + pos[t % seq]) * keep / (1 - p) for BLOCK_T tokens x BLOCK_D columns."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = (t[:, None] < tokens) & (c[None, :] < dim)
    ids = tl.load(ids_ptr + t, mask=t < tokens, other=0)
    x = tl.load(tok_ptr + ids[:, None] * dim + c[None, :], mask=inside, other=0.0).to(tl.float32)
    x += tl.load(pos_ptr + (t % seq)[:, None] * dim + c[None, :], mask=inside, other=0.0).to(tl.float32)
    offs = t[:, None] * dim + c[None, :]
    if DROPOUT:
        keep = tl.rand(seed, offs) >= p
        x = tl.where(keep, x / (1.0 - p), 0.0)
        tl.store(keep_ptr + offs, keep.to(tl.int8), mask=inside)
    tl.store(y_ptr + offs, x, mask=inside)


@triton.jit
def embedding_bwd_kernel(ids_ptr, dy_ptr, keep_ptr, dtok_ptr, dpos_ptr, tokens, seq, dim, p,
                         DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """dtok[ids[t]] += g[t], dpos[t % seq] += g[t] with g = dy * keep / (1 - p), fp32 atomics."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = (t[:, None] < tokens) & (c[None, :] < dim)
    offs = t[:, None] * dim + c[None, :]
    g = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    if DROPOUT:
        keep = tl.load(keep_ptr + offs, mask=inside, other=0)
        g = tl.where(keep != 0, g / (1.0 - p), 0.0)
    ids = tl.load(ids_ptr + t, mask=t < tokens, other=0)
    tl.atomic_add(dtok_ptr + ids[:, None] * dim + c[None, :], g, mask=inside)
    tl.atomic_add(dpos_ptr + (t % seq)[:, None] * dim + c[None, :], g, mask=inside)


def _tiles(dim: int) -> tuple[int, int]:
    block_d = min(triton.next_power_of_2(dim), 128)
    return 16, block_d


def embedding_fwd(ids: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor, p: float = 0.0, seed: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y (tokens, dim) in tok's dtype, int8 keep mask or None) for flattened (batch, seq) int64
    ids (seq = ids.shape[1]), token table (V, dim), position table (>= seq, dim)."""
    batch, seq = ids.shape
    tokens, dim = batch * seq, tok.shape[1]
    y = torch.empty(tokens, dim, device=tok.device, dtype=tok.dtype)
    keep = torch.empty(tokens, dim, device=tok.device, dtype=torch.int8) if p > 0 else None
    bt, bd = _tiles(dim)
    embedding_fwd_kernel[(triton.cdiv(tokens, bt), triton.cdiv(dim, bd))](
        ids, tok, pos, y, keep if keep is not None else y, tokens, seq, dim, p, seed,
        DROPOUT=p > 0, BLOCK_T=bt, BLOCK_D=bd)
    return y, keep


def embedding_bwd(ids: torch.Tensor, dy: torch.Tensor, keep: torch.Tensor | None, p: float, vocab: int,
                  max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dtok (vocab, dim), dpos (max_pos, dim)) in fp32 from contiguous dy (tokens, dim)."""
    batch, seq = ids.shape
    tokens, dim = dy.shape
    dtok = torch.zeros(vocab, dim, device=dy.device, dtype=torch.float32)
    dpos = torch.zeros(max_pos, dim, device=dy.device, dtype=torch.float32)
    bt, bd = _tiles(dim)
    embedding_bwd_kernel[(triton.cdiv(tokens, bt), triton.cdiv(dim, bd))](
        ids, dy, keep if keep is not None else dy, dtok, dpos, tokens, seq, dim, p,
        DROPOUT=keep is not None, BLOCK_T=bt, BLOCK_D=bd)
    return dtok, dpos
