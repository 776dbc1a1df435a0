"""Knowledge distillation: a smaller student trained on the trained teacher's soft targets.

Seed: the seminar notes' §2.2 "Knowledge distillation" (`large-scale-dl-optimizations-seminar.md`):
"response-based knowledge ... with common metric being soft targets (Hinton, 2015)", trained
"offline: teacher is trained before distillation". Hinton, Vinyals & Dean 2015, "Distilling the
Knowledge in a Neural Network", §2, with p = softmax(z_t / T), q = softmax(z_s / T):

    L = α · T² · KL(p ‖ q) + (1 − α) · CE(z_s, y)          (KL summed over V, averaged over N positions)

The soft term's gradient at each position is ∂(T² · KL) / ∂z_s = T · (q − p) / N (the KL's own is
(q − p) / (T·N)).
For large T, with zero-mean logits, q − p ≈ (z_s − z_t) / (V·T), so the gradient tends to
(z_s − z_t) / (V·N): independent of T. That is why the soft term carries T²: changing T does not
re-weigh it against the hard term (Hinton §2.1).

`fit` is the loop both runs use: with a teacher it distils, without one it is plain training on the
labels, the from-scratch baseline on the same batches, optimizer and schedule.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["distillation_loss", "fit"]


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, *,
                      temperature: float = 2.0, alpha: float = 0.5) -> torch.Tensor:
    """α·T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)) + (1 − α)·CE(z_s, y), logits (..., V), targets (...).
    The teacher's logits get no gradient."""
    if temperature <= 0:
        raise ValueError(f"distillation_loss: temperature={temperature} must be > 0 (T = 1 is the plain softmax)")
    if not 0 <= alpha <= 1:
        raise ValueError(f"distillation_loss: alpha={alpha} must lie in [0, 1] (the soft term's weight)")
    z_s, z_t = student_logits.flatten(0, -2), teacher_logits.detach().flatten(0, -2)
    log_q, log_p = (z_s / temperature).log_softmax(-1), (z_t / temperature).log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return alpha * temperature**2 * kl + (1 - alpha) * F.cross_entropy(z_s, targets.flatten())


def fit(student: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], steps: int, *,
        lr: float = 3e-3, teacher: nn.Module | None = None, temperature: float = 2.0,
        alpha: float = 0.5) -> list[float]:
    """Train `student` (a scaletrain GPT) for `steps` (idx, targets) batches, AdamW with a cosine
    schedule: on `distillation_loss` against `teacher`'s logits, or on the labels alone without one.
    Returns the loss per step; leaves the student in eval mode."""
    opt = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for _, (idx, targets) in zip(range(steps), batches):
        if teacher is None:
            loss = student(idx, targets)[1]
        else:
            with torch.no_grad():
                teacher_logits = teacher(idx)[0]
            loss = distillation_loss(student(idx)[0], teacher_logits, targets, temperature=temperature, alpha=alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    student.eval()
    return losses
