"""E expert FFNs as one module: weights stacked by expert, run on tokens grouped by expert.

Each expert is the tiny GPT's MLP, h -> f -> h with GELU (f = 4h by default: each expert has the
dense MLP's size, so top-1 routing costs a dense model's FLOPs per token, Switch §2), and the E
experts' weights are stacked along a leading expert dimension:

    w1 (E, h, f)  b1 (E, f)  w2 (E, f, h)  b2 (E, h)         E · (2hf + f + h) parameters

Stacked, the experts are one grouped GEMM per matrix (grouped_gemm.py) and expert parallelism is a
slice along dim 0 (`shard`: rank r of ep holds experts [r·E/ep, (r+1)·E/ep)).

    forward(x (N, h) grouped by expert, counts (E,)) -> (N, h)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from scaletrain.moe.grouped_gemm import GEMMS

__all__ = ["Experts"]


class Experts(nn.Module):
    """E two-layer GELU FFNs, h -> f -> h, computed by `gemm` ("grouped", "loop" or "padded")."""

    def __init__(self, num_experts: int, hidden: int, ffn_hidden: int, *, gemm: str = "grouped", first: int = 0):
        super().__init__()
        if gemm not in GEMMS:
            raise ValueError(f"Experts: gemm must be one of {sorted(GEMMS)}, got {gemm!r}")
        self.gemm, self.first = gemm, first  # first: the global index of expert 0 here (a shard's offset)
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, ffn_hidden))
        self.b1 = nn.Parameter(torch.zeros(num_experts, ffn_hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, ffn_hidden, hidden))
        self.b2 = nn.Parameter(torch.zeros(num_experts, hidden))

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    def reset_parameters(self, gen: torch.Generator, n_layer: int) -> None:
        """GPT-2's init, as scaletrain.models does the dense MLP: N(0, 0.02) in, N(0, 0.02/√(2L)) for
        the projection back into the residual stream, biases 0."""
        with torch.no_grad():
            self.w1.copy_(torch.randn(self.w1.shape, generator=gen) * 0.02)
            self.w2.copy_(torch.randn(self.w2.shape, generator=gen) * (0.02 / math.sqrt(2 * n_layer)))
            self.b1.zero_()
            self.b2.zero_()

    def forward(self, x: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        mm = GEMMS[self.gemm]
        per_row = torch.tensor(list(counts), device=x.device)  # each row's expert bias: repeat by group
        h = mm(x, self.w1, counts) + self.b1.repeat_interleave(per_row, dim=0, output_size=x.shape[0])
        h = F.gelu(h)
        return mm(h, self.w2, counts) + self.b2.repeat_interleave(per_row, dim=0, output_size=x.shape[0])

    def shard(self, rank: int, world_size: int) -> "Experts":
        """A copy holding experts [rank·E/p, (rank+1)·E/p) of this module (p must divide E)."""
        e = self.num_experts
        if e % world_size:
            raise ValueError(f"Experts.shard: {e} experts do not split evenly over {world_size} ranks")
        lo, n = rank * (e // world_size), e // world_size
        part = Experts(n, self.w1.shape[1], self.w1.shape[2], gemm=self.gemm, first=self.first + lo)
        part = part.to(self.w1.dtype)  # before the copy: float64 weights must not pass through float32
        with torch.no_grad():
            for name, p in part.named_parameters():
                p.copy_(getattr(self, name)[lo:lo + n])
        return part
