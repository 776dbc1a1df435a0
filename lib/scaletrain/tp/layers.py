"""Megatron-LM's column- and row-parallel linear layers (task 6.2).

Shoeybi et al. 2019, "Megatron-LM", §3, equations (2)-(3). torch stores a Linear's weight as
(out, in) and computes Y = X·Wᵀ + b. Over t ranks:

ColumnParallelLinear: W split along *out* (dim 0), rank r holds W_r = rows [r·out/t, (r+1)·out/t)
    and the matching slice of b. Y_r = X·W_rᵀ + b_r is rank r's slice of Y's last dimension: no
    communication in the forward (f: identity); the backward sums dL/dX over the ranks (f's
    allreduce). `gather_output=True` all-gathers Y (an extra collective; Megatron's default for a
    lone layer, off inside a transformer, where a row-parallel layer follows).

RowParallelLinear: W split along *in* (dim 1), rank r holds W_r = columns [r·in/t, (r+1)·in/t)
    and takes X_r, the matching slice of X's last dimension (`input_is_parallel=True`: what a
    column-parallel layer without gather produces; False: the layer slices X itself). X_r·W_rᵀ is
    a partial sum of Y: g's allreduce completes it. The bias is not split: every rank holds all of
    it, and the output must still equal the unsharded layer's, bias included.

Column then row, as in the MLP (h -> 4h -> h) and in attention (QKV, then the output projection),
costs one allreduce forward (g) and one backward (f) for the pair: the GeLU in between is
elementwise, so it runs on Y_r without ever needing the whole Y (Megatron's Figure 3a).

`sequence_parallel=True` (Korthikanti et al. 2022, sequence.py): the column layer takes the
sequence shard (b, s/t, h) and all-gathers it (saving only the shard), the row layer
reduce-scatters its partial sum along the sequence instead of allreducing it.

Build either from an unsharded `nn.Linear` with `from_linear` (its weights sliced, so results are
comparable with the unsharded layer) or directly (a fresh shard initialized as nn.Linear would).
Sizes not divisible by t raise ValueError naming the size.

`shard(full, dim=, rank=, world_size=, parts=)` is the one definition of which slice of an unsharded
tensor a rank holds: the layers, the embedding, `scaletrain.tp.gpt.gpt_shard` and the tests use it.
A fused weight such as attention's QKV projection, (3h, h), is `parts` = 3 blocks (Q, K, V) stacked
along dim 0, and a rank's attention (attention.py) needs Q, K and V *of the same whole heads*: which
rows those are, and why an even split of the stack is wrong, is yours to work out from Shoeybi et al.
2019, §3 and Figure 3b (attention split by heads). Megatron-LM marks such parameters with
`partition_dim` and `partition_stride`; here the same facts sit on the parameter as `tp_dim` and
`tp_parts` (`mark_sharded`), so anything (the grader, a checkpoint writer) can cut the matching
piece of an unsharded tensor (`shard_like`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.tp.collectives import DEFAULT_BACKEND, check_backend, divide, tp_rank, tp_world_size
from scaletrain.tp.operators import copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp
from scaletrain.tp.sequence import reduce_scatter_to_sp, sequence_gather_linear

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "shard", "mark_sharded", "shard_like"]


def shard(full: torch.Tensor, *, dim: int, rank: int, world_size: int, parts: int = 1) -> torch.Tensor:
    """Rank `rank`'s slice (a contiguous copy) of the unsharded `full` along `dim`, out of
    `world_size`: 1/world_size of it.

    parts = 1: `full` is one tensor split `world_size` ways in rank order. parts > 1: `full` is
    `parts` equal blocks stacked along `dim` (QKV: 3); the slice must hold, from every block, the
    rows of the same whole heads of this rank, in block order, because `ParallelSelfAttention`
    splits the rank's output in `parts` equal pieces (Q, K, V) and then in heads, and its output
    projection takes the heads' columns in rank order (module docstring). Graded by property:
    attention built from your slices equals the unsharded attention at head counts t divides, each
    rank holding whole heads, and the GPT equals one process. A size that `parts` and then
    `world_size` do not divide raises ValueError naming it (`divide`).
    """
    # BEGIN SOLUTION
    block = divide(f"size of dim {dim} / parts={parts}", full.shape[dim], parts)
    n = divide(f"size of dim {dim} per part", block, world_size)
    pieces = [full.narrow(dim, p * block + rank * n, n) for p in range(parts)]
    return torch.cat(pieces, dim=dim).contiguous()
    # END SOLUTION


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


def _init_like_linear(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int) -> None:
    """nn.Linear's default initialization, with the *unsharded* fan-in."""
    bound = 1 / math.sqrt(fan_in) if fan_in else 0.0
    with torch.no_grad():
        nn.init.uniform_(weight, -bound, bound)
        if bias is not None:
            nn.init.uniform_(bias, -bound, bound)


