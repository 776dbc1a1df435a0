"""Retrieve and re-rank in Triton (LightSeq, "Hierarchical Auto Regressive Search"): one program per row.

    retrieve  group maxima m_i of G contiguous groups (element j in group ⌊j·G/V⌋), the rough
              threshold R = the K-th largest m_i (K = G: min m_i), then the candidates x >= R
              compacted, in index order, to a scratch row (LightSeq: "write them into GPU memory")
    re-rank   K passes over the compacted candidates only: the largest live value, ties to the
              lowest index, written out and retired.

Reads V elements per row, writes c candidates (c <= V, typically a few K) and K results; the
re-rank touches c elements, not V. The row is held in one block of BLOCK_V >= V lanes (and a
BLOCK_G x BLOCK_V compare for the group maxima): sized for teaching vocabularies, not 50k.
Reference: scaletrain/infer/rerank.py (`retrieve_rerank`); test: tests/test_infer_rerank.py, on CPU
through the interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["retrieve_rerank"]


@triton.jit
def _kth_group_max(x, inb, offs, V, K, G, BLOCK_G: tl.constexpr):
    """R: the K-th largest of the G group maxima (one occurrence retired per pass, so ties count)."""
    gs = tl.arange(0, BLOCK_G)
    member = ((offs * G // V)[None, :] == gs[:, None]) & inb[None, :]
    gmax = tl.max(tl.where(member, x[None, :], float("-inf")), axis=1)
    alive = gs < G
    r = tl.max(gmax, axis=0)
    for _ in range(K):
        r = tl.max(tl.where(alive, gmax, float("-inf")), axis=0)
        first = tl.min(tl.where(alive & (gmax == r), gs, BLOCK_G), axis=0)
        alive = alive & (gs != first)
    return r


@triton.jit
def retrieve_rerank_kernel(x_ptr, cval_ptr, cidx_ptr, val_ptr, idx_ptr, count_ptr, V, K, G,
                           BLOCK_V: tl.constexpr, BLOCK_G: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    inb = offs < V
    x = tl.load(x_ptr + row * V + offs, mask=inb, other=float("-inf")).to(tl.float32)
    r = _kth_group_max(x, inb, offs, V, K, G, BLOCK_G)
    # retrieve: compact the candidates to the front of this row's scratch, in index order
    cand = inb & (x >= r)
    count = tl.sum(cand.to(tl.int32), axis=0)
    slot = tl.cumsum(cand.to(tl.int32), axis=0) - 1
    tl.store(cval_ptr + row * V + slot, x, mask=cand)
    tl.store(cidx_ptr + row * V + slot, offs, mask=cand)
    tl.store(count_ptr + row, count)
    tl.debug_barrier()  # the scratch row is read back by other lanes
    # re-rank: K passes over the c candidates
    live = offs < count
    cv = tl.load(cval_ptr + row * V + offs, mask=live, other=float("-inf"))
    ci = tl.load(cidx_ptr + row * V + offs, mask=live, other=0)
    for j in range(K):
        best = tl.max(tl.where(live, cv, float("-inf")), axis=0)
        at = tl.min(tl.where(live & (cv == best), offs, BLOCK_V), axis=0)  # lowest slot = lowest index
        tl.store(val_ptr + row * K + j, best)
        tl.store(idx_ptr + row * K + j, tl.sum(tl.where(offs == at, ci, 0), axis=0))
        live = live & (offs != at)


def retrieve_rerank(x: torch.Tensor, k: int, groups: int):
    """x (rows, V) → (values (rows, k) fp32, indices (rows, k) int64, candidates per row (rows,) int32)."""
    x = x.contiguous()
    rows, V = x.shape
    cval = torch.empty(rows, V, dtype=torch.float32, device=x.device)
    cidx = torch.empty(rows, V, dtype=torch.int64, device=x.device)
    values = torch.empty(rows, k, dtype=torch.float32, device=x.device)
    indices = torch.empty(rows, k, dtype=torch.int64, device=x.device)
    counts = torch.empty(rows, dtype=torch.int32, device=x.device)
    retrieve_rerank_kernel[(rows,)](x, cval, cidx, values, indices, counts, V, k, groups,
                                    BLOCK_V=triton.next_power_of_2(V), BLOCK_G=triton.next_power_of_2(groups))
    return values, indices, counts
