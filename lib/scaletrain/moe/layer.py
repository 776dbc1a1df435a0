"""The MoE layer: a router, E experts, and the dispatch and combine between them.

It replaces a transformer block's MLP (Shazeer et al. 2017 between LSTM layers; GShard and Switch
in every other FFN of a Transformer). For the T tokens x (T, h) of a micro-batch:

    logits = router(x)                                   (T, E)
    assignments (token, expert, gate)                    router.py: top-k or expert choice
    keep ≤ C per expert                                  capacity.py  (routing="capacity" only)
    rows = x[token], grouped by expert, counts (E,)      dropless.py
    y = experts(rows, counts)                            experts.py: one grouped GEMM per matrix
    out[token] += gate · y                               dropless.combine; 0 for dropped tokens

Three routings, one pipeline:
  "capacity"      top-k token choice with C = ⌈k·T·cf/E⌉ slots per expert (Switch, GShard);
                  pairs over capacity are dropped and counted
  "dropless"      top-k token choice, every assignment kept (MegaBlocks' dMoE)
  "expert_choice" each expert takes its ⌈T·cf/E⌉ best tokens (Zhou et al. 2022)

The layer knows nothing about distribution: expert parallelism swaps `experts` for a module with
the same call, `(rows, counts) -> outputs`, that runs the experts on other ranks
(expert_parallel.py). After each forward, `aux_loss` holds the weighted auxiliary losses to add to
the task loss (α·load balance + c_z·z-loss, losses.py) and `stats` what the routing did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from scaletrain.moe.capacity import apply_capacity, expert_capacity
from scaletrain.moe.dropless import combine, dispatch, group_by_expert
from scaletrain.moe.experts import Experts
from scaletrain.moe.grouped_gemm import GEMMS
from scaletrain.moe.losses import load_balancing_loss, router_z_loss, tokens_per_expert
from scaletrain.moe.router import Router, expert_choice_routing, top_k_routing

__all__ = ["ROUTINGS", "MoEConfig", "MoEStats", "MoE"]

ROUTINGS = ("capacity", "dropless", "expert_choice")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    num_experts: int = 4             # E
    top_k: int = 1                   # k: Switch 1, GShard 2 (token choice only)
    ffn_hidden: int | None = None    # f per expert; None: 4h, the dense MLP's size
    every: int = 2                   # an MoE layer every `every` blocks (Switch, GShard: every other)
    routing: str = "capacity"        # one of ROUTINGS
    capacity_factor: float = 1.25    # Switch's default for training (its Table 1)
    normalize_gates: bool | None = None  # None: renormalise the k gates when k > 1 (GShard)
    aux_loss_coef: float = 1e-2      # α, Switch §2.2
    z_loss_coef: float = 1e-3        # c_z, ST-MoE
    gemm: str = "grouped"            # "grouped" | "loop" | "padded" (grouped_gemm.py)

    def __post_init__(self):
        if self.routing not in ROUTINGS:
            raise ValueError(f"MoEConfig: routing must be one of {ROUTINGS}, got {self.routing!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoEConfig: top_k must be in 1..num_experts = {self.num_experts}, got {self.top_k}")
        if self.every < 1 or self.capacity_factor <= 0:
            raise ValueError(f"MoEConfig: every >= 1 and capacity_factor > 0, got {self.every}, {self.capacity_factor}")
        if self.gemm not in GEMMS:
            raise ValueError(f"MoEConfig: gemm must be one of {sorted(GEMMS)}, got {self.gemm!r}")


@dataclass(frozen=True)
class MoEStats:
    """What one forward's routing did. `chosen` (E,): assignments per expert before capacity;
    `kept` (E,): rows each expert computed; `dropped`: (token, choice) pairs over capacity;
    `dropped_tokens`: tokens with no expert at all (their MoE output is exactly 0);
    `load_balance`, `z_loss`: the unweighted auxiliary losses; `probs` (T, E), `experts` (T, k):
    the router's decision, detached, for pictures."""
    tokens: int
    chosen: torch.Tensor
    kept: torch.Tensor
    dropped: int
    dropped_tokens: int
    load_balance: float
    z_loss: float
    probs: torch.Tensor
    experts: torch.Tensor | None


class MoE(nn.Module):
    def __init__(self, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.router = Router(hidden, cfg.num_experts)
        self.experts = Experts(cfg.num_experts, hidden, cfg.ffn_hidden or 4 * hidden, gemm=cfg.gemm)
        self.aux_loss: torch.Tensor | None = None
        self.stats: MoEStats | None = None

    def reset_parameters(self, gen: torch.Generator, n_layer: int) -> None:
        with torch.no_grad():
            self.router.weight.copy_(torch.randn(self.router.weight.shape, generator=gen) * 0.02)
        self.experts.reset_parameters(gen, n_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., h) -> (..., h); sets `aux_loss` and `stats`."""
        shape, cfg = x.shape, self.cfg
        x = x.reshape(-1, shape[-1])
        t, e = x.shape[0], cfg.num_experts
        logits = self.router(x)
        z = router_z_loss(logits)
        if cfg.routing == "expert_choice":
            c = min(t, expert_capacity(tokens=t, num_experts=e, capacity_factor=cfg.capacity_factor))
            choice = expert_choice_routing(logits, c)
            token, gate = choice.tokens.reshape(-1), choice.gates.reshape(-1)
            expert = torch.arange(e, device=x.device).repeat_interleave(c)
            probs, experts, balance = choice.probs, None, torch.zeros((), dtype=logits.dtype)  # balanced by design
            chosen = kept = torch.full((e,), c)
            dropped, dropped_tokens = 0, t - int(torch.unique(token).numel())  # tokens no expert took
        else:
            routing = top_k_routing(logits, cfg.top_k, normalize=cfg.normalize_gates)
            probs, experts = routing.probs, routing.experts
            balance = load_balancing_loss(probs, experts)
            # assignments in (token, choice) order; group_by_expert then groups them by expert
            token = torch.arange(t, device=x.device).repeat_interleave(cfg.top_k)
            expert, gate = experts.reshape(-1), routing.gates.reshape(-1)
            chosen = tokens_per_expert(experts, e)
            dropped = dropped_tokens = 0
            if cfg.routing == "capacity":
                cap = apply_capacity(experts, e, expert_capacity(tokens=t, num_experts=e, k=cfg.top_k,
                                                                 capacity_factor=cfg.capacity_factor))
                keep = cap.kept.reshape(-1)
                token, expert, gate = token[keep], expert[keep], gate[keep]
                dropped, dropped_tokens = cap.dropped, cap.dropped_tokens
            kept = torch.bincount(expert, minlength=e)
        groups = group_by_expert(token, expert, gate, e)
        y = self.experts(dispatch(x, groups), groups.counts)
        out = combine(y, groups, t)
        self.aux_loss = cfg.aux_loss_coef * balance + cfg.z_loss_coef * z
        self.stats = MoEStats(tokens=t, chosen=chosen.cpu(), kept=kept.cpu(), dropped=dropped,
                              dropped_tokens=dropped_tokens, load_balance=float(balance.detach()), z_loss=float(z.detach()),
                              probs=probs.detach(), experts=None if experts is None else experts.detach())
        return out.view(shape)
