"""ZeRO-Offload's split: the model on the device, the fp32 master copy, the optimizer state and the
update on the host; only 16-bit gradients go down and 16-bit parameters come back.

Ren et al. (2021), "ZeRO-Offload: Democratizing Billion-Scale Model Training", §3-4 (seminar
notes "Large-scale DL optimizations", ZeRO-Offload; seed "Techniques for large-scale training",
CPU Offloading). Of mixed-precision Adam's 16 B/param (`scaletrain.memory.bytes_per_param`:
2 weight + 2 gradient + 12 optimizer), the 12 B of master copy and moments, and the update that
reads and writes them, are the part with the least compute per byte: Adam does ~10 flops per
parameter, the forward and backward 6 per parameter *per token*. So they move to the host:

    device tier   16-bit parameters, 16-bit gradients            4 B/param  (16 without offload)
    host tier     fp32 master, Adam m and v                     12 B/param  (the ZeRO paper's K),
                  + the fp32 gradient while the step runs        4 B/param
    per step      device→host 16-bit gradients  2Ψ bytes; host→device 16-bit parameters  2Ψ bytes

The gradient is upcast and the parameter cast down (the paper's float2half) *on the host*, so
only 2 bytes per parameter cross PCIe each way. `cost_model.offload_step_time` turns those bytes
into time.

On a CPU-only machine both tiers are host memory: the "device" tier is simulated by accounting.
Every tensor that crosses the tier boundary goes through `_to_host` / `_to_device`, which count
its bytes; the tiers' holdings are measured from their storages (`tier_bytes`). With a GPU the
model lives on it, the master on pinned host memory, and the copies are real PCIe traffic
(`tests/test_offload.py::test_real_device_to_host_traffic`, `gpu` marker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from scaletrain.memory_measure import storage_bytes
from scaletrain.precision.master import MixedPrecision

__all__ = ["OffloadOptimizer", "Transfers", "TierBytes"]


@dataclass
class Transfers:
    """Bytes that crossed between the tiers: device→host (gradients) and host→device (parameters)."""
    d2h: int = 0
    h2d: int = 0
    copies: int = 0


@dataclass(frozen=True)
class TierBytes:
    device: int     # 16-bit parameters + gradients (what the accelerator must hold for model states)
    host: int       # master copy + optimizer state (+ fp32 gradients during the step)


class OffloadOptimizer(MixedPrecision):
    """`MixedPrecision` whose master copy, gradients in fp32, optimizer state and step live on `host`.

        off = OffloadOptimizer(model, torch.optim.Adam, dtype=torch.float16, lr=1e-3)
        off.backward(off.model(idx, tgt)[1]); off.step()
        off.transfers            # Transfers(d2h=2Ψ·steps, h2d=2Ψ·(steps not skipped), ...)

    The arithmetic is MixedPrecision's (same casts, same scaler, same optimizer on fp32), so the
    parameters equal a MixedPrecision run exactly; only where the tensors live and what is
    copied between tiers differ.
    """

    def __init__(self, model: nn.Module, optimizer_cls: Callable[..., torch.optim.Optimizer], *,
                 dtype: torch.dtype = torch.float16, host: str | torch.device = "cpu",
                 scaler: dict | None = None, **optimizer_kwargs):
        self.host = torch.device(host)
        if self.host.type != "cpu":
            raise ValueError(f"OffloadOptimizer: the host tier is CPU memory, got host={host!r}")
        self.transfers = Transfers()
        super().__init__(model, optimizer_cls, dtype=dtype, scaler=scaler, **optimizer_kwargs)
        self.device = self.params[0].device

    def _master_copy(self, p: torch.Tensor) -> torch.Tensor:
        # pinned (page-locked) host memory: the DMA engine copies from it without a bounce buffer
        master = torch.empty(p.shape, dtype=torch.float32, device=self.host, pin_memory=p.is_cuda)
        return master.copy_(p.detach())

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        self.transfers.d2h += t.numel() * t.element_size()
        self.transfers.copies += 1
        return t.to(self.host) if t.device != self.host else t.clone()

    def _to_device(self, t: torch.Tensor, out: torch.Tensor) -> None:
        self.transfers.h2d += t.numel() * t.element_size()
        self.transfers.copies += 1
        out.copy_(t)

    def _grads_to_master(self) -> None:
        for m, p in zip(self.master, self.params):
            # the 16-bit gradient crosses (2 B/param), the upcast to fp32 happens on the host
            m.grad = None if p.grad is None else self._to_host(p.grad).float()

    def _master_to_model(self) -> None:
        for m, p in zip(self.master, self.params):
            self._to_device(m.to(p.dtype), p)      # cast down on the host: 2 B/param cross

    def tier_bytes(self) -> TierBytes:
        """Storages held now by each tier (a tied weight counted once)."""
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        device = storage_bytes(self.params) + storage_bytes(p.grad for p in self.params if p.grad is not None)
        host = (storage_bytes(self.master) + storage_bytes(m.grad for m in self.master if m.grad is not None)
                + storage_bytes(state))
        return TierBytes(device=device, host=host)
