"""Magnitude pruning: the smallest weights set to zero, one at a time or a whole output row at a time.

Seed: the seminar notes' §2.3 "Pruning" (`large-scale-dl-optimizations-seminar.md`): magnitude based,
"weights with larger values are more important ... all weights below a certain threshold" are
pruned (Han et al. 2015, "Learning both Weights and Connections"); structured pruning removes
"entire neurons, filters or channels", and only that shrinks the matrices: "unstructured pruning
can't reduce memory footprint since matrices stay the same". With sparsity s:

    unstructured   keep the (1 − s)·n weights of largest |w|, n counted over every pruned weight
                   (kind "global": one threshold for the model) or per Linear (kind "layer")
    structured     per Linear, zero the s·out output rows of smallest ‖W_o,:‖₂ and their bias
                   (kind "row"): the neuron's output is 0, so its row can leave the matrix

Exactly round(s·n) weights (rows) go: ranks from a stable sort, which ties cannot blur the way a
threshold |w| < τ would. Pruned: every Linear inside the model's blocks (the tied embedding /
lm_head stays, as in quantization). One shot, no retraining after it (Han et al. retrain).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

__all__ = ["KINDS", "block_linears", "magnitude_masks", "row_masks", "prune", "zero_fraction"]

KINDS = ("global", "layer", "row")


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The Linears inside `model.blocks`, by their names in the model (blocks.0.attn.qkv, ...)."""
    return {f"blocks.{name}": m for name, m in model.blocks.named_modules() if isinstance(m, nn.Linear)}


def _keep_largest(scores: torch.Tensor, drop: int) -> torch.Tensor:
    """A mask of `scores`' shape, False at its `drop` smallest entries."""
    keep = torch.ones(scores.numel(), dtype=torch.bool)
    keep[scores.flatten().argsort(stable=True)[:drop]] = False
    return keep.view(scores.shape)


def _check(sparsity: float) -> None:
    if not 0 <= sparsity < 1:
        raise ValueError(f"prune: sparsity={sparsity} must lie in [0, 1): the fraction of weights set to zero "
                         "(1 would remove them all)")


def magnitude_masks(weights: list[torch.Tensor], sparsity: float, *, scope: str = "global") -> list[torch.Tensor]:
    """Unstructured: keep-masks dropping the round(sparsity·n) smallest |w|, over all `weights`
    together (scope "global") or within each (scope "layer")."""
    _check(sparsity)
    if scope == "layer":
        return [_keep_largest(w.detach().abs(), round(sparsity * w.numel())) for w in weights]
    if scope != "global":
        raise ValueError(f"magnitude_masks: scope={scope!r} must be 'global' or 'layer'")
    flat = torch.cat([w.detach().abs().flatten() for w in weights])
    keep = _keep_largest(flat, round(sparsity * flat.numel()))
    return [m.view(w.shape) for m, w in zip(keep.split([w.numel() for w in weights]), weights)]


def row_masks(weights: list[torch.Tensor], sparsity: float) -> list[torch.Tensor]:
    """Structured: per weight (out, in), keep-masks dropping its round(sparsity·out) rows of smallest L2 norm."""
    _check(sparsity)
    return [_keep_largest(w.detach().norm(dim=1), round(sparsity * w.shape[0]))[:, None].expand_as(w)
            for w in weights]


@torch.no_grad()
def prune(model: nn.Module, sparsity: float, *, kind: str = "global") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A copy of `model` with its blocks' Linears pruned (kind in KINDS), and the keep-masks by Linear name."""
    if kind not in KINDS:
        raise ValueError(f"prune: kind={kind!r} must be one of {KINDS}")
    model = copy.deepcopy(model)
    linears = block_linears(model)
    weights = [m.weight for m in linears.values()]
    masks = row_masks(weights, sparsity) if kind == "row" else magnitude_masks(weights, sparsity, scope=kind)
    for linear, mask in zip(linears.values(), masks):
        linear.weight.masked_fill_(~mask, 0.0)
        if kind == "row" and linear.bias is not None:
            linear.bias.masked_fill_(~mask[:, 0], 0.0)  # the whole neuron goes, its constant too
    return model, dict(zip(linears, masks))


def zero_fraction(model: nn.Module) -> float:
    """The share of exact zeros among the weights of the model's blocks' Linears."""
    weights = [m.weight for m in block_linears(model).values()]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
