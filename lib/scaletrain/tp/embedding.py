"""The vocabulary-parallel embedding: each rank holds V/t rows of the token table.

Shoeybi et al. 2019, "Megatron-LM", §3 (input embedding): the table E (V, h) is split along the
vocabulary, rank r holds rows [r·V/t, (r+1)·V/t). A token id outside that range contributes zero
on this rank; exactly one rank holds each id, so summing the t partial lookups over the ranks
(g, operators.py) gives every rank the whole embedding (b, s, h). Under sequence parallelism the
sum is a reduce-scatter along the sequence instead (sequence.py), so each rank leaves with its
s/t positions.

Because the split is along V, the output head that shares this weight (GPT-2's tied embeddings)
is a column-parallel layer over the same rows: each rank computes the logits of its V/t tokens,
and the vocabulary-parallel cross-entropy (cross_entropy.py) never needs the others.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.tp.collectives import DEFAULT_BACKEND, check_backend, divide, tp_rank, tp_world_size
from scaletrain.tp.operators import reduce_from_tp
from scaletrain.tp.sequence import reduce_scatter_to_sp
from scaletrain.tp.layers import mark_sharded, shard

__all__ = ["VocabParallelEmbedding", "vocab_range"]


def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of the token ids rank `rank` holds."""
    n = divide("vocab_size", vocab_size, world_size)
    return rank * n, (rank + 1) * n


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding(num_embeddings, embedding_dim) with the rows split over the ranks of `tp_group`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, tp_group: Any = None,
                 sequence_parallel: bool = False, backend: str = DEFAULT_BACKEND):
        super().__init__()
        t, r = tp_world_size(tp_group), tp_rank(tp_group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp_group, self.tp_rank, self.tp_world_size = tp_group, r, t
        self.vocab_start, self.vocab_end = vocab_range(num_embeddings, r, t)
        self.sequence_parallel, self.backend = sequence_parallel, check_backend(backend)
        self.weight = mark_sharded(nn.Parameter(torch.empty(num_embeddings // t, embedding_dim)), dim=0)
        nn.init.normal_(self.weight)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, **kwargs) -> "VocabParallelEmbedding":
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(shard(embedding.weight, dim=0, rank=layer.tp_rank, world_size=layer.tp_world_size))
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)  # any valid row; zeroed below
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sp(partial, self.tp_group, self.backend)
        return reduce_from_tp(partial, self.tp_group, self.backend)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows [{self.vocab_start}, {self.vocab_end}) "
                f"on this rank, sequence_parallel={self.sequence_parallel}")
