"""Mixed-precision training by hand: a 16-bit model, an fp32 master copy, the optimizer on the master.

The three changes of Micikevicius et al. (2018) as the course seed lists them ("Techniques for
large-scale training", Mixed Precision; seminar notes §1.2.7.1):
  1. the model's weights, activations and gradients are 16-bit (fp16 or bf16), so matmuls run
     at tensor-core speed and activations take half the bytes;
  2. an fp32 *master* copy of the weights accumulates the updates: lr·g is often below half an
     fp16 ulp of the weight (|w| = 1 has ulp 2^-10 ≈ 1e-3), so a 16-bit weight would not move;
  3. loss scaling (`DynamicLossScaler`) for fp16; bf16 has fp32's exponent range and needs none.
Memory per parameter with Adam: 2 (16-bit weight) + 2 (16-bit grad) + 4 (master) + 8 (moments)
= 16 B, `scaletrain.memory.bytes_per_param(precision="mixed")`: the same as fp32 training. The
saving is in activations (half the bytes) and time, not in model states.

    mp = MixedPrecision(model, torch.optim.AdamW, dtype=torch.float16, lr=1e-3)
    loss = mp.model(x)...                  # mp.model is the 16-bit copy
    mp.backward(loss); stepped = mp.step() # False when the step was skipped (overflow)

`torch.amp` does it differently: it keeps fp32 parameters and casts per op under `autocast`
(matmuls in 16 bit, reductions such as softmax and LayerNorm in fp32). `scaletrain.bench memory`
runs both side by side.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from scaletrain.precision.scaler import DynamicLossScaler

__all__ = ["MixedPrecision", "HALF_DTYPES"]

HALF_DTYPES = (torch.float16, torch.bfloat16)


class MixedPrecision:
    """A model cast to `dtype` plus fp32 master weights that the optimizer updates.

    `model` is cast in place (its parameters become 16-bit); `self.master[i]` is the fp32 copy of
    `self.params[i]`, created *before* the cast so no precision is lost at the start. fp16 gets a
    `DynamicLossScaler` (keyword arguments in `scaler`); bf16 and fp32 get a disabled one.
    """

    def __init__(self, model: nn.Module, optimizer_cls: Callable[..., torch.optim.Optimizer], *,
                 dtype: torch.dtype = torch.float16, scaler: dict | None = None, **optimizer_kwargs):
        if dtype not in (*HALF_DTYPES, torch.float32):
            raise ValueError(f"MixedPrecision: dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("MixedPrecision: the model has no trainable parameters")
        if any(p.dtype != torch.float32 for p in self.params):
            raise ValueError("MixedPrecision: pass the model in fp32; it keeps the fp32 values as the master copy")
        self.master = [nn.Parameter(self._master_copy(p)) for p in self.params]
        self.model = model.to(dtype)
        self.dtype = dtype
        self.scaler = DynamicLossScaler(**(scaler or {}), enabled=dtype == torch.float16)
        self.optimizer = optimizer_cls(self.master, **optimizer_kwargs)
        self.skipped_steps: list[int] = []
        self.steps = 0

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate S·loss through the 16-bit model (S = 1 without scaling)."""
        self.scaler.scale_loss(loss).backward()

    @torch.no_grad()
    def step(self) -> bool:
        """Master grads ← model grads (fp32), unscale, skip on overflow, step, re-cast the model.

        Returns whether the optimizer stepped. The model's grads are cleared either way.
        """
        self._grads_to_master()
        found_inf = self.scaler.unscale_(m.grad for m in self.master)
        if found_inf:
            self.skipped_steps.append(self.steps)
        else:
            self.optimizer.step()
            self._master_to_model()
        self.scaler.update(found_inf)
        for m, p in zip(self.master, self.params):
            m.grad = p.grad = None
        self.steps += 1
        return not found_inf

    def _master_copy(self, p: torch.Tensor) -> torch.Tensor:
        return p.detach().clone()

    # the two crossings between the model's copy and the master copy (a subclass may move them
    # between memory tiers: scaletrain.offload)
    def _grads_to_master(self) -> None:
        for m, p in zip(self.master, self.params):
            m.grad = None if p.grad is None else p.grad.float()   # the upcast: 2 → 4 bytes

    def _master_to_model(self) -> None:
        for m, p in zip(self.master, self.params):
            p.copy_(m)                       # round-to-nearest into the 16-bit weight


def train_with_overflows(mp: "MixedPrecision", cfg, *, steps: int, poison, seed: int) -> dict:
    """`steps` SGD steps of `mp` on the tiny GPT's batches (`make_batch(cfg, 2, seed + step)`),
    an inf planted in the first gradient at each step in `poison`: the parameters and the loss
    scale after each step, and the steps skipped. What the a7 grader runs on both sides (the
    reference's scaler here, the student's in the worker), so the two runs differ only there."""
    from scaletrain.models import make_batch

    params, scales = [], []
    for step in range(steps):
        idx, tgt = make_batch(cfg, 2, seed=seed + step)
        mp.backward(mp.model(idx, tgt)[1])
        if step in poison:
            mp.params[0].grad.view(-1)[0] = float("inf")
        mp.step()
        params.append([q.detach().clone() for q in mp.params])
        scales.append(float(mp.scaler.scale))
    return {"params": params, "scales": scales, "skipped": list(mp.skipped_steps)}

