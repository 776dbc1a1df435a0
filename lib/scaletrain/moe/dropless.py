"""Tokens grouped by expert into variable-size groups: dispatch and combine without padding.

MegaBlocks (Gale et al. 2022, "Efficient Sparse Training with Mixture-of-Experts", §4-5) drops
no token: instead of E buffers of C slots (capacity.py), the (token, expert) assignments are
grouped by expert, so each expert's tokens sit in one contiguous group whose size is whatever the
router sent it, and the experts run as one grouped GEMM over those groups (grouped_gemm.py; the
paper's block-sparse products). Nothing is dropped and no slot is padding.

    assignments (token, expert, gate):  (0,2,.7) (1,0,.9) (2,2,.6) (3,1,.8)
    grouped by expert:                  row 0: token 1 | row 1: token 3 | rows 2-3: tokens 0, 2
    counts = [1, 1, 2]

    dispatch  (T, h) -> (N, h)   row i holds the token of assignment i's row, N = Σ counts
    combine   (N, h) -> (T, h)   each token gets the gate-weighted sum of its rows' outputs

Groups come in expert order (expert 0's rows first), since the grouped GEMM and the expert-parallel
all-to-all cut the rows by `counts`; the order of the rows *inside* one group is yours to choose
(it changes nothing downstream, as long as each row's token and gate travel together).

The same grouping serves all three routings of the MoE layer: top-k without capacity (every
assignment), top-k with capacity (only the kept pairs: capacity.py) and expert choice (c tokens per
expert). A token with no assignment left gets a zero row from `combine`: the residual carries it.
Backward: dispatch and combine must pass gradients to x, to the expert outputs and to the gates
(autograd's, if they are built from differentiable torch ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Groups", "group_by_expert", "dispatch", "combine"]


@dataclass(frozen=True)
class Groups:
    """Assignments grouped by expert. `token` (N,) int64: the token of each row; `gate` (N,): its
    weight; `counts`: rows per expert, in expert order (a list of E ints: split sizes)."""
    token: torch.Tensor
    gate: torch.Tensor
    counts: list[int]


def group_by_expert(token: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, num_experts: int) -> Groups:
    """Group the N assignments (token[i], expert[i], gate[i]) by expert: `Groups` whose rows are a
    permutation of the assignments with expert 0's rows first, then expert 1's, ...; `counts[e]`
    rows for expert e (0 for an expert nobody chose). Within a group, any order (your choice; say
    which in the handout's question). Graded: counts, and that the rows of each group are exactly
    that expert's (token, gate) assignments, on hidden routings with empty experts."""
    # BEGIN SOLUTION
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=num_experts).tolist()
    return Groups(token=token[order], gate=gate[order], counts=counts)
    # END SOLUTION


def dispatch(x: torch.Tensor, groups: Groups) -> torch.Tensor:
    """(T, h) -> (N, h): row i is the token `groups.token[i]` of x. Differentiable in x. Graded
    with `combine`: the rows for your own groups, and the gradient that reaches x."""
    # BEGIN SOLUTION
    return x.index_select(0, groups.token)
    # END SOLUTION


def combine(y: torch.Tensor, groups: Groups, tokens: int) -> torch.Tensor:
    """(N, h) expert outputs -> (T, h) in y's dtype: token t gets the sum over its rows of the row's
    gate times the row's output; exactly 0 for a token without rows (dropped, or never chosen).
    Differentiable in y and in the gates (the router learns through them). Graded against a
    per-token sum on hidden groups, with its gradients."""
    # BEGIN SOLUTION
    out = y.new_zeros(tokens, y.shape[1])
    return out.index_add(0, groups.token, y * groups.gate[:, None].to(y.dtype))
    # END SOLUTION
