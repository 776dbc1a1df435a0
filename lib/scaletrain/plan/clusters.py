"""Cluster presets: `CLUSTERS["a100-80gb"]` (the paper's Selene) and `CLUSTERS["h100"]`.

Hardware numbers are the vendors' (rounded), links at what NCCL reaches on them, not fitted:

  a100-80gb  DGX A100 nodes of 8 A100-SXM4-80GB (Narayanan et al. 2021, §5: Selene): 312 TFLOP/s
             dense fp16/bf16, 80 GB HBM2e at 2.0 TB/s; NVLink 3 through NVSwitch, 300 GB/s per
             direction per GPU (≈ 240 GB/s reached by a ring); one 200 Gb/s HDR InfiniBand NIC per
             GPU (25 GB/s, ≈ 24 GB/s reached).
  h100       DGX H100 nodes of 8 H100-SXM5-80GB: 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s;
             NVLink 4, 450 GB/s per direction (≈ 360 reached); one 400 Gb/s NDR NIC per GPU
             (≈ 48 GB/s reached).

The A100's GEMM efficiency is fitted on Table 1, rows 1-7 (`calibrate.fit_efficiency`; the test
re-runs the fit and compares with the numbers below). The H100 preset reuses the A100 fit: no
H100 table was fitted, so its predictions are a hardware scaling of the A100's, unvalidated.
"""

from __future__ import annotations

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.plan.efficiency import GemmEfficiency
from scaletrain.plan.specs import ClusterSpec

__all__ = ["CLUSTERS", "A100_EFFICIENCY"]

# calibrate.fit_efficiency(CLUSTERS["a100-80gb"]) on Table 1, rows 1-7
A100_EFFICIENCY = GemmEfficiency(a=1.6244, kappa=215.90)

CLUSTERS = {
    "a100-80gb": ClusterSpec(
        name="a100-80gb", gpus_per_node=8, peak_flops=312e12, hbm_bytes=80 * 10**9, hbm_bandwidth=2.0e12,
        intra=AlphaBeta(alpha_s=2e-6, beta_s_per_byte=1 / 240e9),
        inter=AlphaBeta(alpha_s=5e-6, beta_s_per_byte=1 / 24e9),
        efficiency=A100_EFFICIENCY, reserved_bytes=3 * 10**9),
    "h100": ClusterSpec(
        name="h100", gpus_per_node=8, peak_flops=989e12, hbm_bytes=80 * 10**9, hbm_bandwidth=3.35e12,
        intra=AlphaBeta(alpha_s=2e-6, beta_s_per_byte=1 / 360e9),
        inter=AlphaBeta(alpha_s=5e-6, beta_s_per_byte=1 / 48e9),
        efficiency=A100_EFFICIENCY, reserved_bytes=3 * 10**9),
}
