# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/tp/cross_entropy.py by `python -m autograder release`; edit the source.
"""Cross-entropy over vocabulary-parallel logits, without ever assembling the full logits (task 6.3).

Shoeybi et al. 2019, "Megatron-LM", §3 (output embedding): the head's logits arrive split along
the vocabulary, (N, V/t) per rank. Gathering them would move and hold N·V numbers per rank: for a
GPT-2 vocabulary of 50257 and 8192 tokens, 1.6 GB in fp32, more than all the layers' activations.
Instead, for each of the N rows, with z the logits and y the target (both global):

    loss = log Σ_v exp(z_v - m) + m - z_y,      m = max_v z_v (for a stable exp)

and every term is a reduction over v, which splits over the ranks:
    m      = allreduce_max(max of this rank's logits)             N numbers
    Σ exp  = allreduce(Σ over this rank's V/t logits of exp(z-m))  N numbers
    z_y    = allreduce(z_y if this rank holds y, else 0)           N numbers
so three collectives of N elements replace one of N·V. Backward, with p = softmax(z):
dloss/dz_v = p_v - [v = y], which each rank computes for its own V/t columns from what it saved:
its slice of p (N, V/t) and where its targets fall. Nothing crosses the wire in the backward.

`vocab_parallel_cross_entropy(logits, targets, group)` returns the mean over the N rows like
`F.cross_entropy(full_logits.flatten(0, -2), targets.flatten())`; every rank gets the same loss.
"""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.tp.collectives import DEFAULT_BACKEND, allreduce, allreduce_max, tp_rank, tp_world_size
from scaletrain.tp.embedding import vocab_range

__all__ = ["VocabParallelCrossEntropy", "vocab_parallel_cross_entropy"]


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-row losses (N,) from this rank's logits (N, V/t) and the global targets (N,)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, group: Any, backend: str) -> torch.Tensor:
        rank, t = tp_rank(group), tp_world_size(group)
        start, end = vocab_range(logits.shape[-1] * t, rank, t)
        raise NotImplementedError('a6 task 6.3: implement `forward` (see assignments/a6_tensor_parallel/README.md)')

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        raise NotImplementedError('a6 task 6.3: implement `backward` (see assignments/a6_tensor_parallel/README.md)')


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group: Any = None,
                                 backend: str = DEFAULT_BACKEND) -> torch.Tensor:
    """Mean cross-entropy of this rank's logits (..., V/t) against the global targets (...)."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"vocab_parallel_cross_entropy: logits {tuple(logits.shape)} and targets "
                         f"{tuple(targets.shape)} must agree on every dimension but the last")
    losses = VocabParallelCrossEntropy.apply(logits.flatten(0, -2), targets.flatten(), group, backend)
    return losses.mean()
