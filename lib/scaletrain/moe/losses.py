"""The router's two auxiliary losses: load balance (Switch) and logit size (ST-MoE's z-loss).

Load balance. Left alone, a router collapses: the experts it favours early train faster, score
higher, and get still more tokens (Shazeer et al. 2017, §4). Switch Transformers (Fedus et al.
2021, §2.2, eq. 4-6) add, for N experts and a batch of T tokens,

    loss = α · N · Σᵢ fᵢ · Pᵢ
    fᵢ = (1/T) Σₓ 1{argmax p(x) = i}      the fraction of tokens dispatched to expert i
    Pᵢ = (1/T) Σₓ pᵢ(x)                     the fraction of router probability given to it

fᵢ is a count (no gradient); the gradient flows through Pᵢ and pushes probability away from the
experts that are over-subscribed. Under uniform routing fᵢ = Pᵢ = 1/N and the sum is exactly 1,
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
    """N · Σᵢ fᵢ · Pᵢ (Switch eq. 4 without α): `probs` (T, N) the router's softmax, `experts` (T, k)
    the chosen experts. 1 at perfect balance, N when one expert takes every token with probability 1."""
    t, n = probs.shape
    f = tokens_per_expert(experts, n).to(probs.dtype) / experts.numel()
    p = probs.mean(dim=0)
    return n * (f * p).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """(1/T) Σₜ logsumexp(xₜ)² (ST-MoE eq. 5 without c_z), for router logits (T, N)."""
    return logits.logsumexp(dim=-1).square().mean()
