"""Offloading the optimizer to the host (ZeRO-Offload): what stays on the device, what moves, how long.

    from scaletrain.offload import OffloadOptimizer, offload_step_time
    off = OffloadOptimizer(model, torch.optim.Adam, dtype=torch.float16, lr=1e-3)
    off.backward(off.model(idx, tgt)[1]); off.step()
    off.transfers, off.tier_bytes()       # 4Ψ bytes per step; 4 B/param device, 12 B/param host

engine.py: the split and its byte counts (a simulated device tier on CPU-only machines);
cost_model.py: the step time from PCIe bandwidth and the host's update rate.
"""

from scaletrain.offload.cost_model import OffloadStepTime, offload_step_time
from scaletrain.offload.engine import OffloadOptimizer, TierBytes, Transfers

__all__ = ["OffloadOptimizer", "Transfers", "TierBytes", "OffloadStepTime", "offload_step_time"]
