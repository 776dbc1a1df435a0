"""Sequence-length curriculum (Li, Zhang & He 2022, arXiv 2108.06084; additional-techniques.md §4).

Short sequences are the "easy" samples: early in training the batch's sequences are cut to a short
length that grows to the full one over T steps (DeepSpeed's `seqlen` curriculum, `fixed_root`
schedule; root 1 is its `fixed_linear`):

    s(t) = min(s_full, s_0 + (s_full − s_0)·(t / T)^(1/root)), rounded down to a multiple of `step`

and never below s_0.  The rounding keeps the set of shapes small (each new length is a new kernel
shape, a new compilation under torch.compile).  Early steps cost less (fewer tokens, attention's s²
shrinking faster), which is where the time to a given loss is won.
"""

from __future__ import annotations

import torch

__all__ = ["seq_len_at", "truncate"]


def seq_len_at(t: int, *, full: int, start: int, total_steps: int, step: int = 8, root: int = 1) -> int:
    """The curriculum's sequence length at step t: non-decreasing, `start` at t = 0, `full` from T on."""
    if not 0 < start <= full or total_steps < 1 or step < 1 or root < 1 or t < 0:
        raise ValueError(f"seq_len_at: need 0 < start <= full, total_steps, step, root >= 1, t >= 0; got "
                         f"start={start}, full={full}, total_steps={total_steps}, step={step}, root={root}, t={t}")
    if t >= total_steps:
        return full
    grown = start + (full - start) * (t / total_steps) ** (1.0 / root)
    return max(start, min(full, int(grown) // step * step))


def truncate(idx: torch.Tensor, targets: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's first `seq_len` positions (inputs and their shifted targets alike)."""
    return idx[:, :seq_len].contiguous(), targets[:, :seq_len].contiguous()
