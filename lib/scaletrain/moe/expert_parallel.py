"""Expert parallelism: E/ep experts per rank, tokens sent to their experts' ranks and back.

GShard (Lepikhin et al. 2020, §3.1) and Switch (§5.4, expert and data parallelism) place the experts of one MoE
layer on different devices: with ep ranks, rank r holds experts [r·E/ep, (r+1)·E/ep), every rank
routes its own tokens, and two all-to-alls (all_to_all.py) move each token to the rank of its
expert and its output back. Everything outside the experts (attention, router, LayerNorms,
embeddings) is replicated: the ep ranks are data-parallel ranks that pool their experts
(scaletrain.mesh: ep splits dp).

One forward on rank r, rows already grouped by global expert (dropless.py), counts (E,):

    1. counts as (ep, E/ep): row j = my rows for rank j's experts; an equal all-to-all of these
       counts tells every rank how many rows it gets from each rank for each of its experts:
       recv (ep, E/ep)                                            8·E/ep·(ep-1) bytes
    2. dispatch: all_to_all_v, rows for rank j's experts to rank j (contiguous, since the rows
       are grouped by expert; their sizes are the sums of the count rows, no second exchange)
    3. what arrived is ordered (source rank, my expert); the grouped GEMM wants (my expert,
       source rank): a permutation computed from recv
    4. the local experts (one grouped GEMM per matrix), the permutation undone
    5. combine: all_to_all_v with the splits swapped: each row back to the rank it came from

Backward runs 5 and 2 in reverse (autograd of all_to_all_v), so an expert's weight gradient sums
the contributions of every rank's tokens it served. With routing uniform over E experts and k
choices per token, rank r sends (ep-1)/ep · k·T rows in each of the four all-to-alls (cost.py).

    apply_expert_parallel(model, ep_group)   # every MoE layer's experts -> ExpertParallel shard
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.moe.all_to_all import all_to_all, all_to_all_v
from scaletrain.moe.experts import Experts
from scaletrain.moe.layer import MoE

__all__ = ["ExpertParallel", "apply_expert_parallel", "by_local_expert"]


def by_local_expert(recv_counts: torch.Tensor) -> torch.Tensor:
    """The permutation that reorders rows laid out as blocks (source rank i, local expert l),
    row-major with block sizes recv_counts (ep, E_l), into blocks (l, i): index of each new row."""
    sizes = recv_counts.reshape(-1)
    starts = (sizes.cumsum(0) - sizes).view_as(recv_counts)
    return torch.cat([torch.arange(int(starts[i, l]), int(starts[i, l] + recv_counts[i, l]))
                      for l in range(recv_counts.shape[1]) for i in range(recv_counts.shape[0])]
                     + [torch.zeros(0, dtype=torch.long)])


class ExpertParallel(nn.Module):
    """This rank's shard of `experts` over the ranks of `group`, with the call of `Experts`:
    (rows grouped by global expert, counts (E,)) -> their outputs, same order."""

    def __init__(self, experts: Experts, group: Any):
        super().__init__()
        self.group = group
        self.ep_rank, self.ep_size = dist.get_rank(group), dist.get_world_size(group)
        self.num_experts = experts.num_experts
        self.local = experts.shard(self.ep_rank, self.ep_size)

    def forward(self, x: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        ep, per_rank = self.ep_size, self.num_experts // self.ep_size
        counts = torch.tensor(list(counts), dtype=torch.int64).view(ep, per_rank)
        recv = all_to_all(counts, self.group)  # (ep, E_l): rows rank i sends for each of my experts
        send_splits, recv_splits = counts.sum(1).tolist(), recv.sum(1).tolist()
        arrived, _ = all_to_all_v(x, send_splits, recv_splits, self.group)
        order = by_local_expert(recv).to(x.device)
        y = self.local(arrived.index_select(0, order), recv.sum(0).tolist())
        back = torch.empty_like(y).index_copy(0, order, y)  # rows in arrival order again
        out, _ = all_to_all_v(back, recv_splits, send_splits, self.group)
        return out


def apply_expert_parallel(model: nn.Module, ep_group: Any) -> nn.Module:
    """Shard the experts of every MoE layer of `model` over `ep_group`, in place; returns `model`.
    `ep_group` None (ep = 1 on a Mesh): left as is, every expert on this rank. Call it on every
    rank of the group, on models built alike (same seed): each keeps its slice of the same experts."""
    if ep_group is None:
        return model
    for layer in [m for m in model.modules() if isinstance(m, MoE)]:
        if layer.experts.num_experts % dist.get_world_size(ep_group):
            raise ValueError(f"apply_expert_parallel: {layer.experts.num_experts} experts do not split over "
                             f"ep = {dist.get_world_size(ep_group)} ranks")
        layer.experts = ExpertParallel(layer.experts, ep_group)
    return model
