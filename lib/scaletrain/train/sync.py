"""Gradient synchronization over the dp group: what the capstone's loop calls after the pipeline's backward.

Two objects with one interface, chosen once by `for_config` (the loop never asks which):
  * `PlainDataParallel` (--zero 0): every gradient averaged over dp by one ring allreduce of a flat
    buffer after the backward (bucketing and overlap with it, as in `scaletrain.dp.DataParallel`,
    would need the executor to mark the last micro-batch), then the optimizer;
  * `ZeroDataParallel` (--zero S): `scaletrain.zero.ZeRO` (Rajbhandari et al. 2020, §5; seminar
    §1.2.6) on the dp group only; each rank shards, over its dp peers, the Ψ parameters it holds
    (its tp slice of its pp stage). Stage 1 reduce-scatters in the step; the stages that partition
    gradients (2, 3) reduce-scatter inside the backward, so the fix-ups below sum gradient shards.

The fix-ups run before anything is averaged: the sequence-parallel parameters' partial gradients
summed over tp, and the tied embedding summed over the first and the last stage. Every sum is linear,
so summing shards after the dp mean equals the dp mean of the sums (Megatron's
`finalize_model_grads` also sums after its distributed optimizer's reduce-scatter).
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.nn as nn

from scaletrain.comm import ring_allreduce
from scaletrain.tp.collectives import allreduce
from scaletrain.tp.gpt import allreduce_sequence_parallel_grads, sequence_parallel_params
from scaletrain.train.config import OPTIMIZER_CLASSES, TrainConfig, make_optimizer
from scaletrain.train.recipe import Recipe
from scaletrain.zero import ZeRO, expected_memory, stage_facts, unshard

__all__ = ["PlainDataParallel", "ZeroDataParallel", "for_config"]


class PlainDataParallel:
    """Stage 0: gradients whole on every rank, averaged over dp in `step`, then the optimizer."""

    def __init__(self, cfg: TrainConfig, recipe: Recipe):
        self.params, self.dp_group = recipe.params, recipe.mesh.dp_group
        self.optimizer = make_optimizer(cfg, self.params)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def bytes_sent(self) -> int:
        """Bytes this object's own counter saw (hooks inside the backward): none here."""
        return 0

    def sum_sequence_parallel(self, stage: nn.Module, tp_group) -> None:
        allreduce_sequence_parallel_grads(stage, tp_group)

    def sum_tied(self, weight: nn.Parameter, group) -> None:
        _sum_grad(weight, group)

    def step(self) -> None:
        _average_over_dp(self.params, self.dp_group)
        self.optimizer.step()

    def final_params(self) -> list[torch.Tensor]:
        """Copies of this rank's parameters, in the order of `recipe.params`."""
        return [p.detach().clone() for p in self.params]

    def memory(self) -> dict | None:
        return None


class ZeroDataParallel(PlainDataParallel):
    """ZeRO-S over the dp group; the tied embedding in a param group of its own when this stage holds
    it: its own flat unit, laid out alike on the first and the last stage, so that the two halves of
    its gradient can be summed shard by shard after ZeRO-2/3's reduce-scatter."""

    def __init__(self, cfg: TrainConfig, recipe: Recipe):
        self.params, self.stage = recipe.params, cfg.zero
        tied = recipe.model.wte.weight
        groups = [{"params": [p for p in self.params if p is not tied]}]
        if any(p is tied for p in self.params):
            groups.insert(0, {"params": [tied]})
        self.optimizer = ZeRO(recipe.stage, optimizer_class=OPTIMIZER_CLASSES[cfg.optimizer], stage=cfg.zero,
                              group=recipe.mesh.dp_group, param_groups=groups, lr=cfg.lr)
        self.facts = stage_facts(cfg.zero)
        self.sp_params = {id(p) for p in sequence_parallel_params(recipe.stage)}

    @property
    def bytes_sent(self) -> int:
        return self.optimizer.sent.bytes_sent

    def sum_sequence_parallel(self, stage: nn.Module, tp_group) -> None:
        if self.facts.gradients:  # reduce-scattered inside the backward: sum the shards
            _allreduce_shards(self.optimizer, self.sp_params, tp_group)
        else:
            allreduce_sequence_parallel_grads(stage, tp_group)

    def sum_tied(self, weight: nn.Parameter, group) -> None:
        if self.facts.gradients:
            _allreduce_shards(self.optimizer, {id(weight)}, group)
        else:
            _sum_grad(weight, group)

    def step(self) -> None:
        self.optimizer.step()  # stage 1 reduce-scatters here; every stage averages over dp

    def final_params(self) -> list[torch.Tensor]:
        """With parameters sharded (stage 3) each unit is gathered into a fresh buffer (collective
        over dp) and read through the unit's views."""
        if not self.facts.parameters:
            return super().final_params()
        values = {}
        for unit in self.optimizer.units:
            buffer = unit.shard.new_empty(unit.padded_numel)
            unshard(buffer, unit.shard.detach(), self.optimizer.group)
            values.update({id(p): v.clone() for p, v in zip(unit.params, unit.views(buffer))})
        return [values[id(p)] for p in self.params]

    def memory(self) -> dict:
        """Bytes this rank holds now (after a step, before the next zero_grad), and ZeRO §5's formula
        at this rank's padded parameter count Ψ' (flat buffers are padded to a multiple of N_d)."""
        zero = self.optimizer
        held, formula = zero.memory_report(), expected_memory(zero.units, zero.optimizer, self.stage)
        return {"params": held.params, "grads": held.grads, "optimizer": held.optimizer,
                "expected": asdict(formula), "num_params": sum(u.numel for u in zero.units),
                "padded_params": sum(u.padded_numel for u in zero.units), "dp": zero.dp_world_size}


def for_config(cfg: TrainConfig, recipe: Recipe) -> PlainDataParallel:
    """The gradient synchronization `cfg` asks for (collective: ZeRO builds its flat units)."""
    return ZeroDataParallel(cfg, recipe) if cfg.zero else PlainDataParallel(cfg, recipe)


def _sum_grad(weight: nn.Parameter, group) -> None:
    if weight.grad is None:
        weight.grad = torch.zeros_like(weight)
    ring_allreduce(weight.grad, group=group)


def _average_over_dp(params: list, dp_group) -> None:
    """Plain data parallelism: every gradient averaged over dp by one ring allreduce of a flat buffer."""
    for p in params:  # a parameter this stage did not use this step still takes part (zeros)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    ring_allreduce(flat, op="avg", group=dp_group)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def _allreduce_shards(zero: ZeRO, param_ids: set[int], group) -> None:
    """ZeRO-2/3: sum over `group` the elements of this rank's gradient shards that belong to the
    parameters `param_ids`: the sequence-parallel ones over tp, the tied embedding over its group.

    Rank r's shard of a unit is elements [r·m, (r+1)·m) of its flat buffer; the ranks of `group`
    share r and hold those parameters at the same offsets of equal-sized units (tp peers: the same
    units; the embedding: a unit of its own), so the pieces below line up across them: one
    allreduce of their concatenation."""
    pieces = []
    for unit in zero.units:
        lo, hi = unit.dp_rank * unit.shard_numel, (unit.dp_rank + 1) * unit.shard_numel
        for p, offset in zip(unit.params, unit.offsets):
            a, b = max(lo, offset), min(hi, offset + p.numel())
            if id(p) in param_ids and a < b:
                pieces.append(unit.shard.grad[a - lo:b - lo])
    if pieces:
        flat = allreduce(torch.cat(pieces), group)
        for piece, g in zip(pieces, flat.split([x.numel() for x in pieces])):
            piece.copy_(g)
