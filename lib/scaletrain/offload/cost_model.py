"""How long an offloaded step takes: compute on the device, bytes over PCIe, the update on the host.

Ren et al. (2021), "ZeRO-Offload", §4.1-4.2: per step, 2Ψ bytes of 16-bit gradients go
device→host, the CPU runs Adam over Ψ parameters, and 2Ψ bytes of 16-bit parameters come back.
Three schedules, from slowest to fastest:

  serial     T = T_compute + 2Ψ/B + T_update + 2Ψ/B
  overlap    gradients leave bucket by bucket during the backward (which is ≈ 2/3 of T_compute:
             backward = 2 × forward FLOPs), so only the part of the D2H copy longer than the
             backward shows:  T = T_compute + max(0, 2Ψ/B − ⅔·T_compute) + T_update + 2Ψ/B
  delayed    the paper's one-step delayed parameter update (DPU): step k's update and copies run
             while the device computes step k+1 with step k−1's parameters:
             T = max(T_compute, 2Ψ/B + T_update + 2Ψ/B)

B is the PCIe bandwidth per direction (about 25 GB/s for PCIe 4.0 x16 in practice, ~50 GB/s on
PCIe 5.0). T_update = Ψ / (parameters per second of the host's Adam): the paper's vectorized
CPU-Adam reaches about 1e9 parameters/s on a many-core host.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OffloadStepTime", "offload_step_time"]


@dataclass(frozen=True, kw_only=True)
class OffloadStepTime:
    compute_s: float
    d2h_s: float
    update_s: float
    h2d_s: float

    @property
    def serial_s(self) -> float:
        return self.compute_s + self.d2h_s + self.update_s + self.h2d_s

    @property
    def overlap_s(self) -> float:
        backward = 2 / 3 * self.compute_s
        return self.compute_s + max(0.0, self.d2h_s - backward) + self.update_s + self.h2d_s

    @property
    def delayed_s(self) -> float:
        return max(self.compute_s, self.d2h_s + self.update_s + self.h2d_s)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"offload_step_time: {name} must be a number > 0, got {value!r}")
    return float(value)


def offload_step_time(num_params: int, *, compute_s: float, pcie_gbps: float, update_params_per_s: float,
                      grad_bytes: int = 2, param_bytes: int = 2) -> OffloadStepTime:
    """The three terms of one offloaded step for Ψ = `num_params` (GB/s = 1e9 B/s)."""
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 1:
        raise ValueError(f"offload_step_time: num_params must be an int >= 1, got {num_params!r}")
    bandwidth = _positive("pcie_gbps", pcie_gbps) * 1e9
    compute = _positive("compute_s", compute_s)
    rate = _positive("update_params_per_s", update_params_per_s)
    return OffloadStepTime(compute_s=compute, d2h_s=grad_bytes * num_params / bandwidth,
                           update_s=num_params / rate, h2d_s=param_bytes * num_params / bandwidth)
