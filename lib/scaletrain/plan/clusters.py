"""Cluster presets: `CLUSTERS["a100-80gb"]` (the paper's Selene), `CLUSTERS["h100"]` and `CLUSTERS["h200"]`.

Hardware numbers are the vendors' (rounded), links at what NCCL reaches on them, not fitted. Memory
is the capacity the driver reports (nvidia-smi's total, in MiB: an "80 GB" card holds 80 GiB,
7 % more than 80·10⁹ bytes, and the layouts of Korthikanti et al. 2022's 1T model with the
interleaved schedule need it); `reserved_bytes` takes off what a process cannot use.

  a100-80gb  DGX A100 nodes of 8 A100-SXM4-80GB (Narayanan et al. 2021, §5: Selene): 312 TFLOP/s
             dense fp16/bf16, 80 GB HBM2e (81,920 MiB) at 2.0 TB/s; NVLink 3 through NVSwitch, 300 GB/s per
             direction per GPU (≈ 240 GB/s reached by a ring); one 200 Gb/s HDR InfiniBand NIC per
             GPU (25 GB/s, ≈ 24 GB/s reached).
  h100       DGX H100 / Grand Teton nodes of 8 H100-SXM5-80GB: 989 TFLOP/s dense bf16, 80 GB HBM3
             (81,559 MiB) at 3.35 TB/s; NVLink 4, 450 GB/s per direction (≈ 360 reached); one 400 Gb/s NDR
             InfiniBand or RoCE NIC per GPU (≈ 45 GB/s reached; Dubey et al. 2024 §3.3.1).
  h200       the same node with H200s: the H100's compute and links, 141 GB of HBM3e (143,771 MiB)
             at 4.8 TB/s.

Efficiency (`efficiency.GemmEfficiency`, peak / achieved = a + kappa·O, on top of the element-wise
kernels' HBM traffic that `rates.py` counts, not fits):

  A100  (a, kappa) fitted on Table 1, rows 1-7, with 2021 software (`calibrate.fit_efficiency`;
        the test re-runs the fit and compares with the numbers below): a = 1.55, kappa = 0. With
        the element-wise traffic counted, the size trend of the seven rows needs no GEMM-shape
        penalty: their layers' GEMMs are all large enough (b·s >= 2048, h/t >= 768). Rows 1-7
        within 6 %, rms 3.5 %.
  H100  kappa = 0 as on the A100; `a` fitted on one published H100 run, Llama 3 405B on 8,192
        GPUs (Dubey et al. 2024, Table 4, row 1: 430 TFLOP/s per GPU), with 2024 software
        (`calibrate.fit_a`): a = 1.24, i.e. large GEMMs at 81 % of peak. Its other rows (16,384
        GPUs; context parallelism at 128K) are held out.
  H200  the H100's coefficients (the same chip); its faster HBM shortens the element-wise traffic.
"""

from __future__ import annotations

from scaletrain.comm.cost_model import AlphaBeta
from scaletrain.plan.efficiency import GemmEfficiency
from scaletrain.plan.specs import ClusterSpec

__all__ = ["CLUSTERS", "A100_EFFICIENCY", "H100_EFFICIENCY", "H200_EFFICIENCY"]

# calibrate.fit_efficiency(CLUSTERS["a100-80gb"]) on Table 1, rows 1-7
A100_EFFICIENCY = GemmEfficiency(a=1.5535, kappa=0.0)
# calibrate.fit_a(CLUSTERS["h100"], the fitted Llama 3 row)
H100_EFFICIENCY = GemmEfficiency(a=1.2367, kappa=0.0)
H200_EFFICIENCY = H100_EFFICIENCY
_A100_PEAK, _A100_HBM = 312e12, 2.0e12
_MIB = 2**20

_NVLINK4, _NDR = AlphaBeta(alpha_s=2e-6, beta_s_per_byte=1 / 360e9), AlphaBeta(alpha_s=5e-6, beta_s_per_byte=1 / 45e9)

CLUSTERS = {
    "a100-80gb": ClusterSpec(
        name="a100-80gb", gpus_per_node=8, peak_flops=_A100_PEAK, hbm_bytes=81920 * _MIB, hbm_bandwidth=_A100_HBM,
        intra=AlphaBeta(alpha_s=2e-6, beta_s_per_byte=1 / 240e9),
        inter=AlphaBeta(alpha_s=5e-6, beta_s_per_byte=1 / 24e9),
        efficiency=A100_EFFICIENCY, reserved_bytes=3 * 10**9),
    "h100": ClusterSpec(
        name="h100", gpus_per_node=8, peak_flops=989e12, hbm_bytes=81559 * _MIB, hbm_bandwidth=3.35e12,
        intra=_NVLINK4, inter=_NDR, efficiency=H100_EFFICIENCY, reserved_bytes=3 * 10**9),
    "h200": ClusterSpec(
        name="h200", gpus_per_node=8, peak_flops=989e12, hbm_bytes=143771 * _MIB, hbm_bandwidth=4.8e12,
        intra=_NVLINK4, inter=_NDR, efficiency=H200_EFFICIENCY, reserved_bytes=3 * 10**9),
}
