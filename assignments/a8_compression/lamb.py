# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/compression/lamb.py by `python -m autograder release`; edit the source.
"""LAMB: Adam's update rescaled per layer by a trust ratio ‖w‖ / ‖update‖.

You et al., 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
Algorithm 2; seminar notes §1.2.8.1.1 (LARS's trust ratio with Adam in place of SGD). Each
parameter tensor is a "layer"; Adam's moments and their bias correction are given, the layer-wise
part of Algorithm 2 (decoupled weight decay in the update, the trust ratio with φ = identity,
the step) is task 8.3. The property every correct step has: where the ratio is not clamped, a
layer moves by exactly lr·‖x‖, so a large batch's large learning rate is spent in proportion to
each layer's weight scale, which keeps layers with small weights stable.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["LAMB"]


class LAMB(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, bias_correction: bool = True,
                 max_trust: float | None = None):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"LAMB: lr, eps, weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"LAMB: betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction, max_trust=max_trust))

    @torch.no_grad()
    def step(self, closure=None):
        """One LAMB step (You et al. 2020, Alg. 2, with φ = identity). Per parameter, after Adam's
        moments (given, `u`): the layer-wise rest of the algorithm. Contract: the trust ratio is
        recorded as a float in `self.state[x]["trust_ratio"]`; it is 1 when either norm it divides
        is 0 and at most `max_trust` when that is set; weight decay is decoupled (part of the
        update the ratio measures, as in the paper); graded against Algorithm 2 written out on
        hidden layers and settings, and by the layer's step size."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for x in group["params"]:
                if x.grad is None:
                    continue
                g = x.grad
                state = self.state[x]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(x)
                    state["exp_avg_sq"] = torch.zeros_like(x)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if group["bias_correction"]:
                    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
                else:
                    m_hat, v_hat = m, v
                u = m_hat / (v_hat.sqrt() + group["eps"])
                raise NotImplementedError('a8 task 8.3: implement `step` (see assignments/a8_compression/README.md)')
        return loss
