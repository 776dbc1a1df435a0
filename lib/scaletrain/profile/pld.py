"""Progressive layer dropping (Zhang & He 2020, arXiv 2010.13369; additional-techniques.md §2).

A training-time speedup that changes the training, not the kernels: each step, layer i of L is kept
with probability p_i(t) and otherwise skipped (the gate G = 0 passes the identity, so a dropped
layer costs nothing forward or backward).  The schedule drops little early in training and in early
layers, more later and deeper, because (the paper's observation, for Pre-LN models) early layers and
early steps change the representation most.  The two schedules, θ(t) over time and p_i(t) over
depth, are the paper's §4 (`theta` and `keep_probabilities` state what they satisfy; DeepSpeed's
defaults θ̄ = 0.5, γ = 0.001).  The model must be Pre-LN, x + f(LN(x)) (our GPT is),
so that skipping a block leaves a well-scaled residual stream.  A kept block's two residual branches
are scaled by 1/p_i (inverted dropout's convention: in expectation the branch equals the full one,
so evaluation runs every layer unscaled).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from scaletrain.models import GPT

__all__ = ["theta", "keep_probabilities", "sample_gates", "pld_forward"]


def theta(t: int, *, theta_bar: float = 0.5, gamma: float = 0.001) -> float:
    """θ(t), the deepest layer's keep probability at step t: the paper's schedule over time (Zhang &
    He 2020, §4), 1 at t = 0 and decaying exponentially, at rate γ per step, towards its floor θ̄."""
    if not 0.0 < theta_bar <= 1.0 or gamma < 0 or t < 0:
        raise ValueError(f"theta: need 0 < theta_bar <= 1, gamma >= 0, t >= 0; got {theta_bar}, {gamma}, {t}")
    # BEGIN SOLUTION
    return (1.0 - theta_bar) * math.exp(-gamma * t) + theta_bar
    # END SOLUTION


def keep_probabilities(t: int, num_layers: int, *, theta_bar: float = 0.5, gamma: float = 0.001) -> list[float]:
    """p_1(t), ..., p_L(t), the list's first entry the layer nearest the input: the paper's schedule
    over depth (§4), falling in equal steps per layer from 1 (at i = 0, the input) to θ(t) at the
    deepest layer, i = L; use `theta`."""
    # BEGIN SOLUTION
    th = theta(t, theta_bar=theta_bar, gamma=gamma)
    return [1.0 - i / num_layers * (1.0 - th) for i in range(1, num_layers + 1)]
    # END SOLUTION


def sample_gates(probs: list[float], generator: torch.Generator | None = None) -> list[bool]:
    """G_i ~ Bernoulli(p_i), one independent draw per layer, from `generator` (torch's default when
    None); a list of bools, True for a kept layer."""
    # BEGIN SOLUTION
    draws = torch.rand(len(probs), generator=generator)
    return [bool(u < p) for u, p in zip(draws.tolist(), probs)]
    # END SOLUTION


def pld_forward(model: GPT, idx: torch.Tensor, targets: torch.Tensor | None, gates: list[bool],
                probs: list[float]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`model`'s forward with block i skipped where gates[i] is False and its branches scaled by
    1/probs[i] where kept (the model is not modified; all gates on and probs 1 is its own forward).
    A block is Pre-LN, x + attn(ln1(x)) then x + mlp(ln2(x)) (scaletrain.models.Block); a dropped
    block runs nothing, forward or backward: its parameters get no gradient."""
    b, s = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(s, device=idx.device))
    # BEGIN SOLUTION
    for block, keep, p in zip(model.blocks, gates, probs):
        if keep:  # Pre-LN: x + f(LN(x)); a dropped block is the identity
            x = x + block.attn(block.ln1(x)) / p
            x = x + block.mlp(block.ln2(x)) / p
    # END SOLUTION
    logits = model.lm_head(model.ln_f(x))
    loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return logits, loss
