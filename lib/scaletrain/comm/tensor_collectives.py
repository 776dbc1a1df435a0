"""torch's own collectives on one flat output tensor, under whichever name this torch gives them.

torch 2.13 (the pin) calls them `all_gather_single` / `reduce_scatter_single`; earlier releases
call the same functions, with the same arguments, `all_gather_into_tensor` /
`reduce_scatter_tensor`. The lent GPU machines run torch 2.11, where the new names do not exist:
the first `make gpu-check` there (2026-11-27) errored a2's reduce-scatter baseline with
AttributeError. Every baseline and library call goes through these two functions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_single", "reduce_scatter_single"]


def all_gather_single(out: torch.Tensor, shard: torch.Tensor, group: Any = None) -> None:
    """out (p·shard.numel() elements) = every rank's `shard`, rank order."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, shard, group=group)


def reduce_scatter_single(out: torch.Tensor, x: torch.Tensor, group: Any = None) -> None:
    """out = this rank's 1/p slice of the sum of `x` over the ranks (x.numel() = p·out.numel())."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, x, group=group)
