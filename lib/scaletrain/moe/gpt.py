"""The tiny GPT with an MoE layer in place of the MLP every `every` blocks (Switch and GShard: every
other block, the first MoE block being the second).

    MoEGPT(GPTConfig(...), MoEConfig(num_experts=8, top_k=1), seed=0)

Everything but the replaced MLPs is `scaletrain.models.GPT(cfg, seed=seed)` weight for weight, so
the dense model of the same seed is the baseline at equal active FLOPs (top-1, f = 4h: one expert
per token costs what the dense MLP costs, plus the router's h·E). The MoE layers draw their weights
from a generator of their own, so every rank and the one-process reference build the same experts.

`forward(idx, targets)` returns `(logits, loss)` like the dense GPT, where loss = cross-entropy +
the MoE layers' auxiliary losses (α·load balance + c_z·z-loss each); `last_ce` keeps the
cross-entropy alone and `moe_layers()` the layers, each with its `stats` from that forward.
"""

from __future__ import annotations

import torch

from scaletrain.models import GPT, GPTConfig
from scaletrain.moe.layer import MoE, MoEConfig

__all__ = ["MoEGPT", "moe_block_indices", "MOE_SEED_OFFSET"]

MOE_SEED_OFFSET = 7919  # the experts' generator: seed + this, apart from the dense weights' stream


def moe_block_indices(n_layer: int, every: int) -> list[int]:
    """Blocks whose MLP is an MoE layer: every `every`-th, counting from 1 (every = 2: 1, 3, 5...)."""
    return [i for i in range(n_layer) if i % every == every - 1]


class MoEGPT(GPT):
    def __init__(self, cfg: GPTConfig, moe: MoEConfig, *, seed: int = 0):
        super().__init__(cfg, seed=seed)
        self.moe_cfg = moe
        indices = moe_block_indices(cfg.n_layer, moe.every)
        if not indices:
            raise ValueError(f"MoEGPT: n_layer = {cfg.n_layer} with every = {moe.every} leaves no MoE block")
        gen = torch.Generator().manual_seed(seed + MOE_SEED_OFFSET)
        for i in indices:
            layer = MoE(cfg.n_embd, moe)
            layer.reset_parameters(gen, cfg.n_layer)
            self.blocks[i].mlp = layer
        self.last_ce: torch.Tensor | None = None

    def moe_layers(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits, ce = super().forward(idx, targets)
        if ce is None:
            return logits, None
        self.last_ce = ce.detach()
        return logits, ce + sum(layer.aux_loss for layer in self.moe_layers())
