# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/moe/router.py by `python -m autograder release`; edit the source.
"""Routers: which experts see which token, and with what weight.

Token choice (each token picks its k best experts). Shazeer et al. 2017 (eq. 3-5) introduced the
gate G(x) = Softmax(KeepTopK(x·W_g, k)); Switch Transformers (Fedus et al. 2021, §2.1, eq. 1-2)
route each token to one expert (k = 1) and scale that expert's output by its router
probability p_i(x); GShard (Lepikhin et al. 2020, Algorithm 1) routes to two (k = 2) and
renormalises the pair so that its two weights sum to 1.

    logits (T, E)  one row per token, one column per expert    ->  probs (T, E)
    experts (T, k) each token's k best, best first              gates (T, k) their weights

Why not renormalise at k = 1: the gate would be 1 for every token and the router weights would get
no gradient from the task loss at all (only from the auxiliary losses, losses.py).

Expert choice (Zhou et al. 2022, §3.1): each *expert* picks the c tokens it scores highest,
c = T · capacity_factor / E, with the same softmax over experts per token:

    S = softmax(logits) (T, E);   gates, tokens = topk(Sᵀ, c)   (E, c)

Every expert gets exactly c tokens (perfect balance, no auxiliary loss needed), but a token may
be taken by several experts or by none (it then passes through the residual only), and a token's
experts depend on the other tokens of the batch, later ones included: the paper's limitations
note that this does not carry over to auto-regressive generation as it stands.

Ties in topk are broken by torch; the tests use inputs without ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = ["Routing", "ExpertChoice", "top_k_routing", "expert_choice_routing", "Router"]


@dataclass(frozen=True)
class Routing:
    """Token choice: `experts` and `gates` (T, k), best first; `probs` and `logits` (T, E)."""
    logits: torch.Tensor
    probs: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.probs.shape[1]

    @property
    def k(self) -> int:
        return self.experts.shape[1]


@dataclass(frozen=True)
class ExpertChoice:
    """Expert choice: expert e takes tokens `tokens[e]` with weights `gates[e]`, each (E, c)."""
    logits: torch.Tensor
    probs: torch.Tensor
    tokens: torch.Tensor
    gates: torch.Tensor


def top_k_routing(logits: torch.Tensor, k: int, *, normalize: bool | None = None) -> Routing:
    """Each token's k best experts from router logits (T, E) (Switch §2.1; GShard Algorithm 1).

    Returns a `Routing` whose `logits` are the input, `probs` (T, E) the router's softmax over
    experts, `experts` (T, k) int64 each token's k most probable experts, best first, and `gates`
    (T, k) the weight of each choice. `normalize` (None: k > 1) makes each token's k gates sum to
    1 (GShard); off, a gate is the token's router probability for that expert (Switch at k = 1,
    where the router would otherwise get no gradient from the task loss). Gates stay differentiable
    with respect to `logits`; the input is not modified. Graded: all four fields on hidden (T, E, k),
    and the gradient of the gates."""
    t, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"top_k_routing: k must be in 1..{e} (the number of experts), got {k}")
    raise NotImplementedError('a10 task 10.1: implement `top_k_routing` (see assignments/a10_moe/README.md)')


def expert_choice_routing(logits: torch.Tensor, capacity: int) -> ExpertChoice:
    """Each expert's `capacity` highest-scoring tokens (Expert Choice §3.1): gates are the token's
    softmax probability for that expert, S[token, expert]. The paper's c = T · capacity_factor / E
    is `capacity.expert_capacity(tokens=T, num_experts=E, capacity_factor=cf)`."""
    t, e = logits.shape
    if not 1 <= capacity <= t:
        raise ValueError(f"expert_choice_routing: capacity must be in 1..{t} (the number of tokens), got {capacity}")
    probs = logits.softmax(dim=-1)
    gates, tokens = probs.t().topk(capacity, dim=-1)  # (E, c): the experts choose
    return ExpertChoice(logits=logits, probs=probs, tokens=tokens, gates=gates)


class Router(nn.Module):
    """The router's one weight matrix W_r (E, h), no bias (Switch, GShard): logits = x · W_rᵀ."""

    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(T, h) -> logits (T, E)."""
        return x @ self.weight.t()
