# The file to fill in (handout: README.md here). Staff: generated from lib/scaletrain/precision/scaler.py by `python -m autograder release`; edit the source.
"""Dynamic loss scaling: multiply the loss by S so small fp16 gradients survive, divide them back.

Why (Micikevicius et al., 2018, "Mixed Precision Training", §3.2; seminar notes "Large-scale DL
optimizations" §1.2.7.1): fp16 has a 5-bit exponent, so any |g| < 2^-24 ≈ 6e-8 rounds to zero
and |g| < 2^-14 keeps fewer than 10 mantissa bits. Backpropagation is linear in the loss, so
running it on S·loss gives S·g everywhere, shifting the gradients' exponents up by log2(S) into
fp16's range; dividing by S in fp32 (on the master copy) undoes it exactly when S is a power of 2.

Too large an S overflows (|S·g| > 65504 becomes inf). The *dynamic* rule picks S at run time:
  * a step whose gradients contain inf or NaN is skipped, and S ← S·backoff (0.5);
  * after `growth_interval` (2000) clean steps in a row, S ← S·growth (2.0), probing upward.
This is `torch.amp.GradScaler`'s rule (`_amp_update_scale_`): the scale is a float32, every
product is rounded to float32, a growth that would overflow float32 is not applied, and the
clean-step counter restarts after a growth and after an overflow. `tests/test_precision.py`
checks the trajectory against GradScaler's on the same planted overflow sequence.

`update` is task 7.1 of assignment a7 (the rule); `unscale_` is given.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

__all__ = ["DynamicLossScaler", "to_float32"]


def to_float32(x: float) -> float:
    """`x` rounded to the nearest float32 (inf past float32's range), as GradScaler stores its scale."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


class DynamicLossScaler:
    """The loss scale S and its update rule.

        scaler = DynamicLossScaler()
        (scaler.scale * loss).backward()        # or scaler.scale_loss(loss)
        found_inf = scaler.unscale_(grads)      # g / S in place (fp32 master grads); True on inf/NaN
        if not found_inf: optimizer.step()      # an overflowed step is skipped
        scaler.update(found_inf)                # S moves

    `enabled=False` (the bf16 path) keeps S = 1 and never skips: bf16 has fp32's exponent range,
    so there is nothing to rescue.
    """

    def __init__(self, *, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        if not (isinstance(init_scale, (int, float)) and math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"DynamicLossScaler: init_scale must be a finite number > 0, got {init_scale!r}")
        if not (isinstance(growth_factor, (int, float)) and growth_factor > 1):
            raise ValueError(f"DynamicLossScaler: growth_factor must be > 1, got {growth_factor!r}")
        if not (isinstance(backoff_factor, (int, float)) and 0 < backoff_factor < 1):
            raise ValueError(f"DynamicLossScaler: backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"DynamicLossScaler: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.enabled = bool(enabled)
        self.scale = to_float32(init_scale) if self.enabled else 1.0
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0      # clean steps in a row since the last growth or overflow

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """S·loss, computed in fp32 (a 16-bit loss times 65536 would itself overflow)."""
        return loss.float() * self.scale if self.enabled else loss

    @torch.no_grad()
    def unscale_(self, grads: Iterable[torch.Tensor | None]) -> bool:
        """Divide every gradient by S in place and say whether any element is inf or NaN.

        Run it on the fp32 master gradients: dividing there is exact for a power-of-2 S and
        cannot underflow the way an fp16 division could. One check over *all* gradients: a
        single overflowed element makes the whole step unusable.
        """
        inv = 1.0 / self.scale
        found = torch.zeros((), dtype=torch.bool)
        for g in grads:
            if g is None:
                continue
            if self.enabled:
                g.mul_(inv)
            found |= ~torch.isfinite(g).all().cpu()
        return bool(found)

    def update(self, found_inf: bool) -> None:
        """Move S after a step (task 7.1), exactly as GradScaler does.

        found_inf: S ← float32(S·backoff_factor), and the clean-step counter restarts at 0.
        otherwise: the counter grows by one; when it reaches growth_interval, S ←
        float32(S·growth_factor) unless that is inf (then S stays), and the counter restarts.
        Disabled (bf16): nothing changes. Products are computed in float64 and rounded with
        `to_float32`, which is what GradScaler's float32 scale does.
        """
        if not self.enabled:
            return
        raise NotImplementedError('a7 task 7.1: implement `update` (see assignments/a7_memory/README.md)')

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.growth_tracker = float(state["scale"]), int(state["growth_tracker"])
