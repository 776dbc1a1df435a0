# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/tp/operators.py by `python -m autograder release`; edit the source.
"""The conjugate operators f and g of Megatron-LM, and the gather/scatter of the last dimension (task 6.1).

Shoeybi et al. 2019, "Megatron-LM", §3 and Figure 3: a tensor-parallel MLP computes
Z = GeLU(X·A)·B with A split by columns and B by rows over t ranks. Two operators make every
rank's autograd graph correct with one allreduce forward and one backward:

    f  (before the column-parallel layer): forward identity,  backward allreduce
    g  (after the row-parallel layer):     forward allreduce, backward identity

Why: X enters every rank whole and each rank uses it only through its own columns A_r, so
dL/dX = Σ_r dL/dY_r·A_rᵀ is a sum of t partial products, one per rank: f's backward sums them.
The row-parallel layer leaves each rank with a partial sum Z_r = Y_r·B_r of Z = Σ_r Z_r: g's
forward sums them, and since dL/dZ_r = dL/dZ, g's backward hands every rank the same gradient.
f and g are conjugate: each is the other's transpose (identity ↔ sum over ranks).

Two more, for the layers' optional ends (Megatron's `gather_output=True` and
`input_is_parallel=False`): gathering the last dimension (forward all-gather, backward keep this
rank's slice) and scattering it (forward keep the slice, backward all-gather). They are conjugate too.

Every operator takes the tensor-parallel `group` and the `backend` ("ring": our collectives,
counted by `comm_counter`; "torch": torch.distributed's), see collectives.py.
Seed: "Techniques for large-scale training", Tensor Parallelism; "Large scale deep learning
optimizations" seminar, §1.2.4.
"""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.tp.collectives import DEFAULT_BACKEND, all_gather, allreduce, split

__all__ = ["CopyToTensorParallel", "ReduceFromTensorParallel", "GatherFromTensorParallel",
           "ScatterToTensorParallel", "copy_to_tp", "reduce_from_tp", "gather_from_tp", "scatter_to_tp"]


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, allreduce (sum over the group) backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.1: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.1: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: allreduce (sum over the group) forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.1: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.1: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


class GatherFromTensorParallel(torch.autograd.Function):
    """Forward: all-gather along the last dim (rank order); backward: this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.1: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.1: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


class ScatterToTensorParallel(torch.autograd.Function):
    """Forward: this rank's slice along the last dim; backward: all-gather the slices' gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        raise NotImplementedError('a6 task 6.1: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a6 task 6.1: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


def copy_to_tp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """f(x): enter a column-parallel region."""
    return CopyToTensorParallel.apply(x, group, backend)


def reduce_from_tp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """g(x): leave a row-parallel region with the sum of the partial results."""
    return ReduceFromTensorParallel.apply(x, group, backend)


def gather_from_tp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    return GatherFromTensorParallel.apply(x, group, backend)


def scatter_to_tp(x: torch.Tensor, group: Any = None, backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    return ScatterToTensorParallel.apply(x, group, backend)
