"""Choosing the next token from logits (b, V): greedy, top-k and top-p (nucleus) sampling.

Top-k (Fan et al. 2018) samples among the k most likely tokens; top-p (Holtzman et al. 2020, "The
curious case of neural text degeneration", §3.1) among the smallest set whose probability reaches
p. Both are filters that set the other logits to -inf before one softmax and one draw, so they
compose: `sampler(top_k=40, top_p=0.9)`.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["greedy", "top_k_filter", "top_p_filter", "sampler"]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the vocabulary: (b, V) → (b,)."""
    return logits.argmax(dim=-1)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties at the k-th value all kept), the rest -inf."""
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability sums to >= p, the rest -inf."""
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    # a token is dropped when the tokens ranked before it already reach p (the first always stays)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sampler(*, top_k: int | None = None, top_p: float | None = None, temperature: float = 1.0,
            generator: torch.Generator | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A `pick` for decode.generate: logits/temperature, filtered, then one multinomial draw per row."""
    def pick(logits: torch.Tensor) -> torch.Tensor:
        logits = logits / temperature
        if top_k is not None:
            logits = top_k_filter(logits, top_k)
        if top_p is not None:
            logits = top_p_filter(logits, top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
    return pick
