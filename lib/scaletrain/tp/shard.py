"""Which slice of an unsharded weight a tensor-parallel rank holds: one definition for layers and tests.

A tensor-parallel parameter is a slice of the unsharded one along `dim`. A fused weight such as
attention's QKV projection, (3h, h), is `parts` = 3 blocks [W_q; W_k; W_v] stacked along dim 0;
rank r must hold the rows of *its heads* in each block, i.e. block-wise slices
[W_q,r; W_k,r; W_v,r], not rows [r·3h/t, (r+1)·3h/t) of the stack (which would give rank 0 all of
Q and part of K). Megatron-LM marks such parameters with `partition_dim` and `partition_stride`
(Shoeybi et al. 2019, §3); here the same facts sit on the parameter as `tp_dim` and `tp_parts`,
so anything (the tests, the grader, a checkpoint writer) can slice the matching piece of an
unsharded tensor with `shard`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from scaletrain.tp.collectives import divide

__all__ = ["shard", "mark_sharded", "shard_like"]


def shard(full: torch.Tensor, *, dim: int, rank: int, world_size: int, parts: int = 1) -> torch.Tensor:
    """Rank `rank`'s slice of `full` along `dim`, block-wise over `parts` stacked blocks (a copy)."""
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
