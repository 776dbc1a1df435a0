# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/tp/sequence.py by `python -m autograder release`; edit the source.
"""Sequence parallelism: the all-gather / reduce-scatter pair that replaces f and g (task 6.4).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.2.2
and Figure 5. Tensor parallelism (operators.py) leaves the LayerNorms, the dropouts and the residual
adds replicated: every rank holds and saves the whole (b, s, h) activations there, the 10·s·b·h
bytes per layer of sbhL(10 + 24/t + 5as/(ht)) that do not shrink with t. Those operations are
independent along the sequence, so each rank can run them on its own s/t positions instead. The
transitions between the two regions become

    g  (allreduce after the row-parallel layer)  ->  reduce-scatter along the sequence  ("g-bar")
    f  (identity before the column-parallel layer) ->  all-gather along the sequence    ("g")

and their backwards are the conjugates: all-gather's is reduce-scatter and vice versa. An allreduce
*is* a reduce-scatter followed by an all-gather (collectives.py), so a layer sends exactly the bytes
it sent under tensor parallelism, while every activation outside the tensor-parallel regions is
divided by t: sbhL(34/t + 5as/(ht)) (`scaletrain.memory.sequence_parallel_activation_bytes`).

One more step is needed to reach 34/t: the column-parallel layer must not save the gathered input
(b, s, h) for its weight gradient. `SequenceGatherLinear` saves only this rank's shard and
all-gathers it again in the backward (Korthikanti §4.2.2; Megatron-LM's
`LinearWithGradAccumulationAndAsyncCommunication`): two more all-gathers of b·s·h per layer,
which Megatron overlaps with the input-gradient computation.

Tensors are batch-first, (b, s, h), as in `scaletrain.models`: the sequence is dim 1 (SEQ_DIM).
Megatron keeps (s, b, h) so that its shards are contiguous; here the collectives pay one copy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from scaletrain.tp.collectives import DEFAULT_BACKEND, all_gather, reduce_scatter

__all__ = ["SEQ_DIM", "GatherFromSequenceParallel", "ReduceScatterToSequenceParallel",
           "SequenceGatherLinear", "gather_from_sp", "reduce_scatter_to_sp", "sequence_gather_linear"]

SEQ_DIM = 1


class GatherFromSequenceParallel(torch.autograd.Function):
    """Forward: all-gather the sequence shards (b, s/t, h) -> (b, s, h); backward: reduce-scatter."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.4: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.4: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Forward: sum the partial (b, s, h) over the ranks, keep this rank's (b, s/t, h); backward: all-gather."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.4: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.4: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


class SequenceGatherLinear(torch.autograd.Function):
    """y = all_gather_seq(x)·Wᵀ + b, saving only the shard x for the backward (which gathers it again)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Any,
                backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.4: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.4: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


def gather_from_sp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    return GatherFromSequenceParallel.apply(x, group, backend)


def reduce_scatter_to_sp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    return ReduceScatterToSequenceParallel.apply(x, group, backend)


def sequence_gather_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                           group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    return SequenceGatherLinear.apply(x, weight, bias, group, backend)
