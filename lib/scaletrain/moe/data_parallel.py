"""Expert parallelism composed with data parallelism: which gradients are averaged over which ranks.

On a mesh with dp data-parallel ranks split into ep-rank expert groups (scaletrain.mesh,
ParallelDims(dp=, ep=)), every rank holds a different micro-batch and the objective is the mean of
the dp ranks' losses, L = (1/dp) Σ_r L_r. Two kinds of parameter, two groups:

  dense   (attention, router, LayerNorms, embeddings): replicated on all dp ranks, each holding
          ∂L_r/∂θ; the mean over the dp group is ∂L/∂θ.            ring allreduce, op="avg", dp group
  expert  (E/ep experts per rank): replicated only over the dp/ep ranks that hold the same slice
          (the "edp" group). After the all-to-all's backward, a rank's expert gradient already sums
          Σ_{r ∈ its ep group} ∂L_r/∂W_e; summing over the edp group adds the other ep groups,
          Σ over all dp ranks; dividing by dp (not by dp/ep, the size of the group) gives ∂L/∂W_e.
                                                                   ring allreduce, op="sum", edp group, / dp

At ep = 1 the edp group is the dp group and both rules are the plain mean. DeepSpeed-MoE and
Megatron-Core keep the same two groups ("expert data parallel"). Each kind is flattened into one
buffer and sent as one allreduce (module 3's bucket, one per kind).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from scaletrain.comm.ring import ring_allreduce
from scaletrain.moe.experts import Experts

__all__ = ["expert_parameters", "dense_parameters", "sync_gradients"]


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every `Experts` module (a shard's too, under ExpertParallel)."""
    return [p for m in model.modules() if isinstance(m, Experts) for p in m.parameters()]


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every other parameter (once each: the tied embedding is one tensor)."""
    experts = {id(p) for p in expert_parameters(model)}
    return [p for p in model.parameters() if id(p) not in experts]


def _allreduce_grads(params: list[nn.Parameter], group: Any, op: str, scale: float = 1.0) -> None:
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    ring_allreduce(flat, op=op, group=group)
    if scale != 1.0:
        flat.mul_(scale)
    for p, chunk in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = chunk.view_as(p).clone()


def sync_gradients(model: nn.Module, *, dp_group: Any, edp_group: Any) -> None:
    """Dense gradients: mean over `dp_group`; expert gradients: sum over `edp_group`, divided by the
    dp size (module docstring). Every rank of the dp group calls it after backward."""
    dp = dist.get_world_size(dp_group)
    _allreduce_grads(dense_parameters(model), dp_group, "avg")
    _allreduce_grads(expert_parameters(model), edp_group, "sum", 1.0 / dp)
