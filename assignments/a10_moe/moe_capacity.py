# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/moe/capacity.py by `python -m autograder release`; edit the source.
"""Expert capacity: at most C tokens per expert; the rest are dropped and ride the residual.

Why a capacity at all. GShard and Switch compile static shapes (XLA on TPUs): each expert gets a
buffer of C slots per batch, and the all-to-all exchanges fixed-size (E, C, h) tensors. Switch
Transformers (Fedus et al. 2021, §2.2, eq. 3):

    C = (tokens per batch / number of experts) × capacity factor        (k choices: k·T pairs per batch)

A capacity factor above 1 leaves slack for imbalance; every slot above the load is padding that is
computed and sent for nothing. A token whose expert is full is *dropped*: the MoE layer outputs 0
for it, so the block's residual connection passes it through unchanged (x + 0 = x), and the next
layer sees it as if this layer's MLP were absent. Switch reports the drop rate falling as cf rises
(its Table 1: cf 1.0 -> 1.25 -> 2.0), at the price of memory and communication.

Which tokens win the slots (GShard's Algorithm 1, `position_in_expert`): all first choices
before any second choice, and within one choice earlier tokens first: the (choice, token) pairs
are ranked choice-major, and a pair keeps its slot when fewer than C pairs before it in that order
chose the same expert.

    experts (T=4, k=1) = [0, 0, 1, 0],  E = 2, C = 2   ->  positions [0, 1, 0, 2],  kept [1, 1, 1, 0]

The dropless alternative needs no capacity at all (dropless.py, Megablocks); expert choice
routing has the capacity built in (router.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["expert_capacity", "Capacity", "apply_capacity"]


def expert_capacity(*, tokens: int, num_experts: int, capacity_factor: float, k: int = 1) -> int:
    """C, the slots per expert (Switch §2.2, eq. 3, with k choices per token: the k·T (token, choice)
    pairs over E experts, times the capacity factor), an int rounded up: a fractional slot is a
    whole one. At least 1. The quotient is rounded on 9 decimals before rounding up, so that
    0.1·30/3 (2.0000000000000004 in floats) gives 1 slot, not 2. Graded on hidden (T, E, k, cf)."""
    if capacity_factor <= 0 or num_experts < 1 or tokens < 0 or k < 1:
        raise ValueError(f"expert_capacity: need tokens >= 0, num_experts >= 1, k >= 1 and capacity_factor > 0, "
                         f"got {tokens}, {num_experts}, {k}, {capacity_factor}")
    raise NotImplementedError('a10 task 10.3: implement `expert_capacity` (see assignments/a10_moe/README.md)')


@dataclass(frozen=True)
class Capacity:
    """Which (token, choice) pairs keep their slot. `position` (T, k): the pair's rank among those
    that chose the same expert, in GShard's order; `kept` (T, k): position < capacity."""
    capacity: int
    position: torch.Tensor
    kept: torch.Tensor

    @property
    def dropped(self) -> int:
        """(token, choice) pairs over capacity."""
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens that lost every choice: the MoE layer's output for them is exactly 0."""
        return int((~self.kept.any(dim=1)).sum())


def apply_capacity(experts: torch.Tensor, num_experts: int, capacity: int) -> Capacity:
    """Slots for the (token, choice) pairs of `experts` (T, k), at most `capacity` per expert,
    first choices first, then earlier tokens first (GShard Algorithm 1, `position_in_expert`).

    Returns a `Capacity` with `position` (T, k) int64, each pair's 0-based rank among the pairs that
    chose the same expert, in that priority order, and `kept` (T, k) bool, position < capacity.
    What the grader checks on hidden routings (skewed, so that pairs are dropped): every expert
    keeps at most `capacity` pairs; the pairs dropped are exactly those that come after the
    expert's first `capacity` in priority order; `dropped` and `dropped_tokens` count them."""
    t, k = experts.shape
    raise NotImplementedError('a10 task 10.3: implement `apply_capacity` (see assignments/a10_moe/README.md)')
