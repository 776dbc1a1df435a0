"""Tokens grouped by expert into variable-size groups: dispatch and combine without padding.

MegaBlocks (Gale et al. 2022, "Efficient Sparse Training with Mixture-of-Experts", §4-5) drops
no token: instead of E buffers of C slots (capacity.py), the (token, expert) assignments are sorted
by expert, so each expert's tokens sit in one contiguous group whose size is whatever the router
sent it, and the experts run as one grouped GEMM over those groups (grouped_gemm.py; the paper's
block-sparse products). Nothing is dropped and no slot is padding.

    assignments (token, expert, gate):  (0,2,.7) (1,0,.9) (2,2,.6) (3,1,.8)
    sorted by expert (stable):          row 0: token 1 | row 1: token 3 | rows 2-3: tokens 0, 2
    counts = [1, 1, 2]

    dispatch: rows = x[token_of_row]                       (N, h)  N = Σ counts
    combine:  out[token] += gate_of_row · y[row]           (T, h)  index_add over the rows

The same grouping serves all three routings of the MoE layer: top-k without capacity (every
assignment), top-k with capacity (only the kept pairs: capacity.py) and expert choice (c tokens per
expert). A token with no assignment left gets a zero row from `combine`: the residual carries it.
Backward is autograd's: dispatch is a gather (its gradient an index_add), combine an index_add of
gate-weighted rows (its gradient a gather, and for the gates a row-wise dot product).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Groups", "group_by_expert", "dispatch", "combine"]


@dataclass(frozen=True)
class Groups:
    """Assignments sorted by expert. `token` (N,): the token of each row; `gate` (N,): its weight;
    `counts` (E,): rows per expert, in expert order (a list of ints: split sizes)."""
    token: torch.Tensor
    gate: torch.Tensor
    counts: list[int]


def group_by_expert(token: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, num_experts: int) -> Groups:
    """Sort the assignments (token[i], expert[i], gate[i]) by expert, stably: within one expert the
    rows keep the order they were given in (token order for top-k routing)."""
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=num_experts).tolist()
    return Groups(token=token[order], gate=gate[order], counts=counts)


def dispatch(x: torch.Tensor, groups: Groups) -> torch.Tensor:
    """(T, h) -> (N, h): each assignment's token, grouped by expert."""
    return x.index_select(0, groups.token)


def combine(y: torch.Tensor, groups: Groups, tokens: int) -> torch.Tensor:
    """(N, h) expert outputs -> (T, h): Σ over each token's rows of gate · y (0 for tokens without one)."""
    out = y.new_zeros(tokens, y.shape[1])
    return out.index_add(0, groups.token, y * groups.gate[:, None].to(y.dtype))
