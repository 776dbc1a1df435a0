"""Which slice of an unsharded weight a tensor-parallel rank holds: one definition for layers and tests.

A tensor-parallel parameter is a slice of the unsharded one along `dim`. A fused weight such as
attention's QKV projection, (3h, h), is `parts` = 3 blocks (Q, K, V) stacked along dim 0, and a
rank's attention needs Q, K and V of the same heads: which rows that is, and why an even split of
the stack is wrong, is the point of Shoeybi et al. 2019, §3 (attention split by heads, Figure 3b).
Megatron-LM marks such parameters with `partition_dim` and `partition_stride`; here the same facts
sit on the parameter as `tp_dim` and `tp_parts`, so anything (the tests, the grader, a checkpoint
writer) can slice the matching piece of an unsharded tensor with `shard`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from scaletrain.tp.collectives import divide

__all__ = ["shard", "mark_sharded", "shard_like"]


def shard(full: torch.Tensor, *, dim: int, rank: int, world_size: int, parts: int = 1) -> torch.Tensor:
    """Rank `rank`'s slice of `full` along `dim` (a copy): with `parts` > 1, the rank's share of
    each of the `parts` equal blocks stacked along `dim` (module docstring)."""
    block = divide(f"size of dim {dim} / parts={parts}", full.shape[dim], parts)
    n = divide(f"size of dim {dim} per part", block, world_size)
    pieces = [full.narrow(dim, p * block + rank * n, n) for p in range(parts)]
    return torch.cat(pieces, dim=dim).contiguous()


def mark_sharded(param: nn.Parameter, *, dim: int, parts: int = 1) -> nn.Parameter:
    """Record on `param` how it was sliced (`shard_like` reads it back)."""
    param.tp_dim, param.tp_parts = dim, parts
    return param


def shard_like(full: torch.Tensor, param: torch.Tensor, *, rank: int, world_size: int) -> torch.Tensor:
    """The slice of the unsharded `full` that `param` holds on `rank` (`full` itself when replicated)."""
    dim = getattr(param, "tp_dim", None)
    if dim is None:
        return full
    return shard(full, dim=dim, rank=rank, world_size=world_size, parts=param.tp_parts)