class ColumnParallelLinear(nn.Module):
    """Y = X·Aᵀ + b with A split along its output dimension over the ranks of `tp_group`.

    Input (..., in) whole on every rank (under sequence parallelism: (b, s/t, in), this rank's
    sequence shard). Output (..., out/t), this rank's slice, or (..., out) with `gather_output`.
    `parts` > 1: the weight is `parts` blocks stacked along out (QKV: 3); this rank holds `shard`'s
    slice of it and of the bias, so its output is its heads' share of each block, in block order.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, tp_group: Any = None,
                 gather_output: bool = False, sequence_parallel: bool = False,
                 backend: str = DEFAULT_BACKEND, parts: int = 1):
        super().__init__()
        t = tp_world_size(tp_group)
        divide(f"ColumnParallelLinear: out_features/parts ({out_features}/{parts})",
               divide("ColumnParallelLinear: out_features", out_features, parts), t)
        if sequence_parallel and gather_output:
            raise ValueError("ColumnParallelLinear: gather_output=True leaves the sequence-parallel region "
                             "with the whole output on every rank; use one of the two")
        self.in_features, self.out_features, self.parts = in_features, out_features, parts
        self.tp_group, self.tp_rank, self.tp_world_size = tp_group, tp_rank(tp_group), t
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        self.backend = check_backend(backend)
        self.weight = mark_sharded(nn.Parameter(torch.empty(out_features // t, in_features)), dim=0, parts=parts)
        self.register_parameter("bias", mark_sharded(nn.Parameter(torch.empty(out_features // t)), dim=0,
                                                     parts=parts) if bias else None)
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "ColumnParallelLinear":
        """This rank's columns of an unsharded `linear` (same weights on every rank), `kwargs` as `__init__`."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, **kwargs)
        with torch.no_grad():
            # BEGIN SOLUTION
            where = dict(dim=0, rank=layer.tp_rank, world_size=layer.tp_world_size, parts=layer.parts)
            layer.weight.copy_(shard(linear.weight, **where))
            if linear.bias is not None:
                layer.bias.copy_(shard(linear.bias, **where))
            # END SOLUTION
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        if self.sequence_parallel:
            y = sequence_gather_linear(x, self.weight, self.bias, self.tp_group, self.backend)
        else:
            y = F.linear(copy_to_tp(x, self.tp_group, self.backend), self.weight, self.bias)
        return gather_from_tp(y, self.tp_group, self.backend) if self.gather_output else y
        # END SOLUTION

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.out_features // self.tp_world_size} on this rank), parts={self.parts}, "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Y = X·Aᵀ + b with A split along its input dimension over the ranks of `tp_group`.

    Input (..., in/t), this rank's slice (`input_is_parallel=True`) or (..., in) whole. Output
    (..., out) whole on every rank, or (b, s/t, out), this rank's sequence shard, under sequence
    parallelism (which needs `input_is_parallel=True`). The bias is not split.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, tp_group: Any = None,
                 input_is_parallel: bool = True, sequence_parallel: bool = False,
                 backend: str = DEFAULT_BACKEND):
        super().__init__()
        t = tp_world_size(tp_group)
        divide("RowParallelLinear: in_features", in_features, t)
        if sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel=True needs input_is_parallel=True "
                             "(the input of a sequence-parallel row layer is a column layer's output slice)")
        self.in_features, self.out_features = in_features, out_features
        self.tp_group, self.tp_rank, self.tp_world_size = tp_group, tp_rank(tp_group), t
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.backend = check_backend(backend)
        self.weight = mark_sharded(nn.Parameter(torch.empty(out_features, in_features // t)), dim=1)
        # whole on every rank; under SP each rank sums only its positions' gradients (gpt.py syncs them)
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features)) if bias else None)
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "RowParallelLinear":
        """This rank's rows of an unsharded `linear` (same weights on every rank), `kwargs` as `__init__`."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, **kwargs)
        with torch.no_grad():
            # BEGIN SOLUTION
            layer.weight.copy_(shard(linear.weight, dim=1, rank=layer.tp_rank, world_size=layer.tp_world_size))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
            # END SOLUTION
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.tp_group, self.backend)
        partial = F.linear(x, self.weight)  # X_r·W_rᵀ: this rank's share of the sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, self.tp_group, self.backend)
        else:
            y = reduce_from_tp(partial, self.tp_group, self.backend)
        return y if self.bias is None else y + self.bias  # after the sum: added once, not t times
        # END SOLUTION

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.in_features // self.tp_world_size} on this rank), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}")
