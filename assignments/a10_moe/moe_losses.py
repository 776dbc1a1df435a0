# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/moe/losses.py by `python -m autograder release`; edit the source.
"""The router's two auxiliary losses: load balance (Switch) and logit size (ST-MoE's z-loss).

Load balance. Left alone, a router collapses: the experts it favours early train faster, score
higher, and get still more tokens (Shazeer et al. 2017, §4). Switch Transformers (Fedus et al.
2021, §2.2, eq. 4-6) add, for N experts and a batch of T tokens, α·N times the dot product of two
vectors over the experts: fᵢ, the fraction of the tokens dispatched to expert i (eq. 5), and Pᵢ,
the fraction of the router probability given to expert i (eq. 6).

fᵢ is a count (no gradient); the gradient flows through Pᵢ and pushes probability away from the
experts that are over-subscribed. Under uniform routing fᵢ = Pᵢ = 1/N and the loss is exactly 1,
whatever N: α = 10⁻² in the paper. With k > 1 choices per token we count every choice and divide by
k·T, so Σ fᵢ = 1 and the uniform value stays 1 (Megatron-Core and Mixtral's convention; GShard's
Algorithm 1 counts the first choice only).

Router z-loss (Zoph et al. 2022, ST-MoE, eq. 5), for router logits x (T, N):

    L_z = (1/T) Σₜ (log Σⱼ exp xₜⱼ)²

It keeps the logits small, so the softmax's exponentials stay in range in bfloat16 (their rounding
grows with the logits' size), at no cost in quality; c_z = 10⁻³ in the paper.

Both are computed over the tokens one rank routes (its micro-batch): with data parallelism each rank
adds its own, and the gradient averaging takes their mean, as it does for the task loss.
"""

from __future__ import annotations

import torch

__all__ = ["tokens_per_expert", "load_balancing_loss", "router_z_loss"]


def tokens_per_expert(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many of the (token, choice) pairs of `experts` (T, k) chose each expert: (E,) int64."""
    return torch.bincount(experts.reshape(-1), minlength=num_experts)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch's load-balancing loss (§2.2, eq. 4-6) without α, a 0-dim tensor: `probs` (T, N) the
    router's softmax, `experts` (T, k) the chosen experts (every choice counts, over k·T). 1 at
    perfect balance, N when one expert takes every token with probability 1. Differentiable with
    respect to `probs` only, through the probability fractions; the inputs are not modified.
    Graded: the value and the gradient with respect to `probs` on hidden routings (k = 1, 2, 3)."""
    t, n = probs.shape
    raise NotImplementedError('a10 task 10.2: implement `load_balancing_loss` (see assignments/a10_moe/README.md)')


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """(1/T) Σₜ logsumexp(xₜ)² (ST-MoE eq. 5 without c_z), for router logits (T, N)."""
    return logits.logsumexp(dim=-1).square().mean()
