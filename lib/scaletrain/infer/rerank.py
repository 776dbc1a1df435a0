"""Retrieve and re-rank (LightSeq's hierarchical auto-regressive search), in torch and in Triton.

LightSeq lecture, "Hierarchical Auto Regressive Search for decoding": a beam-search step must pick
the top k of k·V scores, "need sorting k*V elements!". Instead, per row (beam):

    retrieve  split the V logits into k groups; m_i = the maximum of group i; the rough top-k-th
              logit R = min_i m_i; keep the logits >= R ("write them into GPU memory")
    re-rank   the exact top k among those candidates only.

Why it is exact: the k group maxima are k distinct elements >= R, so the row's k-th largest is >= R
and no true top-k element is dropped (ties at R are kept: ">=", as in the worked example, where
both 4s survive). With g >= k groups, R = the k-th largest group maximum keeps the same guarantee;
more groups, a tighter R, fewer candidates. Across beams (`beam_topk`), the global top k lies in the
union of every row's top k, hence among the union of the rows' candidates.

Ties: indices follow the lowest-index-first order of a stable descending sort, on both backends.
-inf is an ordinary value (masked logits); NaN is refused (torch.topk ranks it first).
The Triton kernel (kernels/retrieve_rerank_triton.py) has its launcher in rerank_triton.py.
"""

from __future__ import annotations

import torch

__all__ = ["group_ids", "rough_threshold", "candidates", "retrieve_rerank", "beam_topk", "check_shapes"]


def group_ids(V: int, groups: int, device=None) -> torch.Tensor:
    """Group of each of V positions: ⌊j·g/V⌋, g contiguous groups of ⌊V/g⌋ or ⌈V/g⌉ (none empty when g <= V)."""
    return torch.arange(V, device=device) * groups // V


def check_shapes(x: torch.Tensor, k: int, groups: int) -> None:
    V = x.shape[-1]
    if x.dim() != 2 or not 1 <= k <= groups <= V:
        raise ValueError(f"retrieve and re-rank: need x (rows, V) and 1 <= k <= groups <= V, "
                         f"got x {tuple(x.shape)}, k={k}, groups={groups}")
    if not x.is_floating_point() or torch.isnan(x).any():  # NaN has no place in a descending order
        raise ValueError(f"retrieve and re-rank: needs floating-point scores without NaN, got {x.dtype}"
                         f"{'' if not x.is_floating_point() else ' with NaN'}")


def rough_threshold(x: torch.Tensor, k: int, groups: int | None = None) -> torch.Tensor:
    """R per row (rows,): the k-th largest of the `groups` group maxima (LightSeq: groups = k, R = min m_i)."""
    groups = groups or k
    check_shapes(x, k, groups)
    # BEGIN SOLUTION
    gid = group_ids(x.shape[-1], groups, x.device).expand_as(x)
    maxima = x.new_full((x.shape[0], groups), float("-inf")).scatter_reduce(1, gid, x, "amax")
    return maxima.sort(dim=1, descending=True).values[:, k - 1]  # sorts rows·groups maxima, not rows·V
    # END SOLUTION


def candidates(x: torch.Tensor, k: int, groups: int | None = None) -> torch.Tensor:
    """The retrieved mask (rows, V): x >= R of its row. Its sum is the number of elements re-ranked."""
    # BEGIN SOLUTION
    return x >= rough_threshold(x, k, groups)[:, None]
    # END SOLUTION


def _rerank(values: torch.Tensor, index: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top k of candidate (values, index) rows, already in ascending index order (stable sort)."""
    # BEGIN SOLUTION
    order = values.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return values.gather(-1, order), index.gather(-1, order)
    # END SOLUTION


def retrieve_rerank(x: torch.Tensor, k: int, *, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row top k of x (rows, V) → (values, indices) (rows, k), equal to torch.topk's values.

    The contract: values exactly torch.topk's (ties and -inf included, any 1 <= k <= groups <= V), each
    index pointing at its value, distinct within a row; torch.topk and kthvalue are not for you to
    call, and a sort sees the candidates and the group maxima only, never the whole row. How the
    candidates reach that sort (a padded buffer, a flat list, a loop over rows) is yours."""
    # BEGIN SOLUTION
    mask = candidates(x, k, groups)
    rows, V = x.shape
    pos = mask.cumsum(dim=1) - 1  # each candidate's slot in its row's compacted buffer
    width = max(int(mask.sum(dim=1).max()), k)
    values = x.new_full((rows, width), float("-inf"))
    index = torch.full((rows, width), V, dtype=torch.long, device=x.device)
    r, c = mask.nonzero(as_tuple=True)
    values[r, pos[r, c]] = x[r, c]
    index[r, pos[r, c]] = c
    return _rerank(values, index, k)
    # END SOLUTION


def beam_topk(scores: torch.Tensor, k: int, *, groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k of all beams' scores (beams, V) with flat indices beam·V + token: beam_search's `select`.
    Each beam retrieves its own candidates (R per beam, as LightSeq's example); one re-rank over all.
    A beam holds at most min(k, V) of the survivors, so that is the k each beam retrieves."""
    # BEGIN SOLUTION
    k_row = min(k, scores.shape[1])
    mask = candidates(scores, k_row, min(groups or k_row, scores.shape[1]))
    flat = mask.flatten().nonzero().squeeze(1)  # ascending flat index
    return _rerank(scores.flatten()[flat], flat, k)
    # END SOLUTION

