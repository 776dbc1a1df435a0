"""The FLOP rate of one transformer layer on one rank: its GEMMs on the roofline, plus the memory
traffic of the element-wise kernels between them.

A layer is not only GEMMs. LayerNorm, the bias + GeLU (or SwiGLU), bias + dropout + residual and,
without flash attention, the scale + mask + softmax and dropout of the s² scores are kernels
that read and write whole activations at HBM speed (Korthikanti et al. 2022, §4.1, lists the
same tensors as what a layer keeps; Ivanov et al. 2021, "Data Movement Is All You Need", §3,
measure such kernels at a quarter of BERT's time). Their cost grows like s·b·h while the GEMMs'
grows like s·b·h², so it is what makes small models slower per FLOP than large ones: counted
here, it is not left to the fitted coefficients.

Bytes one layer's forward moves on one of t·c ranks (16-bit values, 1-byte masks; each fused
kernel of Megatron reads its inputs and writes its outputs once), in units of (s/c)·b:

  two LayerNorms        read x, write y:                  2 · 4h           (/t under SP)
  two bias+dropout+add  read y and the residual, write the sum and a mask: 2 · 7h   (/t under SP)
  the MLP's activation  bias+GeLU reads and writes f wide: 4f; SwiGLU reads two, writes one: 6f  (/t)
  softmax and dropout   of a·s scores per token, without flash attention: read and write them,
                        read them again, write them and a 1-byte mask: 9·a·s                     (/t)

The backward moves about twice what the forward does, recomputation once more, so this traffic
scales with the FLOPs and folds into one rate: rate = FLOPs / (GEMM seconds + traffic seconds).
With flash attention the core is one fused kernel without s² traffic (Dao et al. 2022): its GEMMs
cost what a large GEMM costs on the roofline, divided by FLASH_RELATIVE, the fraction of a large
GEMM's speed FlashAttention-2 reaches (Dao 2023, §4.1: 50-73 % of the A100's peak forward and
backward against cuBLAS's 80-90 %).
"""

from __future__ import annotations

from scaletrain.plan.flops import layer_forward_flops, layer_gemms
from scaletrain.plan.specs import ClusterSpec, Layout, ModelSpec

__all__ = ["elementwise_bytes", "gemm_seconds", "layer_rate", "FLASH_RELATIVE"]

FLASH_RELATIVE = 0.75


def elementwise_bytes(model: ModelSpec, layout: Layout) -> float:
    """Bytes one layer's element-wise kernels move in the forward on one rank (module docstring)."""
    t, h = layout.tp, model.hidden
    tokens = model.seq * layout.microbatch / layout.cp
    whole = 2 * 4 * h + 2 * 7 * h
    split = (6 if model.gated_ffn else 4) * model.ffn
    scores = 0 if layout.flash_attention else 9 * model.heads * model.seq
    return tokens * (whole / (t if layout.sequence_parallel else 1) + (split + scores) / t)


def gemm_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """Seconds of one layer's forward GEMMs on one rank, each at its roofline efficiency."""
    eff = cluster.efficiency
    gemms = layer_gemms(model, layout.microbatch, layout.tp, layout.cp)
    matrices, core = [gemms[0], *gemms[3:]], gemms[1:3]  # QKV, out, MLP; Q·Kᵀ and attention·V
    seconds = sum(g[0] * eff.slowdown([g]) for g in matrices)
    if layout.flash_attention:  # one fused kernel: a large GEMM's sides, at FLASH_RELATIVE of its speed
        s = model.seq
        seconds += sum(g[0] for g in core) * eff.slowdown([(1.0, s, s, s)]) / FLASH_RELATIVE
    else:
        seconds += sum(g[0] * eff.slowdown([g]) for g in core)
    return seconds / cluster.peak_flops


def layer_rate(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """FLOP/s one rank runs a layer at: its forward FLOPs over GEMM plus element-wise seconds."""
    flops = layer_forward_flops(model, layout.microbatch) / (layout.tp * layout.cp)
    traffic = elementwise_bytes(model, layout) / cluster.hbm_bandwidth
    return flops / (gemm_seconds(model, cluster, layout) + traffic)
